"""``tf.keras`` must be Keras 2: the plugin refuses Keras 3 at once, naming the fix.

On TF >= 2.16, ``tf.keras`` is Keras 3 unless tf-keras is installed and ``TF_USE_LEGACY_KERAS=1``
is set before TensorFlow is imported. The rule and the refusals are tested here on any stack by
faking the versions; the real Keras 3 (a 2-rank launch without the variable, and a ``keras`` 3
optimizer under legacy mode) only where it exists (the TF 2.18 stack, which ``scripts/test``
also runs), skipped elsewhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import tensorflow as tf

import hvd_overlap.keras
from hvd_overlap.adapters import keras_api

JOB = Path(__file__).parent / "jobs" / "keras3_import.py"
FIX = ("tf-keras==2.17.*", "export TF_USE_LEGACY_KERAS=1 before TensorFlow is imported")


def _installed_keras_3() -> str | None:
    """The version of an importable ``keras`` 3 package, or None."""
    try:
        out = subprocess.run([sys.executable, "-c", "import keras; print(keras.__version__)"],
                             capture_output=True, text=True, timeout=120,
                             env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    except subprocess.TimeoutExpired:
        return None
    version = out.stdout.strip().splitlines()[-1:] if out.returncode == 0 else []
    return version[0] if version and version[0].startswith("3.") else None


TF_MINOR = tuple(int(p) for p in tf.__version__.split(".")[:2])
needs_keras_3 = pytest.mark.skipif(
    TF_MINOR < (2, 16), reason=f"TensorFlow {tf.__version__}: tf.keras is Keras 2 and there is "
    "no Keras 3 to refuse; scripts/test runs it on the TF 2.18 stack")


@pytest.fixture
def keras_3(monkeypatch):
    """Make this process look like TF 2.17 whose ``tf.keras`` is ``keras`` 3.6.0."""
    monkeypatch.setattr(keras_api, "keras_behind_tf_keras", lambda: ("keras", "3.6.0"))
    monkeypatch.setattr(tf, "__version__", "2.17.1")


@pytest.mark.parametrize("tf_version, package, version", [
    ("2.15.1", "keras", "2.15.0"), ("2.17.1", "tf_keras", "2.17.0"),
    ("2.16.2", "tf_keras", "2.16.0")])
def test_keras_2_behind_tf_keras_is_accepted(tf_version, package, version):
    assert keras_api.keras_3_message(tf_version, package, version) is None


def test_keras_3_behind_tf_keras_is_refused_with_the_fix():
    message = keras_api.keras_3_message("2.17.1", "keras", "3.6.0")
    assert message is not None
    assert "keras 3.6.0 (Keras 3)" in message
    for fix in FIX:
        assert fix in message, message


def test_the_installed_tf_keras_is_read_from_the_package_tf_keras_resolves_to():
    package, version = keras_api.keras_behind_tf_keras()
    assert package in ("keras", "tf_keras")
    assert version == sys.modules[package].__version__
    keras_api.require_keras_2()  # this process runs the plugin: Keras 2


def test_constructing_the_optimizer_under_keras_3_fails_before_anything_else(keras_3):
    with pytest.raises(keras_api.KerasVersionError) as err:
        hvd_overlap.keras.DistributedOptimizer(tf.keras.optimizers.SGD(0.1))
    for fix in FIX:
        assert fix in str(err.value)


def test_importing_the_plugin_under_keras_3_fails_at_once():
    """A fresh process (Horovod imported first) whose package behind ``tf.keras`` then says
    3.6.0 and TensorFlow 2.17.1: ``import hvd_overlap.keras`` raises, naming the fix."""
    fake = ("import os, sys; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\n"
            "import horovod.tensorflow, tensorflow as tf\n"  # Horovod reads the real version
            "package = tf.keras.__name__.split('.')[0]\n"
            "sys.modules[package].__version__ = '3.6.0'; tf.__version__ = '2.17.1'\n"
            "import hvd_overlap.keras\n")
    out = subprocess.run([sys.executable, "-c", fake], capture_output=True, text=True,
                         timeout=180)
    assert out.returncode != 0, out.stdout + out.stderr
    assert "KerasVersionError" in out.stderr, out.stderr[-3000:]
    for fix in FIX:
        assert fix in out.stderr, out.stderr[-3000:]


def test_an_optimizer_of_a_keras_3_package_is_refused_naming_tf_keras(monkeypatch):
    package = types.ModuleType("keras3_stand_in")
    package.__version__ = "3.6.0"
    monkeypatch.setitem(sys.modules, "keras3_stand_in", package)
    adam = type("Adam", (), {"__module__": "keras3_stand_in.src.optimizers.adam"})
    with pytest.raises(TypeError, match=r"Keras 3 optimizer .*tf\.keras\.optimizers\.Adam .*"
                       r"TF_USE_LEGACY_KERAS=1"):
        hvd_overlap.keras.DistributedOptimizer(adam())


def test_other_objects_keep_the_plain_refusal():
    with pytest.raises(TypeError, match=r"expected a Keras optimizer .*got str"):
        hvd_overlap.keras.DistributedOptimizer("adam")


@needs_keras_3
def test_the_real_keras_3_optimizer_is_refused_under_legacy_keras():
    version = _installed_keras_3()
    if version is None:
        pytest.fail(f"TensorFlow {tf.__version__} should come with the keras 3 package")
    import keras  # the Keras 3 package; tf.keras is tf_keras here (TF_USE_LEGACY_KERAS=1)

    assert keras_api.keras_behind_tf_keras()[0] == "tf_keras"
    with pytest.raises(TypeError, match=r"Keras 3 optimizer .*tf\.keras\.optimizers\.Adam"):
        hvd_overlap.keras.DistributedOptimizer(keras.optimizers.Adam(0.1))


@needs_keras_3
def test_two_ranks_without_legacy_keras_refuse_on_every_rank():
    """``horovodrun -np 2`` of a script importing the plugin, TF_USE_LEGACY_KERAS unset: every
    rank prints the refusal and the job fails (never hangs: outer timeout, stall shutdown)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="2",
               HOROVOD_STALL_CHECK_TIME_SECONDS="20", HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="40")
    horovodrun = Path(sys.executable).with_name("horovodrun")
    out = subprocess.run(
        ["timeout", "--kill-after=10", "180", str(horovodrun), "-np", "2", "-H", "localhost:2",
         "--gloo", sys.executable, str(JOB)], capture_output=True, text=True, env=env)
    output = out.stdout + out.stderr
    assert out.returncode not in (0, 124, 137), output[-3000:]
    minor = ".".join(tf.__version__.split(".")[:2])
    fixes = (f"pip install 'tf-keras=={minor}.*'", FIX[1])
    for rank in (0, 1):
        lines = [line for line in output.splitlines() if f"rank {rank} refused" in line]
        assert lines, f"rank {rank} did not refuse:\n{output[-3000:]}"
        assert "KerasVersionError" in lines[0] and all(f in lines[0] for f in fixes), lines[0]
    assert "under Keras 3" not in output
