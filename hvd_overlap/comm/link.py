"""The link as ``strategy="auto"`` sees it: a few timed allreduces at start-up, agreed by all ranks.

Two sizes: a tiny one gives the fixed cost of one collective (Horovod's cycle, negotiation,
the ring's latencies), a larger one adds the bandwidth term. Every rank times its own calls
and the ranks average the results, so every rank fits the same link.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_overlap.core.sim.cluster import Cluster

#: the larger probe: long enough on a fast link to see its bandwidth, short on a slow one
PROBE_BYTES = 4 * 2**20


@dataclass(frozen=True)
class Link:
    """What a collective costs between these ranks: a fixed part and a ring bandwidth."""

    ranks: int
    per_collective_s: float  # a 4-byte allreduce inside a graph
    bandwidth: float         # bytes/s per rank, as the ring model's (``core.simulate.Cluster``)


def _allreduce_seconds(nbytes: int, name: str, repeats: int) -> float:
    """Seconds per allreduce of ``nbytes`` when ``repeats`` of them run one after another
    inside a graph, as a train step's do (an eager call would add its dispatch and sync)."""
    x = tf.zeros([max(nbytes // 4, 1)], tf.float32)

    @tf.function
    def chain(x: tf.Tensor) -> tf.Tensor:
        for r in range(repeats):  # each waits for the previous one's result
            x = hvd.allreduce(x, op=hvd.Sum, name=f"{name}.{r}", ignore_name_scope=True)
        return x

    chain(x).numpy()  # trace, and warm Horovod's cache up
    start = time.perf_counter()
    chain(x).numpy()
    return (time.perf_counter() - start) / repeats


def agree(values: list[float], name: str) -> list[float]:
    """The ranks' average of ``values`` (eager; every rank calls it at the same point)."""
    if hvd.size() == 1:
        return list(values)
    got = hvd.allreduce(tf.constant(values, tf.float64), op=hvd.Average, name=name)
    return [float(v) for v in got.numpy()]


def measure_link(name: str, repeats: int = 4, probe_bytes: int = PROBE_BYTES) -> Link:
    """Time ``repeats`` allreduces of 4 bytes and of ``probe_bytes`` (every rank at the same
    point, collectives named from ``name``) and fit the link; the same on every rank."""
    small = _allreduce_seconds(4, f"{name}.small", repeats)
    large = _allreduce_seconds(probe_bytes, f"{name}.large", repeats)
    small, large = agree([small, large], f"{name}.agree")
    p = hvd.size()
    ring_bytes = 2 * (p - 1) / p * probe_bytes if p > 1 else probe_bytes
    return Link(ranks=p, per_collective_s=small,
                bandwidth=ring_bytes / max(large - small, 1e-6))


def cluster_of(link: Link) -> Cluster:
    """The simulator's cluster for a measured link: the fixed cost of a collective is Horovod's
    per-cycle cost at this number of ranks, the ring bandwidth the measured one."""
    grow = math.log2(link.ranks) if link.ranks > 1 else 1.0
    return Cluster(ranks=link.ranks, bandwidth=link.bandwidth,
                   negotiation_s=link.per_collective_s / grow)
