"""One accumulation path: ``backward_passes_per_step`` and batch growth's micro-batches both sum
their gradients in ``hvd_overlap.comm.accumulation.GradientSums``, reset after every read."""

import horovod.tensorflow.keras as hvd
import numpy as np
import pytest
import tensorflow as tf

import hvd_overlap.keras as hvdo
from hvd_overlap.comm.accumulation import GradientSums
from hvd_overlap.growth.data import enable_gradient_accumulation

hvd.init()


def model_and_data(embedding: bool = False, seed: int = 2):
    tf.keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    if embedding:
        model = tf.keras.Sequential([tf.keras.layers.Embedding(20, 4, input_length=3),
                                     tf.keras.layers.Flatten(), tf.keras.layers.Dense(3)])
        x = rng.integers(0, 20, size=(24, 3))
    else:
        model = tf.keras.Sequential([tf.keras.layers.Dense(7, activation="tanh",
                                                           input_shape=(5,)),
                                     tf.keras.layers.Dense(3)])
        x = rng.normal(size=(24, 5)).astype("float32")
    return model, x, rng.normal(size=(24, 3)).astype("float32")


def assert_reset(sums: GradientSums) -> None:
    assert sums.sums and int(sums.count.numpy()) == 0
    for s in sums.sums.values():
        assert not np.any(s.numpy()), f"{s.name} still holds a sum"


def test_both_users_sum_in_the_one_accumulator_and_reset_it():
    """Growth's micro-batches inside an optimizer with ``backward_passes_per_step=2``: two
    instances of the same class, both used, both zero after an even number of passes."""
    model, x, y = model_and_data()
    model.compile(hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), strategy="layerwise",
                                            backward_passes_per_step=2), "mse")
    handle = enable_gradient_accumulation(model)
    handle.steps = 3
    model.fit(x, y, batch_size=6, epochs=1, shuffle=False, verbose=0)  # 4 optimizer passes
    executor_sums = model.optimizer._agg_helper.sums
    assert type(handle.sums) is type(executor_sums) is GradientSums
    assert handle.sums is not executor_sums
    assert_reset(handle.sums)
    assert_reset(executor_sums)
    assert int(model.optimizer.iterations.numpy()) == 4


def test_micro_batch_sums_are_reset_between_steps():
    """Several steps of 3 micro-batches equal the same steps of one batch: a sum left over from
    the previous step would add to the next one's gradient."""
    weights = []
    for steps in (1, 3):
        model, x, y = model_and_data()
        model.compile(tf.keras.optimizers.SGD(0.3, momentum=0.5), "mse")
        handle = enable_gradient_accumulation(model)
        handle.steps = steps
        model.fit(x, y, batch_size=12, epochs=3, shuffle=False, verbose=0)
        assert_reset(handle.sums)
        weights.append(model.get_weights())
    for a, b in zip(*weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_read_is_the_average_of_the_passes_since_the_reset():
    var = tf.Variable([1.0, 2.0])
    acc = GradientSums(prefix="probe_", count_name="probe_count")

    @tf.function
    def step(g1, g2):
        acc.add([g1], [var], sparse_as_dense=False)
        _, sums, count = acc.add([g2], [var], sparse_as_dense=False)
        passes = tf.identity(count)  # read before the reset
        with tf.control_dependencies([passes]):
            averaged = acc.read(sums, 2)
        acc.reset(sums, after=averaged)
        return averaged[0], passes

    got, count = step(tf.constant([1.0, 3.0]), tf.constant([3.0, 5.0]))
    np.testing.assert_array_equal(got.numpy(), [2.0, 4.0])
    assert int(count.numpy()) == 2
    got, _ = step(tf.constant([0.5, 0.5]), tf.constant([1.5, 1.5]))
    np.testing.assert_array_equal(got.numpy(), [1.0, 1.0])  # nothing left of the first step
    assert_reset(acc)


def test_sparse_gradients_need_sparse_as_dense_for_passes_but_not_for_micro_batches():
    model, x, y = model_and_data(embedding=True)
    model.compile(hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), strategy="layerwise",
                                            backward_passes_per_step=2), "mse")
    with pytest.raises(ValueError, match="need sparse_as_dense=True, as in Horovod"):
        model.fit(x, y, batch_size=12, epochs=1, verbose=0)
    model, x, y = model_and_data(embedding=True)
    model.compile(tf.keras.optimizers.SGD(0.1), "mse")
    enable_gradient_accumulation(model).steps = 2
    model.fit(x, y, batch_size=12, epochs=1, verbose=0)  # densified, as one dense gradient
    assert_reset(model._hvdo_accumulation.sums)
