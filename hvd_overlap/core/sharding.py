"""The partition of the sharded strategy: which slice of each bucket every rank owns.

Pure Python and numpy (no TensorFlow, no Horovod), so it can be printed and tested without ranks.
A bucket's variables (those with a gradient) are laid end to end in one flat vector of ``total``
elements, padded with zeros to ``ranks * shard_size``; rank ``r`` owns elements
``[r * shard_size, (r + 1) * shard_size)``. Padding never reaches a user variable: it is added
before the reduce-scatter and cut off after the all-gather. A bucket of one dense kernel that the
factor exchange may carry (``rows``) is cut by whole rows instead (``core.exchange.row_sizes``),
the first ranks owning one row more when the rows do not divide evenly. A ``whole`` bucket
(``shard="dense"``: every bucket but the exchange's kernels, allreduced) is not cut: every rank
owns all of it.

The same layout turns per-rank slot slices into whole per-variable arrays for a checkpoint
(``join_slices``) and back into this rank's slice for any number of ranks (``own_slice``), which is
why a checkpoint can resume on a different number of ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from hvd_overlap.core.exchange import row_range
from hvd_overlap.core.plan import FORWARD, Plan, fmt_bytes, itemsize


@dataclass(frozen=True)
class Segment:
    """One variable's place in its bucket's flat vector."""

    index: int              # position in the plan's variable list (forward order)
    name: str
    layer: str
    shape: tuple[int, ...]
    offset: int
    size: int


@dataclass(frozen=True)
class BucketSlices:
    """How one bucket is cut into ``ranks`` equal slices."""

    bucket: int
    dtype: str
    segments: tuple[Segment, ...]
    ranks: int
    phase: str = FORWARD  # when the updated slices are all-gathered (FORWARD: next step)
    rows: bool = False    # one 2-D kernel cut by whole rows (``row_sizes``), without padding
    whole: bool = False   # not cut: every rank owns it all (allreduced, updated on every rank)

    @property
    def total(self) -> int:
        return sum(s.size for s in self.segments)

    @property
    def shard_size(self) -> int:
        """Elements each rank owns (the last slices hold the padding; ``rows``: the most any
        rank owns; ``whole``: all of them)."""
        if self.whole:
            return self.total
        if self.rows:
            return max(self.size_of(r) for r in range(self.ranks))
        return -(-self.total // self.ranks)

    @property
    def padding(self) -> int:
        return 0 if self.rows or self.whole else self.shard_size * self.ranks - self.total

    def owned(self, rank: int) -> tuple[int, int]:
        """``[start, stop)`` of rank ``rank``'s slice in the padded flat vector."""
        if self.whole:
            return 0, self.total
        if self.rows:
            n_in, n_out = self.segments[0].shape
            start, stop = row_range(n_in, self.ranks, rank)
            return start * n_out, stop * n_out
        return rank * self.shard_size, (rank + 1) * self.shard_size

    def size_of(self, rank: int) -> int:
        """Elements rank ``rank`` owns."""
        start, stop = self.owned(rank)
        return stop - start

    @property
    def layers(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.layer for s in self.segments))


@dataclass(frozen=True)
class ShardLayout:
    """Every bucket's slices, in plan order: the buckets all-gathered in this step's backprop
    (backward order), then those all-gathered at the next step's start (forward order)."""

    ranks: int
    buckets: tuple[BucketSlices, ...]

    def describe(self) -> str:
        """One row per bucket: elements, padding, and what one rank owns."""
        total = sum(b.total * itemsize(b.dtype) for b in self.buckets)
        mine = sum(b.shard_size * itemsize(b.dtype) for b in self.buckets)
        lines = [f"shards: ranks={self.ranks} buckets={len(self.buckets)} "
                 f"total={fmt_bytes(total)} per rank={fmt_bytes(mine)}",
                 f"{'bucket':>6}  {'dtype':<8} {'elements':>10} {'padding':>7} "
                 f"{'per rank':>9}  {'all-gather':<10}  layers"]
        for b in self.buckets:
            when = "none" if b.whole else "next step" if b.phase == FORWARD else "backprop"
            lines.append(f"{b.bucket:>6}  {b.dtype:<8} {b.total:>10} {b.padding:>7} "
                         f"{b.shard_size:>9}  {when:<10}  {', '.join(b.layers)}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


def partition(plan: Plan, ranks: int) -> ShardLayout:
    """Cut every bucket of ``plan`` into ``ranks`` slices. Variables without a gradient are left
    out (never sent nor updated, as with stock Horovod); a bucket with none is dropped."""
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, got {ranks}")
    buckets = []
    for b in plan.buckets:
        segments, offset = [], 0
        for v in b.variables:
            if v.has_grad:
                segments.append(Segment(v.index, v.name, v.layer, v.shape, offset, v.size))
                offset += v.size
        if segments:
            buckets.append(BucketSlices(b.index, b.dtype, tuple(segments), ranks, b.phase,
                                        rows=b.rows and len(segments) == 1,
                                        whole=b.whole))
    return ShardLayout(ranks, tuple(buckets))


def own_slice(bucket: BucketSlices, arrays: Mapping[int, np.ndarray], rank: int) -> np.ndarray:
    """Rank ``rank``'s slice of the bucket, from whole per-variable arrays (by variable index)."""
    flat = np.zeros(bucket.total + bucket.padding, dtype=bucket.dtype)
    for s in bucket.segments:
        flat[s.offset:s.offset + s.size] = np.asarray(arrays[s.index]).reshape(-1)
    start, stop = bucket.owned(rank)
    return flat[start:stop]


def join_slices(bucket: BucketSlices, gathered: np.ndarray) -> dict[int, np.ndarray]:
    """Whole per-variable arrays (by variable index) from the all-gathered padded vector."""
    gathered = np.asarray(gathered).reshape(-1)
    expected = bucket.total + bucket.padding
    if gathered.size != expected:
        raise ValueError(f"bucket {bucket.bucket}: expected {expected} gathered elements, got "
                         f"{gathered.size}")
    return {s.index: gathered[s.offset:s.offset + s.size].reshape(s.shape)
            for s in bucket.segments}


def segment_sizes(bucket: BucketSlices) -> Sequence[int]:
    """Sizes to split the gathered vector into: every variable, then the padding."""
    return [s.size for s in bucket.segments] + [bucket.padding]
