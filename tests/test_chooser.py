"""``auto``'s decisions without TensorFlow (``hvd_overlap.core.chooser``): synthetic step
times in, the plan to run next out."""

from __future__ import annotations

import math

from hvd_overlap.core.choice import Hybrid, Layerwise, StockHorovod
from hvd_overlap.core.chooser import Chooser
from hvd_overlap.core.strategy import Strategy
from hvd_overlap.core.trial import TrialClock

PROBE, A, B = StockHorovod(), Hybrid(bucket_bytes=1 << 20, defer=2), Layerwise(bucket_bytes=1 << 20)


class Run:
    """One rank's chooser, trials one step long, its switches recorded."""

    def __init__(self, times: dict[Strategy, list[float]], agree=lambda v: v,
                 trials=(A, B), clear_gain: float | None = 0.25, **shape):
        self.times = {k: list(v) for k, v in times.items()}
        self.switches: list[Strategy] = []
        self.said: list[str] = []
        self.chooser = Chooser(PROBE, "auto", TrialClock(1, agree), self._perform,
                               lambda probe_s: list(trials), self.said.append,
                               clear_gain=clear_gain, **shape)

    def _perform(self, plan: Strategy) -> bool:
        self.switches.append(plan)
        return True

    def step(self) -> None:
        t = self.times[self.chooser.current]
        self.chooser.observe(t.pop(0) if len(t) > 1 else t[0])

    def until_settled(self, limit: int = 20) -> Chooser:
        for _ in range(limit):
            if self.chooser.settled:
                break
            self.step()
        return self.chooser


def test_a_tie_keeps_the_probe():
    c = Run({PROBE: [0.1], A: [0.1], B: [0.1]})
    chooser = c.until_settled()
    assert chooser.current == PROBE and c.switches == [A, B, PROBE]
    assert chooser.confirming is None and chooser.choices[-1]["chosen"] == PROBE.describe()


def test_a_clear_gain_ends_the_check_at_once():
    c = Run({PROBE: [0.1], A: [0.07], B: [0.1]})
    chooser = c.until_settled()
    assert chooser.current == A and c.switches == [A] and "no further trial" in chooser.reason


def test_a_gain_under_the_clear_one_is_confirmed_then_kept():
    c = Run({PROBE: [0.1], A: [0.09], B: [0.1]})
    chooser = c.until_settled()
    assert chooser.current == A and c.switches == [A, B, PROBE, A]
    assert chooser.confirmed == {PROBE: 0.1, A: 0.09} and "confirmed" in chooser.reason


def test_a_choice_not_confirmed_falls_back_to_the_probe():
    c = Run({PROBE: [0.1], A: [0.09, 0.1], B: [0.1]})
    chooser = c.until_settled()
    assert chooser.current == PROBE and c.switches == [A, B, PROBE, A, PROBE]
    assert "not in its second" in chooser.reason


def test_nothing_to_measure_settles_on_the_probe():
    c = Run({PROBE: [0.1]}, trials=())
    chooser = c.until_settled()
    assert chooser.settled and chooser.current == PROBE and c.switches == []


def test_every_rank_decides_alike_given_agreed_timings():
    """Two ranks time different steps; the clock's agreement (the mean over the ranks) is
    what each decides on, so both switch at the same steps to the same plans."""
    local = [{PROBE: [0.12], A: [0.08, 0.11], B: [0.1]}, {PROBE: [0.08], A: [0.1, 0.09], B: [0.1]}]
    pending: list[list[float]] = [[], []]

    def agree_for(rank: int):
        def agree(values: list[float]) -> list[float]:
            pending[rank] = values
            other = pending[1 - rank]
            return [values[0] + other[0], values[1] + other[1]]
        return agree
    runs = [Run(local[r], agree_for(r), clear_gain=1.0) for r in range(2)]
    for _ in range(20):
        if runs[0].chooser.settled:
            break
        # both ranks' medians are in before either agrees: rank 1 first, then both decide
        for r in (1, 0):
            t = runs[r].times[runs[r].chooser.current]
            pending[r] = [t[0], 1.0]
        for r in (0, 1):
            runs[r].step()
    assert runs[0].switches == runs[1].switches and runs[0].chooser.current == \
        runs[1].chooser.current
    assert runs[0].chooser.measured == runs[1].chooser.measured


def test_reconsider_runs_the_check_again_from_the_probe():
    c = Run({PROBE: [0.1], A: [0.07], B: [0.1]})
    chooser = c.until_settled()
    assert chooser.current == A
    chooser.reconsider("growth", batch_factor=2.0)
    assert not chooser.settled and chooser.current == PROBE and chooser.measured == {}
    assert c.said[-1] == "auto: growth: choosing the plan again"
    chooser = c.until_settled()
    assert chooser.current == A and [ch["why"] for ch in chooser.choices] == ["start", "growth"]


def test_a_short_batch_without_a_model_keeps_the_plan():
    c = Run({PROBE: [0.1], A: [0.07], B: [0.1]})
    chooser = c.until_settled()
    chooser.reconsider("growth", batch_factor=2.0, horizon_steps=5)
    assert chooser.settled and chooser.current == A and "nothing to predict" in chooser.reason


def test_an_untimed_trial_counts_as_the_slowest():
    c = Run({PROBE: [0.1], A: [math.inf], B: [0.1]})
    chooser = c.until_settled()
    assert chooser.current == PROBE and chooser.measured[A] == math.inf


def exchange_style(times: dict[Strategy, list[float]], **shape) -> Run:
    """The exchange's check (``core.trials.Trials``): one trial each, no second probe trial,
    no confirmation, no early end, its own margin."""
    return Run(times, trials=(A,), clear_gain=None, margin=0.05, probe_again=False,
               confirm=False, **shape)


def test_exchange_style_one_trial_each_and_a_big_gain_is_not_confirmed():
    c = exchange_style({PROBE: [0.1], A: [0.05, 0.2]})
    chooser = c.until_settled()
    assert chooser.current == A and c.switches == [A] and chooser.settling_steps == 2
    assert chooser.measured == {PROBE: 0.1, A: 0.05} and chooser.confirmed == {}


def test_exchange_style_keeps_the_probe_inside_its_margin():
    c = exchange_style({PROBE: [1.0], A: [0.96]})  # 4% faster: inside the 5% margin
    chooser = c.until_settled()
    assert chooser.current == PROBE and c.switches == [A, PROBE]
    c = exchange_style({PROBE: [1.0], A: [0.95]})  # exactly the margin: the challenger wins
    assert c.until_settled().current == A


def test_exchange_style_forced_choice():
    c = exchange_style({PROBE: [0.1], A: [0.2]}, forced=A)
    chooser = c.until_settled()
    assert chooser.current == A and c.switches == [A] and chooser.settling_steps == 2


def test_the_quiet_steps_come_first_and_are_no_trial():
    """With quiet steps the probe runs them before its first trial: ``quiet`` while they
    run, their times counted as settling but in no trial (their shape is slower)."""
    c = Run({PROBE: [9.0, 9.0, 0.1], A: [0.07], B: [0.1]}, quiet_steps=2)
    chooser = c.chooser
    assert chooser.quiet
    c.step()
    assert chooser.quiet and chooser.queue is None and c.switches == []
    c.step()
    assert not chooser.quiet and chooser.queue is None  # the probe's trial is next
    chooser = c.until_settled()
    assert chooser.current == A and chooser.measured[PROBE] == 0.1
    assert chooser.settling_steps == 4 and chooser.settling_s > 18.0
