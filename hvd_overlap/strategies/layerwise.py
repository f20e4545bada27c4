"""Technique 1: layer-ordered buckets, each one collective issued as soon as its gradients exist.

Inside the train-step graph every bucket's collective depends only on its own gradients, so
TensorFlow starts it while backprop of the layers below is still running (overlap by dataflow).
Readiness alone does not fix the order (two ranks may finish gradients in different orders, and
Horovod runs whichever is ready on all ranks first), so with ``ordered=True`` each bucket's
collective also waits for the previous bucket's: the buckets go out one by one in plan order.
That costs time when one gradient is late (it holds back every later bucket), so it is off by
default; the deferred phase is always issued in forward order.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from hvd_overlap.collectives import allreduce_bucket, allreduce_sparse, scale_factors
from hvd_overlap.plan import BACKWARD, Bucket, Plan, VarSpec, build_layerwise_plan
from hvd_overlap.strategies.base import Grad, Strategy


class LayerwiseStrategy(Strategy):
    """Buckets in backprop order, cut by ``bucket_bytes``; one grouped allreduce per bucket."""

    name = "layerwise"

    def build_plan(self, specs: Sequence[VarSpec]) -> Plan:
        return build_layerwise_plan(specs, self.settings.bucket_bytes, strategy=self.name)

    def reduce(self, grads: Sequence[Grad], variables: Sequence[tf.Variable], plan: Plan,
               phases: tuple[str, ...] = (BACKWARD,)) -> list[Grad]:
        """Reduce the buckets of ``phases`` (in plan order); other gradients stay local."""
        s = self.settings
        out: list[Grad] = list(grads)
        previous: list[tf.Tensor] = []
        for bucket in plan.buckets:
            if bucket.phase not in phases:
                continue
            with tf.device(s.device_dense), \
                    tf.control_dependencies(previous if s.ordered else []):
                done = self.reduce_bucket(bucket, grads, out)
            previous = done or previous
        return out

    def reduce_bucket(self, bucket: Bucket, grads: Sequence[Grad], out: list[Grad]) -> list:
        """Issue one bucket's collective(s); write results into ``out``; return them."""
        s = self.settings
        pre, post = scale_factors(s.op, s.gradient_predivide_factor)
        dense: list[tuple[int, tf.Tensor]] = []
        done: list[tf.Tensor] = []
        for v in bucket.variables:
            g = grads[v.index]
            if g is None:  # not on the loss path: left alone, as stock Horovod does
                continue
            if isinstance(g, tf.IndexedSlices):
                if not s.sparse_as_dense:
                    r = allreduce_sparse(g, f"{s.name}.b{bucket.index}.v{v.index}", op=s.op)
                    out[v.index] = r
                    done += [r.values, r.indices]
                    continue
                g = tf.convert_to_tensor(g)
            dense.append((v.index, g))
        reduced = allreduce_bucket(
            [g for _, g in dense], f"{s.name}.b{bucket.index}", op=s.op,
            compression=s.compression, prescale_factor=pre, postscale_factor=post)
        for (i, _), r in zip(dense, reduced, strict=True):
            out[i] = r
        return done + reduced
