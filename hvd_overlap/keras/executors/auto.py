"""``strategy="auto"`` (and ``bucket_bytes="auto"`` / ``defer="auto"``): choose the plan at run
time, by the simulator's prediction and then by measurement.

The decisions -- probe, trials, confirmation, keep or switch, reconsider at a growth -- are the
TensorFlow-free ``hvd_overlap.core.chooser``'s. This executor feeds it (each step's time, the
traces, the ranking ``auto_ranking`` makes from the link and the model) and performs what it
orders: it delegates every step to the current plan's executor, and a switch is exact: the
current plan's pending update lands first (``flush``, every rank), the next step runs the new
plan (the train function is traced again), and the optimizer's state carries over -- the Keras
optimizer's own slots for the whole-state plans; for the sharded ones the slot slices, gathered
whole and cut again for the next plan's buckets (``ShardedState.hand_over``): no step is lost or
applied twice. Every rank agrees on each trial's time, so every rank switches at the same step.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_overlap.comm.link import agree
from hvd_overlap.comm.methods import Grad, GradientMethod, SliceMethod
from hvd_overlap.core import autoplan, mutants
from hvd_overlap.core.chooser import (  # noqa: F401 -- tests set them here
    CLEAR_GAIN,
    PREDICTED_GAIN,
    QUIET_STEPS,
    SKIP_AFTER_TRACE,
    TRIAL_STEPS,
    WARM_STEPS,
    Chooser,
)
from hvd_overlap.core.exchange import AUTO
from hvd_overlap.core.plan import Plan, VarSpec
from hvd_overlap.core.strategy import Strategy
from hvd_overlap.core.trial import TrialClock
from hvd_overlap.keras.exchange_choice import DenseExchanges
from hvd_overlap.keras.executors.auto_pool import exchange_blocker
from hvd_overlap.keras.executors.auto_ranking import rank_trials
from hvd_overlap.keras.executors.base import Executor, Plain
from hvd_overlap.keras.executors.compute_clock import ComputeClock, quiet_step
from hvd_overlap.keras.executors.forward_phase import ForwardPhase
from hvd_overlap.keras.executors.mirrored import MirroredShardedExecutor
from hvd_overlap.keras.executors.sharded import ShardedExecutor
from hvd_overlap.keras.executors.step_state import Gradients, TrainLoop, current_step, traced_steps


class AutoExecutor(Executor):
    """Runs one whole-state executor at a time (the probe, the trials, then the choice) and
    switches between them exactly, between steps."""

    defers = True  # a candidate may defer: OverlapCallback / make_train_step install its phase

    def __init__(self, opt: Any, plain: Plain, child: Callable[[Strategy], Executor],
                 probe: Strategy, pool: Callable[[autoplan.Profile], Sequence[Strategy]],
                 settings: Any, label: str):
        super().__init__(opt, plain, None, None, settings)
        self._make_child = child
        self._child: Executor | None = None  # the executor of ``current``, made when first used
        self._pool = pool
        self.label = label              # "auto", or "hybrid (bucket_bytes='auto')"
        self.forced_trials: list[Strategy] | None = None  # tests: measure these instead
        self.log: list[str] = []
        self.model: Any = None
        self._seen_traces = traced_steps()  # step bodies run (traced) when last observed
        clock = TrialClock(WARM_STEPS + TRIAL_STEPS, self._agree,
                           skip_after_trace=SKIP_AFTER_TRACE)
        #: the decisions (TensorFlow-free): this executor feeds it and performs its switches
        self.chooser = Chooser(probe, label, clock, self._switch,
                               lambda probe_s: rank_trials(self, probe_s), self.say,
                               self._note, CLEAR_GAIN, PREDICTED_GAIN,
                               quiet_steps=QUIET_STEPS)
        self._switched, self._decisions, self.switches = False, 0, 0
        self._traced_quiet: bool | None = None  # chooser.quiet when last traced
        self._unphased = ForwardPhase("auto")  # its warning: a step outside step_context
        self._specs: tuple[VarSpec, ...] | None = None  # what the last plan was built for
        self._unrun_plan: Plan | None = None  # the current plan before its first trace
        self.loop = TrainLoop.CUSTOM
        #: the model's dense layers, patched once for the exchange plans (see attach_model);
        #: they take their patched path only in train steps traced while ``_dense_path``
        self._dense = DenseExchanges(AUTO, settings, self._in_patched_step)
        self._traced_dense_path: bool | None = None  # _dense_path when last traced
        self.left_out: list[str] = []  # plans not considered, and why (said in the plan)
        self.compute_clock = ComputeClock()  # the compute, timed in the quiet steps

    # -- the executor in use ---------------------------------------------------------------

    def child(self) -> Executor:
        """The executor of the current plan (one at a time: a switch drops the previous one)."""
        if self._child is None:
            self._child = self._new_child(self.current)
        return self._child

    def _new_child(self, plan: Strategy) -> Executor:
        """The executor of ``plan``, with the local variables and patched dense layers."""
        made = self._make_child(plan)
        made.local_refs = self.local_refs
        if isinstance(made, ShardedExecutor):
            made.exchange.adopt(self._dense.layers)
        return made

    strategy = property(lambda self: "auto")
    defers_now = property(lambda self: self.child().defers_now)
    planner = property(lambda self: self.child().planner)

    @property
    def last_plan(self) -> Plan | None:
        plan = self.child().last_plan
        if plan is None and self._specs is not None:  # switched after the last step run
            if self._unrun_plan is None:
                planner = self.child().planner
                self._unrun_plan = planner.build(self._specs)
            plan = self._unrun_plan
        if plan is None:
            return None
        note = f"{self.label}: {self.current.describe()} -- {self.reason}"
        left = tuple(f"{self.label} left out {why}" for why in self.left_out)
        return replace(plan, notes=plan.notes + (note,) + left)

    def set_method(self, method: GradientMethod | SliceMethod) -> None:
        raise ValueError("strategy='auto' chooses how buckets travel; to register a bucket "
                         "method, pass a strategy (e.g. strategy='layerwise')")

    def attach_model(self, model: Any, loop: TrainLoop = TrainLoop.CUSTOM) -> None:
        """The model being trained (its layers' FLOPs shape the profile) and who runs its
        steps (which plans user code could tell apart). Where the exchange may run, its dense
        layers are patched (once; they compute as Keras's until an exchange plan runs). Called
        at every ``fit``'s start and after ``load_weights`` in it: a sharded plan then cuts its
        slices again from the optimizer's state, in case that was restored."""
        self.model, self.loop = model, loop
        if exchange_blocker(self.loop, self.settings, self.local_refs) is None:
            self._dense.attach(model)
        if isinstance(self._child, MirroredShardedExecutor):
            self._child.reload()

    @property
    def _dense_path(self) -> bool:
        """True while the patched dense layers take their own path in train steps: during a
        check (they record the batch they see, which prices the exchange) and while a plan
        with the exchange runs. Settled on a plan without it, they compute as Keras's and
        record nothing, so the train function is the one that plan runs fixed."""
        return not self.settled or self.current.exchanges

    def _in_patched_step(self) -> bool:
        """For the patched layers: the graph being built is a train step (it runs the
        pre-forward phase) in which they take their own path (``_dense_path``)."""
        return self._dense_path and current_step() is not None

    def apply_gradients(self, grads: list[Grad], variables: list[tf.Variable],
                        args: tuple, kwargs: dict,
                        gradients: Gradients = Gradients.LOCAL) -> Any:
        self._traced_dense_path = self._dense_path
        if current_step() is None:  # not a plugin-made step body: no pre-forward phase
            self._unphased.warn_once(f"it cannot time its plans: it keeps "
                                     f"{self.current.describe()}")
        else:
            self._traced_quiet = self.chooser.quiet
            if self._traced_quiet and gradients is Gradients.LOCAL:  # (global: sent already)
                return quiet_step(self.compute_clock, self.child(), grads, variables, args,
                                  kwargs)
        return self.child().apply_gradients(grads, variables, args, kwargs,
                                            gradients=gradients)

    def reduce_now(self, grads: list[Grad], variables: list[tf.Variable]) -> list[Grad]:
        return self.child().reduce_now(grads, variables)

    def pre_forward(self, landing: bool = False) -> None:
        if not landing and self.chooser.quiet:  # its steps time the compute alone
            self.compute_clock.start()
        self.child().pre_forward(landing)

    def flush(self) -> None:
        self.child().flush()

    @property
    def pending(self) -> bool:
        return self.child().pending

    def take_retrace(self) -> bool:
        """True once after a switch, after the quiet steps start or end, and when the
        patched dense layers' path changes (settled without the exchange, or a reconsider)."""
        switched, self._switched = self._switched, False
        traced = self._traced_dense_path
        if self._dense.layers and traced is not None and traced != self._dense_path:
            self._traced_dense_path, switched = self._dense_path, True
        if self._traced_quiet is not None and self._traced_quiet != self.chooser.quiet:
            self._traced_quiet, switched = self.chooser.quiet, True  # the quiet steps' end
        return self.child().take_retrace() or switched

    # -- the Keras hooks and the sharded state: the current plan's ----------------------------

    def register_local_var(self, var: tf.Variable) -> None:
        self.child().register_local_var(var)

    def gather_state(self) -> None:
        self.child().gather_state()

    @property
    def shard_layout(self):
        return self.child().shard_layout

    def slice_variables(self) -> tuple[list[tf.Variable], list[tf.Variable]]:
        return self.child().slice_variables()

    @property
    def checkpoint_entry(self) -> Any:
        return self.child().checkpoint_entry

    def build(self, var_list) -> Any:
        return self.child().build(var_list)

    def save_own_variables(self, store: Any) -> Any:
        return self.child().save_own_variables(store)

    def load_own_variables(self, store: Any) -> Any:
        return self.child().load_own_variables(store)

    def trackable_children(self, children: dict[str, Any]) -> dict[str, Any]:
        return self.child().trackable_children(children)

    def apply_weight_decay(self, variables) -> Any:
        return self.child().apply_weight_decay(variables)

    # -- the online check: the chooser's (``core.chooser``), fed here ------------------------

    def reconsider(self, why: str, batch_factor: float | None = None,
                   horizon_steps: int | None = None) -> None:
        """Choose again: the per-rank batch changed (``Chooser.reconsider``). Between steps,
        every rank alike; a switch lands the pending update first."""
        self.compute_clock.samples.clear()  # (a new check times the new batch's compute)
        self.chooser.reconsider(why, batch_factor, horizon_steps, TRIAL_STEPS, WARM_STEPS)

    def observe_step(self, seconds: float, usable: bool = True) -> None:
        """One train step took ``seconds`` (wall, this rank); ``usable``: a steady step (not
        the first of an epoch, not one that also landed its own update). Called on every rank
        after every step, by ``OverlapCallback`` and ``make_train_step``."""
        if self.chooser.settled:
            return
        traced, self._seen_traces = traced_steps() != self._seen_traces, traced_steps()
        self.compute_clock.step_ended(usable and not traced and self.chooser.quiet, seconds)
        self.chooser.observe(seconds, usable, traced)

    checking = property(lambda self: not self.chooser.settled)

    def _agree(self, values: list[float]) -> list[float]:
        self._decisions += 1
        return agree(values, f"{self.settings.name}.auto.{self._decisions}")

    # what the chooser holds, as the executor's own (logs, tests, the bench read them here)
    probe = property(lambda self: self.chooser.probe)
    measured = property(lambda self: self.chooser.measured)
    confirmed = property(lambda self: self.chooser.confirmed)
    predicted = property(lambda self: self.chooser.predicted)
    reason = property(lambda self: self.chooser.reason)
    choices = property(lambda self: self.chooser.choices)
    settling_steps = property(lambda self: self.chooser.settling_steps)
    settling_s = property(lambda self: self.chooser.settling_s)
    settling_extra_s = property(lambda self: self.chooser.settling_extra_s)
    current = property(lambda self: self.chooser.current,
                       lambda self, plan: setattr(self.chooser, "current", plan))
    settled = property(lambda self: self.chooser.settled,
                       lambda self, done: setattr(self.chooser, "settled", done))
    _fitted = property(lambda self: self.chooser.fitted,
                       lambda self, fitted: setattr(self.chooser, "fitted", fitted))

    def _switch(self, c: Strategy) -> bool:
        """Run ``c`` from the next step (the chooser's order): land what the current plan left
        pending (every rank), then ask for a new train function. False: nothing switched."""
        if c == self.current or mutants.off("auto_never_switches"):
            return False
        old = self.child()
        old.flush()
        if isinstance(old, MirroredShardedExecutor) and not mutants.off("auto_drops_state"):
            old.release()  # its state back into the whole slots
        if old.last_plan is not None:  # the variables planned for, until c traces its own
            self._specs = old.last_plan.variables
        self._child, self._unrun_plan = self._new_child(c), None
        if old.checkpoint_entry is not None and not mutants.off("auto_drops_state"):
            old.state.hand_over(self._child.state)  # sharded: slot state re-cut for c's slices
        self.switches += 1
        self._switched = True
        return True

    dense_layers = property(lambda self: self._dense.layers)
    pool = property(lambda self: self._pool)

    def say(self, message: str) -> None:
        """Add ``message`` to the log every rank keeps (rank 0 also prints it)."""
        self.log.append(message)
        if hvd.rank() == 0:
            print(f"hvd_overlap: {message}", file=sys.stderr, flush=True)

    def _note(self, message: str) -> None:
        """For rank 0's eyes only (this rank's own times: not in the log the ranks share)."""
        if hvd.rank() == 0:
            print(f"hvd_overlap: {message} (rank 0)", file=sys.stderr, flush=True)
