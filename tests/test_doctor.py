"""``hvd-overlap doctor`` and the stack check behind it (``hvd_overlap.stack_problems``,
``require_stack``, run when ``hvd_overlap.keras`` is imported).

The real stack's report in this process; a missing Horovod and a Keras 3 ``tf.keras`` faked in
fresh processes (the plugin is already imported here), and the rule's other cases (no
TensorFlow, TensorFlow 2.19, Horovod without TensorFlow ops) by faking what it reads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import horovod
import pytest
import tensorflow as tf
from click.testing import CliRunner

import hvd_overlap
from hvd_overlap.core.choice import REGISTRY
from hvd_overlap.tools.cli import main

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
#: in a fresh process: run the doctor twice (plain, --strict), print exit codes and output
DOCTOR = ("from click.testing import CliRunner\n"
          "from hvd_overlap.tools.cli import main\n"
          "plain, strict = (CliRunner().invoke(main, a) for a in (['doctor'], "
          "['doctor', '--strict']))\n"
          "import json; print('REPORT' + json.dumps([plain.exit_code, strict.exit_code, "
          "plain.output]))\n")


def _run(code: str) -> tuple[int, int, str]:
    """Run ``code`` + the doctor in a fresh interpreter: (exit code, --strict's, report)."""
    out = subprocess.run([sys.executable, "-c", code + DOCTOR], capture_output=True, text=True,
                         timeout=300, env=ENV)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("REPORT"))
    return tuple(json.loads(line[len("REPORT"):]))  # type: ignore[return-value]


def test_the_real_stack_report():
    result = CliRunner().invoke(main, ["doctor"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"TensorFlow   {tf.__version__} (distribution: tensorflow" in out
    assert "Keras        tf.keras is " in out and "(Keras 2: the plugin's Keras 2 adapter)" in out
    assert f"Horovod      {horovod.__version__}; built with [X] TensorFlow ops, [X] Gloo" in out
    assert "GPUs         0 visible to TensorFlow" in out or "GPUs " in out
    assert f"strategies   run here: {', '.join(REGISTRY)}" in out
    assert "problems     none" in out
    assert CliRunner().invoke(main, ["doctor", "--strict"]).exit_code == 0


def test_a_missing_horovod_is_reported_with_the_fix_and_refuses_the_import():
    fake = ("import importlib.metadata as m, sys\n"
            "real = m.version\n"
            "def version(name):\n"
            "    if name == 'horovod': raise m.PackageNotFoundError(name)\n"
            "    return real(name)\n"
            "m.version = version; sys.modules['horovod'] = None\n"
            "import hvd_overlap\n"
            "try:\n"
            "    import hvd_overlap.keras\n"
            "except hvd_overlap.StackError as e:\n"
            "    print('REFUSED', str(e).replace(chr(10), ' '))\n")
    out = subprocess.run([sys.executable, "-c", fake], capture_output=True, text=True,
                         timeout=300, env=ENV)
    assert "REFUSED hvd_overlap.keras cannot run here" in out.stdout, out.stderr[-3000:]
    assert "Horovod is not installed" in out.stdout and "HOROVOD_WITH_TENSORFLOW=1" in out.stdout
    plain, strict, report = _run(fake)
    assert (plain, strict) == (0, 1), report
    assert "Horovod      not installed" in report
    assert "problems     Horovod is not installed: build it against this TensorFlow" in report
    assert "strategies   none runs here" in report
    assert f"refused: {', '.join(REGISTRY)}: the stack (problems below)" in report


def test_no_tensorflow_is_named_with_the_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # what an import would not find
    (problem,) = hvd_overlap.stack_problems()
    assert problem.startswith("TensorFlow is not installed: pip install 'tensorflow>=2.15,<2.19'")
    assert "hvd-overlap[cpu]" in problem


@pytest.mark.parametrize("version", ["2.19.0", "2.14.1", "2.20.0rc0"])
def test_tensorflow_outside_2_15_to_2_18_is_refused(monkeypatch, version):
    monkeypatch.setitem(sys.modules, "tensorflow", types.SimpleNamespace(__version__=version))
    (problem,) = hvd_overlap.stack_problems()
    assert problem.startswith(f"TensorFlow {version} is not supported (the plugin runs on 2.15 "
                              "to 2.18")
    with pytest.raises(hvd_overlap.StackError, match="pip install 'tensorflow>=2.15,<2.19'"):
        hvd_overlap.require_stack()
    monkeypatch.setenv(hvd_overlap.stack.SKIP_CHECK_VARIABLE, "1")
    hvd_overlap.require_stack()  # the user vouches for it


@pytest.mark.parametrize("version", ["2.15.1", "2.16.2", "2.18.0", "2.17.0+nv24.1"])
def test_tensorflow_2_15_to_2_18_passes(monkeypatch, version):
    monkeypatch.setitem(sys.modules, "tensorflow", types.SimpleNamespace(__version__=version))
    assert hvd_overlap.stack_problems() == []


def test_horovod_built_without_tensorflow_names_the_rebuild(monkeypatch, tmp_path):
    (tmp_path / "horovod").mkdir()
    (tmp_path / "horovod" / "__init__.py").write_text("")  # and no tensorflow/mpi_lib*.so
    fake = types.SimpleNamespace(__file__=str(tmp_path / "horovod" / "__init__.py"))
    monkeypatch.setitem(sys.modules, "horovod", fake)
    (problem,) = hvd_overlap.stack_problems()
    assert problem.startswith("Horovod was built without TensorFlow (mpi_lib")
    assert "pip uninstall -y horovod, then HOROVOD_WITH_TENSORFLOW=1 pip install" in problem


def test_the_installed_tensorflow_distribution_is_named():
    names = [n for n, _ in hvd_overlap.tensorflow_distributions()]
    assert len(names) == 1 and names[0].startswith("tensorflow"), names
