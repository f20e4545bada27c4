"""What Horovod's collectives cost on a cluster: the simulator's calibration.

``horovodrun -np N hvd-overlap calibrate --json costs.json`` runs ``measure_cycles`` on every
rank: back-to-back eager collectives of a few sizes, once with a cycle so short it does not
count (``HOROVOD_CYCLE_TIME=0.1``) and once with the job's own cycle (Horovod is shut down and
initialised again between the two, in the same processes). Rank 0 fits (``fit``):

- ``overhead_s``: the fixed cost of one collective with the short cycle: negotiation, the
  transport's round trip, the op's dispatch;
- ``cycle_period_s``: the same tiny allreduce with the job's cycle (Horovod's thread starts at
  most one round of collectives per cycle);
- ``bandwidth``: bytes/s, from a straight-line fit of time against size (1 MiB and more) over
  both runs, in ring terms (a ring allreduce of n bytes moves 2 (P-1)/P n bytes per rank);
- ``reduce_scatter_bandwidth`` / ``allgather_bandwidth``: the same fit (4 MiB and more) for
  Horovod's reduce-scatter and all-gather (n bytes in all; (P-1)/P n per rank on a ring);
  ``alltoall_gather_bandwidth``: that all-gather done as an alltoall of the slice repeated P
  times (the sharded strategies' ``gather_with="alltoall"``);
- ``small_excess_s``: per kind, what a collective of 64 KiB, 256 KiB and 1 MiB took beyond
  ``overhead_s`` and its bytes at the kind's rate (the mean of both runs, none below 0): the
  per-message costs of the transport that a line fitted on large collectives misses, which
  a plan of many small dependent collectives pays at each one;
- ``tensor_s``: the extra cost of each tensor of a grouped (fused) allreduce (64 against 1);
- ``cpu_steal``: the share of compute throughput lost while allreduces run beside it (a
  matrix-multiply loop alone and beside back-to-back 16 MiB allreduces in another thread), and
  ``comm_slowdown``: how much longer those allreduces took meanwhile.

``record`` files the result under a network's name and rank count, and once a network has
been measured at 2 ranks and at least one other count, fits the laws by which the costs grow
with the ranks (``hvd_overlap.core.sim.laws``); ``hvd-overlap simulate --calibration`` reads the
file. The repository's lab runs the same measurement on emulated hosts
(``python -m benchmarks calibrate``).
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

from hvd_overlap.core.sim.cluster import Cluster

#: the format of a calibration file (``hvd-overlap calibrate``, ``python -m benchmarks calibrate``)
OVERHEADS_FORMAT = "hvd-overlap-overheads/1"
#: sizes below the lines' (``LINE_FROM``): each kind's cost there, beyond its line, is kept
SMALL_SIZES = (64 << 10, 256 << 10, 1 << 20)
SIZES = (4, *SMALL_SIZES, 4 << 20, 16 << 20, 32 << 20)  # bytes of float32 payload
#: reduce-scatter / all-gather sizes (bytes in all)
PHASE_SIZES = (*SMALL_SIZES, 4 << 20, 16 << 20, 32 << 20)
#: the smallest size of each kind's straight line (its rate): allreduce, then the others
LINE_FROM = {"allreduce": 1 << 20, "phases": 4 << 20}
#: the kinds whose costs are timed at every size
KINDS = ("allreduce", "reduce_scatter", "allgather", "alltoall_gather")
GROUP = 64  # tensors in the grouped allreduce that measures the per-tensor cost
SHORT_CYCLE_MS = 0.1


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _time_op(fn: Callable[[], Any], repeats: int) -> tuple[float, float]:
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
    """One measurement with the cycle Horovod was initialised with; run on every rank after
    ``hvd.init()``. The timings (each the slowest rank's) on rank 0, None elsewhere."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

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


def _steal(hvd: Any, tf: Any, iters: int = 12, allreduces: int = 10) -> dict[str, float]:
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


def measure_cycles(repeats: int = 9) -> dict[str, Any] | None:
    """Both measurements in this job: with the short cycle, then with the job's own (Horovod
    initialised again for each, its environment restored after). Every rank calls it, Horovod
    not initialised; rank 0 gets ``{"fit", "short_cycle", "default_cycle"}``, the others None.
    Horovod is left initialised with the job's cycle."""
    import horovod.tensorflow as hvd

    own = os.environ.get("HOROVOD_CYCLE_TIME")
    os.environ["HOROVOD_CYCLE_TIME"] = str(SHORT_CYCLE_MS)
    try:
        hvd.init()
        short = measure(repeats)
        hvd.shutdown()
    finally:
        if own is None:
            os.environ.pop("HOROVOD_CYCLE_TIME", None)
        else:
            os.environ["HOROVOD_CYCLE_TIME"] = own
    hvd.init()
    default = measure(repeats)
    if short is None or default is None:
        return None
    return {"fit": fit(short, default), "short_cycle": short, "default_cycle": default}


def _slope(points: list[tuple[int, float]]) -> float:
    """Least-squares seconds per byte of ``(bytes, seconds)`` points."""
    mx = statistics.fmean(n for n, _ in points)
    my = statistics.fmean(t for _, t in points)
    return sum((n - mx) * (t - my) for n, t in points) / sum((n - mx) ** 2 for n, _ in points)


def fit(short: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
    """The simulator's parameters from a short-cycle and a default-cycle measurement."""
    big = [(int(n), v["wall_s"]) for m in (short, default) for n, v in m["sizes"].items()
           if int(n) >= LINE_FROM["allreduce"]]  # both runs: the slope does not depend on the cycle
    slope = _slope(big)
    ranks = default.get("ranks", 2)
    phase_bw = {}
    for kind in KINDS[1:]:
        points = [(int(n), t) for m in (short, default)
                  for n, t in m.get("phases", {}).get(kind, {}).items()
                  if int(n) >= LINE_FROM["phases"]]
        if points:  # a ring moves (P-1)/P of the bytes per rank: bandwidth in those terms
            phase_bw[f"{kind}_bandwidth"] = (ranks - 1) / ranks / _slope(points)
    per_tensor = [max(m["grouped"][str(GROUP)] - m["grouped"]["1"], 0.0) / (GROUP - 1)
                  for m in (short, default)]
    overhead = short["sizes"][str(min(int(n) for n in short["sizes"]))]["wall_s"]
    bandwidth = 2 * (ranks - 1) / ranks / slope  # ring terms, as Cluster.allreduce
    excess = _small_excess((short, default), overhead, Cluster(
        ranks=ranks, bandwidth=bandwidth,
        reduce_scatter_bandwidth=phase_bw.get("reduce_scatter_bandwidth"),
        allgather_bandwidth=phase_bw.get("allgather_bandwidth"),
        alltoall_bandwidth=phase_bw.get("alltoall_gather_bandwidth")),
        [k for k in KINDS if k == "allreduce" or f"{k}_bandwidth" in phase_bw])
    return {
        "overhead_s": overhead,
        "cycle_period_s": default["sizes"][str(min(int(n) for n in default["sizes"]))]["wall_s"],
        "bandwidth": bandwidth,
        **phase_bw,
        "tensor_s": statistics.fmean(per_tensor),
        "cpu_steal": default["steal"]["cpu_steal"],
        "comm_slowdown": default["steal"]["comm_slowdown"],
        **({"small_excess_s": excess} if excess else {}),
    }


def _small_excess(runs: tuple[dict[str, Any], ...], overhead: float, line: Cluster,
                  kinds: list[str]) -> dict[str, dict[str, float]]:
    """Per kind of ``kinds`` and size below the lines, the mean over ``runs`` of the time beyond
    ``overhead`` and the collective's cost on ``line`` (the fitted rates, nothing else), none
    below 0. Empty for a calibration without small sizes."""
    out: dict[str, dict[str, float]] = {}
    for kind in kinds:
        for n in SMALL_SIZES:
            got = [m["sizes"].get(str(n), {}).get("wall_s") if kind == "allreduce"
                   else m.get("phases", {}).get(kind, {}).get(str(n)) for m in runs]
            if None in got:
                continue
            cost = line.collective("alltoall" if kind == "alltoall_gather" else kind, n)
            out.setdefault(kind, {})[str(n)] = max(0.0, statistics.fmean(got) - overhead - cost)
    return out


def check_file(doc: dict[str, Any], path: str) -> None:
    """Raise ``ValueError`` if ``doc`` (a file's JSON) is not a calibration file."""
    if doc and doc.get("format") != OVERHEADS_FORMAT:
        raise ValueError(f"{path} is not a calibration file (format {doc.get('format')!r}, "
                         f"expected {OVERHEADS_FORMAT!r}): give another --json path")


def record(doc: dict[str, Any], net: str, ranks: int, measured: dict[str, Any],
           rate: float | None, command: str | None = None) -> dict[str, Any]:
    """``doc`` (a calibration file's JSON, or ``{}``) with ``measured`` (``measure_cycles``'
    result) filed under network ``net`` at ``ranks`` ranks (2 ranks: the network's own
    fields; others: under ``ranks``), replacing an earlier one, and the laws fitted again where
    the network now has 2 ranks and another count. ``rate``: the link's nominal bytes/s per
    rank (None: unknown; the collectives' rates are then kept per rank count, not as shares)."""
    from hvd_overlap.core.sim.laws import fit_laws

    check_file(doc, "the file")
    nets = dict(doc.get("nets", {}))
    entry = dict(nets.get(net, {}))
    if ranks == 2:
        entry.update(measured)
    else:
        entry["ranks"] = {**entry.get("ranks", {}), str(ranks): measured}
    by_ranks = {int(p): m["fit"] for p, m in entry.get("ranks", {}).items()}
    if "fit" in entry:
        by_ranks[2] = entry["fit"]
    entry.pop("laws", None)
    if 2 in by_ranks and len(by_ranks) > 1:
        entry["laws"] = fit_laws(by_ranks, rate)
    nets[net] = entry
    commands = [c for c in (doc.get("command"), command) if c]
    return {"format": OVERHEADS_FORMAT, "what": doc.get("what", (
        "Horovod's collective costs, per network: at 2 ranks (the network's 'fit') and at the "
        "rank counts of its 'ranks', with the laws fitted over them (hvd-overlap calibrate)")),
        "command": "; ".join(commands), "nets": nets,
        **({k: doc[k] for k in ("cluster_defaults",) if k in doc})}


def fit_line(f: dict[str, float]) -> str:
    """One line of a fit: overheads and each collective's rate."""
    phases = ", ".join(f"{k.split('_bandwidth')[0]} {f[k] / 1e6:.0f} MB/s" for k in
                       ("reduce_scatter_bandwidth", "allgather_bandwidth",
                        "alltoall_gather_bandwidth") if k in f)
    small = ", ".join(f"{kind.split('_gather')[0]} {max(by_size.values()) * 1e3:.1f}"
                      for kind, by_size in f.get("small_excess_s", {}).items())
    return (f"overhead {f['overhead_s'] * 1e3:.2f} ms, cycle {f['cycle_period_s'] * 1e3:.2f} "
            f"ms, allreduce {f['bandwidth'] / 1e6:.0f} MB/s" + (f", {phases}" if phases else "")
            + f", {f['tensor_s'] * 1e6:.0f} us/tensor, cpu steal {f['cpu_steal']:.2f}"
            + (f"; below 4 MiB, up to ms beyond the line: {small}" if small else ""))


def laws_line(laws: dict[str, Any]) -> str:
    """One line of the fitted laws: each cost's law and each collective's share of the link,
    with the worst error of the fit."""
    parts = [f"{name} {laws[name]['law']} (worst error {laws[name]['worst']:.0%})"
             for name in ("overhead_s", "tensor_s")]
    parts += [f"{name} {law['share']:.2f} of the rate (worst error "
              f"{max(abs(e) for e in law['errors'].values()):.0%})"
              for name, law in laws.items() if isinstance(law, dict) and "share" in law]
    return "; ".join(parts)
