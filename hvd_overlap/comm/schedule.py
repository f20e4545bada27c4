"""When buckets are issued: the two phases of a step, read from the plan.

- **Backward phase** (``issue_backward``): inside the train step, each bucket's collective
  depends only on its own gradients, so TensorFlow starts it while backprop of the layers below
  runs (overlap by dataflow). With ``ordered`` each bucket also waits for the previous one, so
  they go out one by one in plan order. A plan fused by Horovod (the stock path) is handed to
  the method in one call: Horovod itself orders and fuses it.
- **Forward phase** (``issue_forward``): at the start of the next step, the deferred buckets
  one after the other in forward order (input side first), each under a flag that says whether
  the previous step left anything pending -- a variable equal on every rank, so every rank takes
  the same branch and issues the same collectives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import tensorflow as tf

from hvd_overlap.comm.methods import Grad, GradientMethod
from hvd_overlap.core import mutants
from hvd_overlap.core.plan import BACKWARD, Plan


def issue_backward(plan: Plan, method: GradientMethod, grads: Sequence[Grad],
                   variables: Sequence[tf.Variable], ordered: bool,
                   phases: tuple[str, ...] = (BACKWARD,)) -> list[Grad]:
    """Reduce the plan's buckets of ``phases`` in plan order; return the gradients with those
    buckets' replaced by their global values (the others stay local)."""
    buckets = [b for b in plan.buckets if b.phase in phases]
    out: list[Grad] = list(grads)
    if plan.fused_by_horovod:
        for i, g in method.reduce_all(buckets, grads, variables).items():
            out[i] = g
        return out
    previous: list[tf.Tensor] = []
    for bucket in buckets:
        with tf.control_dependencies(previous if ordered else []):
            reduced = method.reduce(bucket, grads, variables)
        for i, g in reduced.items():
            out[i] = g
        previous = tensors_of(reduced.values()) or previous
    return out


def issue_forward(runs: Sequence[Callable[[], object]], pending: tf.Variable) -> tf.Tensor:
    """Run each function (one deferred bucket, forward order) after the previous one, only if
    ``pending``; then clear ``pending`` (the returned op)."""
    previous: list = []
    unordered = mutants.off("gather_order")
    for run in reversed(runs) if unordered else runs:
        previous = [] if unordered else previous
        def guarded(run=run):
            run()
            return tf.constant(True)
        with tf.control_dependencies(previous):
            previous = [tf.cond(pending, guarded, lambda: tf.constant(False))]
    with tf.control_dependencies(previous):
        return pending.assign(False)


def chain(runs: Sequence[Callable[[], object]]) -> None:
    """Run each function after the previous one (the forward phase when nothing is pending
    yet: the first traced step brings every bucket in at once, in forward order)."""
    previous: list = []
    for run in runs:
        with tf.control_dependencies(previous):
            previous = [run()]


def tensors_of(grads) -> list[tf.Tensor]:
    """The tensors of ``grads`` (an ``IndexedSlices``' values and indices; None left out)."""
    out: list[tf.Tensor] = []
    for g in grads:
        if isinstance(g, tf.IndexedSlices):
            out += [g.values, g.indices]
        elif g is not None:
            out.append(g)
    return out
