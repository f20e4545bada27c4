"""The cluster model: ranks, link and Horovod's settings, and what each collective costs.

Collectives cost ring-algorithm time, growing with the number of ranks P:

- allreduce of n bytes: ``2 (P-1)/P n / bandwidth + 2 (P-1) latency``;
- reduce-scatter and all-gather: half of that each (together: one allreduce's bytes);
- alltoall of a buffer of n bytes per rank (the dense factor exchange's inputs): each rank
  keeps 1/P and sends the rest, ``(P-1)/P n / bandwidth + (P-1) latency``;
- every tensor adds ``tensor_s``; every cycle that carries work adds the negotiation,
  ``negotiation_s`` measured at P=2 and grown with P by an assumed law (``log2`` by default:
  tree / recursive-doubling coordination; ``linear``: a coordinator that talks to every rank).

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
    cpu_steal: float = 0.0
    comm_slowdown: float = 1.0
    fusion_bytes: int = FUSION_BYTES
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    #: measured per collective type (``python -m benchmarks calibrate``; the alltoall's from its
    #: all-gather done as an alltoall); None: the link's ``bandwidth`` (ring model)
    reduce_scatter_bandwidth: float | None = None
    allgather_bandwidth: float | None = None
    alltoall_bandwidth: float | None = None

    def __post_init__(self) -> None:
        if self.ranks < 1 or self.bandwidth <= 0:
            raise ValueError("ranks must be >= 1 and bandwidth > 0")
        if not 0 <= self.cpu_steal < 1 or self.comm_slowdown < 1:
            raise ValueError("cpu_steal must be in [0, 1) and comm_slowdown >= 1")
        if self.negotiation_growth not in ("log2", "linear", "none"):
            raise ValueError("negotiation_growth: log2, linear or none")

    def negotiation(self) -> float:
        """Seconds of one cycle's coordination among ``ranks`` ranks."""
        p = self.ranks
        grow = {"log2": math.log2(p), "linear": p - 1.0, "none": 1.0}[self.negotiation_growth]
        return self.negotiation_s * grow if p > 1 else 0.0

    def allreduce(self, nbytes: float) -> float:
        """Ring allreduce seconds."""
        p = self.ranks
        return 2 * (p - 1) / p * nbytes / self.bandwidth + 2 * (p - 1) * self.latency

    def reduce_scatter(self, nbytes: float) -> float:
        """Ring reduce-scatter seconds (each rank ends with the sum of 1/P of the data)."""
        return self._half_ring(nbytes, self.reduce_scatter_bandwidth)

    def allgather(self, nbytes: float) -> float:
        """Ring all-gather seconds of ``nbytes`` in total (1/P from each rank)."""
        return self._half_ring(nbytes, self.allgather_bandwidth)

    def alltoall(self, nbytes: float) -> float:
        """Pairwise alltoall seconds of a buffer of ``nbytes`` on each rank (it keeps 1/P and
        sends 1/P to each other rank: P-1 steps)."""
        return self._half_ring(nbytes, self.alltoall_bandwidth)

    def _half_ring(self, nbytes: float, bandwidth: float | None) -> float:
        p = self.ranks
        return (p - 1) / p * nbytes / (bandwidth or self.bandwidth) + (p - 1) * self.latency

    def wire_bytes(self, kind: str, nbytes: float) -> float:
        """Bytes one rank sends for a collective of ``nbytes`` (all-gather: in all; alltoall:
        each rank's buffer)."""
        share = (self.ranks - 1) / self.ranks * nbytes
        return 2 * share if kind == "allreduce" else share
