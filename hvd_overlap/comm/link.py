"""The link as ``strategy="auto"`` sees it: a few timed collectives at start-up, agreed by all
ranks.

Two allreduce sizes: a tiny one gives the fixed cost of one collective (Horovod's cycle,
negotiation, the ring's latencies), a larger one adds the bandwidth term. Where the candidate
plans use them, a reduce-scatter, an all-gather and an alltoall of the larger size give each
one's own rate: Gloo's run at a third to half of its allreduce's (docs/scaling.md), which a
single link rate would hide. Every rank times its own calls and the ranks average the results,
so every rank fits the same link.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_overlap.core.sim.cluster import Cluster

#: the larger probe: long enough on a fast link to see its bandwidth, short on a slow one
PROBE_BYTES = 4 * 2**20


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


def _collective(kind: str, x: tf.Tensor, name: str) -> tf.Tensor:
    """One collective of ``kind`` on ``x`` (``nbytes`` in all: an all-gather's input is 1/P)."""
    if kind == "allreduce":
        return hvd.allreduce(x, op=hvd.Sum, name=name, ignore_name_scope=True)
    if kind == "reducescatter":
        return hvd.reducescatter(x, op=hvd.Sum, name=name, ignore_name_scope=True)
    if kind == "allgather":
        return hvd.allgather(x, name=name, ignore_name_scope=True)
    return hvd.alltoall(x, name=name, ignore_name_scope=True)


def _seconds(kinds: list[tuple[str, int]], name: str, repeats: int) -> list[float]:
    """Seconds per collective for each ``(kind, nbytes)`` (``nbytes`` moved in all) when
    ``repeats`` of them run one after another inside a graph, as a train step's do (an eager
    call would add its dispatch and sync). One graph times every kind between in-graph
    timestamps, from a first allreduce that every rank has joined: one trace, one warm-up run
    (Horovod negotiates each name once and caches it), one timed run. Every result is
    consumed: an unused one could be pruned on one rank."""
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

    for _ in range(2):  # the first run traces and warms the cache up; the second is timed
        stamps, total = chains(*inputs)
        total.numpy()
    t = stamps.numpy()
    return [float(b - a) / repeats for a, b in zip(t[:-1], t[1:], strict=True)]


def agree(values: list[float], name: str) -> list[float]:
    """The ranks' average of ``values`` (eager; every rank calls it at the same point)."""
    if hvd.size() == 1:
        return list(values)
    got = hvd.allreduce(tf.constant(values, tf.float64), op=hvd.Average, name=name)
    return [float(v) for v in got.numpy()]


def measure_link(name: str, repeats: int = 4, probe_bytes: int = PROBE_BYTES,
                 phases: bool = False) -> Link:
    """Time ``repeats`` allreduces of 4 bytes and of ``probe_bytes`` (every rank at the same
    point, collectives named from ``name``) and fit the link; with ``phases`` (the same on
    every rank), also each collective of ``PHASES`` at ``probe_bytes``. The same on every rank."""
    kinds = [("allreduce", 4)] + [(k, probe_bytes) for k in
                                  ("allreduce",) + (PHASES if phases else ())]
    small, large, *rest = agree(_seconds(kinds, name, repeats), f"{name}.agree")
    p = hvd.size()
    ring_bytes = 2 * (p - 1) / p * probe_bytes if p > 1 else probe_bytes
    half = (p - 1) / p * probe_bytes if p > 1 else probe_bytes
    rates = [half / max(t - small, 1e-6) for t in rest] if rest else [None] * 3
    return Link(p, small, ring_bytes / max(large - small, 1e-6), *rates)


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
