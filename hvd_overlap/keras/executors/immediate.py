"""``horovod`` and ``layerwise``: every bucket reduced during backprop, then one update."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hvd_overlap.comm.methods import Grad
from hvd_overlap.comm.schedule import issue_backward
from hvd_overlap.keras.executors.base import Executor
from hvd_overlap.keras.executors.step_state import Gradients


class ImmediateExecutor(Executor):
    """Reduce this step's gradients bucket by bucket as they appear; apply them at once."""

    def reduce(self, grads: list[Grad], variables: list[tf.Variable]) -> list[Grad]:
        """Global gradients of this step (the backward phase of the plan; local variables'
        stay on this rank)."""
        def reduce(grads: list[Grad], variables: list[tf.Variable]) -> list[Grad]:
            plan = self.planner.plan_for(variables, grads)
            return issue_backward(plan, self.method, grads, variables, self.settings.ordered)
        return self.with_local(grads, variables, reduce)

    def apply_gradients(self, grads: list[Grad], variables: list[tf.Variable],
                        args: tuple, kwargs: dict,
                        gradients: Gradients = Gradients.LOCAL) -> Any:
        if gradients is Gradients.LOCAL:
            grads = self.reduce(grads, variables)
        return self.plain.apply_gradients(list(zip(grads, variables, strict=True)),
                                          *args, **kwargs)
