"""``backward_passes_per_step > 1``: local accumulation, then one reduction and one update.

As Horovod's ``LocalGradientAggregationHelper``, on top of the immediate mode: its reduction
runs once every ``backward_passes_per_step`` passes, on the summed gradients; ``iterations`` still
advances on every pass, as in Horovod. ``compute_gradients`` called directly behaves as
Horovod's too: it adds this pass to the sums and returns the global sums on every N-th pass
(the local gradients on the others); the ``apply_gradients`` that follows applies only then.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hvd_overlap.comm.methods import Grad
from hvd_overlap.keras.executors.immediate import ImmediateExecutor
from hvd_overlap.keras.executors.step_state import Gradients
from hvd_overlap.keras.state_scope import plugin_state


class AccumulatingExecutor(ImmediateExecutor):
    """Sums ``passes`` local gradients, then reduces and applies them as the immediate mode."""

    def __init__(self, *args: Any, passes: int, average: bool, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.passes = passes
        self.average = average
        self.accumulators: dict[Any, tf.Variable] = {}
        #: passes summed since the last reduction (Horovod's ``_agg_helper.counter``)
        self.counter: tf.Variable | None = None

    @property
    def aggregation(self) -> AccumulatingExecutor:
        return self

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

    def _accumulate(self, grads: list[Grad], variables: list[tf.Variable]
                    ) -> tuple[list[Grad], list[tf.Variable | None], tf.Tensor]:
        """Add this pass's gradients to the sums: (dense gradients, accumulators, pass count)."""
        grads = [_densify(g, self.settings.sparse_as_dense) for g in grads]
        self._init(grads, variables)
        accs = [self.accumulators[v.ref()] if g is not None else None
                for g, v in zip(grads, variables, strict=True)]
        updates = [a.assign_add(g) for a, g in zip(accs, grads, strict=True) if g is not None]
        with tf.control_dependencies(updates):
            return grads, accs, self.counter.assign_add(1)

    def _reduce_sums(self, accs: list[tf.Variable | None], variables: list[tf.Variable]
                     ) -> tuple[list[Grad], tf.Operation]:
        """The global (averaged) sums, and the op that restarts the sums and the count after
        they were read."""
        div = float(self.passes) if self.average else 1.0
        summed = [a.read_value() / div if a is not None else None for a in accs]
        reduced = self.reduce(summed, variables)
        with tf.control_dependencies([r for r in reduced if r is not None]):
            resets = [a.assign(tf.zeros_like(a)) for a in accs if a is not None]
            resets.append(self.counter.assign(0))
        return reduced, tf.group(resets)

    def reduce_now(self, grads: list[Grad], variables: list[tf.Variable]) -> list[Grad]:
        if tf.keras.mixed_precision.global_policy().compute_dtype == "float16":
            raise ValueError(
                "mixed precision with backward_passes_per_step > 1: the LossScaleOptimizer "
                "would decide to skip a pass and change its loss scale from each rank's local "
                "gradients, so the ranks' scales and weights would drift apart (stock Horovod "
                "too). Use backward_passes_per_step=1, and accumulate before the optimizer "
                "(hvd_overlap.growth.data.enable_gradient_accumulation) if you need to")
        grads, accs, count = self._accumulate(grads, variables)
        present = [i for i, g in enumerate(grads) if g is not None]

        def global_sums():
            reduced, restart = self._reduce_sums(accs, variables)
            with tf.control_dependencies([restart]):
                return [tf.identity(reduced[i]) for i in present]

        def local():
            return [tf.identity(grads[i]) for i in present]

        got = tf.cond(tf.equal(count, self.passes), global_sums, local) if present else []
        out: list[Grad] = [None] * len(grads)
        for i, g in zip(present, got, strict=True):
            out[i] = g
        return out

    def apply_gradients(self, grads: list[Grad], variables: list[tf.Variable],
                        args: tuple, kwargs: dict,
                        gradients: Gradients = Gradients.LOCAL) -> Any:
        def count_pass():
            return tf.group(self.opt.iterations.assign_add(1))

        if gradients is Gradients.GLOBAL:  # from reduce_now: apply right after a reduction
            def apply():
                self.plain.apply_gradients(list(zip(grads, variables, strict=True)),
                                           *args, **kwargs)
                return tf.no_op()
            return tf.cond(tf.equal(self.counter, 0), apply, count_pass)

        _, accs, count = self._accumulate(grads, variables)

        def communicate_and_apply():
            sums, restart = self._reduce_sums(accs, variables)
            self.plain.apply_gradients(list(zip(sums, variables, strict=True)),
                                       *args, **kwargs)
            return restart

        return tf.cond(tf.equal(count, self.passes), communicate_and_apply, count_pass)


def _densify(g: Grad, sparse_as_dense: bool) -> Grad:
    if isinstance(g, tf.IndexedSlices):
        if not sparse_as_dense:
            raise ValueError("sparse gradients (IndexedSlices) with backward_passes_per_step > 1 "
                             "need sparse_as_dense=True, as in Horovod")
        return tf.convert_to_tensor(g)
    return g
