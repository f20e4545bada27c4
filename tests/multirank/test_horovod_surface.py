"""The surface of ``hvd.DistributedOptimizer`` that Horovod's own tests (and code written from
them) use beyond the public one: ``_compute_gradients`` on new Keras optimizers, and
``_agg_helper.counter`` with ``backward_passes_per_step > 1`` -- for every strategy, against
stock Horovod's optimizer driven by the same calls."""

from __future__ import annotations

import contextlib

import horovod.tensorflow.keras as hvd
import numpy as np
import pytest
import tensorflow as tf

from tests.multirank.helpers import (
    assert_weights_close,
    ours,
    stock,
    train_fit,
)


def _problem(seed: int = 11):
    """A small dense model and a rank-dependent loss (so averaging changes the gradients)."""
    tf.keras.utils.set_random_seed(seed)
    model = tf.keras.Sequential([tf.keras.layers.Dense(6, activation="tanh", input_shape=(5,)),
                                 tf.keras.layers.Dense(3)])
    rng = np.random.default_rng(seed + 100 * hvd.rank())
    x = tf.constant(rng.normal(size=(8, 5)).astype("float32"))
    y = tf.constant(rng.normal(size=(8, 3)).astype("float32"))

    def loss():
        return tf.reduce_mean(tf.square(model(x) - y))
    return model, loss


@pytest.mark.parametrize("strategy", ["layerwise", "hybrid", "sharded"])
def test_private_compute_gradients_returns_stocks_averaged_gradients(strategy):
    model, loss = _problem()
    got = ours(strategy)(tf.keras.optimizers.Adam(0.01))._compute_gradients(
        loss, var_list=model.trainable_variables)
    ref = stock(tf.keras.optimizers.Adam(0.01))._compute_gradients(
        loss, var_list=model.trainable_variables)
    with tf.GradientTape() as tape:
        local = tape.gradient(loss(), model.trainable_variables)
    for (g, v), (r, w) in zip(got, ref, strict=True):
        assert v is w
        np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-6, atol=1e-7)
    # averaged, not local: the ranks' losses differ, so at least one gradient must differ
    assert any(not np.allclose(g.numpy(), lg.numpy()) for (g, _), lg in
               zip(got, local, strict=True))
    with tf.GradientTape() as tape:  # with the caller's tape and a computed loss, as Horovod's
        value = loss()
    got_tape = ours(strategy)(tf.keras.optimizers.SGD(0.1))._compute_gradients(
        value, model.trainable_variables, tape=tape)
    for (g, _), (r, _) in zip(got_tape, ref, strict=True):
        np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-6, atol=1e-7)


def _accumulate(wrap, passes: int, average: bool, steps: int = 7):
    """``steps`` calls of ``_compute_gradients`` then ``apply_gradients`` in a tf.function
    (Horovod's own pattern), with ``backward_passes_per_step=passes``."""
    model, loss = _problem(seed=4)
    opt = wrap(tf.keras.optimizers.SGD(0.1, momentum=0.5), backward_passes_per_step=passes,
               average_aggregated_gradients=average)

    @tf.function
    def step():
        opt.apply_gradients(opt._compute_gradients(loss, var_list=model.trainable_variables))

    for _ in range(steps):
        step()
    return model, opt


@pytest.mark.parametrize("strategy, average", [("layerwise", False), ("hybrid", True),
                                               ("sharded", False), ("auto", True)])
def test_compute_then_apply_accumulates_as_horovod(strategy, average):
    model, opt = _accumulate(lambda o, **kw: ours(strategy, **kw)(o), 3, average)
    ref_model, ref_opt = _accumulate(stock, 3, average)
    assert int(opt.iterations.numpy()) == int(ref_opt.iterations.numpy()) == 7
    assert int(opt._agg_helper.counter.numpy()) == int(ref_opt._agg_helper.counter.numpy()) == 1
    for a, b in zip(model.get_weights(), ref_model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # two reductions happened: the weights moved, and not by the local gradients alone
    assert not np.allclose(model.get_weights()[0], _problem(seed=4)[0].get_weights()[0])


def test_no_aggregation_helper_without_accumulation():
    assert ours("layerwise")(tf.keras.optimizers.SGD(0.1))._agg_helper is None


@pytest.mark.parametrize("strategy", ["hybrid", "sharded"])
def test_accumulation_under_a_cross_step_strategy_runs_immediate_and_exact(strategy):
    """``backward_passes_per_step > 1`` leaves nothing to defer or shard: the plugin runs the
    strategy as layerwise, says so, and gives stock Horovod's weights in ``fit``."""
    with pytest.warns(UserWarning, match="runs as strategy='layerwise'") if hvd.rank() == 0 \
            else contextlib.nullcontext():
        wrap = ours(strategy, backward_passes_per_step=2)
        probe = wrap(tf.keras.optimizers.SGD(0.1))
    assert probe.strategy == "layerwise"
    got = train_fit("cnn_bn", "sgd_momentum", wrap)
    ref = train_fit("cnn_bn", "sgd_momentum", lambda o: stock(o, backward_passes_per_step=2))
    assert_weights_close(got, ref)
