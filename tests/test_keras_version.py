"""The plugin runs on the Keras generation ``tf.keras`` is, through that generation's adapter
(``hvd_overlap.adapters.keras2`` or ``keras3``), and refuses objects of the other generation,
naming the fix.

The rules are tested on any stack with faked versions; the real mix (tf-keras and Keras 3 both
installed, on the TF 2.18 stack that ``scripts/test`` also runs) only where it exists, skipped
elsewhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf

import hvd_overlap.keras
from hvd_overlap.adapters import generation, keras2, keras_api

JOB = Path(__file__).parent / "jobs" / "keras3_import.py"
TF_MINOR = tuple(int(p) for p in tf.__version__.split(".")[:2])
needs_two_kerases = pytest.mark.skipif(
    TF_MINOR < (2, 16), reason=f"TensorFlow {tf.__version__}: only Keras 2 exists here; "
    "scripts/test runs it on the TF 2.18 stack (tf-keras and Keras 3 installed)")


@pytest.mark.parametrize("version, expected", [("2.15.0", 2), ("2.18.0", 2), ("3.6.0", 3),
                                               ("3.15.1", 3)])
def test_the_generation_of_a_keras_version(version, expected):
    assert generation.generation_of(version) == expected


def test_the_adapter_in_use_is_the_generation_tf_keras_is():
    package, version = generation.keras_behind_tf_keras()
    assert version == sys.modules[package].__version__
    assert keras_api.GENERATION == generation.generation_of(version)
    minor = ".".join(version.split(".")[:2])
    assert minor in keras_api.KERAS_VERSIONS, (version, keras_api.KERAS_VERSIONS)


def _stand_in(monkeypatch, package: str, version: str, name: str = "Adam"):
    """An object whose class comes from ``package`` (faked at ``version``)."""
    monkeypatch.setattr(sys.modules[package] if package in sys.modules else
                        pytest.importorskip(package), "__version__", version)
    return type(name, (), {"__module__": f"{package}.src.optimizers.adam"})()


@pytest.mark.parametrize("version, running, said, fixes", [
    ("3.6.0", 2, "Keras 3 object (keras 3.6.0)",
     ("tf.keras.optimizers.Adam", "unset TF_USE_LEGACY_KERAS")),
    ("2.15.0", 3, "Keras 2 object (keras 2.15.0)",
     ("keras.optimizers.Adam", "TF_USE_LEGACY_KERAS=1")),
], ids=["keras_3_object_under_keras_2", "keras_2_object_under_keras_3"])
def test_an_object_of_the_other_generation_is_refused_naming_both_fixes(
        monkeypatch, version, running, said, fixes):
    adam = _stand_in(monkeypatch, "keras", version)
    message = generation.other_generation_message(adam, running=running)
    assert message is not None
    assert said in message
    assert all(fix in message for fix in fixes), message


def test_objects_of_the_running_generation_or_of_no_keras_pass(monkeypatch):
    assert generation.other_generation_message(
        _stand_in(monkeypatch, "keras", "3.6.0"), running=3) is None
    assert generation.other_generation_message("adam", running=2) is None
    assert generation.other_generation_message(
        type("Adam", (), {"__module__": "mylib.opt"})(), running=2) is None


def test_the_keras_2_adapter_refuses_a_keras_3_optimizer(monkeypatch):
    adam = _stand_in(monkeypatch, "keras", "3.6.0")
    assert "Keras 3 object" in keras2.optimizer_problem(adam)


def test_other_objects_keep_the_plain_refusal():
    with pytest.raises(TypeError, match=r"expected a Keras optimizer .*got str"):
        hvd_overlap.keras.DistributedOptimizer("adam")


@needs_two_kerases
def test_the_real_keras_3_optimizer_is_refused_under_legacy_keras():
    if keras_api.GENERATION != 2:
        pytest.skip("this process runs Keras 3: the two-rank test below covers the other way")
    import keras  # the Keras 3 package; tf.keras is tf_keras here (TF_USE_LEGACY_KERAS=1)

    with pytest.raises(TypeError, match=r"Keras 3 object .*tf\.keras\.optimizers\.Adam"):
        hvd_overlap.keras.DistributedOptimizer(keras.optimizers.Adam(0.1))


@needs_two_kerases
def test_two_ranks_without_legacy_keras_run_keras_3_and_refuse_a_tf_keras_optimizer():
    """``horovodrun -np 2`` of a script importing the plugin with TF_USE_LEGACY_KERAS unset:
    every rank picks the Keras 3 adapter, then refuses a tf-keras optimizer naming the fix, and
    the job fails (never hangs: outer timeout)."""
    pytest.importorskip("tf_keras")
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="2")
    horovodrun = Path(sys.executable).with_name("horovodrun")
    out = subprocess.run(
        ["timeout", "--kill-after=10", "180", str(horovodrun), "-np", "2", "-H", "localhost:2",
         "--gloo", sys.executable, str(JOB)], capture_output=True, text=True, env=env)
    output = out.stdout + out.stderr
    assert out.returncode not in (0, 124, 137), output[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} runs the Keras 3 adapter" in output, output[-3000:]
        lines = [line for line in output.splitlines() if f"rank {rank} refused" in line]
        assert lines, f"rank {rank} did not refuse:\n{output[-3000:]}"
        assert "Keras 2 object" in lines[0] and "keras.optimizers.Adam" in lines[0], lines[0]
    assert "wrapped a Keras 2 optimizer" not in output
