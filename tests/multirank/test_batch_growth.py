"""Batch-size growth on 2 ranks: same decisions everywhere, fewer collectives, exact accumulation.

Every rank runs every test in the same order; all checks happen after the collectives.
"""

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import pytest
import tensorflow as tf

import hvd_overlap.keras as hvdo
from hvd_overlap.growth.callback import BatchSizeScheduler
from hvd_overlap.growth.data import fit_with_growth
from hvd_overlap.growth.policy import BatchGrowth, Milestones, Plateau
from tests.multirank.helpers import REFERENCES

LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def global_data(n: int = 256, seed: int = 0):
    """The whole training set, equal on every rank (each rank trains on its shard)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, n)
    x = rng.normal(size=(n, 10)).astype("float32") + y[:, None].astype("float32") / 2
    return x, y


def model(opt: tf.keras.optimizers.Optimizer) -> tf.keras.Model:
    tf.keras.utils.set_random_seed(11)
    m = tf.keras.Sequential([tf.keras.layers.Dense(32, activation="relu", input_shape=(10,)),
                             tf.keras.layers.Dense(4)])
    m.compile(optimizer=opt, loss=LOSS)
    return m


class StepCounter(tf.keras.callbacks.Callback):
    """Optimizer steps (= gradient allreduces with hvd.DistributedOptimizer) per epoch."""

    def __init__(self):
        super().__init__()
        self.per_epoch: list[int] = []
        self._last = 0

    def on_epoch_end(self, epoch, logs=None):
        now = int(self.model.optimizer.iterations.numpy())
        self.per_epoch.append(now - self._last)
        self._last = now


def gathered(obj, name):
    return hvd_tf.allgather_object(obj, name=name)


@pytest.mark.parametrize("wrap", [
    hvd.DistributedOptimizer,
    lambda opt: hvdo.DistributedOptimizer(opt, strategy="layerwise"),
], ids=["stock", "layerwise"])
def test_growth_same_epoch_on_all_ranks_and_collectives_drop(wrap):
    x, y = global_data()
    m = model(wrap(tf.keras.optimizers.SGD(0.02)))
    policy = BatchGrowth(Milestones({1: 2, 3: 2}), initial_batch=16, base_lr=0.02,
                         num_ranks=hvd.size(), warmup_steps=2)
    counter = StepCounter()
    h = fit_with_growth(m, x, y, scheduler=BatchSizeScheduler(policy), epochs=4,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), counter])
    record = (h.history["batch_size"], h.history["per_rank_batch_size"],
              [round(v, 8) for v in h.history["lr"]], counter.per_epoch)
    records = gathered(record, "growth_record")
    weights = np.concatenate([w.ravel() for w in m.get_weights()])
    all_weights = gathered(weights, "growth_weights")

    assert hvd.size() == 2
    assert all(r == records[0] for r in records), records
    batch, per_rank, lr, steps = records[0]
    assert batch == [16, 32, 32, 64]
    assert per_rank == [8, 16, 16, 32]
    # 128 samples per rank: 16, 8, 8, 4 steps (one allreduce each) -> halves when batch doubles
    assert steps == [16, 8, 8, 4]
    assert lr == [0.02, 0.04, 0.04, 0.08]
    assert all(np.array_equal(w, all_weights[0]) for w in all_weights)


class RankLocalValue(tf.keras.callbacks.Callback):
    """Puts a rank-dependent value into the logs: flat on rank 0, improving on rank 1."""

    def on_epoch_end(self, epoch, logs=None):
        logs["probe"] = 1.0 if hvd.rank() == 0 else 1.0 - 0.5 * epoch


def test_plateau_decision_is_rank_0s_on_every_rank():
    x, y = global_data(128)
    m = model(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.02)))
    policy = BatchGrowth(Plateau(patience=1, min_delta=0.1), initial_batch=8, base_lr=0.02,
                         num_ranks=hvd.size(), max_global_batch=32)
    sched = BatchSizeScheduler(policy, monitor="probe")
    # the probe must write its value before the scheduler reads it
    h = fit_with_growth(m, x, y, scheduler=sched, epochs=4, callbacks=[RankLocalValue(), sched])
    records = gathered((h.history["batch_size"], sched.get_state()), "plateau_record")
    assert all(r == records[0] for r in records)
    # rank 0's probe is flat: grow after e1 and e2 (then capped at 32); rank 1 alone never would
    assert records[0][0] == [8, 8, 16, 32]
    assert [e["epoch"] for e in records[0][1]["events"]] == [2, 3]


def test_accumulation_on_two_ranks_equals_one_big_batch():
    x, y = global_data(256, seed=2)
    results = []
    for ceiling in (None, 8):
        m = model(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.9)))
        policy = BatchGrowth(None, initial_batch=32, base_lr=0.1, num_ranks=hvd.size(),
                             max_per_rank_batch=ceiling)
        counter = StepCounter()
        h = fit_with_growth(m, x, y, scheduler=BatchSizeScheduler(policy), epochs=2,
                            callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                       counter])
        results.append((m.get_weights(), h.history["accumulation_steps"], counter.per_epoch))
    flat = [np.concatenate([w.ravel() for w in r[0]]) for r in results]
    gathered_flat = gathered(flat, "accumulation_weights")

    assert results[0][1] == [1, 1] and results[1][1] == [2, 2]
    assert results[0][2] == results[1][2] == [8, 8]  # same number of collectives
    np.testing.assert_allclose(flat[1], flat[0], rtol=1e-5, atol=1e-6)
    assert all(np.array_equal(g[1], gathered_flat[0][1]) for g in gathered_flat)


@pytest.mark.parametrize("strategy", ["hybrid", "sharded"])
def test_growth_under_a_plugin_strategy_equals_stock_weights(strategy):
    """The study's set-up: the batch doubles, the lr ramps per step, the plugin defers or shards
    the update (OverlapCallback), and the weights stay those of stock Horovod."""
    x, y = global_data(256, seed=3)

    def run(opt, callbacks):
        m = model(opt)
        policy = BatchGrowth(Milestones({1: 2, 2: 2}), initial_batch=16, base_lr=0.05,
                             num_ranks=hvd.size(), warmup_steps=3)
        h = fit_with_growth(m, x, y, scheduler=BatchSizeScheduler(policy), epochs=3, seed=4,
                            callbacks=[*callbacks,
                                       hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        return np.concatenate([w.ravel() for w in m.get_weights()]), h.history["batch_size"]

    # stock's run, once per launch (the same for every strategy)
    ref, ref_batches = REFERENCES.get(("growth", "sgd_momentum_0.05"), lambda: run(
        hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05, momentum=0.9)), []))
    got, batches = run(hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.05, momentum=0.9),
                                                 strategy=strategy), [hvdo.OverlapCallback()])
    assert batches == ref_batches == [16, 32, 64]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)



def _wide_data():
    rng = np.random.default_rng(5)
    y = rng.integers(0, 4, 512)
    return rng.normal(size=(512, 64)).astype("float32") + y[:, None].astype("float32") / 2, y


def _growth_run(wrap, callbacks, milestones: dict[int, int], epochs: int):
    """Adam with a 3-step lr ramp after each growth, a 1024x1024 kernel (the exchange's to
    carry); 256 samples per rank: 32 steps of 8 per rank per epoch, 16 of 16, 8 of 32."""
    x, y = _wide_data()
    tf.keras.utils.set_random_seed(11)
    m = tf.keras.Sequential([
        tf.keras.layers.Dense(1024, activation="relu", input_shape=(64,)),
        tf.keras.layers.Dense(1024, activation="tanh"), tf.keras.layers.Dense(4)])
    opt = wrap(tf.keras.optimizers.Adam(0.003))
    m.compile(optimizer=opt, loss=LOSS)
    policy = BatchGrowth(Milestones(milestones), initial_batch=16, base_lr=0.003,
                         num_ranks=hvd.size(), warmup_steps=3)
    h = fit_with_growth(m, x, y, scheduler=BatchSizeScheduler(policy), epochs=epochs, seed=4,
                        callbacks=[*callbacks, hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    return m, opt, h.history


def _auto(trials=None):
    def wrap(opt):
        o = hvdo.DistributedOptimizer(opt, strategy="auto")
        o._hvdo.forced_trials = trials
        return o
    return wrap


def _assert_same_weights(got, ref):
    for a, b in zip(got.get_weights(), ref.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_auto_chooses_again_at_a_growth_and_equals_stock(monkeypatch, exchanged):
    """``strategy="auto"`` under batch growth: at the growth (48 steps to run at the new
    batch: long enough) the plan is chosen again (the probe, every trial, the choice: a second
    online check), switching out of a sharded plan with the dense factor exchange and back
    into it; the weights are stock Horovod's with the same growth."""
    from hvd_overlap.core.choice import (
        Exchange,
        Hybrid,
        Sharded,
        StockHorovod,
    )
    from hvd_overlap.keras.executors import auto

    probe, exchange = StockHorovod(), Sharded(bucket_bytes=8192, exchange=Exchange(forward="rows"))
    trials = [exchange, Hybrid(bucket_bytes=2048, defer=2)]
    # the exchange measures fastest, by less than a clear win (which would end the check)
    ms = {probe: 100.0, exchange: 80.0, trials[1]: 90.0}
    monkeypatch.setattr(auto, "TRIAL_STEPS", 1)  # a check: 24 steps
    monkeypatch.setattr(auto.AutoExecutor, "_agree",
                        lambda self, values: [ms[self.current] / 1e3, 1.0])

    ref, _, ref_history = _growth_run(hvd.DistributedOptimizer, [], {1: 2}, epochs=4)
    got, opt, history = _growth_run(_auto(trials), [hvdo.OverlapCallback()], {1: 2}, epochs=4)
    ex = opt._hvdo
    choices = opt.plan_choices
    decided = hvd_tf.allgather_object(([(c["why"], c["chosen"]) for c in choices], ex.current),
                                      name="growth.auto.choices")

    assert history["batch_size"] == ref_history["batch_size"] == [16, 32, 32, 32]
    assert len(history["step_time_ms"]) == 4 and min(history["step_time_ms"]) > 0
    assert decided[0] == decided[1], "ranks decided differently"
    assert [c["why"] for c in choices] == ["start", "epoch 1: global batch 16 -> 32"], choices
    assert [c["chosen"] for c in choices] == [exchange.describe()] * 2
    assert set(ex.measured) == {probe, *trials} and ex.settled  # the second check, whole
    assert ex.current == exchange
    assert exchanged["n"] > 0, "the exchange never carried a kernel"
    _assert_same_weights(got, ref)


def test_auto_predicts_for_a_batch_too_short_lived_to_check(monkeypatch):
    """Growths whose batch runs fewer steps than two checks: the simulator alone picks, from
    the model fitted in the first check with its compute scaled by the growth (no trial runs);
    every rank the same; the weights are stock Horovod's with the same growth."""
    from hvd_overlap.keras.executors import auto

    monkeypatch.setattr(auto, "TRIAL_STEPS", 1)  # the first check (24 steps) ends in epoch 0
    ref, _, _ = _growth_run(hvd.DistributedOptimizer, [], {1: 2, 2: 2}, epochs=3)
    got, opt, history = _growth_run(_auto(), [hvdo.OverlapCallback()], {1: 2, 2: 2}, epochs=3)
    choices = opt.plan_choices
    decided = hvd_tf.allgather_object([(c["why"], c["chosen"]) for c in choices],
                                      name="growth.auto.predicted")

    assert history["batch_size"] == [16, 32, 64]
    assert decided[0] == decided[1], "ranks decided differently"
    assert [c["why"] for c in choices] == [
        "start", "epoch 1: global batch 16 -> 32", "epoch 2: global batch 32 -> 64"], choices
    for c, steps in zip(choices[1:], (16, 8), strict=True):
        assert f"{steps} steps, too few for a check; predicted" in c["reason"], c
        assert c["steps"] == 0  # no step spent measuring
    _assert_same_weights(got, ref)
