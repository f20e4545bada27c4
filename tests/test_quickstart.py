"""The quick start as a user runs it: ``horovodrun -np 2`` (launched from this single process),
short enough to read (at most 40 lines): ``examples/quickstart.py`` where ``tf.keras`` is
Keras 2, ``examples/keras3_quickstart.py`` where it is Keras 3."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from hvd_overlap.adapters import keras_api

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / (
    "keras3_quickstart.py" if keras_api.GENERATION == 3 else "quickstart.py")


def test_the_quickstart_is_short():
    assert len(EXAMPLE.read_text().splitlines()) <= 40


def test_the_quickstart_trains_on_two_ranks_and_prints_the_plan():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_NUM_INTRAOP_THREADS": "1",
           "TF_NUM_INTEROP_THREADS": "2", "HOROVOD_STALL_CHECK_TIME_SECONDS": "30",
           "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "55"}
    horovodrun = Path(sys.executable).with_name("horovodrun")
    out = subprocess.run(
        ["timeout", "--kill-after=10", "240", str(horovodrun), "-np", "2", "-H", "localhost:2",
         "--gloo", sys.executable, str(EXAMPLE)], capture_output=True, text=True, env=env)
    output = out.stdout + out.stderr
    assert out.returncode == 0, output[-4000:]
    rank0 = "\n".join(line.split(":", 1)[1] for line in output.splitlines()
                      if line.startswith("[0]<stdout>:"))
    assert "plan: strategy=" in rank0, output[-4000:]
    assert "note: auto: " in rank0  # the plan says what auto chose and why
    accuracy = [float(a) for a in re.findall(r" accuracy: ([0-9.]+)", rank0)]
    assert len(accuracy) == 3 and accuracy[-1] > 0.85, rank0
    assert "plan: strategy=" not in output.replace("[0]<stdout>:plan: strategy=", "")
