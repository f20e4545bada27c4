"""The plan for a variable list: built once (and cached), after checking that every rank holds
the same variables.

The strategies (``hvd_overlap.core.choice``) build pure plans; this is where they
meet TensorFlow variables and gradients: which variables have a gradient on the loss path,
which gradients are sparse, and one small collective that compares the models across ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_overlap.adapters import keras_api
from hvd_overlap.comm import collectives
from hvd_overlap.comm.methods import Grad
from hvd_overlap.core.plan import Plan, VarSpec, layer_of
from hvd_overlap.core.strategy import Strategy


def var_specs(variables: Sequence[tf.Variable], grads: Sequence[Grad] | None = None,
              sparse_as_dense: bool = False, exchangeable: frozenset = frozenset()
              ) -> list[VarSpec]:
    """The plan's view of variables, in the order given (forward order for Keras models);
    with ``grads``, which have none (off the loss path) and which are sparse;
    ``exchangeable``: refs of the dense kernels the factor exchange can carry."""
    grads = list(grads) if grads is not None else [0] * len(variables)
    names = [keras_api.var_name(v) for v in variables]
    dense = [keras_api.var_key(v) in exchangeable for v in variables]
    return [
        VarSpec(index=i, name=name, shape=tuple(int(d) for d in v.shape),
                dtype=tf.as_dtype(v.dtype).base_dtype.name, layer=layer_of(name),
                # (an exchanged kernel's gradient is its rank's rows: IndexedSlices, not sparse)
                sparse=isinstance(g, tf.IndexedSlices) and not (sparse_as_dense or dense[i]),
                has_grad=g is not None, exchangeable=dense[i])
        for i, (v, g, name) in enumerate(zip(variables, grads, names, strict=True))
    ]


def check_same_on_all_ranks(specs: Sequence[VarSpec]) -> None:
    """Raise the same error on every rank if ranks hold different trainable variables.

    One small allgather, issued eagerly while the first train step is traced, before any
    gradient collective: a model that differs across ranks cannot leave a rank waiting.
    """
    if hvd.size() == 1:
        return
    mine = [(s.name, list(s.shape), s.dtype, s.sparse, s.has_grad, s.exchangeable)
            for s in specs]
    with tf.init_scope():
        everyone = collectives.allgather_object(mine, "hvd_overlap.model_check")
    for rank, theirs in enumerate(everyone):
        if theirs == everyone[0]:
            continue
        detail = f"rank 0 has {len(everyone[0])} trainable variables, rank {rank} has {len(theirs)}"
        for a, b in zip(everyone[0], theirs, strict=False):
            if a != b:
                detail = f"first difference: rank 0 {a} vs rank {rank} {b}"
                break
        raise ValueError(
            "the model differs across ranks (" + detail + "). Every rank must build the same "
            "model, with the same layers in the same order, before training."
        )


class Planner:
    """A strategy on ``ranks`` ranks, and the plans it built, keyed by the variable list (and
    which gradients exist, and which are sparse)."""

    def __init__(self, strategy: Strategy, ranks: int, sparse_as_dense: bool):
        self.strategy = strategy
        self.ranks = ranks
        self.sparse_as_dense = sparse_as_dense
        self._plans: dict[tuple, Plan] = {}
        self._checked: set[tuple] = set()
        self.last_plan: Plan | None = None
        self.exchangeable: frozenset = frozenset()  # refs of kernels the exchange can carry

    def plan_for(self, variables: Sequence[tf.Variable], grads: Sequence[Grad] | None = None,
                 check_ranks: bool = True) -> Plan:
        """The plan of these variables; with ``check_ranks`` (the train step) the model is
        compared across ranks first, once per variable list, even if the plan was built before
        (``opt.build_plan``) without the check."""
        specs = var_specs(variables, grads, self.sparse_as_dense, self.exchangeable)
        key = tuple(keras_api.var_key(v) for v in variables) + \
            tuple((s.sparse, s.has_grad, s.exchangeable) for s in specs)
        if check_ranks and key not in self._checked:
            check_same_on_all_ranks(specs)
            self._checked.add(key)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self.build(specs)
        self.last_plan = plan
        return plan

    def build(self, specs: Sequence[VarSpec]) -> Plan:
        """The strategy's plan of ``specs`` (not cached: ``plan_for`` caches)."""
        return self.strategy.build_plan(specs, self.ranks)

    def replace_plan(self, old: Plan, new: Plan) -> None:
        """Put ``new`` where ``old`` was cached (a decision made after the first step)."""
        for key, plan in self._plans.items():
            if plan is old:
                self._plans[key] = new
        if self.last_plan is old:
            self.last_plan = new
