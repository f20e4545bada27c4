"""What ends a 2-rank job whose rank 1 stays alive but stops joining the plugin's collectives
(issue 59): not Horovod's stall shutdown, which never fires under Gloo, but the per-test timeout
of the multi-rank runner (``tests/multirank/run_rank``) and the launch's outer ``timeout``.

Horovod 0.28.1 under Gloo never reports a stall and never shuts down: its Gloo controller
fills ``global_ranks_`` after ``reserve(size)`` instead of ``resize(size)``
(``horovod/common/gloo/gloo_controller.cc``, unchanged on Horovod's master), so the vector's
size stays 0 and ``StallInspector::CheckForStalledTensors`` loops over no rank: no
"Missing ranks" message, no shutdown, whatever ``HOROVOD_STALL_CHECK_TIME_SECONDS`` and
``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` say (MPI's controller sizes the vector and is not
affected; this Horovod has no MPI). Seen here: nothing with 8 s / 14 s and 140 s of stall in
``fit`` with the plugin, nor with 4 s / 8 s, 2 s / 8 s and 2 s / 5 s (response cache off) in
a bare eager allreduce (stalls of 12-60 s), where Horovod's trace log shows the check period
running (the stalled cached tensor is invalidated on time) and no report.

- ``test_horovod_stall_check_never_fires_under_gloo`` pins that: with 2 s / 4 s, which a
  working stall check would act on within about 12 s (the cached tensor is invalidated after
  one check period, then reported and shut down after the next ones), the job is still running
  20 s after the stall, with no stall message. If it fails, this Horovod's stall check works:
  docs/testing.md and this module must then say so.
- ``test_a_stalled_rank_ends_the_multirank_run``: what does end such a job in scripts/test:
  ``run_rank``'s pytest-timeout on a rank, then horovodrun stopping the others. Run here with
  ``--timeout=30`` instead of run_rank's 420 s, on the mismatch (each rank blocked in a
  TensorFlow op): every rank exits non-zero, and the timeout's stack dump shows rank 0 waiting
  in an op of ``fit``'s train function (or rank 1 in its callback's allreduce). It needs
  run_rank's ``--timeout-method=thread``: with ``--timeout-method=signal`` the same launch
  was still hung 80 s after the stall, until the outer ``timeout`` (a signal handler runs only
  when the blocked op returns). (With rank 1 sleeping in Python instead, either method ends
  it: rank 1's test fails, its exit shuts Horovod down and rank 0's op fails.)

The settings these tests launch with are their own: the harness's (``HOROVOD_STALL_*`` from
scripts/test) change nothing under Gloo, so neither test reads them.

Measured (2026-12-06, the 2-core machine at load average 10-13 from other jobs and a Horovod
build; ``-s`` prints the REPORT lines): (a) no stall message, still running 20 s after the
stall; (b) with ``--timeout=30`` the job ended 27.2 s after rank 1 stalled (mismatch; exit
statuses 1 and 1), 28.5 s with rank 1 sleeping (1 and 1; another run 1 and 143: rank 1
terminated by horovodrun first). The module takes 100-125 s.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "tests" / "jobs" / "stall.py"
RUN_RANK = ROOT / "tests" / "multirank" / "run_rank"
HOROVODRUN = Path(sys.executable).with_name("horovodrun")
TO_STALL_S = 240        # launch to rank 1's stall (start-up, tracing, 5 steps) at most
WATCH_S = 20            # (a) how long after the stall the job must still be running
RANK_TIMEOUT_S = 30     # (b) the runner's per-test timeout in this test (run_rank: 420)
TEARDOWN_S = 30         # (b) the timeout's stack dumps, horovodrun stopping the other rank
# what Horovod's stall inspector writes (horovod/common/stall_inspector.cc)
STALL_MESSAGES = ("Missing ranks", "One or more tensors were submitted",
                  "Will shutdown", "stopped by Horovod")


@dataclasses.dataclass
class Run:
    """A watched launch: rank 1's stall time, the launch's end (None: stopped by the test
    while still running), its exit status and output."""

    stall: float | None
    ended: float | None
    status: int | None
    output: str


def job_env(**extra: str) -> dict[str, str]:
    """This process's environment with two ranks' thread settings and ``extra``."""
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_NUM_INTRAOP_THREADS": "1",
            "TF_NUM_INTEROP_THREADS": "2", **extra}


def watch(command: list[str], env: dict[str, str], stamp: Path, after_stall_s: float,
          log: Path) -> Run:
    """Launch ``command`` under ``timeout`` (its own session) and watch it until it ends, or
    until ``after_stall_s`` after the stall (or ``TO_STALL_S`` without one), then stop it."""
    limit = TO_STALL_S + after_stall_s + 30
    with log.open("w") as out:
        proc = subprocess.Popen(["timeout", "--kill-after=10", str(limit), *command],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                start_new_session=True)
        start, stall, ended = time.time(), None, None
        try:
            while True:
                if proc.poll() is not None:
                    ended = time.time()
                    break
                if stall is None and stamp.exists() and stamp.read_text():
                    stall = float(stamp.read_text())
                now = time.time()
                if now > (stall + after_stall_s if stall else start + TO_STALL_S):
                    break
                time.sleep(0.2)
        finally:
            if proc.poll() is None:  # horovodrun stops its ranks on SIGTERM
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
    if stall is None and stamp.exists() and stamp.read_text():
        stall = float(stamp.read_text())
    return Run(stall, ended, proc.returncode if ended else None, log.read_text())


def test_horovod_stall_check_never_fires_under_gloo(tmp_path: Path) -> None:
    """Each rank waits for a tensor the other never submits, with a 2 s stall check and a 4 s
    shutdown: 20 s later the job still runs and Horovod has said nothing."""
    stamp = tmp_path / "stalled"
    env = job_env(HOROVOD_STALL_CHECK_TIME_SECONDS="2", HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="4")
    run = watch([str(HOROVODRUN), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
                 str(JOB), "mismatch", str(stamp)], env, stamp, WATCH_S, tmp_path / "log")
    assert run.stall is not None, f"rank 1 never reached the stall:\n{run.output[-3000:]}"
    fired = [m for m in STALL_MESSAGES if m in run.output]
    assert run.ended is None and not fired, (
        f"Horovod's stall check acted under Gloo ({fired}; ended "
        f"{None if run.ended is None else round(run.ended - run.stall, 1)} s after the stall): "
        "this Horovod build has a working stall shutdown, so docs/testing.md's 'When a rank "
        f"dies or stalls' and this test must be updated.\n{run.output[-3000:]}")
    print(f"\nREPORT stall, Gloo: no stall message and still running {WATCH_S} s after the "
          "stall (check 2 s, shutdown 4 s)")


def test_a_stalled_rank_ends_the_multirank_run(tmp_path: Path) -> None:
    """Rank 0 waits in the plugin's collective, rank 1 in one of its own: run_rank's
    pytest-timeout ends every rank non-zero, and the job, within the bound."""
    stamp = tmp_path / "stalled"
    env = job_env(HVDO_VENV=str(Path(sys.executable).parent.parent),
                  HVDO_MULTIRANK_TESTS=str(JOB.relative_to(ROOT)), HVDO_REPORT="stall",
                  HVDO_STALL_MODE="mismatch", HVDO_STALL_STAMP=str(stamp))
    run = watch([str(HOROVODRUN), "-np", "2", "-H", "localhost:2", "--gloo", str(RUN_RANK),
                 str(tmp_path), f"--timeout={RANK_TIMEOUT_S}"],
                env, stamp, RANK_TIMEOUT_S + TEARDOWN_S, tmp_path / "log")
    tail = run.output[-4000:]
    assert run.stall is not None, f"rank 1 never reached the stall:\n{tail}"
    assert run.ended is not None, \
        f"still running {RANK_TIMEOUT_S + TEARDOWN_S} s after the stall:\n{tail}"
    assert run.status not in (0, 124), tail                     # failed, not by the outer timeout
    assert "finished training" not in run.output
    # every rank ended non-zero: horovodrun prints its status, or the rank's pytest-timeout
    # dump ran to its closing banner (pytest-timeout then calls os._exit(1)), or its shell says
    # it was killed by horovodrun's SIGTERM (horovodrun, racing its own termination, does not
    # always print the terminated rank's line)
    statuses: list[str] = []
    lines = run.output.splitlines()
    for rank in (0, 1):
        code = re.search(rf"^Process {rank} exit with status code (-?\d+)\.", run.output, re.M)
        banners = sum(line.startswith(f"[{rank}]<stdout>:") and "+ Timeout +" in line
                      for line in lines)
        if code:
            assert int(code.group(1)) != 0, f"rank {rank} exited 0:\n{tail}"
            statuses.append(code.group(1))
        elif banners >= 2:
            statuses.append("1 (timeout)")
        else:
            assert f"[{rank}]<stderr>:Terminated" in lines, f"rank {rank}: how it ended:\n{tail}"
            statuses.append("SIGTERM")
    assert "Timeout" in run.output, tail                        # pytest-timeout's banner
    # pytest-timeout's stack dump of the rank it ended first: waiting in a Horovod op inside
    # fit, rank 0 in the train function (the plugin's collective), rank 1 in its callback's
    # allreduce. (The other rank, its peer gone, may fail on its own or be terminated: 143.)
    waits = {0: ("self.train_function(iterator)", "in quick_execute"),
             1: ("in on_train_batch_begin", "in horovod_allreduce")}
    dumps = {rank: "\n".join(line for line in run.output.splitlines()
                             if line.startswith(f"[{rank}]<stdout>:")) for rank in waits}
    waiting = [rank for rank, frames in waits.items()
               if "Timeout +" in dumps[rank] and all(f in dumps[rank] for f in frames)]
    assert waiting, f"no timeout dump of a rank waiting in its collective:\n{tail}"
    took = run.ended - run.stall
    print(f"\nREPORT stall, run_rank --timeout={RANK_TIMEOUT_S}: the job ended {took:.1f} s "
          f"after rank 1 stalled; exit statuses {', '.join(statuses)}")
    assert took < RANK_TIMEOUT_S + TEARDOWN_S
