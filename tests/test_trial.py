"""The online check between settings (``hvd_overlap.core.trials``), without ranks."""

import math

from hvd_overlap.core.trials import Trials


def _run(trials: Trials, times: dict[str, float], steps: int) -> list[tuple[int, str]]:
    """Feed ``steps`` steps, each taking the running setting's time; the switches seen."""
    switches = []
    for step in range(steps):
        got = trials.observe(times[trials.running])
        if got is not None:
            switches.append((step, got))
    return switches


def test_each_setting_runs_warm_then_timed_steps_and_the_faster_stays():
    t = Trials(("rows", "gather"), agree=lambda v: v, warm=2, timed=3)
    assert _run(t, {"rows": 0.5, "gather": 0.2}, 20) == [(4, "gather")]
    assert t.settled and t.running == "gather" and t.measured == {"rows": 0.5, "gather": 0.2}
    assert t.describe() == "rows 500.0 ms, gather 200.0 ms: gather"


def test_the_first_stays_unless_another_is_faster_by_the_margin():
    t = Trials(("rows", "gather"), agree=lambda v: v, warm=1, timed=2, margin=0.05)
    # gather is 2% faster: inside the margin, so back to rows after its trial
    assert _run(t, {"rows": 1.00, "gather": 0.98}, 10) == [(2, "gather"), (5, "rows")]
    assert t.running == "rows"


def test_warm_and_unusable_steps_are_not_timed_and_ranks_agree():
    seen = []

    def agree(values):
        seen.append(values)
        return [values[0] * 2, values[1] * 2]  # two ranks that measured the same

    t = Trials(("a", "b"), agree=agree, warm=2, timed=3)
    for s in (9.0, 9.0, 1.0, 2.0, 3.0):  # two warm steps (the retrace) are not timed
        t.observe(s)
    assert seen == [[2.0, 1.0]] and t.measured == {"a": 2.0}
    for _ in range(5):  # no usable step at all (e.g. only landing steps): the slowest
        t.observe(0.1, usable=False)
    assert math.isinf(t.measured["b"]) and t.settled and t.running == "a"


def test_forced_pick_for_tests():
    t = Trials(("rows", "gather"), agree=lambda v: v, warm=1, timed=1, forced="gather")
    assert _run(t, {"rows": 0.1, "gather": 0.9}, 10) == [(1, "gather")]
    assert t.running == "gather" and t.describe().endswith("(forced)")
