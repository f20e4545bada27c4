"""Start the benchmark: ``horovodrun -np N -H localhost:N --gloo`` running the worker, inside an
emulated network if asked; or the worker itself if this process is already a Horovod rank.

The launch runs in its own process group under an outer timeout; on timeout, error or Ctrl-C
the group gets SIGTERM (horovodrun stops its ranks), then SIGKILL. Horovod's stall shutdown is
set too, so a rank left waiting exits by itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from hvd_overlap.bench.config import BenchConfig
from hvd_overlap.bench.worker import PROGRESS
from hvd_overlap.netns import exec_prefix, parse_net, raise_on_signals, shaped_namespace

ENV_DEFAULTS = {
    "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "2", "TF_CPP_MIN_LOG_LEVEL": "2",
    "HOROVOD_STALL_CHECK_TIME_SECONDS": "30", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "60",
    "PYTHONUNBUFFERED": "1",
    "HOROVOD_TIMELINE": "DYNAMIC",  # the worker records one timeline per strategy (wire time)
}


class BenchError(RuntimeError):
    """The launch failed; the message ends with the tail of its log."""


def under_horovodrun() -> bool:
    return "HOROVOD_RANK" in os.environ


def horovodrun_command(cfg: BenchConfig, config_path: str, out_path: str) -> list[str]:
    """The ``horovodrun`` command line that runs the worker on ``cfg.np`` local ranks."""
    horovodrun = Path(sys.executable).with_name("horovodrun")
    return [str(horovodrun) if horovodrun.exists() else "horovodrun",
            "-np", str(cfg.np), "-H", f"localhost:{cfg.np}", "--gloo",
            sys.executable, "-m", "hvd_overlap.bench.worker", config_path, out_path]


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the launch's process group, SIGKILL if it is still there after 15 s."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
            proc.wait(wait)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass


def run_logged(cmd: list[str], log_path: Path, timeout: float,
               on_progress: Callable[[str], None]) -> int:
    """Run ``cmd`` in its own session, all output to ``log_path``; rank 0's progress lines go
    to ``on_progress``. Returns the exit code (-9/-15 if killed at ``timeout`` seconds)."""
    env = {**{k: v for k, v in ENV_DEFAULTS.items() if k not in os.environ}, **os.environ}
    with open(log_path, "w", buffering=1) as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env, start_new_session=True)
        watchdog = threading.Timer(timeout, _stop, [proc])
        watchdog.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                text = line.split(">:", 1)[-1] if line.startswith("[0]<") else line
                if text.startswith(PROGRESS):
                    on_progress(text[len(PROGRESS):].rstrip())
            return proc.wait()
        finally:
            watchdog.cancel()
            _stop(proc)


def run_bench(cfg: BenchConfig, on_progress: Callable[[str], None]) -> dict[str, Any] | None:
    """Raw results (see ``worker.run``) on the launching process / rank 0; None elsewhere."""
    cfg.validate()
    rate = parse_net(cfg.net)
    if under_horovodrun():
        if rate is not None:
            raise ValueError("already under horovodrun: the network is the one it runs in; "
                             "use --net plain, or run hvd-overlap bench without horovodrun")
        from hvd_overlap.bench import worker

        return worker.run(cfg)
    with ExitStack() as stack:
        stack.enter_context(raise_on_signals())
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hvdo-bench-")))
        (tmp / "config.json").write_text(cfg.to_json())
        out, log = tmp / "out.json", tmp / "launch.log"
        cmd = horovodrun_command(cfg, str(tmp / "config.json"), str(out))
        if rate is not None:
            cmd = exec_prefix(stack.enter_context(shaped_namespace(rate))) + cmd
        code = run_logged(cmd, log, cfg.timeout, on_progress)
        if code != 0 or not out.exists():
            lines = log.read_text().splitlines()
            tail = "\n".join(([ln for ln in lines if ln.startswith("[")] or lines)[-30:])
            why = f"timed out after {cfg.timeout:.0f} s" if code < 0 else f"exit code {code}"
            raise BenchError(f"horovodrun failed ({why}); last lines of its output:\n{tail}")
        return json.loads(out.read_text())
