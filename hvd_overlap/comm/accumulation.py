"""The one gradient accumulator: running sums of local gradients, added pass by pass.

Two users, one mechanism. ``backward_passes_per_step > 1`` (``keras/executors/accumulating``)
adds one pass per optimizer call and reads, reduces and resets the sums every N-th call;
batch growth past the per-rank memory ceiling (``growth/data``) adds the micro-batches of one
train step, reads their average and resets before applying once. The sums live in variables
(one per variable with a gradient, made once in :func:`plugin_state`), added in pass order
from zero, so both paths sum the same floats in the same order.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hvd_overlap.adapters import keras_api
from hvd_overlap.comm.methods import Grad
from hvd_overlap.comm.state_scope import plugin_state

__all__ = ["GradientSums", "densify"]


def densify(g: Grad, sparse_as_dense: bool) -> Grad:
    """``g`` as a dense tensor: IndexedSlices cannot be summed in place, so they need
    ``sparse_as_dense`` (Horovod's rule for ``backward_passes_per_step``)."""
    if isinstance(g, tf.IndexedSlices):
        if not sparse_as_dense:
            raise ValueError("sparse gradients (IndexedSlices) with backward_passes_per_step > 1 "
                             "need sparse_as_dense=True, as in Horovod")
        return tf.convert_to_tensor(g)
    return g


class GradientSums:
    """Per-variable sums of local gradients and the count of passes added since the reset."""

    def __init__(self, prefix: str = "hvd_overlap_acc_",
                 count_name: str = "hvd_overlap_pass_counter"):
        self.prefix, self.count_name = prefix, count_name
        #: one sum per variable (by ``keras_api.var_key``) that has had a gradient
        self.sums: dict[Any, tf.Variable] = {}
        #: passes added since the last reset (Horovod's ``_agg_helper.counter``)
        self.count: tf.Variable | None = None

    def _init(self, grads: list[Grad], variables: list[tf.Variable]) -> None:
        """The count and one zero sum per variable with a gradient (at the first trace)."""
        with plugin_state():
            if self.count is None:
                self.count = tf.Variable(0, dtype=tf.int64, trainable=False,
                                         name=self.count_name)
            for g, v in zip(grads, variables, strict=True):
                if g is not None and keras_api.var_key(v) not in self.sums:
                    self.sums[keras_api.var_key(v)] = tf.Variable(
                        tf.zeros(v.shape, g.dtype), trainable=False,
                        name=self.prefix + v.name.split(":")[0].replace("/", "_"))

    def add(self, grads: list[Grad], variables: list[tf.Variable], sparse_as_dense: bool
            ) -> tuple[list[Grad], list[tf.Variable | None], tf.Tensor]:
        """Add one pass: (its dense gradients, the sums per variable or None, the pass count
        after it -- which waits for every addition)."""
        grads = [densify(g, sparse_as_dense) for g in grads]
        self._init(grads, variables)
        sums = [self.sums[keras_api.var_key(v)] if g is not None else None
                for g, v in zip(grads, variables, strict=True)]
        updates = [s.assign_add(g) for s, g in zip(sums, grads, strict=True) if g is not None]
        with tf.control_dependencies(updates):
            return grads, sums, self.count.assign_add(1)

    @staticmethod
    def read(sums: list[tf.Variable | None], passes: int | None = None) -> list[Grad]:
        """The sums, divided by ``passes`` (their average) unless it is None."""
        div = 1.0 if passes is None else float(passes)
        return [s.read_value() / div if s is not None else None for s in sums]

    def reset(self, sums: list[tf.Variable | None], after: list[Grad]) -> tf.Operation:
        """Zero the sums and the count, once ``after`` (what was computed from them) exists."""
        with tf.control_dependencies([a for a in after if a is not None]):
            resets = [s.assign(tf.zeros_like(s)) for s in sums if s is not None]
            resets.append(self.count.assign(0))
        return tf.group(resets)
