"""What every executor shares: the plain optimizer's own methods, and the defaults of the Keras
hooks a mode may change (a mode that keeps Keras's behaviour does not override them)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from hvd_overlap.comm.methods import Allreduce, CommSettings, Grad, GradientMethod, SliceMethod
from hvd_overlap.comm.planner import Planner
from hvd_overlap.comm.schedule import issue_backward
from hvd_overlap.core.plan import BACKWARD, FORWARD, Plan
from hvd_overlap.core.sharding import ShardLayout

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

    def __init__(self, opt: Any, plain: Plain, planner: Planner,
                 method: GradientMethod | SliceMethod, settings: CommSettings):
        self.opt = opt
        self.plain = plain
        self.planner = planner
        self.method = method
        self.settings = settings
        self.local_compute = False    # inside minimize: compute_gradients stays local
        self.returned_global = False  # compute_gradients returned global gradients (trace time)

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
                        args: tuple, kwargs: dict, reduced: bool = False) -> Any:
        """Apply this step's update. ``reduced``: the gradients are already global (they came
        from this optimizer's ``compute_gradients``), so nothing is sent again."""
        raise NotImplementedError

    def reduce_now(self, grads: list[Grad], variables: list[tf.Variable]) -> list[Grad]:
        """Every bucket's global gradient, in this step (what ``compute_gradients`` returns, as
        stock Horovod's: the caller reads averaged gradients before ``apply_gradients``). The
        backprop overlap stays (each bucket goes out when its gradients exist); nothing is
        deferred."""
        plan = self.planner.plan_for(variables, grads)
        method = self.method if isinstance(self.method, GradientMethod) else \
            Allreduce(self.settings)  # sharded: whole gradients, then each rank takes its slice
        return issue_backward(plan, method, grads, variables, self.settings.ordered,
                              phases=(BACKWARD, FORWARD))

    # -- the cross-iteration phase (a no-op for modes that defer nothing) -----------------------

    def pre_forward(self) -> None:
        """Start of a train step: bring in what the previous step deferred."""

    def flush(self) -> None:
        """Apply any pending update now (eager, every rank)."""

    def take_retrace(self) -> bool:
        """True once, after the first traced step, if the train function must be retraced."""
        return False

    def gather_state(self) -> None:
        """Gather sharded optimizer state for a checkpoint."""

    @property
    def shard_layout(self) -> ShardLayout:
        raise RuntimeError(f"no shard layout: strategy {self.strategy!r} does not shard")

    def slice_variables(self) -> tuple[list[tf.Variable], list[tf.Variable]]:
        """This rank's parameter slices and their slots (sharded modes only)."""
        return [], []

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
        self.plain.apply_gradients(pairs)
        if not count:
            self.opt.iterations.assign_sub(1)
