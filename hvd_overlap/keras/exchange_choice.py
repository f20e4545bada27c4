"""The dense factor exchange as a piece the sharded update composes: which kernels it carries
(decided after the first step, from the batch seen), how their forward gets its weights (an
online check between the forward on the rows and the gather), and what the sharded executor
asks of it. The patched layers themselves are ``hvd_overlap.keras.exchange``; the numbers are
``hvd_overlap.core.exchange``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_overlap.adapters import keras_api
from hvd_overlap.comm import collectives
from hvd_overlap.comm.link import agree
from hvd_overlap.comm.methods import ReduceScatterGather
from hvd_overlap.core.exchange import (
    AUTO,
    GATHER,
    NEVER,
    ROWS,
    DenseShape,
    label_exchange,
    row_range,
)
from hvd_overlap.core.plan import EXCHANGE, EXCHANGE_ROWS, EXCHANGES, Plan
from hvd_overlap.core.sharding import ShardLayout
from hvd_overlap.core.trials import Trials
from hvd_overlap.keras.exchange import ExchangedDense, ReadRows, exchangeable_layers

#: a strategy's ``label``: the plan once each kernel's use (by variable index) is known
Label = Callable[[Plan, Mapping[int, DenseShape], int], Plan]


class DenseExchanges:
    """A sharded executor's patched layers and the decision which kernels the exchange
    carries (``exchange``: ``never``, ``auto`` or ``always``) and how their forward gets its
    weights (``forward``: ``auto``, ``gather`` or ``rows``).

    With ``forward="auto"``, where the cost model puts some kernels' forward on the rows, an
    online check follows the decision: the steps after it run that choice, then the same steps
    with every exchanged kernel's rows gathered, and the faster stays (``Trials``; the rows'
    critical-path collectives can cost more than the gather they save where compute hides
    the gather anyway)."""

    #: tests: the way the online check keeps, whatever it measures (``rows`` or ``gather``)
    forced_forward: str | None = None

    def __init__(self, mode: str, settings: Any, in_train_step: Callable[[], bool],
                 read_rows: ReadRows | None = None, forward: str = AUTO,
                 label: Label | None = None):
        self.mode = mode
        self.read_rows = read_rows  # a kernel on the rows -> this rank's current rows of it
        self.forward = forward
        #: the plan with the kernels' choice made (the strategy's ``label``)
        self.label: Label = label or (lambda plan, shapes, ranks: label_exchange(
            plan, shapes, mode, ranks, forward))
        self.settings = settings
        self.in_train_step = in_train_step
        self.layers: list[ExchangedDense] = []
        self.decided = False
        self.trial: Trials | None = None
        self._plans: dict[str, Plan] = {}          # the decided plan per forward way
        self._rows: dict[int, tuple[int, int]] = {}  # exchanged kernel index -> its rows
        self._keep: set[int] = set()               # the cost model's kernels on the rows
        self._found: dict[int, ExchangedDense] = {}
        self._attached = False
        self._switch: str | None = None  # the online check: the way to take next
        self._way = ROWS                 # ...and the way the current trace takes

    @property
    def settled(self) -> bool:
        """Nothing left to decide: no exchange (``never``, one rank, no eligible layer), or
        the decision and any online check made."""
        if self.mode == NEVER or hvd.size() < 2:
            return True
        if not self._attached:
            return False
        return not self.layers or (self.decided and (self.trial is None or
                                                     self.trial.settled))

    def attach(self, model: Any) -> None:
        """Patch the model's exchangeable layers (once; a no-op with ``exchange="never"`` or
        on one rank)."""
        if self.mode == NEVER or self.layers or hvd.size() < 2:
            return
        self._attached = True
        average = self.settings.op == hvd.Average
        self.layers = [ExchangedDense(layer, f"{self.settings.name}.xch{i}", average,
                                      self.in_train_step)
                       for i, layer in enumerate(exchangeable_layers(model))]

    def adopt(self, layers: list[ExchangedDense]) -> None:
        """Use layers patched before (``strategy="auto"`` patches them once, for every plan it
        may run) instead of patching the model again."""
        if self.mode != NEVER and hvd.size() > 1:
            self._attached, self.layers = True, list(layers)

    def deactivate(self) -> None:
        """The plan ends: every patched layer computes as Keras's again (after a flush)."""
        for x in self.layers:
            x.active, x.read_rows = False, None

    def kernel_refs(self) -> frozenset:
        """Refs of the patched layers' kernels (built ones)."""
        return frozenset(keras_api.var_key(x.kernel) for x in self.layers
                         if x.kernel is not None)

    def kept(self, variables: list[tf.Variable]) -> set[int]:
        """Positions in ``variables`` of the kernels whose forward runs on the rows (active;
        whether the graph being built used them so is ``carried``)."""
        refs = {keras_api.var_key(x.kernel) for x in self.layers if x.active and x.keep}
        return {i for i, v in enumerate(variables) if keras_api.var_key(v) in refs}

    def carried(self, variables: list[tf.Variable]) -> set[int]:
        """Positions in ``variables`` of the kernels whose gradient the step being traced
        computes by the exchange: those the layers declared (``ExchangedDense.declared``), in
        a train step (elsewhere the layers compute as Keras's)."""
        if not self.in_train_step():
            return set()
        refs = {keras_api.var_key(x.kernel) for x in self.layers if x.declared() is not None}
        return {i for i, v in enumerate(variables) if keras_api.var_key(v) in refs}

    def input_gradients(self) -> list[tf.Tensor]:
        """The input gradients of kernels on the rows that the graph being built sends back by
        all-to-all and uses (``ExchangedDense.input_gradients``)."""
        return [t for x in self.layers for t in x.input_gradients()]

    def decide(self, plan: Plan, variables: list[tf.Variable], layout: ShardLayout) -> Plan:
        """Which kernels the exchange carries, from the batch each layer saw in the first step
        (the largest over the ranks) and its calls per step; activates them with this rank's
        rows. Eager, on every rank at the same step (one small allreduce)."""
        key = keras_api.var_key
        by_ref = {key(x.kernel): x for x in self.layers if x.kernel is not None}
        found = {s.index: by_ref[key(variables[s.index])] for b in layout.buckets if b.rows
                 for s in b.segments if key(variables[s.index]) in by_ref}
        order = sorted(found)
        seen = tf.stack([found[i].batch.read_value() for i in order]) if order else \
            tf.zeros([0], tf.int64)
        batch = collectives.allreduce(seen, f"{self.settings.name}.xch.batch",
                                      op=hvd.Max).numpy()
        shapes = {i: DenseShape(*variables[i].shape.as_list(), batch=int(b),
                                calls=max(found[i].calls, 1))
                  for i, b in zip(order, batch, strict=True) if b > 0}
        labelled = self.label(plan, shapes, hvd.size())
        chosen = {v.index: b.collective for b in labelled.buckets if b.collective in EXCHANGES
                  for v in b.variables}
        self._found = found
        self._rows = {i: row_range(int(variables[i].shape[0]), hvd.size(), hvd.rank())
                      for i in chosen.keys() & found.keys()}
        self._keep = {i for i in self._rows if chosen[i] == EXCHANGE_ROWS}
        self._plans = {ROWS: labelled, GATHER: replace(labelled, buckets=tuple(
            replace(b, collective=EXCHANGE) if b.collective == EXCHANGE_ROWS else b
            for b in labelled.buckets))}
        self.decided = True
        if self.forward == AUTO and self._keep:
            self.trial = Trials((ROWS, GATHER), lambda v: agree(
                v, f"{self.settings.name}.xch.trial{len(self.trial.measured)}"),
                forced=self.forced_forward)
        return self.use(ROWS)

    def use(self, way: str) -> Plan:
        """Activate the exchanged kernels for ``way``: ``rows`` (the cost model's choice) or
        ``gather`` (every exchanged kernel's rows gathered); the plan that describes it."""
        for index, rows in self._rows.items():
            keep = way == ROWS and index in self._keep
            if keep and self.read_rows is None:
                raise RuntimeError("the forward on the rows needs read_rows (a sharded state)")
            self._found[index].activate(rows, self.read_rows if keep else None)
        plan = self._plans[way]
        if self.trial is not None and self.trial.settled:
            plan = replace(plan, notes=plan.notes + (
                f"exchange_forward='auto', measured: {self.trial.describe()}",))
        return plan

    def observe(self, seconds: float, usable: bool) -> None:
        """One train step (every rank): the online check may ask to switch the way (taken at
        the next ``after_step``); it keeps one way when it ends."""
        if self.trial is None or self.trial.settled:
            return
        switch = self.trial.observe(seconds, usable)
        way = self.trial.running if self.trial.settled else switch
        if way is not None:
            self._switch = way

    def after_step(self, first: bool, plan: Plan, state: Any,
                   flush: Callable[[], None]) -> tuple[list[Plan], bool]:
        """After a step (every rank): the plans to use from now on, in order, and whether the
        train function must be traced again for them. ``first``: the first step ran, so
        decide which kernels the exchange carries from the batch seen; and whenever the
        online check switches between the forward on the rows and the gather. ``flush`` lands
        what is pending first (a kernel whose forward moves to the rows takes them from the
        kernel as it is)."""
        plans: list[Plan] = []
        if first and self.layers:
            flush()
            plans.append(self.decide(plan, state.variables, state.layout))
        changed = False
        if self._switch is not None:
            way, self._switch = self._switch, None
            changed = way != self._way
            if changed:
                flush()  # every update lands before the forward changes how it reads
            plans.append(self.use(way))
            self._way = way
        return plans, changed

    def check_method(self, method: Any) -> None:
        """With the exchange, some buckets are dense kernels cut by whole rows
        (``BucketSlices.rows``, no padding): only a ``ReduceScatterGather`` (or a subclass) is
        known to send them."""
        if self.mode != NEVER and not isinstance(method, ReduceScatterGather):
            raise ValueError(
                f"with exchange={self.mode!r} some buckets are dense kernels cut by whole rows "
                "(bucket.rows, no padding); a bucket method must send them: subclass "
                "hvd_overlap.comm.methods.ReduceScatterGather, or pass exchange='never'")

    def refuse_global(self, variables: list[tf.Variable]) -> None:
        """``compute_gradients`` cannot return global gradients of the kernels it carries."""
        if self.carried(variables):
            raise ValueError(
                "compute_gradients returns global gradients, but the dense factor exchange "
                "gives each rank only its rows of a kernel's gradient: let apply_gradients "
                "receive the local gradients (model.fit, minimize, or tape.gradient then "
                "apply_gradients), or pass exchange='never' to DistributedOptimizer")
