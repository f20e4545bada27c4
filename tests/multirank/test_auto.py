"""``strategy="auto"`` (issue 15): plans switched mid-run by the online check still give stock
Horovod's weights, every rank takes the same decisions, and the choice is logged once."""

from __future__ import annotations

import horovod.tensorflow as hvd_tf
import numpy as np
import pytest
import tensorflow as tf

import hvd_overlap.keras as hvdo
from hvd_overlap import DEFAULT_BUCKET_BYTES
from hvd_overlap.core.choice import (
    Deferred,
    Hybrid,
    Sharded,
    ShardedHybrid,
    StockHorovod,
    Strategy,
)
from hvd_overlap.keras.executors import auto
from tests.multirank import test_keras_usage
from tests.multirank.helpers import (
    EPOCHS,
    MODELS,
    REFERENCES,
    STEPS_PER_EPOCH,
    ModelCheckpointInTmp,
    Result,
    assert_fit_saw_stocks_weights,
    assert_weights_close,
    max_abs_diff,
    same_on_all_ranks,
    stock,
    stock_loop,
    stock_reference,
    train_fit,
    train_loop,
)
from tests.multirank.test_keras_usage import _fit_mixed, _fit_per_batch_lr

QUIET = auto.QUIET_STEPS  # the quiet steps a check starts with, in the tests that keep them
# trials of plans that defer part or all of a step (so a switch has a pending update to land)
TRIALS = [Hybrid(bucket_bytes=2048, defer=2), Deferred(bucket_bytes=2048)]


@pytest.fixture(autouse=True)
def short_trials(monkeypatch):
    """One timed step per plan, so the probe, both trials, the probe again and a second pass
    over the probe and the choice (six trials of four steps) fit in a run of 24 steps; every
    trial runs whatever the timings (a clear win ends the check early: tested on its own);
    no quiet steps before the probe's trial (tested on their own, ``QUIET``)."""
    monkeypatch.setattr(auto, "TRIAL_STEPS", 1)
    monkeypatch.setattr(auto, "CLEAR_GAIN", 1.0)  # no step is 100% faster
    monkeypatch.setattr(auto, "QUIET_STEPS", 0)


def auto_with(trials=None, strategy="auto", **kw):
    """``strategy="auto"`` (or another ``"auto"`` setting); with ``trials``, the online check
    measures those after the probe (instead of the simulator's ranking), so the test knows
    which plans it switches through. The optimizers made are in ``wrap.made``."""
    made: list = []

    def wrap(opt):
        o = hvdo.DistributedOptimizer(opt, strategy=strategy, **kw)
        o._hvdo.forced_trials = trials
        made.append(o)
        return o
    wrap.made = made
    return wrap


# sharded plans the online check switches through: other bucket sizes (the slices are cut anew)
SHARDED_TRIALS = [ShardedHybrid(bucket_bytes=2048, defer=2), Sharded(bucket_bytes=8192)]


def sharded_auto():
    """``strategy="sharded", bucket_bytes="auto"``, measuring ``SHARDED_TRIALS``."""
    return auto_with(SHARDED_TRIALS, strategy="sharded", bucket_bytes="auto")


def _ran_through_trials(opt, got: Result) -> None:
    """The online check ran the probe and every trial plan (switching into each), steps of the
    deferring trials really deferred, and it made one choice, the plan running now -- the
    same on every rank."""
    ex = opt._hvdo
    assert ex.settled, f"the online check did not finish: {ex.reason}"
    assert set(ex.measured) == {StockHorovod(), *TRIALS}
    assert ex.switches >= len(TRIALS), ex.log
    assert got.deferred_steps > 0, "no step of a deferring trial left its update pending"
    assert [c["why"] for c in ex.choices] == ["start"], ex.choices
    assert ex.choices[0]["chosen"] == ex.current.describe() and ex.current in ex.measured
    decided = hvd_tf.allgather_object((ex.current, ex.log), name=f"auto.same.{ex.switches}")
    assert decided[0] == decided[1], "ranks decided differently"


@pytest.mark.parametrize("opt_name", ["sgd_momentum", "adam", "sgd_schedule"])
def test_fit_switching_plans_matches_stock(opt_name):
    ckpt = ModelCheckpointInTmp()
    wrap = auto_with(TRIALS)
    got = train_fit("cnn_bn", opt_name, wrap, validation=True, callbacks=[ckpt.callback])
    _ran_through_trials(wrap.made[0], got)
    ref = stock_reference("cnn_bn", opt_name)
    assert_weights_close(got, ref)
    assert same_on_all_ranks(got)
    assert ckpt.saved() == EPOCHS
    assert_fit_saw_stocks_weights(got, ref)


@pytest.mark.parametrize("model_name", ["shared_layer", "embedding", "unused_branch"])
def test_model_kinds_switching_plans_match_stock(model_name):
    wrap = auto_with(TRIALS)
    got = train_fit(model_name, "sgd_momentum", wrap)
    _ran_through_trials(wrap.made[0], got)
    assert_weights_close(got, stock_reference(model_name, "sgd_momentum"))


def test_custom_loop_switching_plans_matches_tape():
    """``make_train_step``: the deferring trials defer in a custom loop too."""
    ref = stock_loop("cnn_bn", "adam")
    wrap = auto_with(TRIALS)
    got = train_loop("cnn_bn", "adam", wrap)
    _ran_through_trials(wrap.made[0], got)
    assert_weights_close(got, ref)


@pytest.fixture
def every_plan_worth_a_trial(monkeypatch):
    """Every candidate counts as predicted faster enough to be measured."""
    monkeypatch.setattr(auto, "PREDICTED_GAIN", -1.0)


def test_simulator_ranked_choice_matches_stock_and_is_logged_once(every_plan_worth_a_trial):
    """No forced trials: the link is measured, the profile fitted to the probe's steps, the
    simulator's two best measured; the choice is the same on every rank and in the plan."""
    wrap = auto_with()
    got = train_fit("cnn_bn", "sgd_momentum", wrap, epochs=EPOCHS)
    opt = wrap.made[0]
    ex = opt._hvdo
    assert ex.settled and len(ex.measured) == 3, ex.log
    assert ex.switches >= 2, ex.log  # into each of the two plans measured
    assert len(ex.log) == 2 and "chose" in ex.log[1] and "link" in ex.log[0]
    assert [(c["why"], c["chosen"]) for c in ex.choices] == [("start", ex.current.describe())]
    first = auto.autoplan.pick(ex.measured, ex.probe)
    if first == ex.probe:  # nothing to confirm
        assert ex.current == ex.probe and not ex.confirmed
    else:  # the probe and the first choice measured again decided
        assert set(ex.confirmed) == {ex.probe, first}
        assert ex.current == auto.autoplan.pick(ex.confirmed, ex.probe)
    assert "auto:" in opt.plan.describe()
    logs = hvd_tf.allgather_object(ex.log[1], name="auto.logged")
    assert logs[0] == logs[1]
    assert_weights_close(got, stock_reference("cnn_bn", "sgd_momentum"))


def test_nothing_predicted_faster_enough_is_not_measured(monkeypatch):
    """Where no plan is predicted ``PREDICTED_GAIN`` faster than the probe, the check ends
    after the probe's one trial: no other plan is traced or run (settling is the probe's)."""
    monkeypatch.setattr(auto, "PREDICTED_GAIN", 0.99)
    wrap = auto_with()
    got = train_fit("cnn_bn", "sgd_momentum", wrap, epochs=EPOCHS)
    ex = wrap.made[0]._hvdo
    assert ex.settled and set(ex.measured) == {ex.probe} and ex.switches == 0, ex.log
    assert ex.current == ex.probe and ex.reason.startswith("no plan predicted 99% faster")
    assert ex.settling_steps == auto.QUIET_STEPS + auto.WARM_STEPS + auto.TRIAL_STEPS
    assert "measuring nothing more" in ex.log[0] and len(ex.predicted) > 1
    assert_weights_close(got, stock_reference("cnn_bn", "sgd_momentum"))


def test_the_probe_times_its_compute_inside_its_steps(monkeypatch):
    """The model ``auto`` ranks with starts from the compute timed in the probe's quiet steps
    (the step's start to its last local gradient, plus the update alone), a part of each
    step, the same on every rank; the quiet steps train as any other (stock's weights)."""
    monkeypatch.setattr(auto, "PREDICTED_GAIN", 0.99)
    monkeypatch.setattr(auto, "QUIET_STEPS", QUIET)
    wrap = auto_with()
    got = train_fit("cnn_bn", "sgd_momentum", wrap, epochs=EPOCHS)
    ex = wrap.made[0]._hvdo
    assert ex.settled and ex.current == ex.probe, ex.log
    assert ex.settling_steps == QUIET + auto.WARM_STEPS + auto.TRIAL_STEPS
    samples = ex.compute_clock.samples
    assert 1 <= len(samples) < QUIET and all(s > 0 for s in samples), samples
    assert ex.compute_clock.estimate() < 1.2 * ex.measured[ex.probe], (samples, ex.measured)
    assert "(compute measured: " in ex.log[0], ex.log[0]
    model_compute = hvd_tf.allgather_object(ex.chooser.fitted[0].compute_s,
                                            name="test.auto.model_compute")
    assert len(set(model_compute)) == 1  # agreed: every rank ranks the same
    assert_weights_close(got, stock_reference("cnn_bn", "sgd_momentum"))


def test_quiet_steps_then_plans_switched_match_stock(monkeypatch):
    """The quiet steps (collectives after the whole backward pass, the update after every
    collective), then a check through deferring plans: every switch exact, stock's weights."""
    monkeypatch.setattr(auto, "QUIET_STEPS", QUIET)
    wrap = auto_with(TRIALS)
    got = train_fit("cnn_bn", "adam", wrap, epochs=3)
    ex = wrap.made[0]._hvdo
    _ran_through_trials(wrap.made[0], got)
    assert ex.compute_clock.samples, "no quiet step was timed"
    assert_weights_close(got, train_fit("cnn_bn", "adam", stock, epochs=3))


def test_the_link_probe_times_each_collective_the_plans_use():
    from hvd_overlap.comm.link import cluster_of, measure_link

    link = measure_link("test.link", repeats=2, probe_bytes=1 << 20, phases=True)
    rates = (link.reduce_scatter_bandwidth, link.allgather_bandwidth, link.alltoall_bandwidth)
    assert all(r is not None and 0 < r < float("inf") for r in (link.bandwidth, *rates)), link
    c = cluster_of(link)
    assert (c.reduce_scatter_bandwidth, c.allgather_bandwidth, c.alltoall_bandwidth) == rates
    plain = measure_link("test.link.plain", repeats=2, probe_bytes=1 << 20)
    assert plain.reduce_scatter_bandwidth is None
    assert cluster_of(plain).reduce_scatter(1e6) == cluster_of(plain).allgather(1e6)


def test_a_rank_late_to_the_link_probe_is_not_timed_as_the_link(monkeypatch):
    """One rank reaches the probe's first collective a few tenths of a second after the other
    (in each run: a long computation feeds it there): that wait must not read as the fixed cost
    of a collective, nor (subtracted) as a faster link."""
    from hvd_overlap.comm import link as probe

    first, original = [], probe._collective

    def late(kind, x, name):
        if not first and hvd_tf.rank() == 1:
            m = tf.fill([1500, 1500], tf.reduce_sum(x) + 1.0)  # from x: not folded away
            for _ in range(12):  # about 0.8 s on one core
                m = tf.matmul(m, m) * 1e-3
            x = x + 1e-30 * tf.reduce_sum(m)
        first.append(name)
        return original(kind, x, name)

    monkeypatch.setattr(probe, "_collective", late)
    got = probe.measure_link("test.link.late", repeats=4, probe_bytes=1 << 20)
    # the wait timed as the link would read about 0.1 s per collective; the real fixed cost is
    # a few ms, and stays below 0.05 s with a build running beside the test
    assert got.per_collective_s < 0.05, got


def _times(monkeypatch, ms: dict[Strategy, list[float]]) -> list[Strategy]:
    """Each trial of a plan measures the next of its ``ms`` (the same on every rank; none
    left: the slowest), so the test decides what the online check sees. Returns the plans
    whose trials ended, in order (filled as the run goes)."""
    left = {c: list(t) for c, t in ms.items()}
    timed: list[Strategy] = []

    def agree(self, values):
        timed.append(self.current)
        return [left[self.current].pop(0) / 1e3 if left[self.current] else float("inf"), 1.0]
    monkeypatch.setattr(auto.AutoExecutor, "_agree", agree)
    return timed


HORO, HYBRID, DEFERRED = StockHorovod(), *TRIALS


@pytest.mark.parametrize("second", [80.0, 120.0])
def test_the_first_choice_is_measured_again_and_kept_only_if_faster_again(monkeypatch, second):
    """hybrid wins the first pass (80 vs 100 ms); the probe and hybrid are measured again:
    hybrid stays if it is faster again, else the run goes back to the probe -- one more
    switch, exact like the others."""
    timed = _times(monkeypatch, {HORO: [100.0, 100.0, 100.0], HYBRID: [80.0, second],
                                 DEFERRED: [90.0]})
    wrap = auto_with(TRIALS)
    got = train_fit("cnn_bn", "sgd_momentum", wrap, epochs=3)
    ex = wrap.made[0]._hvdo
    # the probe, each trial, the probe again; then the probe and hybrid, measured again
    assert timed == [HORO, HYBRID, DEFERRED, HORO, HORO, HYBRID], timed
    assert ex.settled and set(ex.confirmed) == {HORO, HYBRID}
    assert got.deferred_steps > 0  # hybrid's and deferred's trials deferred
    if second < 100:
        # to hybrid, deferred, horovod; hybrid again, kept
        assert ex.current == HYBRID and ex.switches == 4, ex.log
        assert "confirmed: 80.0 vs 100.0" in ex.log[-1]
    else:
        # to hybrid, deferred, horovod; hybrid again, then back to horovod
        assert ex.current == HORO and ex.switches == 5, ex.log
        assert "but not in its second (120.0 vs 100.0 ms/step): keeping horovod" in ex.log[-1]
    # the plan kept runs the last epoch: hybrid defers (but at the epoch's end), horovod not
    assert got.pending[-STEPS_PER_EPOCH:] == \
        [ex.current == HYBRID] * (STEPS_PER_EPOCH - 1) + [False], got.pending
    assert [(c["why"], c["chosen"]) for c in ex.choices] == [("start", ex.current.describe())]
    assert_weights_close(got, train_fit("cnn_bn", "sgd_momentum", stock, epochs=3))


def test_a_plan_clearly_faster_in_its_trial_ends_the_check(monkeypatch):
    """hybrid's trial is 30% faster than the probe's: it stays at once (no trial of the
    other plan, no second pass), and the weights are stock Horovod's."""
    monkeypatch.setattr(auto, "CLEAR_GAIN", 0.25)
    timed = _times(monkeypatch, {HORO: [100.0], HYBRID: [70.0], DEFERRED: []})
    wrap = auto_with(TRIALS)
    got = train_fit("cnn_bn", "sgd_momentum", wrap, epochs=3)
    ex = wrap.made[0]._hvdo
    assert timed == [HORO, HYBRID], timed
    assert ex.settled and not ex.confirmed
    assert ex.current == HYBRID and ex.switches == 1, ex.log
    assert [(c["why"], c["chosen"]) for c in ex.choices] == [("start", HYBRID.describe())]
    # hybrid stayed: every step of the last epoch deferred its input side but the epoch's last
    assert got.pending[-STEPS_PER_EPOCH:] == [True] * (STEPS_PER_EPOCH - 1) + [False]
    assert ex.settling_steps == auto.QUIET_STEPS + 2 * (auto.WARM_STEPS + auto.TRIAL_STEPS)
    assert "faster by 25% or more: no further trial" in ex.log[-1]
    assert_weights_close(got, train_fit("cnn_bn", "sgd_momentum", stock, epochs=3))


def test_a_switch_lands_the_pending_update_first():
    """Negative control of the exactness above: the same run where a switch drops the pending
    update instead of landing it ends elsewhere, so the tests can see a lost step."""
    wrap = auto_with(TRIALS)
    original = auto.AutoExecutor._switch
    dropped: list[Strategy] = []

    def dropping(self, c):
        if self.child().pending:
            dropped.append(self.current)
            self.child().phase.pending.assign(False)  # the deferred buckets never land
        original(self, c)

    auto.AutoExecutor._switch = dropping
    try:
        got = train_fit("cnn_bn", "sgd_momentum", wrap, check_steps=False)
    finally:
        auto.AutoExecutor._switch = original
    assert dropped, "no switch left a deferring plan with an update pending"
    assert max_abs_diff(got, stock_reference("cnn_bn", "sgd_momentum")) > 1e-4


def _auto_of(family: str):
    return auto_with(TRIALS) if family == "whole" else sharded_auto()


@pytest.mark.parametrize("family", ["whole", "sharded"])
def test_mixed_precision_with_overflow_equals_stock(family):
    # stock's run, once per launch: kept where test_keras_usage keeps it for its own tests
    if not test_keras_usage._stock_mixed:
        test_keras_usage._stock_mixed.append(_fit_mixed(stock))
    want, want_scale, want_steps = test_keras_usage._stock_mixed[0]
    wrap = _auto_of(family)
    got, scale, steps = _fit_mixed(wrap)
    assert wrap.made[0]._hvdo.switches >= 1
    assert (scale, steps) == (want_scale, want_steps)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# each family once, each optimizer family (new, legacy: the rate is read differently) once
@pytest.mark.parametrize("opt_name, family", [("sgd_momentum", "whole"),
                                              ("legacy_sgd_momentum", "sharded")])
def test_per_batch_learning_rate_callbacks_equal_stock(opt_name, family):
    factory = {"sgd_momentum": lambda: tf.keras.optimizers.SGD(0.1, momentum=0.9),
               "legacy_sgd_momentum": lambda: tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9),
               }[opt_name]
    want = REFERENCES.get(("per_batch_lr", opt_name), lambda: _fit_per_batch_lr(stock, factory))
    wrap = _auto_of(family)
    got = _fit_per_batch_lr(wrap, factory)
    assert wrap.made[0]._hvdo.switches >= 1
    for a, b in zip(want, got, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_bucket_bytes_auto_keeps_the_named_strategy_and_matches_stock():
    sizes = [Hybrid(bucket_bytes=1024, defer=1), Hybrid(bucket_bytes=8192, defer=1)]
    wrap = auto_with(sizes, strategy="hybrid", bucket_bytes="auto")
    got = train_fit("cnn_bn", "sgd_momentum", wrap)
    ex = wrap.made[0]._hvdo
    assert ex.settled and ex.current.name == "hybrid"
    assert ex.probe == Hybrid(bucket_bytes=DEFAULT_BUCKET_BYTES)
    assert set(ex.measured) == {ex.probe, *sizes} and ex.switches >= len(sizes), ex.log
    assert [(c["why"], c["chosen"]) for c in ex.choices] == [("start", ex.current.describe())]
    assert_weights_close(got, stock_reference("cnn_bn", "sgd_momentum"))


def test_switching_out_of_a_sharded_plan_carries_adams_state():
    """``strategy="auto"`` into a sharded plan and out of it again with Adam: the slices start
    from the optimizer's whole moments and go back into them when the plan ends, so the next
    plan goes on from them; the weights are stock's (a dropped state would show)."""
    plans = [Sharded(bucket_bytes=2048), Hybrid(bucket_bytes=2048, defer=2)]
    wrap = auto_with(plans)
    got = train_fit("cnn_bn", "adam", wrap)
    ex = wrap.made[0]._hvdo
    assert ex.settled and set(ex.measured) == {HORO, *plans}, ex.log
    assert ex.switches >= len(plans), ex.log  # out of the sharded plan at least once
    assert_weights_close(got, stock_reference("cnn_bn", "adam"))


# slots re-cut at each switch: a new optimizer's and a legacy one's (SGD's momentum is one slot
# re-cut the same way as Adam's two)
@pytest.mark.parametrize("opt_name", ["adam", "legacy_adam"])
def test_sharded_bucket_bytes_auto_recuts_the_state_and_matches_stock(opt_name):
    """``strategy="sharded", bucket_bytes="auto"``: every switch re-cuts the optimizer state
    for the next plan's slices (gathered whole, sliced again), so the run equals stock's; the
    slots stay slices (1/P), out of ``optimizer.variables()``."""
    ckpt = ModelCheckpointInTmp()
    wrap = sharded_auto()
    # three epochs: the plan chosen last runs (and builds its slices) after the choice
    got = train_fit("cnn_bn", opt_name, wrap, epochs=3, validation=True,
                    callbacks=[ckpt.callback])
    opt = wrap.made[0]
    ex = opt._hvdo
    assert ex.settled and ex.switches >= len(SHARDED_TRIALS), ex.log
    assert ex.probe == Sharded(bucket_bytes=DEFAULT_BUCKET_BYTES)
    assert set(ex.measured) == {ex.probe, *SHARDED_TRIALS}
    slices, slots = opt.slice_variables()
    n = sum(int(np.prod(v.shape)) for v in slices)
    whole = sum(int(np.prod(v.shape)) for v in MODELS["cnn_bn"]().trainable_variables)
    assert whole / hvd_tf.size() <= n < whole, "the state is not sharded"
    assert slots and not {id(v) for v in slots} & {id(v) for v in opt.variables()}
    assert_weights_close(got, train_fit("cnn_bn", opt_name, stock, epochs=3, validation=True))
    assert same_on_all_ranks(got)
    assert ckpt.saved() == 3


def test_sharded_auto_checkpoint_resume_equals_uninterrupted_run():
    """The checkpointed state follows the switches: a run resumed from a checkpoint saved after
    them (and switching again) ends where the uninterrupted run ends -- and, without the
    optimizer state, elsewhere (the test can fail)."""
    whole = train_fit("cnn_bn", "adam", sharded_auto(), epochs=4)
    ckpt = ModelCheckpointInTmp()
    wrap = sharded_auto()
    train_fit("cnn_bn", "adam", wrap, epochs=2, callbacks=[ckpt.callback])
    assert wrap.made[0]._hvdo.switches >= len(SHARDED_TRIALS)
    saved = tf.train.load_checkpoint(ckpt.path).get_variable_to_shape_map()
    assert [k for k in saved if "hvd_overlap_sharded_state" in k]
    resumed = train_fit("cnn_bn", "adam", sharded_auto(), epochs=4, initial_epoch=2,
                        restore=ckpt.path)
    assert_weights_close(resumed, whole, trainable_only=hvd_tf.rank() != 0)
    fresh = train_fit("cnn_bn", "adam", sharded_auto(), epochs=4, initial_epoch=2,
                      restore=ckpt.path, restore_optimizer=False)
    assert max_abs_diff(fresh, whole) > 1e-4


def test_a_sharded_switch_that_drops_the_state_ends_elsewhere():
    """Negative control of the re-cut above: a switch whose next plan starts from fresh slots
    (the gathered state not handed over) ends away from stock's weights."""
    from hvd_overlap.keras.sharded_state import ShardedState

    original = ShardedState.hand_over

    def dropping(self, successor):
        self.checkpoint.serve(successor)  # (the real one also restores the gathered slots)

    ShardedState.hand_over = dropping
    try:
        got = train_fit("cnn_bn", "sgd_momentum", sharded_auto())
    finally:
        ShardedState.hand_over = original
    assert max_abs_diff(got, stock_reference("cnn_bn", "sgd_momentum")) > 1e-4
