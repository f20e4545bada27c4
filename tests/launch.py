"""One ``horovodrun`` launch of a job script (``tests/jobs/``) from a single-process test:
under the shared lock (one multi-rank launch at a time on this machine), an outer timeout,
Horovod's stall shutdown, one intra-op thread per rank, the repository on ``PYTHONPATH``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).parents[1]
LOCK = "/tmp/hvdo-multirank.lock"


def horovodrun(ranks: int, job: Path, *args: str, limit_s: int = 180,
               env: dict[str, str] | None = None, unset: Sequence[str] = ()) -> None:
    """Run ``job`` with ``args`` on ``ranks`` local ranks (Gloo) and assert it succeeded;
    ``env`` adds variables, ``unset`` removes them (e.g. ``TF_USE_LEGACY_KERAS``)."""
    run_env = {k: v for k, v in os.environ.items() if k not in unset}
    run_env.update({
        "TF_CPP_MIN_LOG_LEVEL": "2", "TF_NUM_INTRAOP_THREADS": "1",
        "TF_NUM_INTEROP_THREADS": "1" if ranks > 2 else "2",
        "HOROVOD_STALL_CHECK_TIME_SECONDS": "30", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "55",
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [run_env.get("PYTHONPATH")])]),
        **(env or {})})
    launcher = Path(sys.executable).with_name("horovodrun")
    done = subprocess.run(
        ["flock", LOCK, "timeout", "--kill-after=10", str(limit_s), str(launcher), "-np",
         str(ranks), "-H", f"localhost:{ranks}", "--gloo", sys.executable, str(job), *args],
        capture_output=True, text=True, env=run_env, cwd=ROOT, timeout=900)  # lock wait too
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
