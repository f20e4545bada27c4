"""The cluster model: ranks, link and Horovod's settings, and what each collective costs.

Collectives cost ring-algorithm time, growing with the number of ranks P:

- allreduce of n bytes: ``2 (P-1)/P n / bandwidth + 2 (P-1) latency``;
- reduce-scatter and all-gather: half of that each (together: one allreduce's bytes);
- alltoall of a buffer of n bytes per rank (the dense factor exchange's inputs): each rank
  keeps 1/P and sends the rest, ``(P-1)/P n / bandwidth + (P-1) latency``;
- a collective below a few MiB adds what the calibration measured beyond its line at that size
  (``small_excess``: the transport's per-message costs, which a plan of many small dependent
  collectives pays at each; interpolated between the sizes measured, from 0 at no bytes to 0
  at ``4 x`` the largest, where the lines are fitted), once per ring step (P-1 of them);
- every tensor adds ``tensor_s``; every cycle that carries work adds the negotiation,
  ``negotiation_s``. Both are their cost at P=2, grown with P by a law (``GROWTH_LAWS``:
  ``log2``, tree / recursive-doubling coordination, the negotiation's default; ``linear``, a
  coordinator that talks to every rank; ``none``, the per-tensor cost's default). On this
  repository's emulated hosts the law is fitted to calibrations at 2-4 ranks
  (``python -m benchmarks calibrate --np 2 --np 3 --np 4``) instead of assumed.

On a host where communication runs on the cores that compute (CPU training), the two slow each
other down while they overlap: compute runs at ``1 - cpu_steal`` of its speed, and a transfer
takes ``comm_slowdown`` times as long. Both are 0 / 1 on a GPU cluster.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from hvd_overlap.core.plan import DEFAULT_BUCKET_BYTES

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]?)(bit|bps)?\s*$", re.IGNORECASE)


def parse_rate(rate: str | float) -> float:
    """A link rate -> bytes per second: ``"1gbit"``, ``"500mbit"``, ``"10gbps"`` (tc's
    spelling, bits per second), or bytes/s as a number. The one rate parser: the simulator,
    ``hvd-overlap profile`` and the bench's emulated links read rates with it."""
    if isinstance(rate, int | float):
        return float(rate)
    m = _RATE.match(rate)
    if not m:
        raise ValueError(f"bandwidth {rate!r}: write it like '1gbit', '500mbit' or bytes/s")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2).lower()]
    return float(m.group(1)) * scale / 8


#: how a cost measured at 2 ranks grows with the rank count P (1 at P = 2 for every law)
GROWTH_LAWS = ("log2", "linear", "none")


def growth(law: str, ranks: int) -> float:
    """The factor of a 2-rank cost at ``ranks`` ranks under ``law`` (``GROWTH_LAWS``); 0 for a
    single rank (nothing to coordinate)."""
    if law not in GROWTH_LAWS:
        raise ValueError(f"growth law {law!r}: choose one of {', '.join(GROWTH_LAWS)}")
    if ranks < 2:
        return 0.0
    return {"log2": math.log2(ranks), "linear": ranks - 1.0, "none": 1.0}[law]


FUSION_BYTES = 128 * 1024 * 1024  # HOROVOD_FUSION_THRESHOLD default
CYCLE_S = 1e-3                    # HOROVOD_CYCLE_TIME default in Horovod 0.28.1 (1 ms)


@dataclass(frozen=True)
class Cluster:
    """The ranks, the link and Horovod's settings. ``bandwidth`` in bytes/s per rank,
    ``latency`` in seconds per ring hop."""

    ranks: int
    bandwidth: float
    latency: float = 0.0
    cycle_s: float = CYCLE_S
    negotiation_s: float = 0.0
    negotiation_growth: str = "log2"
    tensor_s: float = 0.0
    tensor_growth: str = "none"
    #: measured (ranks, negotiation seconds, per-tensor seconds) at a few rank counts
    #: (``python -m benchmarks calibrate --np 2 --np 3 --np 4``): interpolated between them,
    #: grown by the laws above beyond the largest; empty: the 2-rank costs and the laws
    measured_costs: tuple[tuple[int, float, float], ...] = ()
    cpu_steal: float = 0.0
    comm_slowdown: float = 1.0
    fusion_bytes: int = FUSION_BYTES
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    #: measured per collective type (``python -m benchmarks calibrate``; the alltoall's from its
    #: all-gather done as an alltoall); None: the link's ``bandwidth`` (ring model)
    reduce_scatter_bandwidth: float | None = None
    allgather_bandwidth: float | None = None
    alltoall_bandwidth: float | None = None
    #: per collective kind, ``((bytes, seconds), ...)`` at 2 ranks: what a collective of that
    #: size took beyond the negotiation and its bytes at the kind's rate (``small_excess_s`` of
    #: ``hvd-overlap calibrate``); empty: nothing beyond
    small_excess: tuple[tuple[str, tuple[tuple[int, float], ...]], ...] = ()

    def __post_init__(self) -> None:
        if self.ranks < 1 or self.bandwidth <= 0:
            raise ValueError("ranks must be >= 1 and bandwidth > 0")
        if not 0 <= self.cpu_steal < 1 or self.comm_slowdown < 1:
            raise ValueError("cpu_steal must be in [0, 1) and comm_slowdown >= 1")
        for name in ("negotiation_growth", "tensor_growth"):
            if getattr(self, name) not in GROWTH_LAWS:
                raise ValueError(f"{name}: {', '.join(GROWTH_LAWS)}")

    def negotiation(self) -> float:
        """Seconds of one cycle's coordination among ``ranks`` ranks."""
        return self._cost(1, self.negotiation_s, self.negotiation_growth)

    def per_tensor(self) -> float:
        """Seconds each tensor of a collective adds among ``ranks`` ranks."""
        return self._cost(2, self.tensor_s, self.tensor_growth)

    def _cost(self, column: int, at_2: float, law: str) -> float:
        p = self.ranks
        if p < 2:
            return 0.0
        points = sorted((row[0], row[column]) for row in self.measured_costs)
        if not points:
            return at_2 * growth(law, p)
        top, top_cost = points[-1]
        if p >= top:
            return top_cost * growth(law, p) / growth(law, top)
        for (lo, lo_cost), (hi, hi_cost) in zip(points, points[1:], strict=False):
            if lo <= p <= hi:
                return lo_cost + (hi_cost - lo_cost) * (p - lo) / (hi - lo)
        return points[0][1] * growth(law, p) / growth(law, points[0][0])

    def excess(self, kind: str, nbytes: float) -> float:
        """Seconds a collective of ``kind`` and ``nbytes`` takes beyond its line
        (``small_excess``, grown with the ring's P-1 steps)."""
        points = dict(self.small_excess).get(kind)
        if not points or self.ranks < 2:
            return 0.0
        curve = [(0.0, 0.0), *points, (4.0 * points[-1][0], 0.0)]
        for (lo, lo_s), (hi, hi_s) in zip(curve, curve[1:], strict=False):
            if nbytes <= hi:
                return (self.ranks - 1) * (lo_s + (hi_s - lo_s) * (nbytes - lo) / (hi - lo))
        return 0.0

    def allreduce(self, nbytes: float) -> float:
        """Ring allreduce seconds."""
        p = self.ranks
        return (2 * (p - 1) / p * nbytes / self.bandwidth + 2 * (p - 1) * self.latency
                + self.excess("allreduce", nbytes))

    def reduce_scatter(self, nbytes: float) -> float:
        """Ring reduce-scatter seconds (each rank ends with the sum of 1/P of the data)."""
        return (self._half_ring(nbytes, self.reduce_scatter_bandwidth)
                + self.excess("reduce_scatter", nbytes))

    def allgather(self, nbytes: float) -> float:
        """Ring all-gather seconds of ``nbytes`` in total (1/P from each rank)."""
        return self._half_ring(nbytes, self.allgather_bandwidth) + self.excess("allgather", nbytes)

    def alltoall(self, nbytes: float) -> float:
        """Pairwise alltoall seconds of a buffer of ``nbytes`` on each rank (it keeps 1/P and
        sends 1/P to each other rank: P-1 steps)."""
        return self._half_ring(nbytes, self.alltoall_bandwidth) + self.excess("alltoall", nbytes)

    def collective(self, kind: str, nbytes: float) -> float:
        """Seconds of one collective of ``kind`` (``allreduce``, ``reduce_scatter``,
        ``allgather``, ``alltoall``) carrying ``nbytes``."""
        return {"allreduce": self.allreduce, "reduce_scatter": self.reduce_scatter,
                "allgather": self.allgather, "alltoall": self.alltoall}[kind](nbytes)

    def _half_ring(self, nbytes: float, bandwidth: float | None) -> float:
        p = self.ranks
        return (p - 1) / p * nbytes / (bandwidth or self.bandwidth) + (p - 1) * self.latency

    def wire_bytes(self, kind: str, nbytes: float) -> float:
        """Bytes one rank sends for a collective of ``nbytes`` (all-gather: in all; alltoall:
        each rank's buffer)."""
        share = (self.ranks - 1) / self.ranks * nbytes
        return 2 * share if kind == "allreduce" else share
