"""``backward_passes_per_step > 1``: local accumulation, then one reduction and one update.

As Horovod's ``LocalGradientAggregationHelper``, on top of the immediate mode: its reduction
runs once every ``backward_passes_per_step`` passes, on the summed gradients; ``iterations`` still
advances on every pass, as in Horovod.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hvd_overlap.comm.methods import Grad
from hvd_overlap.keras.executors.immediate import ImmediateExecutor
from hvd_overlap.keras.state_scope import plugin_state


class AccumulatingExecutor(ImmediateExecutor):
    """Sums ``passes`` local gradients, then reduces and applies them as the immediate mode."""

    def __init__(self, *args: Any, passes: int, average: bool, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.passes = passes
        self.average = average
        self.accumulators: dict[Any, tf.Variable] = {}
        self.counter: tf.Variable | None = None

    def _init(self, grads: list[Grad], variables: list[tf.Variable]) -> None:
        """The pass counter and one accumulator per variable with a gradient (first trace)."""
        with plugin_state():
            if self.counter is None:
                self.counter = tf.Variable(0, dtype=tf.int64, trainable=False,
                                           name="hvd_overlap_pass_counter")
            for g, v in zip(grads, variables, strict=True):
                if g is not None and v.ref() not in self.accumulators:
                    self.accumulators[v.ref()] = tf.Variable(
                        tf.zeros(v.shape, g.dtype), trainable=False,
                        name="hvd_overlap_acc_" + v.name.split(":")[0].replace("/", "_"))

    def reduce_now(self, grads: list[Grad], variables: list[tf.Variable]) -> list[Grad]:
        raise ValueError(
            "backward_passes_per_step > 1 sums local gradients over several passes before "
            "reducing them, so compute_gradients cannot return global gradients (it is called "
            "directly by your code or by the LossScaleOptimizer of mixed precision). Call "
            "opt.minimize / model.fit without mixed precision, or accumulate yourself "
            "(hvd_overlap.growth.data.enable_gradient_accumulation) with "
            "backward_passes_per_step=1")

    def apply_gradients(self, grads: list[Grad], variables: list[tf.Variable],
                        args: tuple, kwargs: dict, reduced: bool = False) -> Any:
        grads = [_densify(g, self.settings.sparse_as_dense) for g in grads]
        self._init(grads, variables)
        accs = [self.accumulators[v.ref()] if g is not None else None
                for g, v in zip(grads, variables, strict=True)]
        updates = [a.assign_add(g) for a, g in zip(accs, grads, strict=True) if g is not None]
        with tf.control_dependencies(updates):
            count = self.counter.assign_add(1)

        def communicate_and_apply():
            div = float(self.passes) if self.average else 1.0
            summed = [a.read_value() / div if a is not None else None for a in accs]
            reduced = self.reduce(summed, variables)
            self.plain.apply_gradients(list(zip(reduced, variables, strict=True)),
                                       *args, **kwargs)
            with tf.control_dependencies([r for r in reduced if r is not None]):
                resets = [a.assign(tf.zeros_like(a)) for a in accs if a is not None]
                resets.append(self.counter.assign(0))
            return tf.group(resets)

        def just_count():
            return tf.group(self.opt.iterations.assign_add(1))

        return tf.cond(tf.equal(count, self.passes), communicate_and_apply, just_count)


def _densify(g: Grad, sparse_as_dense: bool) -> Grad:
    if isinstance(g, tf.IndexedSlices):
        if not sparse_as_dense:
            raise ValueError("sparse gradients (IndexedSlices) with backward_passes_per_step > 1 "
                             "need sparse_as_dense=True, as in Horovod")
        return tf.convert_to_tensor(g)
    return g
