"""A sharded checkpoint (with the dense factor exchange) saved on 2 ranks resumes on 1 and on
3 ranks where stock Horovod's own checkpoint resumes: its optimizer state is whole arrays, cut
again for the new number of ranks. Each run is its own ``horovodrun`` launch of
``tests/jobs/resume_on_other_ranks.py`` (an outer timeout and the stall shutdown guard it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

JOB = Path(__file__).parent / "jobs" / "resume_on_other_ranks.py"
ROOT = Path(__file__).parents[1]


def _launch(ranks: int, *args: str) -> None:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_NUM_INTRAOP_THREADS": "1",
           "TF_NUM_INTEROP_THREADS": "1", "PYTHONPATH": os.pathsep.join(
               [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "HOROVOD_STALL_CHECK_TIME_SECONDS": "30", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "55"}
    horovodrun = Path(sys.executable).with_name("horovodrun")
    done = subprocess.run(
        ["timeout", "--kill-after=10", "240", str(horovodrun), "-np", str(ranks), "-H",
         f"localhost:{ranks}", "--gloo", sys.executable, str(JOB), *args],
        capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """Stock's and the plugin's checkpoints after one epoch on 2 ranks."""
    base = tmp_path_factory.mktemp("resume")
    for kind in ("stock", "sharded"):
        _launch(2, "train", kind, str(base / kind), "-")
    return base


@pytest.mark.parametrize("ranks", [1, 3])
def test_sharded_checkpoint_resumes_on_another_number_of_ranks(saved, ranks):
    for kind in ("stock", "sharded"):
        _launch(ranks, "resume", kind, str(saved / kind), str(saved / f"{kind}{ranks}.npz"))
    want = np.load(saved / f"stock{ranks}.npz")
    got = np.load(saved / f"sharded{ranks}.npz")
    assert int(got["iterations"]) == int(want["iterations"]) == 12
    weights = [k for k in want.files if k != "iterations"]
    for k in weights:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
