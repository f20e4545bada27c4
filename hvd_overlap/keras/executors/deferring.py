"""``deferred`` and ``hybrid``: buckets of the plan's forward phase are reduced and applied at
the start of the next step, in forward order, each layer's forward waiting only for its own
bucket's update; the backward-phase buckets are reduced and applied in this step.

Step t keeps the local gradients of the forward-phase buckets in buffers and sets ``pending``.
The buffers start at zero on every rank and are never read before being written, so they need
no broadcast.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hvd_overlap.adapters import keras_api
from hvd_overlap.comm.methods import Grad
from hvd_overlap.comm.schedule import issue_backward, issue_forward
from hvd_overlap.comm.state_scope import plugin_state
from hvd_overlap.core.plan import BACKWARD, FORWARD, Plan
from hvd_overlap.keras.executors.forward_phase import NextStepExecutor
from hvd_overlap.keras.executors.step_state import Gradients, Stage


class DeferringExecutor(NextStepExecutor):
    """Backward-phase buckets now; forward-phase buckets from buffers, in the next step."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.variables: list[tf.Variable] = []     # the variable list the plan indexes
        self.buffers: dict[int, tf.Variable] = {}  # variable index -> local gradient of step t
        self.step_hypers: list[tuple[tf.Variable, tf.Variable]] = []  # (hyper, step t's value)

    def _init(self, plan: Plan, variables: list[tf.Variable]) -> None:
        """A buffer for every forward-phase variable with a gradient, and the pending flag."""
        with plugin_state():
            for bucket in plan.phase_buckets(FORWARD):
                for v in bucket.variables:
                    if v.has_grad:
                        var = variables[v.index]
                        self.buffers[v.index] = tf.Variable(
                            tf.zeros(var.shape, var.dtype), trainable=False,
                            name="hvd_overlap_grad_" + v.name.split(":")[0].replace("/", "_"))
            # made here, at the first trace (a tf.function may create variables only then)
            self.step_hypers = [
                (h, tf.Variable(tf.zeros([], h.dtype), trainable=False,
                                name=f"hvd_overlap_step_{h.name.split(':')[0].split('/')[-1]}"))
                for h in keras_api.hyper_variables(self.opt)]
        self.phase.create()
        self.plan, self.variables = plan, list(variables)

    def apply_gradients(self, grads: list[Grad], variables: list[tf.Variable],
                        args: tuple, kwargs: dict,
                        gradients: Gradients = Gradients.LOCAL) -> Any:
        local: list = []
        if gradients is Gradients.LOCAL:  # (global: compute_gradients kept and scaled them)
            grads, variables, local = self.split_local(grads, variables)
        ordered = self.settings.ordered
        if gradients is Gradients.GLOBAL or not self.phase.can_defer():
            # the whole update now: global already (compute_gradients), or no next-step phase
            with tf.control_dependencies(self.phase.assert_not_pending()):
                if gradients is Gradients.LOCAL:
                    grads = issue_backward(self.planner.plan_for(variables, grads), self.method,
                                           grads, variables, ordered, phases=(BACKWARD, FORWARD))
                return self.plain.apply_gradients(
                    list(zip(grads, variables, strict=True)) + local, *args, **kwargs)
        plan = self.planner.plan_for(variables, grads)
        if self.phase.stage is not Stage.UNPLANNED and plan is not self.plan:
            raise ValueError("a deferring DistributedOptimizer serves one model: create one "
                             "optimizer per model (the variable list changed)")
        if self.phase.stage is Stage.UNPLANNED:
            # First trace: the plan was unknown when the pre-forward phase was traced, so this
            # graph reduces every bucket now (exact); the next trace defers.
            self._init(plan, variables)
            whole = issue_backward(plan, self.method, grads, variables, ordered,
                                   phases=(BACKWARD, FORWARD))
            return self.plain.apply_gradients(
                list(zip(whole, variables, strict=True)) + local, *args, **kwargs)
        now = issue_backward(plan, self.method, grads, variables, ordered)
        backward = sorted(v.index for b in plan.phase_buckets(BACKWARD) for v in b.variables)
        pairs = [(now[i], variables[i]) for i in backward if grads[i] is not None] + local
        self.apply_part(pairs, count=not self.buffers)  # nothing deferred: count now
        for i, buf in self.buffers.items():
            buf.assign(tf.convert_to_tensor(grads[i]))
        if self.buffers:
            self._remember_hypers()
            self.phase.pending.assign(True)
        return self.opt.iterations

    def _remember_hypers(self) -> None:
        """Keep the hyperparameters this step was given (learning rate; for legacy optimizers
        also momentum, betas...): a callback may set others before the next step
        (``on_train_batch_begin``: Horovod's warm-up, ``BatchSizeScheduler``), and the deferred
        part of this step's update must be applied with this step's. (A LearningRateSchedule
        reads ``iterations``, which the deferral keeps right.)"""
        for hyper, kept in self.step_hypers:
            kept.assign(keras_api.read_value(hyper))

    def pre_forward(self, landing: bool = False) -> None:
        if self.phase.stage is Stage.UNPLANNED:
            return  # nothing traced yet, so nothing can be pending in this graph
        # only buckets with a buffered gradient: one whose variables all lack a gradient has
        # nothing to bring in (and must not count the step a second time)
        forward = [b for b in self.plan.phase_buckets(FORWARD)
                   if any(v.index in self.buffers for v in b.variables)]
        last = len(forward) - 1
        runs = [lambda b=b, k=k: self._bring_in(b, k == last) for k, b in enumerate(forward)]
        if not self.step_hypers:
            issue_forward(runs, self.phase.pending)
            return
        # the deferred buckets are step t's update: applied with step t's hyperparameters, then
        # the ones this step was given are put back
        now = [keras_api.read_value(h) for h, _ in self.step_hypers]
        with tf.control_dependencies(now):
            swapped = [h.assign(tf.where(self.phase.pending, kept, v))
                       for (h, kept), v in zip(self.step_hypers, now, strict=True)]
        with tf.control_dependencies(swapped):
            done = issue_forward(runs, self.phase.pending)
        with tf.control_dependencies([done]):
            for (h, _), v in zip(self.step_hypers, now, strict=True):
                h.assign(v)

    def _bring_in(self, bucket, last: bool) -> None:
        """Reduce one deferred bucket from its buffers and apply it (the last one counts the
        step)."""
        grads: list[Grad] = [None] * len(self.variables)
        for v in bucket.variables:
            if v.index in self.buffers:
                grads[v.index] = self.buffers[v.index].read_value()
        got = self.method.reduce(bucket, grads, self.variables)
        self.apply_part([(got[v.index], self.variables[v.index]) for v in bucket.variables
                         if v.index in got], count=last)
