"""``sharded`` and ``sharded_hybrid``: reduce-scatter during backprop, update this rank's slice
of every bucket, all-gather the updated slices -- for the plan's backward-phase buckets, each
updated as soon as its reduce-scatter lands and gathered while backprop goes on; for its
forward-phase ones, at the start of the next step (forward order).
A dense kernel whose forward runs on the rows (``exchange_forward="rows"``) is not gathered in
train steps: its forward reads this rank's rows from the slice the optimizer updates
(``KeptRows``), and the whole kernel is gathered when the weights are read (``flush``, the end
of a landing step) and after any step whose forward read the kernel instead (a step the plugin
did not make: ``fit`` without ``OverlapCallback``, ``train_on_batch``).

The slices, their optimizer slots and the checkpoint layout are ``ShardedState``
(``hvd_overlap.keras.sharded_state``); the partition is ``hvd_overlap.core.sharding``.
"""

from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from hvd_overlap.adapters import keras_api
from hvd_overlap.comm.methods import Grad
from hvd_overlap.comm.schedule import chain, issue_forward
from hvd_overlap.core.plan import BACKWARD, FORWARD, Plan
from hvd_overlap.core.sharding import BucketSlices, ShardLayout, partition
from hvd_overlap.keras.exchange_choice import DenseExchanges
from hvd_overlap.keras.executors.forward_phase import NextStepExecutor
from hvd_overlap.keras.executors.step_state import Gradients, Stage, TrainLoop
from hvd_overlap.keras.kept_rows import KeptRows
from hvd_overlap.keras.sharded_slots import numpy_dtype, plain_order, stale_state_error
from hvd_overlap.keras.sharded_state import ShardedState


class ShardedExecutor(NextStepExecutor):
    """Each rank updates its slice; the slot variables exist for the slices only."""

    state_class: type[ShardedState] = ShardedState

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.state = self.state_class(self.settings.name, self.opt, self.plain.cls)
        self.rows = KeptRows(self.state)
        layers, forward = self.planner.strategy.exchange_modes()
        self.exchange = DenseExchanges(layers, self.settings, self.phase.installed,
                                       self.rows.read, forward, self.planner.strategy.label)

    def set_method(self, method: Any) -> None:
        """As any executor's, checked by the exchange first (``check_method``)."""
        self.exchange.check_method(method)
        super().set_method(method)

    def attach_model(self, model: Any, loop: TrainLoop = TrainLoop.CUSTOM) -> None:
        """With ``exchange``: patch the model's dense layers the exchange can carry (before the
        first step; later, the layout is fixed and nothing changes)."""
        if self.phase.stage is Stage.UNPLANNED:
            self.exchange.attach(model)
        self.rows.mark()  # (a fit starts: weights may have been loaded since)

    def apply_gradients(self, grads: list[Grad], variables: list[tf.Variable],
                        args: tuple, kwargs: dict,
                        gradients: Gradients = Gradients.LOCAL) -> Any:
        """Reduce-scatter every bucket (``Gradients.GLOBAL``: each rank takes its slice of the
        global ones), update this rank's slices; the forward-phase all-gathers run at the start
        of the next step -- or now, on the first trace (no pre-forward phase was set up yet)
        and in steps without that phase."""
        defer = self.phase.can_defer()
        first = self.phase.stage is Stage.UNPLANNED
        if first:
            self.planner.exchangeable = self.exchange.kernel_refs()
        plan = self.planner.plan_for(variables, grads)
        if first:
            _check_shardable(variables, plan)
            self.phase.create()
            self.state.create(partition(plan, hvd.size()), variables, self.plain.build)
            self.rows.create()
            self.plan = plan
        elif plan is not self.plan:
            raise ValueError("a sharded DistributedOptimizer serves one model: create one "
                             "optimizer per model (the variable list changed)")
        st = self.state
        checks = [] if defer else self.phase.assert_not_pending()
        # The exchange's input gradients are on backprop's critical path: the buckets ready
        # before them (the layers above) are reduce-scattered after them, so that Horovod,
        # which runs one collective at a time, sends those first.
        checks = list(checks) + self.exchange.input_gradients()
        given_global = gradients is Gradients.GLOBAL
        if given_global:
            grads = [g if g is None else tf.convert_to_tensor(g) for g in grads]
        pairs = {}
        carried = self.exchange.carried(st.variables)  # kernels whose rows came global
        kept = self.exchange.kept(st.variables)  # kernels whose forward runs on the rows
        rows_here = [b for b in st.layout.buckets if b.segments[0].index in kept & carried]
        for b in st.layout.buckets:
            with tf.control_dependencies(checks):
                if given_global or b.segments[0].index in carried:
                    piece = st.slice_of(b, grads)  # this rank's rows: global already
                else:
                    piece = self.method.scatter(b, grads)
            if b.segments[0].index not in kept:  # the current weights, exactly
                st.params[b.bucket].assign(st.slice_of(b, variables))
            elif b not in rows_here:  # kept, but its forward read the kernel here
                self.rows.refresh(variables[b.segments[0].index])
            pairs[b.bucket] = (piece, st.params[b.bucket])
        # Backward-phase buckets, output side first (the order their slices arrive in): each
        # updated as soon as reduce-scattered and all-gathered while backprop goes on. Updates
        # touch ``iterations`` so they run in this order; every part sees the step's number.
        now = [b for b in reversed(st.layout.buckets)
               if b.phase == BACKWARD and b.segments[0].index not in kept]
        for b in now:
            self.apply_part([pairs[b.bucket]], count=False)
            self._gather(b)
        self.apply_part([pairs[b.bucket] for b in st.layout.buckets if b not in now],
                        count=True)
        if rows_here:
            self.rows.read_done()
        for b in st.layout.buckets:  # (a kept kernel this graph did not use: gathered now)
            if b not in rows_here and b.segments[0].index in kept:
                self._gather(b)
        forward = [lambda b=b: self._gather(b) for b in self._deferred(landing=False)]
        if first or not defer:  # no pre-forward phase: every bucket now, in forward order
            chain(forward)
        elif forward or rows_here:
            self.phase.pending.assign(True)
        return self.opt.iterations

    def _deferred(self, landing: bool) -> list[BucketSlices]:
        """The buckets a pre-forward phase gathers, in forward order: the forward-phase ones
        except kernels whose forward runs on the rows -- those too when ``landing`` (the
        weights are about to be read)."""
        kept = self.exchange.kept(self.state.variables)
        return [b for b in self.state.layout.buckets
                if (landing if b.segments[0].index in kept else b.phase == FORWARD)]

    def _gather(self, bucket: BucketSlices) -> tf.Tensor:
        """All-gather one bucket's updated slices into the model's variables."""
        st = self.state
        whole = self.method.gather(bucket, st.params[bucket.bucket])
        for seg, value in zip(bucket.segments, whole, strict=True):
            st.variables[seg.index].assign(value)
        return tf.constant(True)

    def reduce_now(self, grads: list[Grad], variables: list[tf.Variable]) -> list[Grad]:
        self.exchange.refuse_global(variables)
        return super().reduce_now(grads, variables)

    def take_retrace(self) -> bool:
        """After the first step (every rank): with ``exchange``, decide which kernels it
        carries from the batch seen (agreed across ranks) and activate them, then retrace; and
        whenever the exchange's online check switches between the forward on the rows and the
        gather (every update landed first)."""
        asked = self.phase.take_retrace()  # (True: the first step ran, the plan is known)
        plans, changed = self.exchange.after_step(asked, self.plan, self.state, self.flush)
        for plan in plans:
            self._use(plan)
        return asked or changed

    def _use(self, plan: Plan) -> None:
        """Run ``plan`` from the next trace (every update landed); a layout it changes (a
        kernel the exchange declined, whole under ``shard="dense"``) is cut again."""
        self.planner.replace_plan(self.plan, plan)
        self.plan, layout = plan, partition(plan, hvd.size())
        if layout != self.state.layout:
            self.state.recut(layout, self.plain.build)
        self.rows.mark()
        self.phase.forget_flush()  # a flush traced before must gather the kept kernels now

    def observe_step(self, seconds: float, usable: bool = True) -> None:
        """The exchange's online check between the forward on the rows and the gather."""
        self.exchange.observe(seconds, usable)

    @property
    def settled(self) -> bool:
        """True once the plan is final (the exchange decided and checked)."""
        return self.exchange.settled

    @property
    def checking(self) -> bool:
        return not self.settled

    def pre_forward(self, landing: bool = False) -> None:
        """The deferred gathers, at the start of a train step; ``landing``: at the end of a
        landing step (``OverlapCallback``'s checkpoint points), every gather left."""
        self._issue_gathers(landing)

    def _issue_gathers(self, landing: bool) -> None:
        if self.phase.stage is Stage.UNPLANNED:
            return
        issue_forward([lambda b=b: self._gather(b) for b in self._deferred(landing)],
                      self.phase.pending)

    def flush(self) -> None:
        self.phase.flush(lambda: self._issue_gathers(landing=True))
        self.rows.mark()  # (the weights may be written now: set_weights flushes first)

    def gather_state(self) -> None:
        st = self.state
        if st.layout is None:
            return
        step = int(self.opt.iterations.numpy())
        if st.checkpoint.iterations != step:
            st.checkpoint.set(step, st.gather_state())

    @property
    def checkpoint_entry(self) -> Any:
        return self.state.checkpoint

    def register_local_var(self, var: tf.Variable) -> None:
        raise ValueError("strategy='sharded' keeps optimizer state for slices of the shared "
                         "variables only; a variable each rank keeps for itself needs its own "
                         "whole state: use strategy='layerwise', 'deferred' or 'hybrid'")

    def slice_variables(self) -> tuple[list[tf.Variable], list[tf.Variable]]:
        st = self.state
        return list(st.params.values()), [v for d in st.slots.values() for v in d.values()]

    @property
    def shard_layout(self) -> ShardLayout:
        if self.state.layout is None:
            raise RuntimeError("no shard layout: strategy='sharded' builds it at the first step")
        return self.state.layout

    # -- Keras hooks -------------------------------------------------------------------------

    def build(self, var_list) -> None:
        """Slots are built for the slices at the first step, not for the model's variables (a
        user's ``opt.build(model.trainable_variables)`` is a no-op)."""
        return None

    def save_own_variables(self, store: Any) -> Any:
        """``.keras`` files: the gathered state in the plain optimizer's own layout, so the file
        loads like one saved by stock Horovod (with or without the plugin, any rank count)."""
        st = self.state
        if st.layout is None or self.plain.save_own_variables is None:  # legacy: none, as stock
            return super().save_own_variables(store)
        step = int(self.opt.iterations.numpy())
        if st.checkpoint.iterations != step:
            raise stale_state_error(step, st.checkpoint.iterations)
        variables = st.variables
        arrays = [v.numpy() for v in keras_api.head_variables(self.opt)]
        for slot, index, initial in plain_order(self.plain.cls, self.opt, variables):
            saved = st.checkpoint.slots.get(slot, {}).get(index)
            # a variable without gradient keeps its initial slot value, as in stock Horovod
            arrays.append(saved if saved is not None else np.full(
                variables[index].shape, initial, numpy_dtype(variables[index])))
        keras_api.fill_store(store, arrays)
        return None

    def load_own_variables(self, store: Any) -> Any:
        if self.plain.load_own_variables is None:
            return super().load_own_variables(store)
        arrays = [np.asarray(a) for a in keras_api.read_store(store)]
        head = keras_api.head_variables(self.opt)
        for v, a in zip(head, arrays, strict=False):
            v.assign(a)
        self.state.checkpoint.restore_plain(arrays[len(head):], int(self.opt.iterations.numpy()))
        return None

    def trackable_children(self, children: dict[str, Any]) -> dict[str, Any]:
        """This rank's slot slices are not checkpointed as the optimizer's own variables
        (another rank, or another number of ranks, could not use them); the gathered whole
        arrays are, through ``hvd_overlap_sharded_state``."""
        hidden = {id(v) for d in self.state.slots.values() for v in d.values()}
        if not hidden:
            return children
        return {k: c for k, c in children.items() if not _holds_any(c, hidden)}

    def apply_weight_decay(self, variables) -> Any:
        """Decoupled weight decay on the slices (``ShardedState.decay``)."""
        if self.state.layout is None or self.opt.weight_decay is None:
            return super().apply_weight_decay(variables)
        self.state.decay({id(v) for v in variables})  # (the step's update is applied in parts)
        return None


def _check_shardable(variables, plan: Plan) -> None:
    """Checks that need the variables (first step, before any collective, on every rank)."""
    for spec in plan.variables:
        v = variables[spec.index]
        if spec.has_grad and getattr(v, "constraint", None) is not None:
            raise ValueError(
                f"variable {v.name} has a constraint, which Keras applies to the whole variable "
                "after its update; strategy='sharded' updates slices. Remove the constraint or "
                "use strategy='deferred' or 'layerwise'")


def _holds_any(child, ids: set[int]) -> bool:
    """True if a trackable child is, or is a list holding, one of the variables ``ids``."""
    if id(child) in ids:
        return True
    if isinstance(child, tf.Variable) or not hasattr(child, "__iter__"):
        return False
    try:
        return any(id(item) in ids for item in child)
    except TypeError:
        return False
