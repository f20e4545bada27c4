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
from benchmarks.config import AUTO, LOCAL, BenchConfig, base_name, is_clean_group
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
}
#: Only the launches that record timelines set it: set at all, it starts a writer thread on rank 0
#: that keeps its core busy, so timed launches never do (whatever this process's environment).
TIMELINE_ENV = {"HOROVOD_TIMELINE": "DYNAMIC"}


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
    """This process's environment less ``HOROVOD_TIMELINE``, ``ENV_DEFAULTS`` where it sets
    nothing, then ``overrides`` (and the repository root on ``PYTHONPATH``: the ranks import
    ``benchmarks``)."""
    env = {**{k: v for k, v in ENV_DEFAULTS.items() if k not in os.environ}, **os.environ}
    env.pop("HOROVOD_TIMELINE", None)
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
    """Run one launch of the worker (a timeline launch with ``HOROVOD_TIMELINE`` set); its
    rank-0 results."""
    kind = job.strategies[0] if cfg.one_per_launch else (
        "clean" if is_clean_group(job.strategies) else "plugin")
    tag = f"r{job.round}-{kind}" + ("-timeline" if job.record else "")
    job_path, out, log = tmp / f"{tag}.json", tmp / f"{tag}.out.json", tmp / "launch.log"
    job_path.write_text(job.to_json())
    env = TIMELINE_ENV if job.record else None
    if isinstance(network, Hosts):
        with open(log, "a", buffering=1) as f:
            code = run_on_hosts(worker_command(str(job_path), str(out)), network,
                                timeout=cfg.timeout, on_line=_progress_filter(f, on_progress),
                                pin=cfg.pin, env=_environment(env))
    else:
        cmd = horovodrun_command(cfg.np, worker_command(str(job_path), str(out)))
        code = run_logged(cmd if network is None else exec_prefix(network) + cmd, log,
                          cfg.timeout, on_progress, env)
    if code != 0 or not out.exists():
        lines = log.read_text().splitlines()
        tail = "\n".join(([ln for ln in lines if ln.startswith("[")] or lines)[-30:])
        why = f"timed out after {cfg.timeout:.0f} s" if code < 0 else f"exit code {code}"
        raise BenchError(f"launch {tag} failed ({why}); last lines of its output:\n{tail}")
    return json.loads(out.read_text())


def merge(cfg: BenchConfig, launches: list[dict[str, Any]],
          recorded: list[dict[str, Any]]) -> dict[str, Any]:
    """One raw result from the timed launches (step times per strategy in round order, what
    every launch recorded about its process) and the timeline launches (wire times)."""
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
    paths = {s: path for raw in recorded for s, path in raw["timelines"].items()}
    wire = {s: wire_time_per_step(path, cfg.steps) for s, path in paths.items()}
    sent = {s: wire_bytes_per_step(path, cfg.steps, first["ranks"]) for s, path in paths.items()}
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
            "stock_stand_in": any(raw.get("stock_stand_in") for raw in launches),
            "pinned": all(raw["pinned"] for raw in launches),
            "load_avg_1min": max(raw["load_avg_1min"] for raw in launches),
            "versions": first["versions"], "threads": first["threads"]}


def run_bench(cfg: BenchConfig, on_progress: Callable[[str], None],
              timeline_dir: str | None = None) -> dict[str, Any] | None:
    """Raw results (see ``merge``) on the launching process / rank 0; None elsewhere. The
    timelines are kept in ``timeline_dir`` if given (a temporary folder otherwise)."""
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
        launches = [_launch(cfg, Job(cfg, group, r), tmp, network, on_progress)
                    for r, group in plan]
        timelines = Path(timeline_dir) if timeline_dir else tmp / "timelines"
        timelines.mkdir(parents=True, exist_ok=True)
        recorded = [_launch(cfg, job, tmp, network, on_progress)
                    for job in timeline_jobs(cfg, plan, launches, str(timelines))]
        return merge(cfg, launches, recorded)


def timeline_jobs(cfg: BenchConfig, plan: list[tuple[int, tuple[str, ...]]],
                  launches: list[dict[str, Any]], directory: str) -> list[Job]:
    """The timeline launches after the timed ones: the last round's groups, each strategy but
    replicas and ``local``, ``auto`` as the plan it chose last (its keywords)."""
    last = max(r for r, _ in plan)
    chosen = [raw["auto"]["keywords"] for raw in launches
              if raw.get("auto", {}).get("keywords")]
    picks = {AUTO: chosen[-1]} if chosen else {}
    jobs = []
    for r, group in plan:
        kept = tuple(s for s in group if base_name(s) == s and s != LOCAL
                     and (s != AUTO or AUTO in picks))
        if r == last and kept:
            jobs.append(Job(cfg, kept, r, directory,
                            picks={s: picks[s] for s in kept if s in picks}))
    return jobs


def _in_this_process(cfg: BenchConfig) -> dict[str, Any] | None:
    """Under horovodrun: every strategy in this process, one job per round."""
    from benchmarks import worker

    # the same directory on every rank (the rendezvous port is the job's): rank 0 writes there
    job_id = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT", str(os.getppid()))
    base = Path(tempfile.gettempdir()) / f"hvdo-bench-{job_id}"
    launches = [worker.run(Job(cfg, cfg.strategies, r)) for r in range(cfg.rounds)]
    plan = [(r, cfg.strategies) for r in range(cfg.rounds)]
    base.mkdir(exist_ok=True)
    # timelines only if this run was started with HOROVOD_TIMELINE (which slowed its rank 0);
    # rank 0 knows auto's choice: every rank records the same plans
    import horovod.tensorflow as hvd

    jobs = hvd.broadcast_object(
        timeline_jobs(cfg, plan, launches, str(base)) if launches[0] is not None else None,
        0, name="hvdo.bench.timeline_jobs")
    recorded = [worker.run(job) for job in jobs]
    if launches[0] is None:
        return None
    return merge(cfg, launches, [raw for raw in recorded if raw is not None])
