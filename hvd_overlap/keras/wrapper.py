"""The wrapped optimizer's class: a mixin placed before the user's optimizer class in the MRO
that hands every call to the executor of the chosen mode (``_hvdo``), and the generated class
named like the user's (so saved models restore without the plugin, as with Horovod).
``hvd_overlap.keras.optimizer.DistributedOptimizer`` makes one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hvd_overlap.adapters import keras_api
from hvd_overlap.comm.methods import GradientMethod, SliceMethod
from hvd_overlap.core import mutants
from hvd_overlap.core.choice import Strategy
from hvd_overlap.core.plan import Plan
from hvd_overlap.core.sharding import ShardLayout
from hvd_overlap.keras.executors import Executor, Plain
from hvd_overlap.keras.executors.step_state import Gradients, TrainLoop
from hvd_overlap.keras.train_step import OverlapTrainStep


class DistributedMixin:
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
        keras_api.refuse_xla(self._hvdo.strategy)  # (while tracing: every rank alike)
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

    def pre_forward(self, landing: bool = False) -> None:
        """Start of a train step: bring in the previous step's deferred updates, in forward
        order, each layer's forward waiting only for its own bucket. (``deferred``/``hybrid``:
        reduce and apply the deferred buckets; ``sharded``: all-gather the updated slices.)

        ``OverlapCallback`` calls it inside ``model.fit``'s train step; in custom loops use
        ``make_train_step``. Harmless (a no-op) for strategies that defer nothing. ``landing``:
        called again at the end of a landing step (``StepKind.LAND``), every update left lands.
        """
        self._hvdo.pre_forward(landing)

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
        return cls._hvdo_factory(plain, **cls._hvdo_options)

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        children = keras_api.parent_trackable_children(super(), save_type, **kwargs)
        executor = getattr(self, "_hvdo", None)  # None while Keras builds the object
        return executor.trackable_children(children) if executor is not None else children

    def _apply_weight_decay(self, variables):
        return self._hvdo.apply_weight_decay(variables)


def plain_methods(opt) -> Plain:
    """The optimizer's own methods, from the class after the mixin in its MRO."""
    parent = super(DistributedMixin, opt)
    return Plain(apply_gradients=keras_api.plain_apply(parent),
                 build=getattr(parent, "build", None),
                 save_own_variables=getattr(parent, "save_own_variables", None),
                 load_own_variables=getattr(parent, "load_own_variables", None),
                 apply_weight_decay=keras_api.plain_weight_decay(parent),
                 cls=keras_api.plain_optimizer_class(type(opt)))


def distributed_class(base: type, options: dict, factory: Callable[..., Any]) -> type:
    """The class of one wrapped optimizer: named like the user's (so saved configs restore the
    plain class without the plugin, as with Horovod), remembering the wrapper's options and the
    factory that made it, so that ``from_config`` (Keras's cloning) rebuilds a distributed
    optimizer like this one."""
    return type(base.__name__, (DistributedMixin, base),
                {"__module__": base.__module__, "__doc__": base.__doc__,
                 "_hvdo_options": options, "_hvdo_factory": staticmethod(factory),
                 **keras_api.ENTRY_METHODS})
