"""Start the benchmark: per round, one launch of the clean baseline (``stock``, ``local``: a
process that never imports the plugin's runtime) and one of the plugin's strategies, in an order
that alternates with the round; then merge the launches' step times and read their timelines.

Each launch is the worker on ``np`` ranks: ``horovodrun -np N -H localhost:N --gloo`` on this
machine (``--net plain``) or inside one shaped loopback (``--net-model loopback``), or one rank
per emulated host through Horovod's Gloo rendezvous (``--net-model hosts``, the default; see
``benchmarks.hostrun``). The network is made once for the whole benchmark.

A launch runs in its own process group under an outer timeout; on timeout, error or Ctrl-C
it gets SIGTERM, then SIGKILL. Horovod's stall shutdown is set too, so a rank left waiting exits
by itself. If this process is already a Horovod rank, the worker runs here, for all strategies in
this one process (its ``stock`` row is then not a clean baseline, and the report says so).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks import importable
from benchmarks.config import BenchConfig, is_clean_group
from benchmarks.hostrun import run_on_hosts, stop_all
from benchmarks.netns import (
    HOSTS,
    Hosts,
    emulated_hosts,
    exec_prefix,
    parse_net,
    raise_on_signals,
    shaped_namespace,
)
from benchmarks.worker import PROGRESS, Job

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


def horovodrun_command(np: int, argv: list[str]) -> list[str]:
    """The ``horovodrun`` command line that runs ``argv`` on ``np`` local ranks (Gloo)."""
    horovodrun = Path(sys.executable).with_name("horovodrun")
    return [str(horovodrun) if horovodrun.exists() else "horovodrun",
            "-np", str(np), "-H", f"localhost:{np}", "--gloo", *argv]


def worker_command(job_path: str, out_path: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.worker", job_path, out_path]


def launch_plan(cfg: BenchConfig) -> list[tuple[int, tuple[str, ...]]]:
    """``(round, strategies)`` per launch: the clean group and the plugin's group each round
    (with ``one_per_launch``: each strategy alone), in an order that rotates with the round."""
    if cfg.one_per_launch:
        groups = [(s,) for s in cfg.strategies]
    else:
        clean = tuple(s for s in cfg.strategies if is_clean_group([s]))
        groups = [g for g in (clean, tuple(s for s in cfg.strategies if s not in clean)) if g]
    return [(r, g) for r in range(cfg.rounds)
            for g in groups[r % len(groups):] + groups[:r % len(groups)]]


def _progress_filter(log, on_progress: Callable[[str], None]) -> Callable[[str], None]:
    """Write each tagged output line to ``log``; pass rank 0's progress lines on."""
    def write(line: str) -> None:
        log.write(line)
        text = line.split(">:", 1)[-1] if line.startswith("[0]<") else line
        if text.startswith(PROGRESS):
            on_progress(text[len(PROGRESS):].rstrip())
    return write


def _environment(overrides: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment, ``ENV_DEFAULTS`` where it sets nothing, then ``overrides``
    (and the repository root on ``PYTHONPATH``: the ranks import ``benchmarks``)."""
    env = {**{k: v for k, v in ENV_DEFAULTS.items() if k not in os.environ}, **os.environ}
    return importable({**env, **(overrides or {})})


def run_logged(cmd: list[str], log_path: Path, timeout: float,
               on_progress: Callable[[str], None], env: dict[str, str] | None = None) -> int:
    """Run ``cmd`` in its own session (environment: ``_environment(env)``), all output to
    ``log_path``; rank 0's progress lines go to ``on_progress``. Returns the exit code (-9/-15
    if killed at ``timeout`` seconds)."""
    with open(log_path, "a", buffering=1) as log:
        write = _progress_filter(log, on_progress)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=_environment(env), start_new_session=True)
        watchdog = threading.Timer(timeout, stop_all, [[proc]])
        watchdog.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                write(line)
            return proc.wait()
        finally:
            watchdog.cancel()
            stop_all([proc])


def _launch(cfg: BenchConfig, job: Job, tmp: Path, network: str | Hosts | None,
            on_progress: Callable[[str], None]) -> dict[str, Any]:
    """Run one launch of the worker; its rank-0 results."""
    kind = job.strategies[0] if cfg.one_per_launch else (
        "clean" if is_clean_group(job.strategies) else "plugin")
    tag = f"r{job.round}-{kind}"
    job_path, out, log = tmp / f"{tag}.json", tmp / f"{tag}.out.json", tmp / "launch.log"
    job_path.write_text(job.to_json())
    if isinstance(network, Hosts):
        with open(log, "a", buffering=1) as f:
            code = run_on_hosts(worker_command(str(job_path), str(out)), network,
                                timeout=cfg.timeout, on_line=_progress_filter(f, on_progress),
                                pin=cfg.pin, env=_environment())
    else:
        cmd = horovodrun_command(cfg.np, worker_command(str(job_path), str(out)))
        code = run_logged(cmd if network is None else exec_prefix(network) + cmd, log,
                          cfg.timeout, on_progress)
    if code != 0 or not out.exists():
        lines = log.read_text().splitlines()
        tail = "\n".join(([ln for ln in lines if ln.startswith("[")] or lines)[-30:])
        why = f"timed out after {cfg.timeout:.0f} s" if code < 0 else f"exit code {code}"
        raise BenchError(f"launch {tag} failed ({why}); last lines of its output:\n{tail}")
    return json.loads(out.read_text())


def merge(cfg: BenchConfig, launches: list[dict[str, Any]]) -> dict[str, Any]:
    """One raw result from the launches: step times per strategy in round order, wire times
    from the timelines, and what every launch recorded about its process."""
    from benchmarks.timelines import wire_bytes_per_step, wire_time_per_step

    first = launches[0]
    times: dict[str, list[float]] = {s: [] for s in cfg.strategies}
    samples: dict[str, list[list[float]]] = {s: [] for s in cfg.strategies}
    means: dict[str, list[list[float]]] = {s: [] for s in cfg.strategies}
    link: dict[str, list[list[float | None]]] = {s: [] for s in cfg.strategies}
    faults: dict[str, list[Any]] = {s: [] for s in cfg.strategies}  # per round, per rank
    history: dict[str, list[int]] = {s: [] for s in cfg.strategies}  # untimed steps, per round
    for raw in launches:
        for s, n in raw["history_steps"].items():
            history[s].append(n)
        for s, t in raw["step_times"].items():
            times[s].append(t)
            samples[s].append(raw["step_samples"][s])
            means[s].append(raw["step_means"][s])
            link[s].append(raw["link_bytes_per_step"][s])
            faults[s].append(raw.get("page_faults_per_step", {}).get(s))
    wire = {s: wire_time_per_step(path, cfg.steps)
            for raw in launches for s, path in raw["timelines"].items()}
    sent = {s: wire_bytes_per_step(path, cfg.steps, first["ranks"])
            for raw in launches for s, path in raw["timelines"].items()}
    memory = {s: m for raw in launches for s, m in raw["optimizer_state_bytes"].items()}
    return {"config": json.loads(cfg.to_json()), "ranks": first["ranks"],
            "global_batch": first["global_batch"], "params": first["params"],
            "grad_bytes": first["grad_bytes"], "step_times": times,
            "step_samples": samples, "step_means": means, "link_bytes_per_step": link,
            "page_faults_per_step": faults,
            "wire_time_per_step_s": {s: w and w["all"] for s, w in wire.items()},
            "wire_by_collective_s": wire, "optimizer_state_bytes": memory,
            "sent_bytes_per_step": sent, "history_steps": history,
            "launches": [{k: raw[k] for k in ("round", "strategies", "clean_process",
                                              "plugin_modules", "horovod_env", "load_avg_1min")}
                         for raw in launches],
            "auto_choices": [{"round": raw["round"], **raw["auto"]} for raw in launches
                             if raw.get("auto")],
            # --whole-fit: per strategy, one fit per round (seconds end to end)
            "whole_fit": {s: [raw["whole_fit"][s] for raw in launches
                              if s in raw.get("whole_fit", {})]
                          for s in cfg.strategies if cfg.whole_fit},
            # the other online checks settled before timing (the exchange's, sharded+auto's)
            "settled_checks": [{"round": raw["round"], "strategy": s, **check}
                               for raw in launches
                               for s, check in (raw.get("exchange_checks") or {}).items()],
            "clean_baseline": all(raw["clean_process"] for raw in launches
                                  if is_clean_group(raw["strategies"])),
            "pinned": all(raw["pinned"] for raw in launches),
            "load_avg_1min": max(raw["load_avg_1min"] for raw in launches),
            "versions": first["versions"], "threads": first["threads"]}


def run_bench(cfg: BenchConfig, on_progress: Callable[[str], None]) -> dict[str, Any] | None:
    """Raw results (see ``merge``) on the launching process / rank 0; None elsewhere."""
    cfg.validate()
    rate = parse_net(cfg.net)
    if under_horovodrun():
        if rate is not None:
            raise ValueError("already under horovodrun: the network is the one it runs in; "
                             "use --net plain, or run the bench without horovodrun")
        return _in_this_process(cfg)
    with ExitStack() as stack:
        stack.enter_context(raise_on_signals())
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hvdo-bench-")))
        network: str | Hosts | None = None
        if rate is not None and cfg.net_model == HOSTS:
            network = stack.enter_context(emulated_hosts(cfg.np, rate))
        elif rate is not None:
            network = stack.enter_context(shaped_namespace(rate))
        plan = launch_plan(cfg)
        launches = []
        for r, group in plan:
            timelines = tmp / f"timelines-{r}" if r == cfg.rounds - 1 else None
            if timelines:
                timelines.mkdir(exist_ok=True)
            job = Job(cfg, group, r, str(timelines or ""))
            launches.append(_launch(cfg, job, tmp, network, on_progress))
        return merge(cfg, launches)


def _in_this_process(cfg: BenchConfig) -> dict[str, Any] | None:
    """Under horovodrun: every strategy in this process, one job per round."""
    from benchmarks import worker

    # the same directory on every rank (the rendezvous port is the job's): rank 0 writes there
    job_id = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT", str(os.getppid()))
    base = Path(tempfile.gettempdir()) / f"hvdo-bench-{job_id}"
    launches = []
    for r in range(cfg.rounds):
        timelines = str(base) if r == cfg.rounds - 1 else ""
        if timelines:
            base.mkdir(exist_ok=True)
        raw = worker.run(Job(cfg, cfg.strategies, r, timelines))
        if raw is not None:
            launches.append(raw)
    return merge(cfg, launches) if launches else None
