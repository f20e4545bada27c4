"""Every strategy reaches the weights of stock Horovod, to fp32 tolerance, on 2 ranks."""

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import pytest
import tensorflow as tf

from tests.multirank.helpers import (
    assert_weights_close,
    max_abs_diff,
    ours,
    same_on_all_ranks,
    stock,
    train_fit,
    train_loop,
)

STRATEGIES = ["layerwise", "horovod"]
# A small budget so even these small models get several buckets.
SMALL_BUCKETS = {"bucket_bytes": 2048}


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("model_name", ["cnn_bn", "shared_layer", "embedding", "unused_branch"])
def test_fit_matches_stock_sgd_momentum(model_name, strategy):
    ref = train_fit(model_name, "sgd_momentum", stock)
    got = train_fit(model_name, "sgd_momentum", ours(strategy, **SMALL_BUCKETS))
    assert_weights_close(got, ref)
    assert same_on_all_ranks(got)


@pytest.mark.parametrize("opt_name", ["adam", "legacy_sgd_nesterov", "legacy_adam"])
def test_fit_matches_stock_other_optimizers(opt_name):
    ref = train_fit("cnn_bn", opt_name, stock)
    got = train_fit("cnn_bn", opt_name, ours("layerwise", **SMALL_BUCKETS))
    assert_weights_close(got, ref)


def test_reference_is_sensitive():
    """Without communication the weights differ: the comparisons above can fail."""
    ref = train_fit("cnn_bn", "sgd_momentum", stock)
    local = train_fit("cnn_bn", "sgd_momentum", lambda opt: opt)
    assert max_abs_diff(local, ref) > 1e-3
    # ...and the local runs differ between ranks, the averaged ones do not.
    assert not same_on_all_ranks(local)
    assert same_on_all_ranks(ref)


@pytest.mark.parametrize("opt_name", ["sgd_momentum", "adam"])
@pytest.mark.parametrize("model_name", ["cnn_bn", "embedding", "unused_branch"])
def test_custom_loop_matches_distributed_tape(model_name, opt_name):
    ref = train_loop(model_name, opt_name, lambda opt: opt,
                     tape_wrap=hvd_tf.DistributedGradientTape)
    got = train_loop(model_name, opt_name, ours("layerwise", **SMALL_BUCKETS))
    assert_weights_close(got, ref)
    assert same_on_all_ranks(got)


@pytest.mark.parametrize("kwargs", [
    {"sparse_as_dense": True},
    {"compression": hvd.Compression.fp16},
    {"gradient_predivide_factor": 2.0},
    {"op": hvd.Sum},
    {"backward_passes_per_step": 2},
    {"backward_passes_per_step": 3, "average_aggregated_gradients": True},
], ids=["sparse_as_dense", "fp16", "predivide", "sum", "bpps2", "bpps3_avg"])
def test_horovod_keywords_match_stock(kwargs):
    model = "embedding" if "sparse_as_dense" in kwargs else "cnn_bn"
    ref = train_fit(model, "sgd_momentum", lambda opt: stock(opt, **kwargs))
    got = train_fit(model, "sgd_momentum", ours("layerwise", bucket_bytes=2048, **kwargs))
    assert_weights_close(got, ref)


@pytest.mark.parametrize("plan_first", [False, True])
def test_model_differing_across_ranks_fails_on_every_rank(plan_first):
    """A model that differs across ranks is refused on every rank before any gradient moves,
    also when the plan was built before training (``opt.build_plan``, as the README shows)."""
    tf.keras.utils.set_random_seed(0)
    width = 8 + hvd.rank()
    model = tf.keras.Sequential([tf.keras.layers.Dense(width, input_shape=(4,)),
                                 tf.keras.layers.Dense(2)])
    opt = ours("layerwise")(tf.keras.optimizers.SGD(0.1))
    if plan_first:
        opt.build_plan(model.trainable_variables)
    with pytest.raises(ValueError, match="model differs across ranks"):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(tf.ones((2, 4))))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
