"""``strategy="auto"`` (and ``bucket_bytes="auto"`` / ``defer="auto"``): choose the plan at run
time, by the simulator's prediction and then by measurement.

1. The first steps run a *probe* plan (stock Horovod's fusion for ``auto``; the user's strategy
   at the default bucket size otherwise): a trial of ``WARM_STEPS + TRIAL_STEPS`` steps, of
   which the steady ones are timed (not a step that traced, nor the one after it).
2. Between two steps, on every rank: a few collectives measure the link, the model's variables
   (and the FLOPs of its layers, when ``OverlapCallback`` gave the model) make a profile whose
   compute is fitted so the simulator reproduces the probe's measured step, and the simulator
   ranks every candidate (``hvd_overlap.core.autoplan``).
3. The predicted best and the best of another strategy each get a trial of the same length,
   then the probe a second one (its first ran in the process's first steps, which stall more
   often; this one replaces it); the fastest measured plan is kept (the probe unless another
   is faster by more than ``core.trial.MARGIN``). A trial faster than the probe's by
   ``CLEAR_GAIN`` or more ends the check there: that plan stays.
4. A choice other than the probe is confirmed: the probe runs one more trial, then the choice
   (the executor that will stay), and the choice is kept only if it is faster again by the same
   margin -- a plan picked for one lucky trial (seven steps time a plan to a few per cent on a
   shared machine) falls back to the probe. Rank 0 logs the choice with the reason, once.

A trial ends after a fixed number of steps, the same on every rank whatever each rank could
time, and its timing is averaged over the ranks before it is compared: every rank takes the
same decisions at the same step, so none is left waiting in a collective. A plan change is
exact: the current plan's pending update lands first (``flush``, every rank), the next step
runs the new plan (the train function is traced again), and the optimizer's state carries
over -- the Keras optimizer's own slots for the whole-state plans; for the sharded family
(``strategy="sharded", bucket_bytes="auto"``) the slot slices, gathered whole and cut again for
the next plan's buckets (``ShardedState.hand_over``): no step is lost or applied twice.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_overlap.comm.link import agree, cluster_of, measure_link
from hvd_overlap.comm.methods import Grad, GradientMethod, SliceMethod
from hvd_overlap.comm.planner import Planner
from hvd_overlap.core import autoplan, mutants
from hvd_overlap.core.autoplan import Candidate
from hvd_overlap.core.exchange import AUTO
from hvd_overlap.core.plan import Plan, VarSpec
from hvd_overlap.core.trial import TrialClock
from hvd_overlap.keras.exchange_choice import DenseExchanges
from hvd_overlap.keras.executors.auto_pool import dense_batches, exchange_blocker, usable_pool
from hvd_overlap.keras.executors.base import Executor, Plain
from hvd_overlap.keras.executors.forward_phase import ForwardPhase
from hvd_overlap.keras.executors.mirrored import MirroredShardedExecutor
from hvd_overlap.keras.executors.sharded import ShardedExecutor
from hvd_overlap.keras.executors.step_state import Gradients, TrainLoop
from hvd_overlap.keras.flops import layer_flops_by_name

#: steps of a trial: room for a deferring plan's two traced steps and the step after them...
WARM_STEPS = 3
#: ...then the steps it is timed over
TRIAL_STEPS = 7
#: steps not timed after a step that traced (a deferring plan's first steady step follows)
SKIP_AFTER_TRACE = 1
#: a plan is measured in a trial, or chosen by prediction alone (a batch too short-lived for a
#: check), only if predicted this much faster than the probe: the simulator's error on this
#: machine is ~15% (scaling.md), and each trial costs its traces and steps (settling)
PREDICTED_GAIN = 0.1
#: a trial this much faster than the probe's ends the check at once: a lucky or stalled trial
#: moves a 7-step median by a few per cent, not by a quarter, and each further trial costs a
#: trace (1-2 s for a sharded plan on this machine's CPU) and steps at a slower plan
CLEAR_GAIN = 0.25


class AutoExecutor(Executor):
    """Runs one whole-state executor at a time (the probe, the trials, then the choice) and
    switches between them exactly, between steps."""

    defers = True  # a candidate may defer: OverlapCallback / make_train_step install its phase

    def __init__(self, opt: Any, plain: Plain, child: Callable[[Candidate], Executor],
                 probe: Candidate, pool: Callable[[autoplan.Profile], Sequence[Candidate]],
                 settings: Any, label: str):
        super().__init__(opt, plain, None, None, settings)
        self._make_child = child
        self._child: Executor | None = None  # the executor of ``current``, made when first used
        self.probe = probe
        self._pool = pool
        self.label = label              # "auto", or "hybrid (bucket_bytes='auto')"
        self.current = probe
        self.forced_trials: list[Candidate] | None = None  # tests: measure these instead
        self.log: list[str] = []
        self.model: Any = None
        self.traces = 0
        self._seen_traces = 0
        self._clock = TrialClock(WARM_STEPS + TRIAL_STEPS, self._agree,
                                 skip_after_trace=SKIP_AFTER_TRACE)
        self._switched = False
        self._decisions = 0
        self.switches = 0
        self._marks = ForwardPhase("auto")  # which graphs run the pre-forward phase
        self._specs: tuple[VarSpec, ...] | None = None  # what the last plan was built for
        self._unrun_plan: Plan | None = None  # the current plan before its first trace
        self.loop = TrainLoop.CUSTOM
        #: the model's dense layers, patched once for the exchange plans (see attach_model);
        #: they take their patched path only in train steps traced while ``_dense_path``
        self._dense = DenseExchanges(AUTO, settings, self._in_patched_step)
        self._traced_dense_path: bool | None = None  # _dense_path when last traced
        self.left_out: list[str] = []  # plans not considered, and why (said in the plan)
        self._start_check("start")
        self.choices: list[dict[str, Any]] = []  # every choice made, one per batch phase
        #: the last check's fitted profile, cluster and pool (what a prediction starts from)
        self._fitted: tuple[autoplan.Profile, Any, Sequence[Candidate]] | None = None

    # -- the executor in use ---------------------------------------------------------------

    def child(self) -> Executor:
        """The executor of the current plan (one at a time: a switch drops the previous one)."""
        if self._child is None:
            self._child = self._make_child(self.current)
            self._child.local_refs = self.local_refs
            if isinstance(self._child, ShardedExecutor):
                self._child.exchange.adopt(self._dense.layers)
        return self._child

    @property
    def strategy(self) -> str:
        return "auto"

    @property
    def defers_now(self) -> bool:
        return self.child().defers_now

    @property
    def last_plan(self) -> Plan | None:
        plan = self.child().last_plan
        if plan is None and self._specs is not None:  # switched after the last step run
            if self._unrun_plan is None:
                planner = self.child().planner
                self._unrun_plan = planner.strategy.build_plan(self._specs, planner.options)
            plan = self._unrun_plan
        if plan is None:
            return None
        note = f"{self.label}: {self.current.describe()} -- {self.reason}"
        left = tuple(f"{self.label} left out {why}" for why in self.left_out)
        return replace(plan, notes=plan.notes + (note,) + left)

    @property
    def planner(self) -> Planner:  # type: ignore[override]
        return self.child().planner

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
        return not self.settled or bool(self.current.exchange)

    def _in_patched_step(self) -> bool:
        """For the patched layers: the graph being built is a train step (it runs the
        pre-forward phase) in which they take their own path (``_dense_path``)."""
        return self._dense_path and self._marks.installed()

    def apply_gradients(self, grads: list[Grad], variables: list[tf.Variable],
                        args: tuple, kwargs: dict,
                        gradients: Gradients = Gradients.LOCAL) -> Any:
        self.traces += 1  # Python runs here only while a train function is traced
        self._traced_dense_path = self._dense_path
        if not self._marks.installed():
            self._marks.warn_once(f"it cannot time its plans: it keeps {self.current.describe()}")
        return self.child().apply_gradients(grads, variables, args, kwargs,
                                            gradients=gradients)

    def reduce_now(self, grads: list[Grad], variables: list[tf.Variable]) -> list[Grad]:
        return self.child().reduce_now(grads, variables)

    def pre_forward(self) -> None:
        self._marks.mark()
        self.child().pre_forward()

    def flush(self) -> None:
        self.child().flush()

    @property
    def pending(self) -> bool:
        return self.child().pending

    def take_retrace(self) -> bool:
        """True once after a switch, and once when the patched dense layers' path changes
        (the check settled on a plan without the exchange: its train function records
        nothing; a reconsider: the check records batches again)."""
        switched, self._switched = self._switched, False
        traced = self._traced_dense_path
        if self._dense.layers and traced is not None and traced != self._dense_path:
            self._traced_dense_path, switched = self._dense_path, True
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

    # -- the online check ------------------------------------------------------------------

    def reconsider(self, why: str, batch_factor: float | None = None,
                   horizon_steps: int | None = None) -> None:
        """Choose again: the per-rank batch changed (by ``batch_factor``), so the fastest plan
        may be another (compute grows while the gradient bytes stay; the exchange sends more
        per step). Between steps, every rank alike; a switch lands the pending update first.
        With ``horizon_steps`` (the steps the new batch will run) shorter than two checks'
        worth, the simulator alone picks (``_predict_for``); otherwise the check runs again
        from the probe, as at the start."""
        check = 6 * (WARM_STEPS + TRIAL_STEPS)  # probe, two trials, probe, confirmation pair
        if horizon_steps is not None and horizon_steps < 2 * check:
            self._predict_for(why, batch_factor, horizon_steps)
            return
        self._switch(self.probe)
        self._clock.restart()
        self._start_check(why)
        self._say(f"{self.label}: {why}: choosing the plan again")

    def _start_check(self, why: str) -> None:
        """The online check's state at its start (``why``: "start", or a reconsider's)."""
        self.measured: dict[Candidate, float] = {}
        self.queue: list[Candidate] | None = None   # None: the model has not ranked yet
        self.first_probe_s: float | None = None     # the probe's first trial (fits the model)
        self.confirming: Candidate | None = None    # the first pass's choice, measured again
        self.confirmed: dict[Candidate, float] = {}  # the second pass: the probe, the choice
        self.predicted: dict[Candidate, float] = {}  # the simulator's step of each candidate
        self.settled = False
        self.settling_steps = 0   # steps run before the choice was final...
        self.settling_s = 0.0     # ...and their wall time on this rank (traces included)
        self.trigger = why        # why this check runs (a growth: reconsider)
        self.reason = (f"measuring {self.probe.describe()} first" if why == "start"
                       else f"{why}: measuring {self.probe.describe()} first")

    def observe_step(self, seconds: float, usable: bool = True) -> None:
        """One train step took ``seconds`` (wall, this rank); ``usable``: a steady step (not
        the first of an epoch, not one that also landed its own update). Called on every rank
        after every step, by ``OverlapCallback`` and ``make_train_step``."""
        if self.settled:
            return
        self.settling_steps += 1
        self.settling_s += seconds
        traced, self._seen_traces = self.traces != self._seen_traces, self.traces
        step = self._clock.observe(seconds, usable, traced)
        if step is not None:
            self._trial_done(step)

    @property
    def checking(self) -> bool:
        return not self.settled

    def _agree(self, values: list[float]) -> list[float]:
        self._decisions += 1
        return agree(values, f"{self.settings.name}.auto.{self._decisions}")

    def _trial_done(self, step: float) -> None:
        """A trial ended with ``step`` (agreed by the ranks; ``inf``: no rank had a steady
        step, tiny epochs: this plan counts as the slowest)."""
        if self.confirming is not None:
            self.confirmed[self.current] = step
        else:
            self.measured[self.current] = step
        if self.queue is None:
            self.first_probe_s = step
            trials = self._rank(step)
            if not trials:  # nothing worth measuring: the probe, for the reason _rank gave
                self.queue = []
                self._settle(self.probe)
                return
            # the probe once more, last: its first trial ran in the process's first steps,
            # which stall more often than later ones; every plan compared is then a later one
            self.queue = trials + [self.probe]
        elif self.confirming is None and self.current != self.probe \
                and step <= self.first_probe_s * (1 - CLEAR_GAIN):
            self.queue = []
            self.reason = (self._why(self.current) + f"; faster by {CLEAR_GAIN:.0%} or more:"
                           " no further trial")
            self._settle(self.current)
            return
        if self.queue:
            self._switch(self.queue.pop(0))
            return
        if self.confirming is None:
            best = autoplan.pick(self.measured, self.probe)
            self.reason = self._why(best)
            if best != self.probe:
                # the probe (running now) once more, then the choice: the same two, measured
                # again side by side, decide; the choice's executor is the one that stays
                self.confirming, self.queue = best, [best]
                return
            self._settle(best)
            return
        self._settle(self._second_pass())

    def _predict_for(self, why: str, batch_factor: float | None, horizon: int) -> None:
        """The plan for a batch that runs too few steps for a check: the simulator's pick
        from the model fitted in the last check, its compute scaled by ``batch_factor`` -- the
        current plan unless another is predicted faster than it by ``PREDICTED_GAIN`` (a switch
        costs a trace); without such a model (the check did not rank, or the factor is
        unknown) the current plan stays."""
        self.trigger = why
        short = f"{why}: {horizon} steps, too few for a check"
        if not self.settled:  # a check under way stops: the probe, never slower than stock
            choice = self.probe
            self.reason = f"{short}; the check under way stops: {choice.describe()}"
        elif self._fitted is None or not batch_factor:
            choice = self.current
            self.reason = f"{short}; nothing to predict from: keeping {choice.describe()}"
        else:
            profile, cluster, pool = self._fitted
            grown = autoplan.at_batch(profile, batch_factor)
            self.predicted = {c: r.step_s for c, r in autoplan.rank(grown, cluster, pool)}
            current_s = autoplan.predict(grown, cluster, self.current).step_s
            choice = autoplan.pick({**self.predicted, self.current: current_s}, self.current,
                                   margin=PREDICTED_GAIN)
            self.reason = (f"{short}; predicted {choice.describe()} "
                           f"{self.predicted.get(choice, current_s) * 1e3:.1f} ms/step"
                           + ("" if choice == self.current else
                              f" vs {self.current.describe()} {current_s * 1e3:.1f}"))
        self.queue, self.confirming = [], None
        self._chose(choice, steps=0, seconds=0.0)

    def _second_pass(self) -> Candidate:
        """The first pass's choice if the second pass confirms it, else the probe."""
        best, probe = self.confirming, self.probe
        again = autoplan.pick(self.confirmed, probe)
        b, p = self.confirmed[best] * 1e3, self.confirmed[probe] * 1e3
        if again == best:
            self.reason += f"; confirmed: {b:.1f} vs {p:.1f} ms/step"
        else:
            self.reason = (f"{best.describe()} was faster in its first trial "
                           f"({self.measured[best] * 1e3:.1f} vs "
                           f"{self.measured[probe] * 1e3:.1f} ms/step) but not in its second "
                           f"({b:.1f} vs {p:.1f} ms/step): keeping {probe.describe()}")
        return again

    def _chose(self, choice: Candidate, steps: int, seconds: float) -> None:
        """Run ``choice`` from the next step, the check over; record and say it (``steps``
        and ``seconds``: what choosing cost this rank)."""
        self._switch(choice)
        self.settled = True
        self.choices.append({"why": self.trigger, "chosen": choice.describe(),
                             "reason": self.reason, "steps": steps, "seconds": seconds})
        self._say(f"{self.label} chose {choice.describe()}: {self.reason}")

    def _settle(self, choice: Candidate) -> None:
        self._chose(choice, self.settling_steps, self.settling_s)
        if hvd.rank() == 0:  # (this rank's own times: not in the log the ranks share)
            print(f"hvd_overlap: {self.label}: {self.settling_cost()} (rank 0)",
                  file=sys.stderr, flush=True)

    @property
    def settling_extra_s(self) -> float | None:
        """How much longer the settling steps took on this rank than the choice's measured step
        would have (None before a choice could be timed)."""
        chosen = self.confirmed.get(self.current, self.measured.get(self.current))
        if chosen is None or not math.isfinite(chosen):
            return None
        return self.settling_s - self.settling_steps * chosen

    def settling_cost(self) -> str:
        """What choosing cost this rank: the steps run before the choice was final, their wall
        time (traces included) and how much longer that was than the choice would have taken."""
        extra = self.settling_extra_s
        more = "" if extra is None else \
            f", {extra:.1f} s more than {self.settling_steps} steps of the choice"
        return f"settling took {self.settling_steps} steps, {self.settling_s:.1f} s{more}"

    def _rank(self, probe_s: float) -> list[Candidate]:
        """The candidates to measure next, from the simulator (or ``forced_trials``)."""
        if hvd.size() == 1:
            self.reason = "one rank: nothing to communicate"
            return []
        if not math.isfinite(probe_s):
            self.reason = "no steady step could be timed (epochs too short): keeping the probe"
            return []
        if self.forced_trials is not None:
            return [c for c in self.forced_trials if c != self.probe]
        plan = self.child().last_plan
        flops = layer_flops_by_name(self.model) if self.model is not None else None
        batches = dense_batches(self._dense.layers, plan.variables,
                                f"{self.settings.name}.auto.batch")
        profile = autoplan.profile_from_specs(plan.variables, flops, dense=batches)
        # the candidates depend on the layers and their bytes, not on the compute fitted below
        candidates = self._pool(profile)
        # the sharded plans and the exchange run on reduce-scatter, all-gather and alltoall:
        # time them too (the same pool, so the same answer, on every rank)
        sharded = any(c.strategy in autoplan.SHARDED for c in candidates)
        link = measure_link(f"{self.settings.name}.auto.link", phases=sharded)
        if "allreduce" in link.unmeasured:  # no rate to predict any plan with
            self.reason = ("the link probe could not tell a 64 MiB allreduce from a 4-byte one "
                           f"({link.per_collective_s * 1e3:.2f} ms): nothing to predict, "
                           f"keeping {self.probe.describe()}")
            self._say(f"{self.label}: {self.reason}")
            return []
        cluster = cluster_of(link)
        fitted = autoplan.fit_compute(profile, cluster, self.probe, probe_s)
        pool, self.left_out = usable_pool(candidates, self.loop, self.settings,
                                          self.local_refs)
        pool, unpriced = _priced(pool, link.unmeasured, self.settings.gather_with)
        self.left_out += unpriced
        ranked = autoplan.rank(fitted, cluster, pool)
        self._fitted = (fitted, cluster, pool)
        self.predicted = {c: r.step_s for c, r in ranked}
        self.predicted.setdefault(self.probe, probe_s)
        worth = [(c, r) for c, r in ranked if r.step_s < probe_s * (1 - PREDICTED_GAIN)]
        order = autoplan.trial_order(worth, self.probe)
        if not order:
            best, result = next(((c, r) for c, r in ranked if c != self.probe),
                                (self.probe, None))
            self.reason = (f"no plan predicted {PREDICTED_GAIN:.0%} faster than "
                           f"{self.probe.describe()} {probe_s * 1e3:.1f} ms/step" + (
                               f" (best: {best.describe()} {result.step_s * 1e3:.1f} ms)"
                               if result is not None else "") + ": nothing to measure")
        rates = [f"{k} {r / 1e6:.0f}" if r is not None else f"{k} unmeasured" for k, r, phase
                 in (("reduce-scatter", link.reduce_scatter_bandwidth, "reducescatter"),
                     ("all-gather", link.allgather_bandwidth, "allgather"),
                     ("alltoall", link.alltoall_bandwidth, "alltoall"))
                 if r is not None or phase in link.unmeasured]
        self._say(f"{self.label}: link {link.bandwidth / 1e6:.0f} MB/s"
                  + (f" ({', '.join(rates)} MB/s)" if rates else "") + ", "
                  f"{link.per_collective_s * 1e3:.2f} ms per collective; probe "
                  f"{self.probe.describe()} {probe_s * 1e3:.1f} ms/step (compute fitted: "
                  f"{fitted.compute_s * 1e3:.1f} ms); predicted: " + "; ".join(
                      f"{c.describe()} {r.step_s * 1e3:.1f} ms" for c, r in ranked[:3])
                  + (f"; measuring {', '.join(c.describe() for c in order)}" if order
                     else f"; none {PREDICTED_GAIN:.0%} faster: measuring nothing more"))
        return order

    def _why(self, best: Candidate) -> str:
        parts = [f"{c.describe()} {t * 1e3:.1f} ms" for c, t in
                 sorted(self.measured.items(), key=lambda ct: ct[1])]
        ref = self.measured[self.probe]
        said = self.predicted.get(best)
        mine = self.measured[best]
        ratio = f"{ref / mine:.2f}x" if math.isfinite(mine) else "no steady step timed"
        return (f"measured {mine * 1e3:.1f} vs {self.probe.describe()} "
                f"{ref * 1e3:.1f} ms/step ({ratio}"
                + (f"; predicted {said * 1e3:.1f} ms" if said is not None else "")
                + "); measured: " + ", ".join(parts)
                + (f" ({self.probe.describe()}'s first trial: {self.first_probe_s * 1e3:.1f} ms)"
                   if self.first_probe_s is not None and len(self.measured) > 1 else ""))

    def _switch(self, c: Candidate) -> None:
        """Run ``c`` from the next step: land what the current plan left pending (every rank),
        then ask for a new train function."""
        if c == self.current or mutants.off("auto_never_switches"):
            return
        old = self.child()
        old.flush()
        if isinstance(old, MirroredShardedExecutor) and not mutants.off("auto_drops_state"):
            old.release()  # its state back into the whole slots
        if old.last_plan is not None:  # the variables planned for, until c traces its own
            self._specs = old.last_plan.variables
        self._child, self.current, self._unrun_plan = None, c, None
        if old.checkpoint_entry is not None and not mutants.off("auto_drops_state"):
            old.state.hand_over(self.child().state)  # sharded: slot state re-cut for c's slices
        self.switches += 1
        self._switched = True

    def _say(self, message: str) -> None:
        self.log.append(message)
        if hvd.rank() == 0:
            print(f"hvd_overlap: {message}", file=sys.stderr, flush=True)


def _priced(pool: Sequence[Candidate], unmeasured: Sequence[str], gather_with: str
            ) -> tuple[list[Candidate], list[str]]:
    """The candidates whose collectives the link probe measured, and what was left out: the
    sharded plans need the reduce-scatter and the gather (``gather_with``), the exchange the
    alltoall and the all-gather. (Ranked by a rate not measured, they would be ranked by the
    allreduce's, which Gloo's phases do not run at.)"""
    if not unmeasured:
        return list(pool), []
    gather = "alltoall" if gather_with == "alltoall" else "allgather"

    def needs(c: Candidate) -> set[str]:
        used = {"reducescatter", gather} if c.strategy in autoplan.SHARDED else set()
        return used | ({"alltoall", "allgather"} if c.exchange else set())
    kept = [c for c in pool if not needs(c) & set(unmeasured)]
    if len(kept) == len(pool):
        return kept, []
    return kept, [f"the plans on {', '.join(sorted(set(unmeasured)))}: the link probe could not "
                  "measure their rate"]
