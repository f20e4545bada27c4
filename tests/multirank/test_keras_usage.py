"""What Keras users combine with the optimizer (issue 13): mixed precision, and user code between
``compute_gradients`` and ``apply_gradients``. Each against stock Horovod on 2 ranks."""

from __future__ import annotations

import tempfile
from pathlib import Path

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import pytest
import tensorflow as tf

import hvd_overlap.keras as hvdo
from tests.multirank.helpers import (
    BATCH,
    LOSS,
    MODELS,
    OPTIMIZERS,
    STEPS_PER_EPOCH,
    Result,
    assert_weights_close,
    ours,
    rank_data,
    stock,
    stock_reference,
    train_fit,
)

STEPS = 8


def _mixed_model() -> tf.keras.Model:
    L = tf.keras.layers
    return tf.keras.Sequential([
        L.Dense(32, activation="relu", input_shape=(20,)), L.Dense(16, activation="relu"),
        L.Dense(10), L.Activation("linear", dtype="float32"),  # float32 logits for the loss
    ])


def _mixed_data():
    """Rank 1's inputs are large: its float16 gradients of the scaled loss overflow for the
    first steps (dynamic loss scaling starts high and halves), rank 0's do not."""
    rng = np.random.default_rng(11 + hvd.rank())
    x = rng.normal(size=(16 * STEPS, 20)).astype("float32")
    if hvd.rank() == 1:
        x *= 300.0
    return x, rng.integers(0, 10, 16 * STEPS)


def _fit_mixed(wrap):
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        tf.keras.utils.set_random_seed(4)
        model = _mixed_model()
        model.compile(wrap(tf.keras.optimizers.SGD(0.01, momentum=0.9)), LOSS)
        x, y = _mixed_data()
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0,
                  callbacks=[hvdo.OverlapCallback(),
                             hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        scale = float(model.optimizer.loss_scale.numpy())
        return [w.copy() for w in model.get_weights()], scale, \
            int(model.optimizer.iterations.numpy())
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


_stock_mixed: list = []


@pytest.mark.parametrize("strategy", ["horovod", "layerwise", "deferred", "hybrid", "sharded",
                                      "sharded_hybrid"])
def test_mixed_precision_with_overflow_on_one_rank_equals_stock(strategy):
    """The loss-scale optimizer skips a step when the gradients are not finite; it decides on
    each rank, so every rank must see the same gradients (stock Horovod's reduce in
    compute_gradients). It used to hang (layerwise) or stop (hybrid, sharded)."""
    if not _stock_mixed:
        _stock_mixed.append(_fit_mixed(stock))
    want, want_scale, want_steps = _stock_mixed[0]
    got, scale, steps = _fit_mixed(ours(strategy, bucket_bytes=2048))
    assert want_scale < 2.0 ** 15, "the test must make the first steps overflow"
    assert (scale, steps) == (want_scale, want_steps)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _clipped_steps(wrap, global_clip: bool = True):
    """A custom loop with user code between compute_gradients and apply_gradients: clipping by
    the global norm of the gradients compute_gradients returns."""
    tf.keras.utils.set_random_seed(6)
    model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="tanh", input_shape=(8,)),
                                 tf.keras.layers.Dense(10)])
    opt = wrap(tf.keras.optimizers.SGD(0.1, momentum=0.9))
    rng = np.random.default_rng(21 + hvd.rank())
    x = rng.normal(size=(16 * STEPS, 8)).astype("float32") * (1 + 4 * hvd.rank())
    y = rng.integers(0, 10, 16 * STEPS)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = LOSS(yb, model(xb, training=True))
        pairs = opt.compute_gradients(loss, model.trainable_variables, tape=tape)
        grads = [g for g, _ in pairs]
        norm = tf.linalg.global_norm(grads)
        if global_clip:
            grads, _ = tf.clip_by_global_norm(grads, 0.5, use_norm=norm)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return norm

    norms = [float(step(x[k:k + 16], y[k:k + 16]).numpy()) for k in range(0, len(x), 16)]
    if hasattr(opt, "flush"):  # ours: nothing may stay pending
        opt.flush()
    return [w.numpy() for w in model.trainable_variables], norms


@pytest.mark.parametrize("strategy", ["horovod", "layerwise", "hybrid", "sharded"])
def test_user_code_between_compute_and_apply_sees_stock_gradients(strategy):
    """``compute_gradients`` returns the averaged gradients, as stock Horovod's does: a global
    norm computed from them is the same on every rank and equals stock's."""
    want, want_norms = _clipped_steps(stock)
    got, norms = _clipped_steps(ours(strategy, bucket_bytes=256))
    assert max(want_norms) > 0.5, "the clip must be active"
    np.testing.assert_allclose(norms, want_norms, rtol=1e-5)
    everyone = hvd_tf.allgather_object(norms, name=f"norms.{strategy}")
    assert everyone[0] == everyone[1]
    for a, b in zip(want, got, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_clipping_local_gradients_would_differ():
    """Negative control for the test above: the same loop with local gradients (no wrapper)
    gives other norms and weights, so that test can fail."""
    want, want_norms = _clipped_steps(stock)
    got, norms = _clipped_steps(lambda opt: opt)
    assert not np.allclose(norms, want_norms, rtol=1e-3)
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(want, got, strict=True)) > 1e-3


class PerBatchLR(tf.keras.callbacks.Callback):
    """Sets the learning rate before every batch, as Horovod's warm-up callback does (and, for
    a legacy optimizer, whose hyperparameters are all variables, the momentum too, as that
    callback's momentum correction does)."""

    def on_train_batch_begin(self, batch, logs=None):
        opt = self.model.optimizer
        opt.learning_rate = 0.2 / (1.0 + batch)
        if isinstance(opt, tf.keras.optimizers.legacy.Optimizer):
            opt.momentum = 0.9 - 0.05 * (batch % 4)


def _fit_per_batch_lr(wrap, opt_factory):
    tf.keras.utils.set_random_seed(9)
    model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="tanh", input_shape=(8,)),
                                 tf.keras.layers.Dense(10)])
    model.compile(wrap(opt_factory()), LOSS)
    rng = np.random.default_rng(31 + hvd.rank())
    x = rng.normal(size=(16 * STEPS, 8)).astype("float32")
    y = rng.integers(0, 10, 16 * STEPS)
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0,
              callbacks=[PerBatchLR(), hvdo.OverlapCallback(),
                         hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    return [w.copy() for w in model.get_weights()]


@pytest.mark.parametrize("opt_name", ["sgd_momentum", "legacy_sgd_momentum"])
@pytest.mark.parametrize("strategy", ["deferred", "hybrid"])
def test_per_batch_learning_rate_callbacks_apply_to_their_own_step(strategy, opt_name):
    """A deferred update of step t is applied at the start of step t+1, after the callbacks
    set step t+1's rate: it must still use step t's rate (it used to take t+1's: 2e-2 off)."""
    factory = {"sgd_momentum": lambda: tf.keras.optimizers.SGD(0.1, momentum=0.9),
               "legacy_sgd_momentum": lambda: tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9),
               }[opt_name]
    want = _fit_per_batch_lr(stock, factory)
    got = _fit_per_batch_lr(ours(strategy, bucket_bytes=256), factory)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _fit_with_local_var(wrap):
    """A model whose first layer each rank keeps for itself (``register_local_var``)."""
    tf.keras.utils.set_random_seed(12)
    model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="tanh", input_shape=(8,)),
                                 tf.keras.layers.Dense(10)])
    opt = wrap(tf.keras.optimizers.SGD(0.1, momentum=0.9))
    for v in model.layers[0].trainable_variables:
        opt.register_local_var(v)
    model.compile(opt, LOSS)
    rng = np.random.default_rng(41 + hvd.rank())
    x = rng.normal(size=(16 * STEPS, 8)).astype("float32")
    y = rng.integers(0, 10, 16 * STEPS)
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0,
              callbacks=[hvdo.OverlapCallback()])
    return [w.copy() for w in model.get_weights()]


@pytest.mark.parametrize("strategy", ["horovod", "layerwise", "hybrid", "deferred"])
def test_register_local_var_equals_stock(strategy):
    """Local variables keep their own (scaled) gradients on each rank, the others are averaged:
    each rank's weights equal stock Horovod's on that rank, and the local layer differs across
    ranks (so the test would see a gradient that was averaged)."""
    want = _fit_with_local_var(stock)
    got = _fit_with_local_var(ours(strategy, bucket_bytes=256))
    for a, b in zip(want, got, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    first = hvd_tf.allgather_object(got[0], name=f"local.{strategy}")
    assert not np.allclose(first[0], first[1]), "the local layer must differ across ranks"
    last = hvd_tf.allgather_object(got[-1], name=f"shared.{strategy}")
    np.testing.assert_allclose(last[0], last[1], rtol=1e-6)


def test_register_local_var_is_refused_by_sharded_with_the_fix():
    opt = hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), strategy="sharded")
    with pytest.raises(ValueError, match="layerwise"):
        opt.register_local_var(tf.Variable(tf.zeros(3)))


@pytest.mark.parametrize("strategy,opt_name", [
    *[(s, o) for s in ("hybrid", "sharded") for o in ("adadelta", "adamax", "ftrl", "lion")],
    ("sharded", "legacy_nadam"), ("hybrid", "legacy_nadam"), ("deferred", "legacy_nadam"),
    *[("sharded", o) for o in ("legacy_rmsprop", "legacy_adagrad", "legacy_adadelta",
                               "legacy_adamax", "legacy_ftrl", "sgd_clipvalue")]])
def test_optimizers_claimed_exact_equal_stock_under_per_bucket_applies(strategy, opt_name):
    """The element-wise optimizers not covered elsewhere, updated bucket by bucket (hybrid) or
    slice by slice (sharded); the legacy Nadam's momentum schedule advances once per step
    however many parts apply it. (The new Nadam's depends on the number of traces, even
    stock's, and is refused: next test.)"""
    want = stock_reference("odd_sizes", opt_name)
    got = train_fit("odd_sizes", opt_name, ours(strategy, bucket_bytes=512))
    assert_weights_close(got, want)


@pytest.mark.parametrize("strategy", ["layerwise", "hybrid", "sharded"])
def test_load_model_resumes_training_as_an_uninterrupted_stock_run(strategy, tmp_path_factory):
    """``hvd_overlap.keras.load_model`` gives the saved optimizer back wrapped, with its state
    (Adam's moments): 1 epoch, save, load, 1 more epoch equals 2 uninterrupted epochs of stock
    Horovod. A plain ``tf.keras.models.load_model`` would give an optimizer that does not
    average (checked: its class is the plain one)."""
    want = stock_reference("odd_sizes", "adam")  # 2 epochs, seed 3
    tf.keras.utils.set_random_seed(3)
    model = MODELS["odd_sizes"]()
    model.compile(ours(strategy, bucket_bytes=512)(OPTIMIZERS["adam"]()), LOSS)
    x, y = rank_data("odd_sizes", BATCH * STEPS_PER_EPOCH)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvdo.OverlapCallback(), hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    path = Path(hvd_tf.broadcast_object(str(tmp_path_factory.mktemp("load")), 0,
                                        name=f"load_model_dir.{strategy}"))
    saved = path / f"rank{hvd.rank()}.keras"
    model.save(saved)
    plain = tf.keras.models.load_model(saved)
    assert not hasattr(plain.optimizer, "strategy")
    loaded = hvdo.load_model(saved, strategy=strategy, bucket_bytes=512)
    assert loaded.optimizer.strategy == strategy
    loaded.fit(x, y, batch_size=BATCH, epochs=2, initial_epoch=1, shuffle=False, verbose=0,
               callbacks=[hvdo.OverlapCallback()])
    assert int(loaded.optimizer.iterations.numpy()) == 2 * STEPS_PER_EPOCH
    assert_weights_close(Result(loaded), want)


class RecordEvery(tf.keras.callbacks.Callback):
    """Reads the weights every ``n`` batches, as ModelCheckpoint(save_freq=n) would save them
    (counted across epochs)."""

    def __init__(self, n: int):
        super().__init__()
        self.n, self.seen, self.done = n, [], 0

    def on_train_batch_end(self, batch, logs=None):
        self.done += 1
        if self.done % self.n == 0:
            self.seen.append([w.copy() for w in self.model.get_weights()])


def _fit_recording(wrap, overlap: tf.keras.callbacks.Callback | None):
    tf.keras.utils.set_random_seed(3)
    model = MODELS["odd_sizes"]()
    model.compile(wrap(tf.keras.optimizers.SGD(0.05, momentum=0.9)), LOSS)
    x, y = rank_data("odd_sizes", BATCH * STEPS_PER_EPOCH)
    record = RecordEvery(5)
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
              callbacks=[record, *([overlap] if overlap else [])])  # the recorder comes first
    return record.seen


@pytest.mark.parametrize("strategy", ["deferred", "hybrid", "sharded"])
def test_weights_read_by_an_earlier_callback_at_a_flush_point_are_current(strategy):
    """A callback listed before ``OverlapCallback(flush_every=N)`` (ModelCheckpoint with
    save_freq=N) runs before its flush: the step itself must have landed its whole update."""
    want = _fit_recording(stock, None)
    got = _fit_recording(ours(strategy, bucket_bytes=512), hvdo.OverlapCallback(flush_every=5))
    assert len(got) == len(want) == 4
    for step_want, step_got in zip(want, got, strict=True):
        for a, b in zip(step_want, step_got, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _fit_checkpointing(wrap, overlap: tf.keras.callbacks.Callback | None, tag: str,
                       first: bool = True) -> list[str]:
    """``fit`` with a real ``ModelCheckpoint(save_freq=5)`` (weights and optimizer state, one
    file per save), listed before ``overlap`` if ``first``; the files' prefixes, in order."""
    tf.keras.utils.set_random_seed(3)
    model = MODELS["odd_sizes"]()
    model.compile(wrap(tf.keras.optimizers.SGD(0.05, momentum=0.9)), LOSS)
    x, y = rank_data("odd_sizes", BATCH * STEPS_PER_EPOCH)
    base = Path(hvd_tf.broadcast_object(tempfile.mkdtemp(), 0, name=f"ckpt_files.{tag}"))
    prefix = str(base / f"rank{hvd.rank()}" / "ckpt-{epoch}-{batch}")
    save = tf.keras.callbacks.ModelCheckpoint(prefix, save_weights_only=True, save_freq=5)
    around = [overlap] if overlap else []
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
              callbacks=[save, *around] if first else [*around, save])
    return sorted({str(p)[:-len(".index")] for p in (base / f"rank{hvd.rank()}").glob("*.index")})


def _restored(prefix: str, wrap) -> Result:
    """A fresh model (its optimizer wrapped by ``wrap``) restored from a checkpoint file."""
    tf.keras.utils.set_random_seed(9)  # other initial weights: they must all be overwritten
    model = MODELS["odd_sizes"]()
    model.compile(wrap(tf.keras.optimizers.SGD(0.05, momentum=0.9)), LOSS)
    model.load_weights(prefix).expect_partial()
    return Result(model)


@pytest.mark.parametrize("strategy, first", [("deferred", True), ("hybrid", True),
                                             ("sharded", False)])
def test_save_freq_checkpoint_files_restore_to_stocks_state(strategy, first):
    """``ModelCheckpoint(save_freq=5)`` with ``OverlapCallback(flush_every=5)`` writes files
    holding stock Horovod's weights and momentum at every save (listed before the callback;
    sharded after it, which gathers the state): restored, they equal stock's files restored."""
    want = _fit_checkpointing(stock, None, f"stock.{strategy}")
    got = _fit_checkpointing(ours(strategy, bucket_bytes=512),
                             hvdo.OverlapCallback(flush_every=5), strategy, first)
    assert [Path(p).name for p in got] == [Path(p).name for p in want] and len(got) == 4
    for mine, theirs in zip(got, want, strict=True):
        assert_weights_close(_restored(mine, ours(strategy, bucket_bytes=512)),
                             _restored(theirs, stock))
        reader, ref = tf.train.load_checkpoint(mine), tf.train.load_checkpoint(theirs)
        state = sorted(k for k in ref.get_variable_to_shape_map() if k.startswith("optimizer/"))
        stored = [k for k in state if reader.has_tensor(k)]
        assert any("_iterations" in k for k in stored)
        if strategy != "sharded":  # sharded keeps the gathered slots under its own entry
            assert stored == state and any("_variables" in k for k in state)  # the momentum
        for k in stored:
            np.testing.assert_allclose(reader.get_tensor(k), ref.get_tensor(k),
                                       rtol=1e-5, atol=1e-6, err_msg=k)


class ResetAt(tf.keras.callbacks.Callback):
    """Sets the model's weights back to their initial values after batch ``k`` (on every
    rank), as a callback restoring or swapping weights mid-fit would."""

    def __init__(self, k: int):
        super().__init__()
        self.k, self.initial = k, None

    def on_train_begin(self, logs=None):
        self.initial = [w.copy() for w in self.model.get_weights()]

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.k:
            self.model.set_weights(self.initial)


def _fit_with_reset(wrap, overlap):
    tf.keras.utils.set_random_seed(3)
    model = MODELS["odd_sizes"]()
    model.compile(wrap(tf.keras.optimizers.SGD(0.05, momentum=0.9)), LOSS)
    x, y = rank_data("odd_sizes", BATCH * STEPS_PER_EPOCH)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[ResetAt(4), *([overlap] if overlap else [])])
    return [w.copy() for w in model.get_weights()]


@pytest.mark.parametrize("strategy", ["deferred", "hybrid", "sharded"])
def test_set_weights_during_fit_is_not_overwritten_by_a_pending_update(strategy):
    want = _fit_with_reset(stock, None)
    got = _fit_with_reset(ours(strategy, bucket_bytes=512), hvdo.OverlapCallback())
    for a, b in zip(want, got, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strategy,opt_name", [("hybrid", "nadam"), ("deferred", "nadam"),
                                               ("sharded", "nadam")])
def test_nadam_is_refused_where_it_cannot_be_exact(strategy, opt_name):
    with pytest.raises(ValueError, match="Nadam.*traced.*legacy.Nadam.*layerwise"):
        hvdo.DistributedOptimizer(OPTIMIZERS[opt_name](), strategy=strategy)
