"""BatchSizeScheduler, fit_with_growth and gradient accumulation on one process (Horovod size 1)."""

import csv

import horovod.tensorflow.keras as hvd
import numpy as np
import pytest
import tensorflow as tf

import hvd_overlap  # noqa: F401  (Horovod environment before hvd.init)
from hvd_overlap.growth.callback import BatchSizeScheduler
from hvd_overlap.growth.data import ShardedDataset, enable_gradient_accumulation, fit_with_growth
from hvd_overlap.growth.policy import BatchGrowth, Milestones, Plateau

hvd.init()

LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def data(n: int = 64, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = rng.normal(size=(n, 6)).astype("float32") + y[:, None].astype("float32")
    return x, y


def mlp(seed: int = 1) -> tf.keras.Model:
    tf.keras.utils.set_random_seed(seed)
    return tf.keras.Sequential([tf.keras.layers.Dense(16, activation="tanh", input_shape=(6,)),
                                tf.keras.layers.Dense(3)])


def compiled(opt=None, seed: int = 1) -> tf.keras.Model:
    model = mlp(seed)
    model.compile(optimizer=opt or tf.keras.optimizers.SGD(0.05), loss=LOSS,
                  metrics=["accuracy"])
    return model


def test_logs_growth_epoch_lr_and_steps(tmp_path):
    x, y = data(64)
    model = compiled()
    policy = BatchGrowth(Milestones({2: 2, 4: 2}), initial_batch=8, base_lr=0.05,
                         lr_scaling="linear")
    sched = BatchSizeScheduler(policy)
    steps = []
    count = tf.keras.callbacks.LambdaCallback(
        on_epoch_end=lambda e, logs: steps.append(int(model.optimizer.iterations.numpy())))
    log = tmp_path / "log.csv"
    board = tf.keras.callbacks.TensorBoard(str(tmp_path / "tb"), update_freq="epoch")
    history = fit_with_growth(model, x, y, scheduler=sched, epochs=6, shuffle=False,
                              callbacks=[count, tf.keras.callbacks.CSVLogger(str(log)), board])
    h = history.history
    assert history.epoch == [0, 1, 2, 3, 4, 5]
    assert h["batch_size"] == [8, 8, 16, 16, 32, 32]
    assert h["per_rank_batch_size"] == h["batch_size"]
    assert h["accumulation_steps"] == [1] * 6
    assert h["lr"] == pytest.approx([0.05, 0.05, 0.1, 0.1, 0.2, 0.2])
    assert np.diff([0] + steps).tolist() == [8, 8, 4, 4, 2, 2]  # 64 samples / batch
    assert float(model.optimizer.learning_rate.numpy()) == pytest.approx(0.2)
    rows = list(csv.DictReader(log.open()))  # one CSV for the whole run, not one per fit
    assert [int(r["batch_size"]) for r in rows] == h["batch_size"]
    assert [float(r["lr"]) for r in rows] == pytest.approx(h["lr"])
    # TensorBoard: one run, one epoch_batch_size / epoch_lr point per epoch
    scalars: dict[str, list[tuple[int, float]]] = {}
    for f in sorted((tmp_path / "tb" / "train").glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(f)):
            for v in event.summary.value:
                if v.tag.startswith("epoch_"):
                    value = float(tf.make_ndarray(v.tensor))
                    scalars.setdefault(v.tag, []).append((event.step, value))
    assert [s for s, _ in scalars["epoch_batch_size"]] == list(range(6))
    assert [v for _, v in scalars["epoch_batch_size"]] == h["batch_size"]
    assert [v for _, v in scalars["epoch_lr"]] == pytest.approx(h["lr"])


def test_warmup_sets_lr_per_step():
    x, y = data(32)
    model = compiled()
    policy = BatchGrowth(Milestones({1: 2}), initial_batch=4, base_lr=0.1, warmup_steps=3)
    seen = []
    probe = tf.keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda b, logs: seen.append(
            float(model.optimizer.learning_rate.numpy())))
    # the probe runs after the scheduler (which is put first), so it sees the lr of the step
    fit_with_growth(model, x, y, scheduler=BatchSizeScheduler(policy), epochs=2,
                    callbacks=[probe])
    assert seen == pytest.approx([0.1] * 8 + [0.1 + 0.1 / 3, 0.1 + 0.2 / 3, 0.2, 0.2])


def test_plateau_growth_on_monitored_loss_in_plain_fit():
    """The callback alone (plain fit, fixed data): decisions, logs and lr coupling."""
    x, y = data(32)
    model = compiled(tf.keras.optimizers.SGD(0.0))  # lr 0 -> loss is constant -> plateau
    policy = BatchGrowth(Plateau(patience=1, min_delta=1e-6), initial_batch=8, base_lr=1e-9,
                         lr_scaling="sqrt")
    sched = BatchSizeScheduler(policy, monitor="loss", verbose=1)
    h = model.fit(x, y, batch_size=8, epochs=4, verbose=0, shuffle=False, callbacks=[sched])
    # e0 sets best; e1 stalls -> grow; e2 stalls -> grow; e3 stalls -> grow
    assert h.history["batch_size"] == [8, 8, 16, 32]
    assert [e.epoch for e in policy.events] == [2, 3, 4]
    assert policy.lr == pytest.approx(1e-9 * np.sqrt(8))


def test_missing_monitor_is_an_error():
    x, y = data(16)
    model = compiled()
    sched = BatchSizeScheduler(BatchGrowth(Plateau(), initial_batch=8, base_lr=0.1),
                               monitor="val_loss")
    with pytest.raises(ValueError, match="val_loss"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[sched])


@pytest.mark.parametrize("wrap", [lambda o: o, hvd.DistributedOptimizer],
                         ids=["sgd", "hvd_sgd"])
def test_accumulating_two_micro_batches_equals_one_big_batch(wrap):
    x, y = data(16, seed=3)
    weights = []
    for steps in (1, 2):
        model = compiled(wrap(tf.keras.optimizers.SGD(0.5)))
        enable_gradient_accumulation(model).steps = steps
        model.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0)
        assert int(model.optimizer.iterations.numpy()) == 4
        weights.append(model.get_weights())
    moved = max(float(np.abs(a - b).max()) for a, b in zip(mlp().get_weights(), weights[0],
                                                           strict=True))
    assert moved > 1e-2  # training really changed the weights
    for a, b in zip(*weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_accumulation_with_momentum_and_metrics_matches():
    x, y = data(24, seed=5)
    results = []
    for steps in (1, 3):
        model = compiled(tf.keras.optimizers.SGD(0.2, momentum=0.9))
        enable_gradient_accumulation(model).steps = steps
        h = model.fit(x, y, batch_size=24, epochs=3, shuffle=False, verbose=0)
        results.append((model.get_weights(), h.history))
    for a, b in zip(results[0][0], results[1][0], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert results[0][1]["loss"] == pytest.approx(results[1][1]["loss"], rel=1e-5)
    assert results[0][1]["accuracy"] == pytest.approx(results[1][1]["accuracy"])


def test_per_rank_ceiling_uses_accumulation_in_fit_with_growth():
    x, y = data(64)
    model = compiled()
    policy = BatchGrowth(Milestones({1: 4}), initial_batch=8, base_lr=0.05,
                         max_per_rank_batch=8, lr_scaling="none")
    h = fit_with_growth(model, x, y, scheduler=BatchSizeScheduler(policy), epochs=2).history
    assert h["batch_size"] == [8, 32]
    assert h["per_rank_batch_size"] == [8, 8]
    assert h["accumulation_steps"] == [1, 4]
    assert int(model.optimizer.iterations.numpy()) == 8 + 2


def test_resume_from_state_matches_uninterrupted_run():
    x, y = data(64)

    def policy():
        return BatchGrowth(Milestones({1: 2, 3: 2}), initial_batch=8, base_lr=0.05,
                           warmup_steps=3, max_per_rank_batch=16)

    full_model = compiled()
    full = fit_with_growth(full_model, x, y, scheduler=BatchSizeScheduler(policy()), epochs=5)

    part_model = compiled()
    first = BatchSizeScheduler(policy())
    fit_with_growth(part_model, x, y, scheduler=first, epochs=2)
    state, weights = first.get_state(), part_model.get_weights()
    opt_vars = [v.numpy() for v in part_model.optimizer.variables]

    resumed_model = compiled()
    resumed_model.set_weights(weights)
    resumed_model.optimizer.build(resumed_model.trainable_variables)
    for v, value in zip(resumed_model.optimizer.variables, opt_vars, strict=True):
        v.assign(value)
    second = BatchSizeScheduler(policy())
    second.set_state(state)
    rest = fit_with_growth(resumed_model, x, y, scheduler=second, epochs=5, initial_epoch=2)
    assert rest.epoch == [2, 3, 4]
    assert rest.history["batch_size"] == full.history["batch_size"][2:] == [16, 32, 32]
    assert rest.history["accumulation_steps"] == [1, 2, 2]
    assert rest.history["lr"] == pytest.approx(full.history["lr"][2:])
    for a, b in zip(resumed_model.get_weights(), full_model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_sharded_dataset_equal_steps_and_disjoint_shards():
    x = np.arange(21, dtype="float32")[:, None]
    shards = [ShardedDataset(x, x[:, 0], rank=r, size=2, seed=4) for r in range(2)]
    assert [s.samples_per_rank for s in shards] == [10, 10]
    assert [s.steps(4) for s in shards] == [2, 2]
    seen = [np.concatenate([b[1].numpy() for b in s.for_epoch(1, 4)]) for s in shards]
    assert all(len(v) == 8 for v in seen)
    assert not set(seen[0]) & set(seen[1])
    again = np.concatenate([b[1].numpy() for b in shards[0].for_epoch(1, 4)])
    other = np.concatenate([b[1].numpy() for b in shards[0].for_epoch(2, 4)])
    assert np.array_equal(seen[0], again) and not np.array_equal(seen[0], other)
    ds = tf.data.Dataset.from_tensor_slices((x, x[:, 0]))
    tshards = [ShardedDataset(ds, rank=r, size=2) for r in range(2)]
    got = [np.concatenate([b[1].numpy() for b in s.for_epoch(0, 3)]) for s in tshards]
    assert [len(g) for g in got] == [9, 9] and not set(got[0]) & set(got[1])


def test_sharded_dataset_turns_the_autotuner_off_unless_asked():
    """A new iterator every epoch: tf.data's autotuner held fit's return ~1.2 s at its end."""
    x = np.arange(20, dtype="float32")[:, None]
    ds = tf.data.Dataset.from_tensor_slices((x, x[:, 0]))
    for data in (x, ds):
        args = (data, x[:, 0]) if data is x else (data,)
        assert ShardedDataset(*args, rank=0, size=2).for_epoch(0, 4).options().autotune.enabled \
            is False
        assert ShardedDataset(*args, rank=0, size=2, autotune=True).for_epoch(
            0, 4).options().autotune.enabled is True


def test_fit_with_growth_rejects_owned_arguments_and_wrong_rank_count():
    x, y = data(16)
    model = compiled()
    sched = BatchSizeScheduler(BatchGrowth(None, initial_batch=8, base_lr=0.1))
    with pytest.raises(TypeError, match="batch_size"):
        fit_with_growth(model, x, y, scheduler=sched, epochs=1, batch_size=4)
    sched2 = BatchSizeScheduler(BatchGrowth(None, initial_batch=8, base_lr=0.1, num_ranks=2))
    with pytest.raises(ValueError, match="num_ranks"):
        fit_with_growth(model, x, y, scheduler=sched2, epochs=1)
