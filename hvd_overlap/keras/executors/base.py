"""What every executor shares: the plain optimizer's own methods, and the defaults of the Keras
hooks a mode may change (a mode that keeps Keras's behaviour does not override them)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_overlap.adapters import keras_api
from hvd_overlap.comm.methods import Allreduce, CommSettings, Grad, GradientMethod, SliceMethod
from hvd_overlap.comm.planner import Planner
from hvd_overlap.comm.schedule import issue_backward
from hvd_overlap.core.plan import BACKWARD, FORWARD, Plan
from hvd_overlap.core.sharding import ShardLayout
from hvd_overlap.keras.executors.step_state import Gradients, Handoff, TrainLoop

Pairs = list[tuple[Any, tf.Variable]]


@dataclass
class Plain:
    """The wrapped optimizer's own (un-distributed) methods: its class's, after the plugin's
    mixin in the MRO, bound to the optimizer."""

    apply_gradients: Callable[..., Any]
    build: Callable[[Sequence[tf.Variable]], Any]
    save_own_variables: Callable[[Any], Any] | None   # None for legacy optimizers
    load_own_variables: Callable[[Any], Any] | None
    apply_weight_decay: Callable[[Sequence[tf.Variable]], Any] | None
    cls: type                                          # the user's optimizer class


class Executor:
    """One mode of turning local gradients into an update (chosen once, at creation):
    ``apply_gradients`` is the mode; the rest are hooks with Keras's behaviour by default."""

    defers = False  # True: updates land in the next step's pre-forward phase (OverlapCallback)

    def __init__(self, opt: Any, plain: Plain, planner: Planner | None,
                 method: GradientMethod | SliceMethod | None, settings: CommSettings):
        self.opt = opt
        self.plain = plain
        if planner is not None:  # None: a delegating executor (auto) reads its child's
            self.planner = planner
        self.method = method
        self.settings = settings
        self.local_refs: set = set()  # register_local_var: variables each rank keeps for itself
        self.handoff = Handoff()      # compute_gradients -> apply_gradients (trace time)

    @property
    def defers_now(self) -> bool:
        """True if the plan running now defers (auto's current plan may not: see there)."""
        return self.defers

    @property
    def strategy(self) -> str:
        return self.planner.strategy.name

    @property
    def last_plan(self) -> Plan | None:
        return self.planner.last_plan

    def set_method(self, method: GradientMethod | SliceMethod) -> None:
        """Replace how buckets travel (before the first step)."""
        want = SliceMethod if isinstance(self.method, SliceMethod) else GradientMethod
        if not isinstance(method, want):
            raise TypeError(f"strategy {self.strategy!r} sends buckets with a {want.__name__} "
                            f"(hvd_overlap.comm.methods), got {type(method).__name__}")
        if self.last_plan is not None:
            raise RuntimeError("set the bucket method before the first step")
        self.method = method

    def apply_gradients(self, grads: list[Grad], variables: list[tf.Variable],
                        args: tuple, kwargs: dict,
                        gradients: Gradients = Gradients.LOCAL) -> Any:
        """Apply this step's update. ``Gradients.GLOBAL``: they came from this optimizer's
        ``compute_gradients``, reduced already, so nothing is sent again."""
        raise NotImplementedError

    def register_local_var(self, var: tf.Variable) -> None:
        """A variable each rank keeps for itself: its gradient is never sent (as Horovod's)."""
        if self.last_plan is not None:
            raise RuntimeError("register_local_var before the first step (the plan is built "
                               "then, without the local variables)")
        self.local_refs.add(keras_api.var_key(var))

    def split_local(self, grads: list[Grad], variables: list[tf.Variable]
                    ) -> tuple[list[Grad], list[tf.Variable], Pairs]:
        """(shared gradients, shared variables, local pairs): a local variable's gradient stays
        on this rank, divided by the number of ranks if ``scale_local_gradients`` (Horovod's
        default, so that it weighs as much as an averaged one)."""
        if not self.local_refs:
            return grads, variables, []
        key = keras_api.var_key
        shared = [i for i, v in enumerate(variables) if key(v) not in self.local_refs]
        local = [(self._scaled(grads[i]), variables[i]) for i, v in enumerate(variables)
                 if key(v) in self.local_refs and grads[i] is not None]
        return [grads[i] for i in shared], [variables[i] for i in shared], local

    def _scaled(self, g: Grad) -> Grad:
        if not self.settings.scale_local_gradients:
            return g
        n = float(hvd.size())
        if isinstance(g, tf.IndexedSlices):
            return tf.IndexedSlices(g.values / n, g.indices, g.dense_shape)
        return g / n

    def with_local(self, grads: list[Grad], variables: list[tf.Variable], reduce_fn
                   ) -> list[Grad]:
        """``reduce_fn(grads, variables)`` over the shared variables; local ones kept (scaled),
        all in the original order."""
        if not self.local_refs:
            return reduce_fn(grads, variables)
        shared_grads, shared_vars, local = self.split_local(grads, variables)
        key = keras_api.var_key
        got = dict(zip((key(v) for v in shared_vars), reduce_fn(shared_grads, shared_vars),
                       strict=True))
        got.update((key(v), g) for g, v in local)
        return [got.get(key(v)) for v in variables]

    def reduce_now(self, grads: list[Grad], variables: list[tf.Variable]) -> list[Grad]:
        """Every bucket's global gradient, in this step (what ``compute_gradients`` returns, as
        stock Horovod's: the caller reads averaged gradients before ``apply_gradients``). The
        backprop overlap stays (each bucket goes out when its gradients exist); nothing is
        deferred."""
        method = self.method if isinstance(self.method, GradientMethod) else \
            Allreduce(self.settings)  # sharded: whole gradients, then each rank takes its slice

        def reduce(grads: list[Grad], variables: list[tf.Variable]) -> list[Grad]:
            plan = self.planner.plan_for(variables, grads)
            return issue_backward(plan, method, grads, variables, self.settings.ordered,
                                  phases=(BACKWARD, FORWARD))
        return self.with_local(grads, variables, reduce)

    # -- the cross-iteration phase (a no-op for modes that defer nothing) -----------------------

    def pre_forward(self, landing: bool = False) -> None:
        """Start of a train step: bring in what the previous step deferred. ``landing``: the
        step's end, in a step after which the weights may be read (``StepKind.LAND``)."""

    def flush(self) -> None:
        """Apply any pending update now (eager, every rank)."""

    def take_retrace(self) -> bool:
        """True once, after the first traced step, if the train function must be retraced."""
        return False

    def gather_state(self) -> None:
        """Gather sharded optimizer state for a checkpoint."""

    def observe_step(self, seconds: float, usable: bool = True) -> None:
        """A train step took ``seconds`` on this rank (``auto`` times its plans with it)."""

    @property
    def checking(self) -> bool:
        """True while an online check times the steps (``observe_step`` reads them)."""
        return False

    def attach_model(self, model: Any, loop: TrainLoop = TrainLoop.CUSTOM) -> None:
        """The model being trained (``auto`` reads its layers' FLOPs), and who runs its steps."""

    def reconsider(self, why: str, batch_factor: float | None = None,
                   horizon_steps: int | None = None) -> None:
        """The per-rank batch changed (``auto`` chooses its plan again; a fixed plan keeps)."""

    @property
    def shard_layout(self) -> ShardLayout:
        raise RuntimeError(f"no shard layout: strategy {self.strategy!r} does not shard")

    def slice_variables(self) -> tuple[list[tf.Variable], list[tf.Variable]]:
        """This rank's parameter slices and their slots (sharded modes only)."""
        return [], []

    @property
    def checkpoint_entry(self) -> Any:
        """What the optimizer's checkpoints hold besides its own variables (sharded modes: the
        gathered slot state), or None."""
        return None

    @property
    def aggregation(self) -> Any:
        """What Horovod calls the optimizer's ``_agg_helper`` (accumulating mode), or None."""
        return None

    @property
    def pending(self) -> bool:
        """True if an update of the last step has not landed in the weights yet."""
        return False

    # -- Keras hooks -------------------------------------------------------------------------

    def build(self, var_list: Sequence[tf.Variable]) -> Any:
        return self.plain.build(var_list)

    def save_own_variables(self, store: Any) -> Any:
        return self.plain.save_own_variables(store) if self.plain.save_own_variables else None

    def load_own_variables(self, store: Any) -> Any:
        return self.plain.load_own_variables(store) if self.plain.load_own_variables else None

    def trackable_children(self, children: dict[str, Any]) -> dict[str, Any]:
        return children

    def apply_weight_decay(self, variables: Sequence[tf.Variable]) -> Any:
        return self.plain.apply_weight_decay(variables)

    # -- helpers for modes that apply a step's update in parts ----------------------------------

    def apply_part(self, pairs: Pairs, count: bool) -> None:
        """Apply some buckets' updates; ``iterations`` advances only if ``count``, so that every
        bucket of a step sees the same step number (LR schedules, Adam's bias correction).
        Keras's ``apply_gradients`` always advances it, so a part that does not count takes
        that step back."""
        if not pairs:
            if count:
                self.opt.iterations.assign_add(1)
            return
        # Nadam's momentum-schedule product (legacy Keras 2, Keras 3), which every
        # apply_gradients advances
        schedule = keras_api.momentum_schedule(self.opt, [v for _, v in pairs])
        before = keras_api.read_value(schedule) if schedule is not None else None
        self.plain.apply_gradients(pairs)
        if not count:
            self.opt.iterations.assign_sub(1)
            if schedule is not None:  # as iterations: every part sees the step's start value
                schedule.assign(before)
