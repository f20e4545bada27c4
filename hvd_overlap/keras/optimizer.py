"""``DistributedOptimizer``: the drop-in replacement for ``hvd.DistributedOptimizer`` (Keras).

The wrapper is a class generated from the user's optimizer class (so saved models restore without
the plugin, as with Horovod), with a mixin in front of it that hands ``apply_gradients`` to the
executor of the chosen mode (``hvd_overlap.keras.executors``: immediate, accumulating, deferring,
sharded), picked once here. Reducing in ``apply_gradients``, inside the same train-step graph as
``tape.gradient``, keeps the overlap with backprop (each collective depends only on its own
gradients) and covers ``model.fit``, ``optimizer.minimize`` and custom loops alike.
"""

from __future__ import annotations

import itertools
import warnings
from dataclasses import replace

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_overlap.adapters import keras_api
from hvd_overlap.comm.methods import CommSettings, GradientMethod, SliceMethod, default_method
from hvd_overlap.comm.methods import StockHorovod as StockHorovodMethod
from hvd_overlap.comm.planner import Planner
from hvd_overlap.core import mutants
from hvd_overlap.core.autoplan import Candidate
from hvd_overlap.core.choice import Auto, StockHorovod, Strategy, for_accumulation
from hvd_overlap.core.exchange import AUTO, NEVER
from hvd_overlap.core.plan import DEFAULT_BUCKET_BYTES, Plan
from hvd_overlap.core.sharding import ShardLayout
from hvd_overlap.core.spelling import KEYWORDS, resolve
from hvd_overlap.core.strategies import get_strategy
from hvd_overlap.keras.executors import (
    Executor,
    MirroredShardedExecutor,
    Plain,
    ShardedExecutor,
    make_executor,
)
from hvd_overlap.keras.executors.auto import AutoExecutor
from hvd_overlap.keras.executors.auto_pool import auto_choices
from hvd_overlap.keras.executors.step_state import Gradients, TrainLoop
from hvd_overlap.keras.train_step import OverlapTrainStep
from hvd_overlap.keras.validation import (
    validate,
    validate_deferring,
    validate_elastic,
    validate_exchange,
    validate_sharding,
)

_counter = itertools.count()


class _DistributedMixin:
    """Placed before the wrapped optimizer class in the MRO. Every method delegates to the
    executor of the chosen mode (``_hvdo``), made once by ``DistributedOptimizer``."""

    _hvdo: Executor

    @property
    def strategy(self) -> str:
        """The running strategy's name (``"auto"`` while it chooses; ``plan`` says what)."""
        return self._hvdo.strategy

    @property
    def strategy_config(self) -> Strategy:
        """The strategy object this optimizer runs (``hvd_overlap.core.choice``)."""
        return self._hvdo.chosen

    @property
    def plan(self) -> Plan:
        """The plan of the last variable list seen (after one step or ``build_plan``)."""
        plan = self._hvdo.last_plan
        if plan is None:
            raise RuntimeError(
                "no plan yet: call opt.build_plan(model.trainable_variables) or run one step")
        return plan

    def build_plan(self, variables) -> Plan:
        """Build (without any collective) and return the plan for these variables. The first
        train step still compares the model across ranks before any gradient collective."""
        return self._hvdo.planner.plan_for(list(variables), check_ranks=False)

    @property
    def defers(self) -> bool:
        """True if this optimizer defers buckets into the next forward (needs OverlapCallback)."""
        return self._hvdo.defers

    @property
    def defers_now(self) -> bool:
        """True if the plan running now defers (``strategy="auto"`` running stock's fusion
        does not; its next plan may)."""
        return self._hvdo.defers_now

    @property
    def pending(self) -> bool:
        """True if the last step's update has not landed in the weights yet (``flush()``)."""
        return self._hvdo.pending

    def register_local_var(self, var) -> None:
        """As Horovod's: ``var`` is kept by each rank for itself (e.g. a per-rank embedding),
        its gradient never sent; divided by the number of ranks if ``scale_local_gradients``.
        Before the first step."""
        self._hvdo.register_local_var(var)

    def register_bucket_method(self, method: GradientMethod | SliceMethod) -> None:
        """Send every bucket with ``method`` (``hvd_overlap.comm.methods``) instead of the
        strategy's own, as DDP's ``register_comm_hook``; before the first step. The schedule
        (phases, order) stays the plan's."""
        self._hvdo.set_method(method)

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        grads = [g for g, _ in grads_and_vars]
        variables = [v for _, v in grads_and_vars]
        return self._hvdo.apply_gradients(grads, variables, args, kwargs,
                                          gradients=self._hvdo.handoff.take())

    # -- where Keras computes gradients: local inside minimize, global when called directly
    # (``executors.step_state.Handoff`` says why) ------------------------------------------------

    def minimize(self, loss, var_list, *args, **kwargs):
        with self._hvdo.handoff.minimizing():
            return super().minimize(loss, var_list, *args, **kwargs)

    def compute_gradients(self, loss, var_list, tape=None):
        return self._hvdo_global(super().compute_gradients(loss, var_list, tape=tape))

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        """Legacy optimizers' own method; on new ones Horovod's name for ``compute_gradients``
        (its tests and code written against ``hvd.DistributedOptimizer`` call it)."""
        plain = keras_api.legacy_compute_gradients(super())
        if plain is not None:  # legacy optimizers
            return self._hvdo_global(plain(
                loss, var_list=var_list, grad_loss=grad_loss, tape=tape))
        if grad_loss is not None:
            raise ValueError("grad_loss is an argument of legacy optimizers only; "
                             "multiply the loss by it instead")
        return self.compute_gradients(loss, var_list, tape=tape)

    @property
    def _agg_helper(self):
        """Horovod's gradient-aggregation helper, by its name: with ``backward_passes_per_step
        > 1`` an object whose ``counter`` counts the passes summed since the last reduction
        (a variable, made by the first step); None otherwise."""
        return self._hvdo.aggregation

    def get_gradients(self, loss, params):  # legacy optimizers
        grads = super().get_gradients(loss, params)
        return [g for g, _ in self._hvdo_global(list(zip(grads, params, strict=True)))]

    def _hvdo_global(self, grads_and_vars):
        """What ``compute_gradients`` returns: global gradients, except inside ``minimize``."""
        grads_and_vars = list(grads_and_vars)
        handoff = self._hvdo.handoff
        if handoff.computes is Gradients.LOCAL or mutants.off("skip_agreement"):
            return grads_and_vars
        variables = [v for _, v in grads_and_vars]
        grads = self._hvdo.reduce_now([g for g, _ in grads_and_vars], variables)
        handoff.returned(Gradients.GLOBAL)
        return list(zip(grads, variables, strict=True))

    def pre_forward(self) -> None:
        """Start of a train step: bring in the previous step's deferred updates, in forward
        order, each layer's forward waiting only for its own bucket. (``deferred``/``hybrid``:
        reduce and apply the deferred buckets; ``sharded``: all-gather the updated slices.)

        ``OverlapCallback`` calls it inside ``model.fit``'s train step; in custom loops use
        ``make_train_step``. Harmless (a no-op) for strategies that defer nothing.
        """
        self._hvdo.pre_forward()

    def flush(self) -> None:
        """Apply any pending deferred update now. Call it on every rank before anyone
        looks at the weights: evaluate, predict, save, checkpoint, end of training.
        ``OverlapCallback`` does so in ``model.fit``."""
        self._hvdo.flush()

    def observe_step(self, seconds: float, usable: bool = True) -> None:
        """Report that a train step took ``seconds`` on this rank (``usable``: a steady step).
        ``strategy="auto"`` times its candidate plans with it; ``OverlapCallback`` and
        ``make_train_step`` call it on every rank after every step. A no-op otherwise."""
        self._hvdo.observe_step(seconds, usable)

    @property
    def checking(self) -> bool:
        """True while ``strategy="auto"`` (or the exchange's ``exchange_forward="auto"``) times
        its steps to choose: ``OverlapCallback`` then waits for each step's end before timing
        it. False once the choice is final (until a ``reconsider``)."""
        return self._hvdo.checking

    def attach_model(self, model, loop: TrainLoop = TrainLoop.CUSTOM) -> None:
        """The model this optimizer trains (before the first step), and who runs its steps
        (``loop``): ``strategy="auto"`` reads its layers' FLOPs to predict the plans and leaves
        out the plans whose gradients or state that loop could see; ``exchange`` patches its
        dense layers. ``OverlapCallback`` and ``make_train_step(step_fn, model)`` pass it. A
        no-op otherwise."""
        self._hvdo.attach_model(model, loop)

    def reconsider(self, why: str = "asked to", batch_factor: float | None = None,
                   horizon_steps: int | None = None) -> None:
        """``strategy="auto"`` (or a setting ``"auto"``): choose the plan again because the
        per-rank batch changed (by ``batch_factor``; the balance of compute and wire moved).
        If the new batch runs long enough (``horizon_steps`` unknown, or at least twice the
        steps a check takes), the check runs again as at the start: its probe, then the plans
        the simulator ranks for the model as it runs now. Otherwise the simulator alone picks,
        from the model fitted in the last check with its compute scaled by ``batch_factor``,
        and keeps the current plan unless another is predicted 10% faster.
        ``BatchSizeScheduler`` calls it at every growth; call it yourself, between steps and on
        every rank alike, if you change the batch by hand. Exact: the current plan's pending
        update lands first. ``why`` goes into the log and ``plan_choices``. A no-op for a fixed
        plan."""
        self._hvdo.reconsider(why, batch_factor, horizon_steps)

    @property
    def plan_choices(self) -> list[dict]:
        """``strategy="auto"``: every choice made in this run, in order (one per batch phase):
        ``why`` it chose, the plan ``chosen``, the ``reason``, and its settling ``steps`` and
        ``seconds`` on this rank. Empty for a fixed plan."""
        return list(getattr(self._hvdo, "choices", []))

    def take_retrace(self) -> bool:
        """True once, after the first traced step of a deferring strategy: that step could not
        defer (the plan was unknown when it was traced), so the train function must be traced
        again (``OverlapCallback`` and ``make_train_step`` do it)."""
        return self._hvdo.take_retrace()

    def gather_state(self) -> None:
        """``sharded`` only: gather every rank's optimizer-state slices so that a checkpoint
        saved now is complete (whole per-variable arrays, restorable on any number of ranks).
        Call it on every rank, after ``flush()``; ``OverlapCallback`` does both at the end of
        every epoch (and every ``flush_every`` batches). A no-op for other strategies."""
        self._hvdo.gather_state()

    @property
    def shard_layout(self) -> ShardLayout:
        """``sharded`` only: which slice of each bucket every rank owns (after one step)."""
        return self._hvdo.shard_layout

    def slice_variables(self) -> tuple[list, list]:
        """``sharded`` only: this rank's parameter slices and their optimizer slots (kept out
        of ``variables()``); empty lists for other strategies."""
        return self._hvdo.slice_variables()

    def make_train_step(self, step_fn, model=None):
        """Wrap a custom-loop step (which ends with ``apply_gradients``) in a ``tf.function``
        that starts with the pre-forward phase. Call ``flush()`` after the loop. ``model``
        (optional): ``strategy="auto"`` reads its layers' FLOPs to predict the plans."""
        if model is not None:
            self.attach_model(model)
        return OverlapTrainStep(self, step_fn)

    # -- Keras hooks: the executor keeps Keras's behaviour or replaces it (sharded) -------------
    # (the private names Keras, TF or Horovod call are listed in keras_api.HOOK_NAMES)

    def build(self, var_list):
        return self._hvdo.build(var_list)

    def save_own_variables(self, store):
        return self._hvdo.save_own_variables(store)

    def load_own_variables(self, store):
        return self._hvdo.load_own_variables(store)

    @classmethod
    def from_config(cls, config, custom_objects=None):
        """A new distributed optimizer with this one's options, around the plain optimizer
        the config describes (fresh state, as Keras's ``from_config`` gives)."""
        plain = keras_api.plain_optimizer_class(cls).from_config(
            config, custom_objects=custom_objects)
        return DistributedOptimizer(plain, **cls._hvdo_options)

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        children = keras_api.parent_trackable_children(super(), save_type, **kwargs)
        executor = getattr(self, "_hvdo", None)  # None while Keras builds the object
        return executor.trackable_children(children) if executor is not None else children

    def _apply_weight_decay(self, variables):
        return self._hvdo.apply_weight_decay(variables)


def _plain(opt) -> Plain:
    """The optimizer's own methods, from the class after the mixin in its MRO."""
    parent = super(_DistributedMixin, opt)
    return Plain(apply_gradients=parent.apply_gradients, build=getattr(parent, "build", None),
                 save_own_variables=getattr(parent, "save_own_variables", None),
                 load_own_variables=getattr(parent, "load_own_variables", None),
                 apply_weight_decay=keras_api.plain_weight_decay(parent),
                 cls=keras_api.plain_optimizer_class(type(opt)))


def _distributed_class(base: type, options: dict) -> type:
    """The class of one wrapped optimizer: named like the user's (so saved configs restore the
    plain class without the plugin, as with Horovod), remembering the wrapper's options so that
    ``from_config`` (Keras's cloning) rebuilds a distributed optimizer like this one."""
    return type(base.__name__, (_DistributedMixin, base),
                {"__module__": base.__module__, "__doc__": base.__doc__,
                 "_hvdo_options": options})


def DistributedOptimizer(  # noqa: N802 -- same name as Horovod's factory
    optimizer,
    strategy: str | Strategy = "layerwise",
    bucket_bytes: int | str = DEFAULT_BUCKET_BYTES,
    ordered: bool = False,
    defer: int | str | None = None,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression=hvd.Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op=hvd.Average,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups=None,
    process_set=hvd.global_process_set,
    scale_local_gradients: bool = True,
    gather_with: str = "allgather",
    exchange: str = "never",
    exchange_forward: str = "auto",
    shard: str = "all",
):
    """Wrap a Keras optimizer so its gradients are averaged across ranks by ``strategy``.

    Same keywords and defaults as ``horovod.tensorflow.keras.DistributedOptimizer``, plus
    ``strategy``: an object of ``hvd_overlap.core.choice`` (``Layerwise()``, ``Deferred()``,
    ``Hybrid()``, ``Sharded()``, ``ShardedHybrid()``, ``Auto()``, ``StockHorovod()``), each
    taking only the settings it uses, or its name (``"sharded+exchange"``: the one string
    spelling, ``hvd_overlap.core.spelling.parse``). With a name, ``bucket_bytes``, ``ordered``,
    ``defer``, ``gather_with``, ``exchange``, ``exchange_forward``, ``shard``, ``num_groups``
    and ``groups`` are sugar for the object's settings: one a strategy has no use for is a
    ``TypeError``. ``process_set`` must be the global one; ``scale_local_gradients`` as
    Horovod's (see ``register_local_var``). Deferring strategies and ``auto`` need
    ``OverlapCallback`` (``model.fit``) or ``make_train_step`` (custom loops).
    """
    given = {k: v for k, v in locals().items() if k != "optimizer"}
    chosen = resolve(strategy, **{k: given.pop(k) for k in KEYWORDS})
    # what from_config rebuilds: the strategy object, and Horovod's own keywords
    options = {**given, "strategy": chosen}
    if isinstance(backward_passes_per_step, int) and backward_passes_per_step > 1:
        chosen = _accumulating_plan(chosen, backward_passes_per_step)
    validate(optimizer, op, gradient_predivide_factor, backward_passes_per_step, process_set)
    if chosen.shards:
        validate_sharding(optimizer)
    plan_options = chosen.plan_options(hvd.size())
    if plan_options.exchange != NEVER:
        validate_exchange(compression)
    if chosen.defers and not isinstance(chosen, Auto):
        validate_deferring(optimizer, chosen.name)
    validate_elastic(chosen.name, chosen.defers or chosen.tuned)
    if isinstance(chosen, StockHorovod):
        prefix = name or f"Distributed{type(optimizer).__name__}"
    else:
        prefix = name or f"hvdo{next(_counter)}"
    settings = CommSettings(
        name=prefix, op=op, compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, device_dense=device_dense,
        device_sparse=device_sparse, ordered=getattr(chosen, "ordered", False),
        gather_with=plan_options.gather_with,
        scale_local_gradients=scale_local_gradients,
        groups=getattr(chosen, "groups", None) or getattr(chosen, "num_groups", 0) or None,
    )
    cls = _distributed_class(type(optimizer), options)
    wrapped = super(_DistributedMixin, cls).from_config(optimizer.get_config())
    plain = _plain(wrapped)

    def executor(c: Candidate) -> Executor:
        """The executor of one plan (a candidate of ``auto``, or the user's own)."""
        st = get_strategy(c.strategy)
        sets = settings if not chosen.tuned else replace(
            settings, name=f"{prefix}.{c.strategy}.{c.bucket_bytes}.{c.defer}")
        options = replace(plan_options, bucket_bytes=c.bucket_bytes or DEFAULT_BUCKET_BYTES,
                          defer=c.defer)
        if c.exchange:  # one of auto's sharded plans, with the dense factor exchange
            options = replace(options, exchange=AUTO, exchange_forward=c.exchange,
                              shard=c.shard)
        planner = Planner(st, options, sparse_as_dense)
        method = default_method(sets, fused_by_horovod=c.strategy == "horovod", shards=st.shards)
        if isinstance(method, StockHorovodMethod):
            method = _StockFunction(sets)
        return make_executor(st, wrapped, plain, planner, method, sets,
                             backward_passes_per_step, average_aggregated_gradients,
                             MirroredShardedExecutor if isinstance(chosen, Auto)
                             else ShardedExecutor)

    size = getattr(chosen, "bucket_bytes", 0)
    defer_ = getattr(chosen, "defer", None)
    if chosen.tuned:
        probe, pool, label = auto_choices(optimizer, chosen.name, size, defer_)
        wrapped._hvdo = AutoExecutor(wrapped, plain, executor, probe, pool, settings, label)
    else:
        wrapped._hvdo = executor(Candidate(chosen.name, size, defer_))
    wrapped._hvdo.chosen = chosen
    entry = wrapped._hvdo.checkpoint_entry
    if entry is not None:  # sharded state: a checkpoint dependency, saved and restored with it
        keras_api.track_child(wrapped, entry, name="hvd_overlap_sharded_state")
    return wrapped


class _StockFunction(StockHorovodMethod):
    """Stock Horovod's gradient function made as stock makes it, eagerly (``hvd.Distributed
    Optimizer`` does so in ``__init__``): Horovod then wraps it in a ``tf.function``, so the
    train step calls it as stock's does -- the same ops, conds and names -- instead of
    holding them inline (what a function made while the step is traced gets)."""

    def _fn(self):
        with tf.init_scope():
            return super()._fn()


def _accumulating_plan(chosen: Strategy, passes: int) -> Strategy:
    """``backward_passes_per_step > 1``: the strategy that runs (``choice.for_accumulation``),
    said once (rank 0) where it is not the one asked for."""
    instead = for_accumulation(chosen)
    if instead is not chosen and hvd.is_initialized() and hvd.rank() == 0:
        warnings.warn(
            f"hvd_overlap: strategy {chosen.name!r} with backward_passes_per_step={passes} runs "
            f"as strategy={instead.name!r}: the summed gradients are reduced once every "
            f"{passes} passes, within the pass, so nothing is deferred into the next forward or "
            "sharded (the weights are stock Horovod's). For both, accumulate before the "
            "optimizer with backward_passes_per_step=1 (hvd_overlap.growth.data."
            "enable_gradient_accumulation)", stacklevel=3)
    return instead
