"""The link as ``strategy="auto"`` sees it: a few timed collectives at start-up, agreed by all
ranks.

Two allreduce sizes: a tiny one gives the fixed cost of one collective (Horovod's cycle,
negotiation, the ring's latencies), a larger one adds the bandwidth term. Where the candidate
plans use them, a reduce-scatter, an all-gather and an alltoall of the larger size give each
one's own rate: Gloo's run at a third to half of its allreduce's (docs/scaling.md), which a
single link rate would hide. Every rank times its own calls and the ranks average the results,
so every rank fits the same link.

A rate is a measurement only where the bytes took measurably longer than a 4-byte collective:
the probe graph runs several times (each collective's fastest run counts: a stall only slows a
run), a size whose transfer cannot be told from the fixed cost is enlarged (up to
``MAX_PROBE_BYTES``), and a rate still unresolved, or a reduce-scatter, all-gather or alltoall
faster than an allreduce's rate by ``MAX_PHASE_GAIN`` (in ring terms they move half its bytes in
about half its time), is reported unmeasured (``Link.unmeasured``): the caller does not rank
plans by it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_overlap.comm import collectives
from hvd_overlap.core.sim.cluster import Cluster

#: the larger probe: long enough on a fast link to see its bandwidth, short on a slow one
PROBE_BYTES = 4 * 2**20
#: ...enlarged 4x at a time up to this where its transfer hides in the fixed cost
MAX_PROBE_BYTES = 64 * 2**20
#: timed runs of the probe graph (after one that warms up); each collective's fastest counts
TRIES = 2
#: a transfer is resolved when it took at least this share of the fixed cost (and 0.1 ms)
#: longer than a 4-byte collective
RESOLVE = 0.5
#: a reduce-scatter, all-gather or alltoall more than this many times faster than the allreduce
#: (both in ring terms, where each moves half an allreduce's bytes in half its time) is no
#: measurement: an unresolved transfer or a stall of the fixed cost
MAX_PHASE_GAIN = 4.0


#: the collectives besides the allreduce whose rates the sharded plans and the exchange depend on
PHASES = ("reducescatter", "allgather", "alltoall")


@dataclass(frozen=True)
class Link:
    """What a collective costs between these ranks: a fixed part and a ring bandwidth, and the
    rates of the other collectives where they were measured (None: the allreduce's)."""

    ranks: int
    per_collective_s: float  # a 4-byte allreduce inside a graph
    bandwidth: float         # bytes/s per rank, as the ring model's (``core.simulate.Cluster``)
    reduce_scatter_bandwidth: float | None = None  # in half-ring terms, as ``Cluster``'s
    allgather_bandwidth: float | None = None
    alltoall_bandwidth: float | None = None
    #: collectives (``"allreduce"`` or of ``PHASES``) whose rate could not be measured: their
    #: rate is None (the allreduce's ``bandwidth`` is a lower bound): rank no plan by it
    unmeasured: tuple[str, ...] = ()


def _collective(kind: str, x: tf.Tensor, name: str) -> tf.Tensor:
    """One collective of ``kind`` on ``x`` (``nbytes`` in all: an all-gather's input is 1/P)."""
    if kind == "allreduce":
        return collectives.allreduce(x, name, op=hvd.Sum)
    if kind == "reducescatter":
        return collectives.reduce_scatter(x, name, op=hvd.Sum)
    if kind == "allgather":
        return collectives.all_gather(x, name)
    return collectives.alltoall(x, name)


def _seconds(kinds: list[tuple[str, int]], name: str, repeats: int,
             tries: int = TRIES) -> list[float]:
    """Seconds per collective for each ``(kind, nbytes)`` (``nbytes`` moved in all) when
    ``repeats`` of them run one after another inside a graph, as a train step's do (an eager
    call would add its dispatch and sync). One graph times every kind between in-graph
    timestamps, from a first allreduce that every rank has joined: one trace, one warm-up run
    (Horovod negotiates each name once and caches it), then ``tries`` timed runs, each kind's
    fastest kept. Every result is consumed: an unused one could be pruned on one rank."""
    p = hvd.size()
    inputs = []
    for kind, nbytes in kinds:
        n = max(nbytes // 4, p)
        inputs.append(tf.zeros([n // p if kind == "allgather" else n - n % p], tf.float32))

    @tf.function(autograph=False)  # plain Python loops; autograph would convert Horovod's code
    def chains(*xs: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        # the clock starts when every rank is in: a rank that arrives late would otherwise be
        # timed as the first collective's cost (and, subtracted, as a faster link)
        ready = _collective("allreduce", tf.zeros([p]), f"{name}.ready")
        with tf.control_dependencies([ready]):
            stamps, sums = [tf.timestamp()], [tf.reduce_sum(ready)]
        for i, ((kind, _), x) in enumerate(zip(kinds, xs, strict=True)):
            last: tf.Tensor = stamps[-1]
            for r in range(repeats):  # each waits for the previous one's result
                with tf.control_dependencies([last]):
                    last = _collective(kind, tf.identity(x), f"{name}.{i}.{kind}.{r}")
                sums.append(tf.reduce_sum(last))
            with tf.control_dependencies([last]):
                stamps.append(tf.timestamp())
        return tf.stack(stamps), tf.add_n(sums)

    best = [math.inf] * len(kinds)
    for run in range(1 + tries):  # the first run traces and warms the cache up
        stamps, total = chains(*inputs)
        total.numpy()
        t = stamps.numpy()
        if run:
            best = [min(m, float(b - a) / repeats)
                    for m, a, b in zip(best, t[:-1], t[1:], strict=True)]
    return best


def agree(values: list[float], name: str) -> list[float]:
    """The ranks' average of ``values`` (eager; every rank calls it at the same point)."""
    if hvd.size() == 1:
        return list(values)
    got = collectives.allreduce(tf.constant(values, tf.float64), name, op=hvd.Average)
    return [float(v) for v in got.numpy()]


def _resolved(seconds: float, small: float) -> bool:
    """True if a transfer of ``seconds`` is measurably longer than the fixed cost ``small``."""
    return seconds - small >= max(RESOLVE * small, 1e-4)


def measure_link(name: str, repeats: int = 4, probe_bytes: int = PROBE_BYTES,
                 phases: bool = False, max_bytes: int = MAX_PROBE_BYTES) -> Link:
    """Time ``repeats`` allreduces of 4 bytes and of ``probe_bytes`` (every rank at the same
    point, collectives named from ``name``) and fit the link; with ``phases`` (the same on
    every rank), also each collective of ``PHASES`` at ``probe_bytes``. A size whose transfer
    is not resolved is timed again 4x larger, up to ``max_bytes``; what stays unresolved or
    implausible is in ``Link.unmeasured``. The same on every rank (the times are agreed)."""
    kinds = ("allreduce",) + (PHASES if phases else ())
    sizes = dict.fromkeys(kinds, probe_bytes)
    small, *times = agree(_seconds([("allreduce", 4)] + [(k, probe_bytes) for k in kinds],
                                   name, repeats), f"{name}.agree")
    took = dict(zip(kinds, times, strict=True))
    p = hvd.size()
    share = {k: (2 if k == "allreduce" else 1) * (p - 1) / p if p > 1 else 1.0 for k in kinds}

    def rates() -> dict[str, float | None]:
        got = {k: share[k] * sizes[k] / (took[k] - small) if _resolved(took[k], small) else None
               for k in kinds}
        ring = got["allreduce"]
        for k in PHASES:  # faster than any backend runs it against its own allreduce
            if ring is not None and got.get(k) is not None and got[k] > MAX_PHASE_GAIN * ring:
                got[k] = None
        return got

    for again in range(1, 8):  # (agreed times: every rank enlarges the same kinds)
        grow = [k for k, r in rates().items() if r is None and sizes[k] * 4 <= max_bytes]
        if not grow:
            break
        for k in grow:
            sizes[k] *= 4
        got = agree(_seconds([(k, sizes[k]) for k in grow], f"{name}.x{again}", repeats),
                    f"{name}.x{again}.agree")
        took.update(zip(grow, got, strict=True))
    final = rates()
    ring = final["allreduce"]
    bound = share["allreduce"] * sizes["allreduce"] / max(took["allreduce"] - small, 1e-6)
    return Link(p, small, ring if ring is not None else bound,
                *(final.get(k) for k in PHASES),
                unmeasured=tuple(k for k in kinds if final[k] is None))


def cluster_of(link: Link) -> Cluster:
    """The simulator's cluster for a measured link: the fixed cost of a collective is Horovod's
    per-cycle cost at this number of ranks, the ring bandwidth the measured one, and each
    other collective's rate its own where measured."""
    grow = math.log2(link.ranks) if link.ranks > 1 else 1.0
    return Cluster(ranks=link.ranks, bandwidth=link.bandwidth,
                   negotiation_s=link.per_collective_s / grow,
                   reduce_scatter_bandwidth=link.reduce_scatter_bandwidth,
                   allgather_bandwidth=link.allgather_bandwidth,
                   alltoall_bandwidth=link.alltoall_bandwidth)
