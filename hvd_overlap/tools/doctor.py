"""``hvd-overlap doctor``: what this environment runs the plugin with, in the spirit of
``horovodrun --check-build``: Python, TensorFlow (which distribution), the Keras behind
``tf.keras``, numpy, Horovod and what it was built with, the GPUs TensorFlow sees, and which
strategies run here or are refused, and why.

One process, no ``horovodrun``: every probe catches its own failure, so a broken stack gets a
report (exit 0) that names the fix; ``--strict`` exits 1 when something keeps the plugin from
running.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import sys
from dataclasses import dataclass, field
from typing import Any

import click

#: Horovod's build flags, as ``hvd.<flag>()`` names them, and how the report labels them
HOROVOD_BUILT = (("gloo_built", "Gloo"), ("mpi_built", "MPI"), ("nccl_built", "NCCL"),
                 ("cuda_built", "CUDA"), ("rocm_built", "ROCm"), ("ccl_built", "oneCCL"),
                 ("ddl_built", "DDL"))
#: the tested Horovod release
HOROVOD_TESTED = "0.28.1"
#: TensorFlow minors tested here (2.16 is inside the supported range but never ran)
TF_TESTED = ("2.15", "2.17", "2.18")


@dataclass
class Report:
    """The doctor's findings: (label, value) rows, each strategy's refusal (None: it runs),
    problems (the plugin cannot run; each names its fix) and notes (it runs; worth knowing)."""

    rows: list[tuple[str, str]] = field(default_factory=list)
    strategies: dict[str, str | None] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, label: str, value: str) -> None:
        self.rows.append((label, value))


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def _tensorflow(report: Report) -> Any:
    """TensorFlow's version, distribution, build and GPUs; the module, or None."""
    import hvd_overlap

    dists = hvd_overlap.tensorflow_distributions()
    names = ", ".join(f"{n} {v}" for n, v in dists) or "none"
    try:
        import tensorflow as tf
    except Exception as e:  # missing, or a broken install
        report.add("TensorFlow", f"not importable ({_first_line(e)}); distributions: {names}")
        return None
    build = tf.sysconfig.get_build_info()
    kind = "CUDA" if build.get("is_cuda_build") else "ROCm" if build.get("is_rocm_build") else "CPU"
    report.add("TensorFlow", f"{tf.__version__} (distribution: {names}; a {kind} build)")
    if len(dists) > 1:
        report.notes.append(f"{len(dists)} distributions install the module tensorflow ({names}):"
                            " one was installed over the other; uninstall all but one, then "
                            "reinstall it")
    minor = ".".join(tf.__version__.split(".")[:2])
    if minor not in TF_TESTED:
        report.notes.append(f"TensorFlow {minor} was never tested with the plugin (tested: "
                            f"{', '.join(TF_TESTED)})")
    try:
        gpus = tf.config.list_physical_devices("GPU")
    except Exception as e:
        report.add("GPUs", f"not listed ({_first_line(e)})")
    else:
        report.add("GPUs", f"{len(gpus)} visible to TensorFlow"
                   + (f": {', '.join(g.name for g in gpus)}" if gpus else ""))
    return tf


def _keras(report: Report, tf: Any) -> None:
    """The Keras behind ``tf.keras`` (2 or 3), tf-keras, ``TF_USE_LEGACY_KERAS``."""
    legacy = os.environ.get("TF_USE_LEGACY_KERAS")
    installed = ", ".join(f"{n} {v}" for n in ("keras", "tf-keras")
                          if (v := _dist_version(n))) or "none"
    setting = f"TF_USE_LEGACY_KERAS={legacy}" if legacy is not None else \
        "TF_USE_LEGACY_KERAS unset"
    if tf is None:
        report.add("Keras", f"installed: {installed}; {setting}")
        return
    try:
        package = tf.keras.__name__.split(".")[0]
        version = str(getattr(sys.modules.get(package), "__version__", "unknown"))
    except Exception as e:
        report.add("Keras", f"tf.keras does not load ({_first_line(e)}); installed: "
                   f"{installed}; {setting}")
        return
    generation = version.split(".")[0]
    report.add("Keras", f"tf.keras is {package} {version} (Keras {generation}: the plugin's "
               f"Keras {generation} adapter); installed: {installed}; {setting}")
    keras3 = _dist_version("keras")
    if generation == "2" and keras3 and keras3.startswith("3."):
        report.notes.append(f"the keras {keras3} package (Keras 3) is installed too: build "
                            "models and optimizers with tf.keras.* (tf-keras), not keras.*")


def _numpy(report: Report) -> None:
    try:
        import numpy as np
    except Exception as e:
        report.add("numpy", f"not importable ({_first_line(e)})")
        return
    report.add("numpy", np.__version__)


def _horovod(report: Report) -> None:
    """Horovod's version and what it was built with; where ``horovodrun`` is."""
    version = _dist_version("horovod")
    if version is None:
        report.add("Horovod", "not installed")
        return
    try:
        import horovod.tensorflow as hvd
    except Exception as e:
        report.add("Horovod", f"{version}, its TensorFlow ops do not load ({_first_line(e)})")
        return
    flags = []
    for attr, label in HOROVOD_BUILT:
        try:
            flags.append(f"[{'X' if getattr(hvd, attr)() else ' '}] {label}")
        except Exception:  # an older Horovod without this query
            flags.append(f"[?] {label}")
    report.add("Horovod", f"{version}; built with [X] TensorFlow ops, {', '.join(flags)}")
    beside = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    report.add("horovodrun", beside if os.path.exists(beside) else
               shutil.which("horovodrun") or "not found beside this Python nor on PATH")
    if version != HOROVOD_TESTED:
        report.notes.append(f"Horovod {version} was never tested with the plugin (tested: "
                            f"{HOROVOD_TESTED})")
    try:
        gpu_ops = any(getattr(hvd, f)() for f in ("nccl_built", "cuda_built", "rocm_built"))
    except Exception:
        gpu_ops = True
    tf = sys.modules.get("tensorflow")
    if tf is not None and not gpu_ops and tf.config.list_physical_devices("GPU"):
        report.notes.append("GPUs are visible but Horovod was built without GPU support: GPU "
                            "tensors go through host memory; rebuild Horovod with "
                            "HOROVOD_GPU_OPERATIONS=NCCL (docs/install.md)")


def _strategies(report: Report) -> None:
    """Import ``hvd_overlap.keras`` as a script would: every strategy runs, or all are refused
    with the import's reason (the stack); on Keras 3 those the Keras 3 adapter cannot run are
    refused with its reason."""
    from hvd_overlap import StackError
    from hvd_overlap.core.choice import REGISTRY

    try:
        import hvd_overlap.keras  # noqa: F401
    except ImportError as e:
        why = str(e).strip()
        listed = isinstance(e, StackError) and report.problems  # the same as stack_problems()
        report.strategies = dict.fromkeys(
            REGISTRY, "the stack (problems below)" if listed else why.splitlines()[0])
        if not listed:
            report.problems.append(f"import hvd_overlap.keras: {type(e).__name__}: {why}")
        return
    from hvd_overlap.adapters import keras_api

    report.strategies = {name: keras_api.generation_problem(None, name, shards=cls.shards)
                         for name, cls in REGISTRY.items()}


def collect() -> Report:
    """Probe this process's stack; never raises for a missing or broken part."""
    import hvd_overlap

    report = Report()
    report.add("hvd-overlap", f"{hvd_overlap.__version__} "
               f"({os.path.dirname(hvd_overlap.__file__)})")
    report.add("Python", f"{platform.python_version()} ({sys.executable}, {platform.machine()})")
    tf = _tensorflow(report)
    _keras(report, tf)
    _numpy(report)
    _horovod(report)
    report.problems += hvd_overlap.stack_problems()
    _strategies(report)
    return report


def format_report(report: Report) -> str:
    """The report as aligned text."""
    width = max(len(label) for label, _ in report.rows) + 2
    lines = [f"{label:<{width}}{value}" for label, value in report.rows]
    runs = [name for name, why in report.strategies.items() if why is None]
    refused = {name: why for name, why in report.strategies.items() if why is not None}
    lines.append(f"{'strategies':<{width}}" + (
        f"run here: {', '.join(runs)}" if runs else "none runs here"))
    if refused:
        lines.append(f"{'':<{width}}refused: {', '.join(refused)}: "
                     f"{next(iter(refused.values()))}")
    for title, items in (("problems", report.problems), ("notes", report.notes)):
        lines.append(f"{title:<{width}}" + ("none" if not items else items[0]))
        lines += [f"{'':<{width}}{item}" for item in items[1:]]
    return "\n".join(lines)


@click.command()
@click.option("--strict", is_flag=True,
              help="exit 1 when something keeps the plugin from running (default: always 0)")
def doctor(strict: bool) -> None:
    """Print the stack the plugin runs on (Python, TensorFlow, Keras, numpy, Horovod and its
    build, GPUs) and which strategies run here or are refused, and why. One process, no
    horovodrun needed; like `horovodrun --check-build`."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    report = collect()
    click.echo(format_report(report))
    if strict and report.problems:
        raise SystemExit(1)
