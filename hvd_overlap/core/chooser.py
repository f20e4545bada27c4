"""``auto``'s decisions, with no TensorFlow: which plan runs next, from what was observed.

Observations in: each step's wall time (and whether it was steady, and whether it traced), the
simulator's ranking after the probe's first trial (``rank``, given by the executor, which
measures the link and fits the model), and a growth of the batch (``reconsider``). Decisions
out: the plan to run from the next step (``perform``: the executor lands what is pending and
switches), settle, or choose again. The check itself (``hvd_overlap.keras.executors.auto``):

0. with ``quiet_steps`` (``auto``: ``QUIET_STEPS``), the probe first runs that many quiet
   steps (``quiet``), in which the executor times the model's compute alone: its collectives
   wait for the whole backward pass and its update for every collective;
1. the probe runs a trial (``WARM_STEPS + TRIAL_STEPS`` steps, the steady ones timed);
2. the ranking names the trials: the predicted best and the best of another kind;
3. each runs a trial, then the probe a second one; the fastest stays (the probe unless
   another is faster by more than ``core.trial.MARGIN``); a trial faster than the probe's
   first by ``CLEAR_GAIN`` ends the check at once;
4. a choice other than the probe is confirmed: the probe, then the choice, once more each.

Every rank agrees on each trial's time (``TrialClock``), so every rank decides alike. The
exchange's check between the forward on the rows and the gather (``core.trials.Trials``) is
this machine with one trial each: ``probe_again``, ``confirm`` off, no ``clear_gain``, its
own ``margin``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from hvd_overlap.core import autoplan
from hvd_overlap.core.margin import keep_unless_faster
from hvd_overlap.core.sim.run import StepResult
from hvd_overlap.core.strategy import Strategy
from hvd_overlap.core.trial import MARGIN, TrialClock

#: steps of a trial: room for a deferring plan's two traced steps and the step after them...
WARM_STEPS = 3
#: ...then the steps it is timed over
TRIAL_STEPS = 7
#: quiet steps before the probe's first trial (``auto``): the first traces them, the others
#: time the compute (five, their median)
QUIET_STEPS = 6
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


class Chooser:
    """The online check's state and decisions. ``perform(plan)`` runs ``plan`` from the next
    step (False: it could not, the plan stays); ``rank(probe_s)``: the trials to measure after
    the probe's first trial (the executor's model and link); ``say``: a message for the log
    every rank keeps; ``note``: one for rank 0's eyes only."""

    def __init__(self, probe: Strategy, label: str, clock: TrialClock,
                 perform: Callable[[Strategy], bool], rank: Callable[[float], list[Strategy]],
                 say: Callable[[str], None], note: Callable[[str], None] = lambda _: None,
                 clear_gain: float | None = CLEAR_GAIN, predicted_gain: float = PREDICTED_GAIN,
                 margin: float = MARGIN, probe_again: bool = True, confirm: bool = True,
                 forced: Strategy | None = None, quiet_steps: int = 0):
        self.probe = self.current = probe
        self.label, self.clock = label, clock
        self._perform, self._rank, self._say, self._note = perform, rank, say, note
        self.clear_gain, self.predicted_gain = clear_gain, predicted_gain  # None: no early end
        #: the check's shape: ``margin`` (a share of the probe, ``keep_unless_faster``) a trial
        #: must beat; the probe's second trial after the others; the confirmation pair
        self.margin, self.probe_again, self.confirm = margin, probe_again, confirm
        self.forced = forced  # tests: keep this one whatever the timings
        self.quiet_steps = quiet_steps  # the probe's quiet steps at each check's start
        self.choices: list[dict[str, Any]] = []  # every choice made, one per batch phase
        #: the last ranking's fitted profile, cluster and pool (what a prediction starts from)
        self.fitted: tuple[autoplan.Profile, Any, Sequence[Strategy]] | None = None
        self.start("start")

    def start(self, why: str) -> None:
        """The check's state at its start (``why``: "start", or a reconsider's)."""
        self.measured: dict[Strategy, float] = {}
        self.queue: list[Strategy] | None = None   # None: the model has not ranked yet
        self.first_probe_s: float | None = None    # the probe's first trial (fits the model)
        self.confirming: Strategy | None = None    # the first pass's choice, measured again
        self.confirmed: dict[Strategy, float] = {}  # the second pass: the probe, the choice
        self.predicted: dict[Strategy, float] = {}  # the simulator's step of each candidate
        self.settled = False
        self.quiet_left = self.quiet_steps  # quiet steps still to run (not trial steps)
        self.settling_steps = 0   # steps run before the choice was final...
        self.settling_s = 0.0     # ...and their wall time on this rank (traces included)
        self.trigger = why        # why this check runs (a growth: reconsider)
        self.reason = (f"measuring {self.probe.describe()} first" if why == "start"
                       else f"{why}: measuring {self.probe.describe()} first")

    def switch(self, plan: Strategy) -> None:
        """Run ``plan`` from the next step (the executor performs it)."""
        if plan != self.current and self._perform(plan):
            self.current = plan

    def observe(self, seconds: float, usable: bool = True, traced: bool = False) -> None:
        """One train step took ``seconds`` on this rank (``usable``: a steady one; ``traced``:
        it traced a train function)."""
        if self.settled:
            return
        self.settling_steps += 1
        self.settling_s += seconds
        if self.quiet_left:  # a quiet step: the compute's, not the trial's
            self.quiet_left -= 1
            return
        step = self.clock.observe(seconds, usable, traced)
        if step is not None:
            self.trial_done(step)

    def trial_done(self, step: float) -> None:
        """A trial ended with ``step`` (agreed by the ranks; ``inf``: no rank had a steady
        step, tiny epochs: this plan counts as the slowest)."""
        if self.confirming is not None:
            self.confirmed[self.current] = step
        else:
            self.measured[self.current] = step
        if self.queue is None:
            self.first_probe_s = step
            trials = self._rank(step)
            if not trials:  # nothing worth measuring: the probe, for the reason rank gave
                self.queue = []
                self.settle(self.probe)
                return
            # the probe once more, last: its first trial ran in the process's first steps,
            # which stall more often than later ones; every plan compared is then a later one
            self.queue = trials + [self.probe] if self.probe_again else list(trials)
        elif self.confirming is None and self.current != self.probe \
                and self.clear_gain is not None \
                and not keep_unless_faster(step, self.first_probe_s, self.clear_gain):
            self.queue = []
            self.reason = (self.why(self.current) + f"; faster by {self.clear_gain:.0%} or "
                           "more: no further trial")
            self.settle(self.current)
            return
        if self.queue:
            self.switch(self.queue.pop(0))
            return
        if self.confirming is None:
            best = self.forced if self.forced is not None else \
                autoplan.pick(self.measured, self.probe, self.margin)
            self.reason = self.why(best)
            if best != self.probe and self.confirm:
                # the probe (running now) once more, then the choice: the same two, measured
                # again side by side, decide; the choice's executor is the one that stays
                self.confirming, self.queue = best, [best]
                return
            self.settle(best)
            return
        self.settle(self.second_pass())

    def trials_from(self, ranked: Sequence[tuple[Strategy, StepResult]],
                    probe_s: float) -> list[Strategy]:
        """The trials to measure from the simulator's ranking: those predicted
        ``predicted_gain`` faster than the probe, one of each kind. Against the probe's own
        prediction where the ranking has it (with the compute measured, the simulator's
        step of the probe need not be its measured ``probe_s``), else against ``probe_s``."""
        self.predicted = {c: r.step_s for c, r in ranked}
        base = self.predicted.setdefault(self.probe, probe_s)
        worth = [(c, r) for c, r in ranked
                 if not keep_unless_faster(r.step_s, base, self.predicted_gain)]
        order = autoplan.trial_order(worth, self.probe)
        if not order:
            best, result = next(((c, r) for c, r in ranked if c != self.probe),
                                (self.probe, None))
            self.reason = (f"no plan predicted {self.predicted_gain:.0%} faster than "
                           f"{self.probe.describe()} ({base * 1e3:.1f} ms predicted, "
                           f"{probe_s * 1e3:.1f} ms/step measured)" + (
                               f" (best: {best.describe()} {result.step_s * 1e3:.1f} ms)"
                               if result is not None else "") + ": nothing to measure")
        return order

    def reconsider(self, why: str, batch_factor: float | None = None,
                   horizon_steps: int | None = None, trial_steps: int = TRIAL_STEPS,
                   warm_steps: int = WARM_STEPS) -> None:
        """Choose again: the per-rank batch changed (by ``batch_factor``). With
        ``horizon_steps`` (the steps the new batch will run) shorter than two checks' worth,
        the simulator alone picks (``predict_for``); otherwise the check runs again from the
        probe, as at the start."""
        # the quiet steps, probe, two trials, probe, confirmation pair
        check = self.quiet_steps + 6 * (warm_steps + trial_steps)
        if horizon_steps is not None and horizon_steps < 2 * check:
            self.predict_for(why, batch_factor, horizon_steps)
            return
        self.switch(self.probe)
        self.clock.restart()
        self.start(why)
        self._say(f"{self.label}: {why}: choosing the plan again")

    def predict_for(self, why: str, batch_factor: float | None, horizon: int) -> None:
        """The plan for a batch that runs too few steps for a check: the simulator's pick
        from the model fitted in the last check, its compute scaled by ``batch_factor`` -- the
        current plan unless another is predicted faster than it by ``predicted_gain`` (a switch
        costs a trace); without such a model the current plan stays."""
        self.trigger = why
        short = f"{why}: {horizon} steps, too few for a check"
        if not self.settled:  # a check under way stops: the probe, never slower than stock
            choice = self.probe
            self.reason = f"{short}; the check under way stops: {choice.describe()}"
        elif self.fitted is None or not batch_factor:
            choice = self.current
            self.reason = f"{short}; nothing to predict from: keeping {choice.describe()}"
        else:
            profile, cluster, pool = self.fitted
            grown = autoplan.at_batch(profile, batch_factor)
            self.predicted = {c: r.step_s for c, r in autoplan.rank(grown, cluster, pool)}
            current_s = autoplan.predict(grown, cluster, self.current).step_s
            choice = autoplan.pick({**self.predicted, self.current: current_s}, self.current,
                                   margin=self.predicted_gain)
            self.reason = (f"{short}; predicted {choice.describe()} "
                           f"{self.predicted.get(choice, current_s) * 1e3:.1f} ms/step"
                           + ("" if choice == self.current else
                              f" vs {self.current.describe()} {current_s * 1e3:.1f}"))
        self.queue, self.confirming = [], None
        self.chose(choice, steps=0, seconds=0.0)

    def second_pass(self) -> Strategy:
        """The first pass's choice if the second pass confirms it, else the probe."""
        best, probe = self.confirming, self.probe
        again = self.forced if self.forced is not None else \
            autoplan.pick(self.confirmed, probe, self.margin)
        b, p = self.confirmed[best] * 1e3, self.confirmed[probe] * 1e3
        if again == best:
            self.reason += f"; confirmed: {b:.1f} vs {p:.1f} ms/step"
        else:
            self.reason = (f"{best.describe()} was faster in its first trial "
                           f"({self.measured[best] * 1e3:.1f} vs "
                           f"{self.measured[probe] * 1e3:.1f} ms/step) but not in its second "
                           f"({b:.1f} vs {p:.1f} ms/step): keeping {probe.describe()}")
        return again

    def chose(self, choice: Strategy, steps: int, seconds: float) -> None:
        """Run ``choice`` from the next step, the check over; record and say it (``steps``
        and ``seconds``: what choosing cost this rank)."""
        self.switch(choice)
        self.settled = True
        self.choices.append({"why": self.trigger, "chosen": choice.describe(),
                             "reason": self.reason, "steps": steps, "seconds": seconds})
        self._say(f"{self.label} chose {choice.describe()}: {self.reason}")

    @property
    def quiet(self) -> bool:
        """The probe's quiet steps run (the model's compute is timed in them, alone)."""
        return not self.settled and self.quiet_left > 0 and self.current == self.probe

    def settle(self, choice: Strategy) -> None:
        self.chose(choice, self.settling_steps, self.settling_s)
        self._note(f"{self.label}: {self.settling_cost()}")

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

    def why(self, best: Strategy) -> str:
        """The measurements behind choosing ``best``, in words."""
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
