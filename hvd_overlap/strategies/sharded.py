"""Technique 2: reduce-scatter under backprop, update one's own slice, all-gather in forward order.

Per bucket (the layerwise plan's buckets), the flattened gradient is reduce-scattered as soon as
it exists, so each rank holds the global average of its ``1/P`` slice; the optimizer updates only
that slice (its slots exist only for it); the updated parameter slices are all-gathered at the
start of the next step, input side first, each layer's forward waiting only for its own bucket.
The bytes on the wire equal one ring allreduce. The partition is ``hvd_overlap.sharding``; the
optimizer side (slices, slots, checkpoints) is ``hvd_overlap.keras.sharded``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import tensorflow as tf

from hvd_overlap.collectives import all_gather, reduce_scatter, scale_factors
from hvd_overlap.plan import (
    Plan,
    VarSpec,
    build_layerwise_plan,
    half_the_bytes,
    sharded_collective,
)
from hvd_overlap.sharding import BucketShards, segment_sizes
from hvd_overlap.strategies.base import Grad, Strategy


class ShardedStrategy(Strategy):
    """Layerwise buckets, each reduce-scattered in backprop and all-gathered in the next forward
    (with ``defer=k``: only the ``k`` input-side buckets; the others right after their update)."""

    name = "sharded"
    defers = True
    shards = True

    def default_defer(self, plan: Plan) -> int:
        """How many input-side buckets wait for the next forward to be all-gathered: all."""
        return -1

    def build_plan(self, specs: Sequence[VarSpec]) -> Plan:
        defer = self.settings.defer
        if defer is None:
            defer = self.default_defer(build_layerwise_plan(specs, self.settings.bucket_bytes))
        plan = build_layerwise_plan(specs, self.settings.bucket_bytes, self.name, defer=defer)
        gather = self.settings.gather_with
        return replace(plan, buckets=tuple(replace(b, collective=sharded_collective(gather))
                                           for b in plan.buckets),
                       notes=("sharded: every bucket is reduce-scattered during backprop and "
                              "each rank updates its 1/P slice; phase says when the updated "
                              "slices are all-gathered: 'backward' right after the update, in "
                              "this step; 'forward' at the start of the next step, in forward "
                              "order (input side first)",
                              f"the slices are gathered with {gather}"
                              + (" (each rank's slice repeated P times: the all-gather's "
                                 "result and bytes)" if gather == "alltoall" else "")))


    def reduce(self, grads: Sequence[Grad], variables: Sequence[tf.Variable],
               plan: Plan) -> list[Grad]:
        raise TypeError("the sharded strategy reduces gradients to slices, not whole gradients; "
                        "its DistributedOptimizer applies them (see reduce_scatter)")

    def reduce_scatter(self, bucket: BucketShards, grads: Sequence[Grad]) -> tf.Tensor:
        """This rank's slice of the bucket's averaged (or summed) flat gradient."""
        s = self.settings
        parts = [tf.reshape(tf.convert_to_tensor(grads[seg.index]), [-1])
                 for seg in bucket.segments]
        if bucket.padding:
            parts.append(tf.zeros([bucket.padding], parts[0].dtype))
        flat = parts[0] if len(parts) == 1 else tf.concat(parts, 0)
        pre, post = scale_factors(s.op, s.gradient_predivide_factor)
        with tf.device(s.device_dense):
            return reduce_scatter(flat, f"{s.name}.b{bucket.bucket}.rs", op=s.op,
                                  compression=s.compression, prescale_factor=pre,
                                  postscale_factor=post)

    def all_gather(self, bucket: BucketShards, piece: tf.Tensor) -> list[tf.Tensor]:
        """Every variable of the bucket, whole, from each rank's slice (padding cut off)."""
        with tf.device(self.settings.device_dense):
            flat = all_gather(piece, f"{self.settings.name}.b{bucket.bucket}.ag",
                              self.settings.gather_with)
        pieces = tf.split(flat, segment_sizes(bucket), 0)
        return [tf.reshape(p, seg.shape) for p, seg in zip(pieces, bucket.segments, strict=False)]


class ShardedHybridStrategy(ShardedStrategy):
    """``sharded`` whose output-side buckets are all-gathered during backprop, right after their
    update; only the input-side ones holding at most half the bytes (``defer=k`` to choose)
    wait for the next forward, which is shorter than backprop."""

    name = "sharded_hybrid"

    def default_defer(self, plan: Plan) -> int:
        return half_the_bytes([b.nbytes for b in plan.buckets])
