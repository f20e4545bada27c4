"""State of the deferred (cross-iteration) phase: gradient buffers, a pending flag, and which
traced graphs contain the pre-forward phase.

Step t stores the local gradients of the FORWARD-phase buckets here and sets ``pending``; the
pre-forward phase of step t+1 (or a flush) reduces them bucket by bucket in forward order and
applies the updates. ``pending`` is a variable, equal on every rank, so every rank takes the same
branch and issues the same collectives. The buffers start at zero on every rank and are never
read before being written, so they need no broadcast.
"""

from __future__ import annotations

import weakref

import tensorflow as tf

from hvd_overlap.plan import FORWARD, Plan


class Deferral:
    """Plugin-owned buffers and flags for one model's deferred buckets."""

    def __init__(self) -> None:
        self.plan: Plan | None = None
        self.variables: list[tf.Variable] = []  # the variable list the plan indexes
        self.buffers: dict[int, tf.Variable] = {}  # variable index in the plan -> buffer
        self.pending: tf.Variable | None = None
        self.needs_retrace = False
        self.flush_fn = None  # pre_forward as a tf.function, made at the first flush
        self._graphs: weakref.WeakSet = weakref.WeakSet()

    def mark_pre_forward(self) -> None:
        """Record that the graph being built (or eager) runs the pre-forward phase."""
        self._graphs.add(tf.compat.v1.get_default_graph())

    def has_pre_forward(self) -> bool:
        return tf.compat.v1.get_default_graph() in self._graphs

    def create(self, plan: Plan, variables, buffers: bool = True) -> None:
        """The pending flag and (with ``buffers``) a gradient buffer for every FORWARD-phase
        variable that has a gradient (first trace only)."""
        with tf.init_scope():
            self.pending = tf.Variable(False, trainable=False, name="hvd_overlap_pending")
            for bucket in plan.phase_buckets(FORWARD) if buffers else ():
                for v in bucket.variables:
                    if v.has_grad:
                        var = variables[v.index]
                        self.buffers[v.index] = tf.Variable(
                            tf.zeros(var.shape, var.dtype), trainable=False,
                            name="hvd_overlap_grad_" + v.name.split(":")[0].replace("/", "_"))
        self.plan = plan
        self.variables = list(variables)
        self.needs_retrace = True
