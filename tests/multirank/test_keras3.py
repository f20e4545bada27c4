"""Keras 3 (TF 2.18, no tf-keras): every strategy the Keras 3 adapter runs trains a Keras 3
model on 2 ranks to the weights of one process trained on the global batch (fp32 tolerance),
in ``fit`` (with validation, a checkpoint callback and LR schedules), in custom loops and
``train_on_batch``; what Keras 3 cannot run is refused on every rank before any collective.

Run by scripts/test on the keras3 stack; skipped on Keras 2 stacks (their own files test them).
"""

from __future__ import annotations

import horovod.tensorflow as hvd
import numpy as np
import pytest

from hvd_overlap.adapters import keras_api

pytestmark = pytest.mark.skipif(keras_api.GENERATION != 3, reason=(
    "Keras 3 only: scripts/test runs it on the keras3 stack (TF 2.18 + Keras 3)"))

if keras_api.GENERATION == 3:
    import keras
    import tensorflow as tf

    import hvd_overlap.keras as hvdo
    from hvd_overlap.core.plan import EXCHANGES
    from tests.multirank.keras3_helpers import (
        BATCH,
        EPOCHS,
        LOSS,
        OPTIMIZERS,
        STEPS,
        assert_equal_on_every_rank,
        assert_same_weights,
        global_data,
        mlp,
        rank_rows,
        reference,
        with_embedding,
    )

#: small buckets, so that hybrid splits even this small model (half its bytes deferred)
SPLIT = 256
RUNS = ["horovod", "layerwise", "deferred", "hybrid", "sharded", "sharded_hybrid", "auto"]


def strategy_of(name: str):
    """The strategy a test names: ``hybrid`` with small buckets, so that it splits."""
    return hvdo.Hybrid(bucket_bytes=SPLIT) if name == "hybrid" else name


def _fit(strategy, opt_name, build=None, ints=False, callbacks=(), **fit):
    build = build or mlp
    x, y = global_data(ints=ints)
    mine = rank_rows(len(x))
    model = build()
    opt = hvdo.DistributedOptimizer(OPTIMIZERS[opt_name](), strategy=strategy_of(strategy))
    model.compile(opt, LOSS)
    model.fit(x[mine], y[mine], batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=[hvdo.OverlapCallback(), *callbacks], **fit)
    want = reference(build, OPTIMIZERS[opt_name](), x, y, **fit)
    return model, opt, want


@pytest.mark.parametrize("strategy", RUNS)
@pytest.mark.parametrize("opt_name", ["sgd_momentum", "adam"])
def test_fit_equals_the_global_batch(strategy, opt_name):
    model, opt, want = _fit(strategy, opt_name)
    assert_same_weights(model, want, f"{strategy}/{opt_name}")
    assert int(opt.iterations.numpy()) == EPOCHS * STEPS
    assert_equal_on_every_rank(model)


@pytest.mark.parametrize("strategy", ["layerwise", "hybrid"])
@pytest.mark.parametrize("opt_name", ["nadam", "adamw", "rmsprop", "sgd_schedule"])
def test_fit_with_other_optimizers_equals_the_global_batch(strategy, opt_name):
    model, _, want = _fit(strategy, opt_name)
    assert_same_weights(model, want, f"{strategy}/{opt_name}")


@pytest.mark.parametrize("strategy", ["sharded+exchange=always", "sharded+exchange=always+rows",
                                      "sharded_hybrid+exchange=always"])
@pytest.mark.parametrize("opt_name", ["sgd_momentum", "adam"])
def test_the_dense_exchange_equals_the_global_batch(strategy, opt_name):
    """Every Dense kernel's gradient rows by the exchange (all-to-all of the inputs,
    all-gather of the output errors) instead of a reduce-scatter; ``+rows``: the forward on
    the kernel's rows too (validation between epochs reads the gathered kernels)."""
    x, y = global_data()
    model, opt, want = _fit(strategy, opt_name, validation_data=(x[:16], y[:16]))
    assert_same_weights(model, want, f"{strategy}/{opt_name}")
    assert_equal_on_every_rank(model)
    layers = opt._hvdo.exchange.layers
    assert len(layers) == 3 and all(x.active for x in layers), "the exchange did not run"
    assert all(x.keep for x in layers) == strategy.endswith("+rows")
    carried = sorted(v.name for b in opt.plan.buckets if b.collective in EXCHANGES
                     for v in b.variables)
    assert carried == sorted(keras_api.var_name(x.kernel) for x in layers), carried


def test_kernels_the_exchange_declines_are_allreduced_whole():
    """``shard="dense"`` with ``exchange="auto"``: at 8 per rank the exchange declines every
    kernel of this small model, so after the first step they leave the row-sliced layout (their
    slices and Adam's slots cut again, whole) and are allreduced; the global batch's weights."""
    model, opt, want = _fit("sharded+exchange+shard=dense", "adam")
    assert_same_weights(model, want, "sharded+exchange+shard=dense/adam")
    assert_equal_on_every_rank(model)
    assert opt._hvdo.exchange.decided and not any(x.active for x in opt._hvdo.exchange.layers)
    assert all(b.whole for b in opt._hvdo.state.layout.buckets)


@pytest.mark.parametrize("opt_name", ["adamw_no_bias", "rmsprop", "sgd_schedule"])
def test_the_sharded_update_with_other_optimizers_equals_the_global_batch(opt_name):
    """Slices spanning several variables: decoupled weight decay masked where a variable is
    excluded from it; the slots of each slice only."""
    model, opt, want = _fit("sharded", opt_name)
    assert_same_weights(model, want, f"sharded/{opt_name}")
    params, slots = opt.slice_variables()
    assert slots and {int(np.prod(s.shape)) for s in slots} <= {int(np.prod(p.shape))
                                                              for p in params}
    assert sum(int(np.prod(p.shape)) for p in params) < sum(
        int(np.prod(v.shape)) for v in model.trainable_variables), "the slices are not 1/P"
    assert not {id(v) for v in slots} & {id(v) for v in opt.variables}, \
        "the slices' slots are in opt.variables (a broadcast would overwrite them)"


@pytest.mark.parametrize("strategy", ["layerwise", "deferred"])
def test_an_embedding_equals_the_global_batch(strategy):
    model, _, want = _fit(strategy, "adam", build=with_embedding, ints=True)
    assert_same_weights(model, want, strategy)


class _Pending(keras.callbacks.Callback if keras_api.GENERATION == 3 else object):
    """Records ``opt.pending`` after every batch, and the weights then."""

    def __init__(self):
        super().__init__()
        self.pending: list[bool] = []
        self.weights: list[list[np.ndarray]] = []

    def on_train_batch_end(self, batch, logs=None):
        self.pending.append(bool(self.model.optimizer.pending))
        self.weights.append(self.model.get_weights())


@pytest.mark.parametrize("strategy", ["deferred", "hybrid"])
def test_deferring_strategies_defer_and_flush_for_validation_and_checkpoints(strategy, tmp_path):
    """Each step's update lands in the next step (``pending`` after every step but an epoch's
    last, which lands for the checkpoint), validation inside fit and the checkpoint see current
    weights, and an LR changed every batch by a callback applies to the step it was set for."""
    seen = _Pending()
    path = tmp_path / f"rank{hvd.rank()}.weights.h5"
    x, y = global_data()
    lr_by_batch = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda b, logs: seen.model.optimizer.learning_rate.assign(
            0.05 + 0.01 * b))
    fit = dict(validation_data=(x[:32], y[:32]))
    model, _, want = _fit(strategy, "sgd_momentum", callbacks=[
        lr_by_batch, seen, keras.callbacks.ModelCheckpoint(str(path), save_weights_only=True)],
        **fit)
    per_epoch = [True] * (STEPS - 1) + [False]
    assert seen.pending == per_epoch * EPOCHS, seen.pending
    # the reference with the same per-batch learning rates
    ref = mlp()
    ref.compile(OPTIMIZERS["sgd_momentum"](), LOSS)
    ref.fit(x, y, batch_size=hvd.size() * BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
            callbacks=[keras.callbacks.LambdaCallback(
                on_train_batch_begin=lambda b, logs: ref.optimizer.learning_rate.assign(
                    0.05 + 0.01 * b))], **fit)
    assert_same_weights(model, ref, strategy)
    del want
    saved = mlp()
    saved.load_weights(str(path))
    assert_same_weights(saved, ref, "checkpoint")
    assert model.evaluate(x[:32], y[:32], verbose=0) == pytest.approx(
        ref.evaluate(x[:32], y[:32], verbose=0), rel=1e-5)


@pytest.mark.parametrize("strategy", RUNS)
def test_a_custom_loop_equals_the_global_batch(strategy):
    x, y = global_data()
    mine = rank_rows(len(x))
    model = mlp()
    opt = hvdo.DistributedOptimizer(OPTIMIZERS["adam"](), strategy=strategy_of(strategy))

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = LOSS(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    train_step = opt.make_train_step(step, model=model)
    for i in range(EPOCHS * STEPS):
        rows = mine[(i % STEPS) * BATCH:(i % STEPS + 1) * BATCH]
        train_step(tf.constant(x[rows]), tf.constant(y[rows]))
    opt.flush()
    assert_same_weights(model, reference(mlp, OPTIMIZERS["adam"](), x, y), strategy)
    assert_equal_on_every_rank(model)


@pytest.mark.parametrize("strategy", ["layerwise", "hybrid"])
def test_train_on_batch_equals_the_global_batch(strategy):
    x, y = global_data()
    mine = rank_rows(len(x))
    model = mlp()
    model.compile(hvdo.DistributedOptimizer(OPTIMIZERS["sgd_momentum"](),
                                            strategy=strategy_of(strategy)), LOSS)
    for i in range(EPOCHS * STEPS):
        rows = mine[(i % STEPS) * BATCH:(i % STEPS + 1) * BATCH]
        model.train_on_batch(x[rows], y[rows])
    assert_same_weights(model, reference(mlp, OPTIMIZERS["sgd_momentum"](), x, y), strategy)


def test_the_broadcast_callback_starts_every_rank_from_rank_0():
    """Ranks build different initial weights (seeded by rank); the plugin's
    ``BroadcastGlobalVariablesCallback`` makes rank 0's the start of every rank."""
    x, y = global_data()
    mine = rank_rows(len(x))
    model = mlp(seed=10 + hvd.rank())
    model.compile(hvdo.DistributedOptimizer(OPTIMIZERS["adam"](), strategy=strategy_of("hybrid")),
                  LOSS)
    model.fit(x[mine], y[mine], batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=[hvdo.BroadcastGlobalVariablesCallback(0), hvdo.OverlapCallback()])
    assert_same_weights(model, reference(lambda: mlp(seed=10), OPTIMIZERS["adam"](), x, y))
    assert_equal_on_every_rank(model)


def test_broadcast_variables_sets_every_rank_to_rank_0():
    model = mlp(seed=20 + hvd.rank())
    hvdo.broadcast_variables(model.variables, root_rank=0)
    assert_same_weights(model, mlp(seed=20))


def test_mixed_precision_with_an_overflow_on_one_rank_skips_on_every_rank():
    """mixed_float16 set before the optimizer is made: the loss-scale optimizer goes inside the
    distributed one and sees global gradients, so a step whose gradients overflow on one rank
    only is skipped on every rank, as in the one-process run on the global batch. fp16
    forwards round differently on a batch of 8 and of 16 rows, hence the looser tolerance;
    the ranks agree bit for bit and skip exactly where the reference skips."""
    x, y = global_data()
    x[2 * hvd.size() * BATCH + BATCH + 1] = 6e4  # rank 1's row of the third step: overflows
    mine = rank_rows(len(x))
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = mlp()
        opt = hvdo.DistributedOptimizer(OPTIMIZERS["sgd_momentum"](), strategy="layerwise")
        assert isinstance(opt, keras.optimizers.LossScaleOptimizer)
        model.compile(opt, LOSS)
        model.fit(x[mine], y[mine], batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
        want = reference(mlp, keras.optimizers.LossScaleOptimizer(
            OPTIMIZERS["sgd_momentum"]()), x, y)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert model.optimizer is opt  # compile added no loss-scale optimizer around ours
    assert_equal_on_every_rank(model)
    scale = float(opt.dynamic_scale.numpy())
    assert scale == float(want.optimizer.dynamic_scale.numpy())
    assert scale < 32768.0, "no step was skipped: the overflow did not happen"
    for u, v in zip(model.get_weights(), want.get_weights(), strict=True):
        np.testing.assert_allclose(u, v, rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("strategy", ["sharded", "sharded_hybrid"])
def test_nadam_is_refused_by_the_sharded_update_on_every_rank(strategy):
    with pytest.raises(ValueError, match="Nadam keeps its momentum-schedule product in a "
                                         "variable.*strategy='hybrid'"):
        hvdo.DistributedOptimizer(OPTIMIZERS["nadam"](), strategy=strategy)


def test_a_loss_scale_optimizer_around_ours_is_refused_on_every_rank():
    """A mixed_float16 model compiled with a distributed optimizer made before the policy was
    set: compile puts a loss-scale optimizer around it; the first step refuses on every rank
    (while it is traced, before any collective), naming the fix."""
    opt = hvdo.DistributedOptimizer(OPTIMIZERS["sgd_momentum"](), strategy="layerwise")
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = mlp()
        model.compile(opt, LOSS)
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        x, y = global_data()
        with pytest.raises(ValueError, match=r"LossScaleOptimizer wraps .*DistributedOptimizer"
                                             r"\(keras.optimizers.LossScaleOptimizer\(opt\)\)"):
            model.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
