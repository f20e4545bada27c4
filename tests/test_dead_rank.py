"""A rank that dies mid-epoch ends the job, with the dead rank named, well within 60 s, for
every strategy (issue 13): nothing waits forever on a collective the dead rank never joins.

Each case launches ``tests/jobs/dead_rank.py`` under ``horovodrun -np 2 --gloo`` (an outer
timeout guards the launch itself) and measures the time from rank 1's death to the end of the
launch. ``scripts/dead-rank-times`` prints the measured times.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvd_overlap.core.strategies import STRATEGIES

JOB = Path(__file__).parent / "jobs" / "dead_rank.py"
LIMIT_S = 60


def kill_a_rank(strategy: str, stamp: Path) -> tuple[float, int, str]:
    """(seconds from rank 1's death to the job's end, exit status, output)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_NUM_INTRAOP_THREADS": "1",
           "TF_NUM_INTEROP_THREADS": "2"}
    horovodrun = Path(sys.executable).with_name("horovodrun")
    proc = subprocess.run(
        ["timeout", "--kill-after=10", "240", str(horovodrun), "-np", "2", "-H", "localhost:2",
         "--gloo", sys.executable, str(JOB), strategy, str(stamp)],
        capture_output=True, text=True, env=env)
    end = time.time()
    died = float(stamp.read_text())
    return end - died, proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("strategy", [*sorted(STRATEGIES), "auto", "sharded+exchange"])
def test_a_dead_rank_ends_the_job_quickly_and_is_named(strategy, tmp_path):
    seconds, status, output = kill_a_rank(strategy, tmp_path / "died")
    assert status not in (0, 124), output[-2000:]            # failed, and not by the timeout
    assert "finished training" not in output
    assert "Process 1 exit with status code" in output or "rank 1" in output.lower(), \
        output[-2000:]
    print(f"\n{strategy}: the job ended {seconds:.1f} s after rank 1 died")  # dead-rank-times
    assert seconds < LIMIT_S, f"{strategy}: {seconds:.1f} s after rank 1 died"
