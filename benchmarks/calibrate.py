"""Measured per-collective costs of Horovod on this host: the simulator's calibration.

``python -m benchmarks calibrate --net plain --net 1gbit --json FILE`` starts 2 ranks (Gloo,
each pinned to its own core, as the benchmark) once per network and per Horovod cycle time, and
times back-to-back eager allreduces of a few sizes on each (``--np 2 --np 3 --np 4``: the same at
each rank count, ranks beyond the cores sharing them as the benchmark's do; how the costs grow
with the ranks is then fitted, ``hvd_overlap.core.sim.laws``). From the times it fits

- ``overhead_s``: the fixed cost of one collective with a cycle so short that it does not count
  (``HOROVOD_CYCLE_TIME=0.1``): negotiation, the Gloo round trip, the op's dispatch;
- ``cycle_period_s``: the same tiny allreduce with Horovod's default cycle (1 ms), whose
  thread starts at most one round of collectives per cycle;
- ``bandwidth``: bytes/s, from a straight-line fit of time against size over both runs, in
  ring terms (a ring allreduce of n bytes moves 2 (P-1)/P n bytes per rank: n at 2 ranks);
- ``reduce_scatter_bandwidth`` / ``allgather_bandwidth``: the same fit for Horovod's
  reduce-scatter and all-gather (n bytes in all; each moves (P-1)/P n per rank on a ring, half an
  allreduce, but Gloo's implementations do not all reach the link's rate: on emulated hosts with
  duplex links its all-gather runs at about half the allreduce's rate);
  ``alltoall_gather_bandwidth``: the same all-gather done as an alltoall of the slice repeated
  P times (the sharded strategies' ``gather_with="alltoall"``);
- ``tensor_s``: the extra cost of each tensor of a grouped (fused) allreduce (64 tensors
  against 1, the mean of both cycle settings);
- ``cpu_steal``: the share of compute throughput lost while allreduces run alongside it (a
  matrix-multiply loop timed alone and with back-to-back 16 MiB allreduces in another thread);
  ``comm_slowdown`` is how much longer those allreduces took meanwhile (recorded, not modelled).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

SIZES = (4, 1 << 20, 4 << 20, 16 << 20, 32 << 20)  # bytes of float32 payload
PHASE_SIZES = (4 << 20, 16 << 20, 32 << 20)  # reduce-scatter / all-gather sizes (bytes in all)
GROUP = 64  # tensors in the grouped allreduce that measures the per-tensor cost
SHORT_CYCLE_MS = 0.1


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _time_op(fn, repeats: int) -> tuple[float, float]:
    """Median wall seconds of ``fn()`` and the CPU seconds per wall second over the repeats."""
    for _ in range(2):
        fn()
    walls, cpu0, w0 = [], _cpu_seconds(), time.perf_counter()
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls), (_cpu_seconds() - cpu0) / (time.perf_counter() - w0)


def measure(repeats: int = 9) -> dict[str, Any] | None:
    """Run on every rank (under horovodrun); the timings on rank 0, None elsewhere."""
    from benchmarks.worker import pin_rank

    pin_rank()
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    sizes: dict[int, dict[str, float]] = {}
    for n in SIZES:
        x = tf.ones([max(n // 4, 1)], tf.float32)
        wall, cpu = _time_op(lambda x=x, n=n: hvd.allreduce(x, op=hvd.Sum,
                                                            name=f"cal.{n}").numpy(),
                             repeats if n >= 1 << 20 else 5 * repeats)  # tiny: cheap, noisy
        sizes[n] = {"wall_s": max(hvd.allgather_object(wall)), "cpu_share": cpu}
    phases: dict[str, dict[str, float]] = {"reduce_scatter": {}, "allgather": {},
                                           "alltoall_gather": {}}
    for n in PHASE_SIZES:
        whole = tf.ones([n // 4], tf.float32)
        part = tf.ones([n // 4 // hvd.size()], tf.float32)  # all-gather: n bytes in all
        for kind, fn in (
                ("reduce_scatter", lambda n=n, whole=whole: hvd.reducescatter(
                    whole, op=hvd.Sum, name=f"cal.rs{n}").numpy()),
                ("allgather", lambda n=n, part=part: hvd.allgather(
                    part, name=f"cal.ag{n}").numpy()),
                ("alltoall_gather", lambda n=n, part=part: hvd.alltoall(
                    tf.tile(part, [hvd.size()]), name=f"cal.a2a{n}").numpy())):
            wall, _ = _time_op(fn, repeats)
            phases[kind][str(n)] = max(hvd.allgather_object(wall, name=f"cal.{kind}.{n}"))
    steal = _steal(hvd, tf)
    tiny = [tf.ones([1], tf.float32) for _ in range(GROUP)]
    grouped = {}
    for k in (1, GROUP):
        wall, _ = _time_op(lambda k=k: [t.numpy() for t in hvd.grouped_allreduce(
            tiny[:k], op=hvd.Sum, name=f"cal.g{k}")], 3 * repeats)
        grouped[k] = max(hvd.allgather_object(wall))
    if hvd.rank() != 0:
        return None
    return {"sizes": {str(n): v for n, v in sizes.items()}, "phases": phases,
            "grouped": {str(k): v for k, v in grouped.items()},
            "steal": steal, "cycle_time_ms": os.environ.get("HOROVOD_CYCLE_TIME"),
            "ranks": hvd.size()}


def _steal(hvd, tf, iters: int = 12, allreduces: int = 10) -> dict[str, float]:
    """Compute slowed by concurrent allreduces: a matmul loop timed alone, then while another
    thread runs ``allreduces`` back-to-back 16 MiB allreduces (the same count on every rank)."""
    import threading

    a = tf.random.stateless_uniform([768, 768], seed=[1, 2])
    mm = tf.function(lambda: tf.reduce_sum(tf.linalg.matmul(a, a)))
    x = tf.ones([(16 << 20) // 4], tf.float32)
    comm_alone, _ = _time_op(lambda: hvd.allreduce(x, op=hvd.Sum, name="cal.steal").numpy(), 5)
    mm().numpy()
    t0 = time.perf_counter()
    for _ in range(iters):
        mm().numpy()
    alone = (time.perf_counter() - t0) / iters
    hvd.allgather_object(0, name="cal.sync0")
    done: list[float] = []

    def comm() -> None:
        for _ in range(allreduces):
            t = time.perf_counter()
            hvd.allreduce(x, op=hvd.Sum, name="cal.steal").numpy()
            done.append(time.perf_counter() - t)

    thread = threading.Thread(target=comm)
    thread.start()
    n, t0 = 0, time.perf_counter()
    while thread.is_alive():
        mm().numpy()
        n += 1
    busy = (time.perf_counter() - t0) / max(n, 1)
    thread.join()
    return {"compute_alone_s": alone, "compute_with_comm_s": busy,
            "cpu_steal": max(0.0, 1.0 - alone / busy), "comm_alone_s": comm_alone,
            "comm_slowdown": statistics.median(done) / comm_alone}


def _slope(points: list[tuple[int, float]]) -> float:
    """Least-squares seconds per byte of ``(bytes, seconds)`` points."""
    mx = statistics.fmean(n for n, _ in points)
    my = statistics.fmean(t for _, t in points)
    return sum((n - mx) * (t - my) for n, t in points) / sum((n - mx) ** 2 for n, _ in points)


def fit(short: dict[str, Any], default: dict[str, Any]) -> dict[str, float]:
    """The simulator's parameters from a short-cycle and a default-cycle measurement."""
    big = [(int(n), v["wall_s"]) for m in (short, default) for n, v in m["sizes"].items()
           if int(n) >= 1 << 20]  # both runs: the slope does not depend on the cycle
    slope = _slope(big)
    ranks = default.get("ranks", 2)
    phase_bw = {}
    for kind in ("reduce_scatter", "allgather", "alltoall_gather"):
        points = [(int(n), t) for m in (short, default)
                  for n, t in m.get("phases", {}).get(kind, {}).items()]
        if points:  # a ring moves (P-1)/P of the bytes per rank: bandwidth in those terms
            phase_bw[f"{kind}_bandwidth"] = (ranks - 1) / ranks / _slope(points)
    per_tensor = [max(m["grouped"][str(GROUP)] - m["grouped"]["1"], 0.0) / (GROUP - 1)
                  for m in (short, default)]
    return {
        "overhead_s": short["sizes"][str(min(int(n) for n in short["sizes"]))]["wall_s"],
        "cycle_period_s": default["sizes"][str(min(int(n) for n in default["sizes"]))]["wall_s"],
        "bandwidth": 2 * (ranks - 1) / ranks / slope,  # ring terms, as Cluster.allreduce
        **phase_bw,
        "tensor_s": statistics.fmean(per_tensor),
        "cpu_steal": default["steal"]["cpu_steal"],
        "comm_slowdown": default["steal"]["comm_slowdown"],
    }


def _launch(net: str, cycle_ms: float | None, timeout: float, net_model: str,
            ranks: int = 2, repeats: int = 9) -> dict[str, Any]:
    """One measurement of ``ranks`` ranks on ``net``: this machine's loopback, one shaped
    loopback, or ``ranks`` emulated hosts (``net_model``), as the benchmark runs them."""
    from benchmarks.hostrun import run_on_hosts
    from benchmarks.launch import (
        ENV_DEFAULTS,
        BenchError,
        horovodrun_command,
        run_logged,
    )
    from benchmarks.netns import (
        HOSTS,
        emulated_hosts,
        exec_prefix,
        parse_net,
        shaped_namespace,
    )

    rate = parse_net(net)
    env = dict(ENV_DEFAULTS)
    if cycle_ms is not None:
        env["HOROVOD_CYCLE_TIME"] = str(cycle_ms)
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hvdo-cal-")))
        worker = [sys.executable, "-m", "benchmarks.calibrate", str(tmp / "out.json"), str(repeats)]
        if rate is not None and net_model == HOSTS:
            hosts = stack.enter_context(emulated_hosts(ranks, rate))
            with open(tmp / "log", "w") as log:
                code = run_on_hosts(worker, hosts, timeout=timeout, on_line=log.write,
                                    env={**os.environ, **env})
        else:
            cmd = horovodrun_command(ranks, worker)
            if rate is not None:
                cmd = exec_prefix(stack.enter_context(shaped_namespace(rate))) + cmd
            code = run_logged(cmd, tmp / "log", timeout, lambda _line: None, env=env)
        out = tmp / "out.json"
        if code != 0 or not out.exists():
            tail = "\n".join((tmp / "log").read_text().splitlines()[-20:])
            raise BenchError(f"calibration of {ranks} ranks on net {net} failed (exit {code}):"
                             f"\n{tail}")
        return json.loads(out.read_text())


def calibrate(net: str, timeout: float = 600.0, net_model: str = "hosts",
              ranks: int = 2, repeats: int = 9) -> dict[str, Any]:
    """Measure ``ranks`` ranks on ``net`` (``plain`` or a tc rate of ``net_model``) with a short
    and the default cycle, each timing the median of ``repeats`` collectives (fewer: quicker
    on a slow link)."""
    short = _launch(net, SHORT_CYCLE_MS, timeout, net_model, ranks, repeats)
    default = _launch(net, None, timeout, net_model, ranks, repeats)
    return {"fit": fit(short, default), "short_cycle": short, "default_cycle": default}


if __name__ == "__main__":
    result = measure(int(sys.argv[2]) if len(sys.argv) > 2 else 9)
    if result is not None:
        Path(sys.argv[1]).write_text(json.dumps(result, indent=2))
