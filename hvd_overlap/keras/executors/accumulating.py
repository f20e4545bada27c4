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

from hvd_overlap.comm.accumulation import GradientSums
from hvd_overlap.comm.methods import Grad
from hvd_overlap.keras.executors.immediate import ImmediateExecutor
from hvd_overlap.keras.executors.step_state import Gradients


class AccumulatingExecutor(ImmediateExecutor):
    """Sums ``passes`` local gradients, then reduces and applies them as the immediate mode."""

    def __init__(self, *args: Any, passes: int, average: bool, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.passes = passes
        self.average = average
        #: the sums across optimizer calls (the accumulator growth's micro-batches use too)
        self.sums = GradientSums()

    @property
    def aggregation(self) -> AccumulatingExecutor:
        return self

    @property
    def counter(self) -> tf.Variable | None:
        """Passes summed since the last reduction (Horovod's ``_agg_helper.counter``)."""
        return self.sums.count

    def _reduce_sums(self, accs: list[tf.Variable | None], variables: list[tf.Variable]
                     ) -> tuple[list[Grad], tf.Operation]:
        """The global (averaged) sums, and the op that restarts the sums and the count after
        they were read."""
        reduced = self.reduce(self.sums.read(accs, self.passes if self.average else None),
                              variables)
        return reduced, self.sums.reset(accs, after=reduced)

    def reduce_now(self, grads: list[Grad], variables: list[tf.Variable]) -> list[Grad]:
        if tf.keras.mixed_precision.global_policy().compute_dtype == "float16":
            raise ValueError(
                "mixed precision with backward_passes_per_step > 1: the LossScaleOptimizer "
                "would decide to skip a pass and change its loss scale from each rank's local "
                "gradients, so the ranks' scales and weights would drift apart (stock Horovod "
                "too). Use backward_passes_per_step=1, and accumulate before the optimizer "
                "(hvd_overlap.growth.data.enable_gradient_accumulation) if you need to")
        grads, accs, count = self.sums.add(grads, variables, self.settings.sparse_as_dense)
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

        _, accs, count = self.sums.add(grads, variables, self.settings.sparse_as_dense)

        def communicate_and_apply():
            sums, restart = self._reduce_sums(accs, variables)
            self.plain.apply_gradients(list(zip(sums, variables, strict=True)),
                                       *args, **kwargs)
            return restart

        return tf.cond(tf.equal(count, self.passes), communicate_and_apply, count_pass)
