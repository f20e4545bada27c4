"""What Keras users combine with the optimizer (issue 13): mixed precision, and user code between
``compute_gradients`` and ``apply_gradients``. Each against stock Horovod on 2 ranks."""

from __future__ import annotations

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import pytest
import tensorflow as tf

import hvd_overlap.keras as hvdo
from tests.multirank.helpers import LOSS, ours, stock

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


@pytest.mark.parametrize("strategy", ["layerwise", "deferred", "hybrid", "sharded"])
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
