"""The stack the plugin runs on, checked before TensorFlow or Horovod is imported:
TensorFlow 2.15-2.18 and a Horovod built with TensorFlow ops against it. The package depends on
none of them (it uses the user's), so ``hvd_overlap.comm`` -- imported first by
``hvd_overlap.keras`` -- calls ``require_stack`` and a missing or unsupported piece fails with
the fix named (``StackError``); ``hvd-overlap doctor`` prints ``stack_problems``. Reads package
metadata and files only: importing this module loads neither TensorFlow nor Horovod."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import sys
import sysconfig
from pathlib import Path

#: the TensorFlow releases (major, minor) the plugin runs on, first and last
TF_RANGE: tuple[tuple[int, int], tuple[int, int]] = ((2, 15), (2, 18))
#: set to 1 to skip ``require_stack`` (an untested stack you vouch for, e.g. a patched Horovod)
SKIP_CHECK_VARIABLE = "HVD_OVERLAP_SKIP_STACK_CHECK"
_HOROVOD_BUILD = ("HOROVOD_WITH_TENSORFLOW=1 pip install --no-build-isolation --no-cache-dir "
                  "horovod==0.28.1 (docs/install.md: Gloo, MPI or NCCL build lines)")


class StackError(ImportError):
    """The installed TensorFlow or Horovod cannot run ``hvd_overlap.keras``; names the fix."""


def _version_tuple(version: str) -> tuple[int, ...]:
    """(2, 18, 1) of '2.18.1', '2.16.0rc0', '2.15.0+nv24.1'."""
    return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3])


def tensorflow_distributions() -> list[tuple[str, str]]:
    """(distribution, version) of each installed distribution that provides the module
    ``tensorflow`` (``tensorflow``, ``tensorflow-cpu``, ``tensorflow-intel``, a vendor's...),
    from package metadata: normally one; two mean one was installed over the other."""
    found = []
    for name in importlib.metadata.packages_distributions().get("tensorflow", []):
        try:
            found.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _origin(name: str) -> str | None:
    """The file a top-level module is (or would be) loaded from, without importing it; None if
    it is not installed (or blocked: ``sys.modules[name] = None``)."""
    module = sys.modules.get(name, False)
    if module is not False:
        return (getattr(module, "__file__", None) or name) if module is not None else None
    spec = importlib.util.find_spec(name)
    return (spec.origin or name) if spec is not None else None


def stack_problems() -> list[str]:
    """What keeps ``hvd_overlap.keras`` from running in this environment, each with its fix; []
    when nothing does. Reads package metadata and files only (imports neither TensorFlow nor
    Horovod), so ``hvd-overlap doctor`` reports it even where an import would fail."""
    problems = []
    lo, hi = TF_RANGE
    fix_tf = "pip install 'tensorflow>=2.15,<2.19' (GPUs: 'tensorflow[and-cuda]')"
    if _origin("tensorflow") is None:
        problems.append(f"TensorFlow is not installed: {fix_tf}, or 'hvd-overlap[cpu]' for the "
                        "tested CPU build; then build Horovod against it")
    else:
        loaded = sys.modules.get("tensorflow")
        found = tensorflow_distributions()
        version = getattr(loaded, "__version__", None) or (found[0][1] if found else None)
        if version and not lo <= _version_tuple(version)[:2] <= hi:
            problems.append(f"TensorFlow {version} is not supported (the plugin runs on "
                            f"2.{lo[1]} to 2.{hi[1]}; Horovod 0.28.1 does not build against 2.19 "
                            f"or later): {fix_tf}, then rebuild Horovod against it")
    origin = _origin("horovod")
    if origin is None:
        problems.append(f"Horovod is not installed: build it against this TensorFlow: "
                        f"{_HOROVOD_BUILD}")
    else:
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        ops = Path(origin).parent / "tensorflow" / f"mpi_lib{suffix}"
        if not ops.exists():
            problems.append(f"Horovod was built without TensorFlow ({ops.name} not found): "
                            f"pip uninstall -y horovod, then {_HOROVOD_BUILD}")
    return problems


def require_stack() -> None:
    """Raise ``StackError`` naming the fix unless TensorFlow 2.15-2.18 and a Horovod with
    TensorFlow ops that loads against it are installed (``HVD_OVERLAP_SKIP_STACK_CHECK=1``
    skips the check). Imports Horovod's TensorFlow ops, so call it where they are needed."""
    if os.environ.get(SKIP_CHECK_VARIABLE) == "1":
        return
    problems = stack_problems()
    if problems:
        raise StackError("hvd_overlap.keras cannot run here:\n- " + "\n- ".join(problems)
                         + "\n(`hvd-overlap doctor` prints the whole stack)")
    try:
        import horovod.tensorflow  # noqa: F401  (loads the ops against this TensorFlow)
    except Exception as e:  # an ImportError, or TF's NotFoundError for an undefined symbol
        raise StackError(f"Horovod's TensorFlow ops do not load ({type(e).__name__}: {e}); "
                         "Horovod was probably built against another TensorFlow: pip uninstall "
                         f"-y horovod, then {_HOROVOD_BUILD}") from e
