"""The Keras wrapper in one process (Horovod size 1): API, errors, save/load, plain-SGD equality."""

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import pytest
import tensorflow as tf

import hvd_overlap
import hvd_overlap.keras as hvdo

hvd.init()


def small_model():
    tf.keras.utils.set_random_seed(1)
    return tf.keras.Sequential([
        tf.keras.layers.Conv2D(4, 3, input_shape=(8, 8, 1)), tf.keras.layers.BatchNormalization(),
        tf.keras.layers.Flatten(), tf.keras.layers.Dense(10),
    ])


def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(64, 8, 8, 1)).astype("float32"), rng.integers(0, 10, 64)


def fit(model, opt):
    model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = data()
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0,
              callbacks=[hvdo.OverlapCallback()])
    return model.get_weights()


@pytest.mark.parametrize("strategy", sorted(hvd_overlap.STRATEGIES))
@pytest.mark.parametrize("make_opt", [
    lambda: tf.keras.optimizers.SGD(0.1, momentum=0.9),
    lambda: tf.keras.optimizers.legacy.Adam(0.01),
], ids=["sgd", "legacy_adam"])
def test_size_one_equals_the_plain_optimizer(strategy, make_opt):
    plain = fit(small_model(), make_opt())
    wrapped = fit(small_model(), hvdo.DistributedOptimizer(make_opt(), strategy=strategy))
    for a, b in zip(wrapped, plain, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_wrapper_keeps_the_class_name_and_config():
    opt = hvdo.DistributedOptimizer(tf.keras.optimizers.Adam(0.01))
    assert type(opt).__name__ == "Adam"
    assert isinstance(opt, tf.keras.optimizers.Adam)
    assert opt.get_config()["learning_rate"] == pytest.approx(0.01)
    assert opt.strategy == "layerwise"


def test_saved_model_loads_without_the_plugin(tmp_path):
    model = small_model()
    fit(model, hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.9)))
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = tf.keras.models.load_model(path)
    assert type(loaded.optimizer).__name__ == "SGD"
    for a, b in zip(loaded.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_plan_is_printable_before_training():
    model = small_model()
    opt = hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), bucket_bytes=1024)
    with pytest.raises(RuntimeError, match="build_plan"):
        _ = opt.plan
    plan = opt.build_plan(model.trainable_variables)
    assert opt.plan is plan
    assert plan.buckets[0].layers == (model.layers[-1].name,)
    assert "conv2d" in plan.describe()


@pytest.mark.parametrize("kwargs, match", [
    ({"strategy": "fastest"}, "unknown strategy 'fastest'.*horovod.*layerwise"),
    ({"bucket_bytes": 0}, "bucket_bytes must be a positive"),
    ({"op": hvd_tf.Adasum}, "op must be hvd.Average or hvd.Sum"),
    ({"backward_passes_per_step": 0}, "backward_passes_per_step must be"),
    ({"groups": 2}, "tune bucket_bytes"),
    ({"strategy": "deferred", "backward_passes_per_step": 2}, "layerwise"),
    ({"strategy": "hybrid", "defer": -3}, "defer must be"),
])
def test_bad_arguments_name_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), **kwargs)


def test_not_an_optimizer():
    with pytest.raises(TypeError, match="Keras optimizer"):
        hvdo.DistributedOptimizer("sgd")


def test_wrapping_twice_is_refused():
    opt = hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1))
    with pytest.raises(TypeError, match="already"):
        hvdo.DistributedOptimizer(opt)


def test_importing_the_plugin_leaves_horovods_environment_alone():
    """The plugin must not change how stock Horovod runs in the same process (issue 11): a
    fresh interpreter's environment is the same before and after importing every module."""
    import subprocess
    import sys

    code = ("import os, json; before = dict(os.environ); import hvd_overlap.keras, "
            "hvd_overlap.data, hvd_overlap.bench.worker; "
            "print(json.dumps({k: v for k, v in os.environ.items() if before.get(k) != v}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "{}"


def test_pure_modules_load_neither_tensorflow_nor_horovod():
    import subprocess
    import sys

    code = ("import sys, hvd_overlap, hvd_overlap.plan, hvd_overlap.sharding, "
            "hvd_overlap.batching, hvd_overlap.simulate; "
            "print(sorted(m for m in ('tensorflow', 'horovod') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_cli_plan_prints_the_plan_of_a_saved_model(tmp_path):
    from click.testing import CliRunner

    from hvd_overlap.cli import main

    path = str(tmp_path / "m.keras")
    model = small_model()
    model.save(path)
    result = CliRunner().invoke(main, ["plan", path, "--bucket-bytes", "1024"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("plan: strategy=layerwise bucket_bytes=1.0KiB buckets=2")
    assert f"{model.layers[-1].name}/kernel:0" in "".join(result.output.splitlines()[3:5])


def test_deferring_refuses_global_clipnorm():
    with pytest.raises(ValueError, match="global_clipnorm.*clipnorm"):
        hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, global_clipnorm=1.0),
                                  strategy="deferred")


def test_deferred_without_the_callback_names_the_fix():
    model = small_model()
    model.compile(hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), strategy="deferred"),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = data()
    with pytest.raises(ValueError, match="OverlapCallback"):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)


def test_overlap_callback_flushes_before_evaluate_and_leaves_fit_clean():
    model = small_model()
    opt = hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.9),
                                    strategy="deferred")
    fit(model, opt)
    assert int(opt.iterations.numpy()) == 8          # 2 epochs x 4 steps, all applied
    assert not bool(opt._hvdo.deferral.pending.numpy())
    assert "train_step" not in vars(model)           # the patch is removed after fit


def test_sharded_keras_file_resumes_before_the_first_step(tmp_path):
    """A .keras file saved by a sharded optimizer, loaded into a fresh sharded optimizer before
    training (state kept until the slices exist), resumes as if never interrupted; without the
    optimizer state the run ends elsewhere."""
    x, y = data()

    def run(opt, epochs, initial_epoch=0, load=None, save=None, drop_state=False):
        model = small_model()
        model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        if load:
            model.load_weights(load)
            if drop_state:
                opt._hvdo.shards.checkpoint.pending_plain = None
        model.fit(x, y, batch_size=16, epochs=epochs, initial_epoch=initial_epoch,
                  shuffle=False, verbose=0, callbacks=[hvdo.OverlapCallback()])
        if save:
            model.save(save)
        return model.get_weights()

    def sharded():
        return hvdo.DistributedOptimizer(tf.keras.optimizers.Adam(0.01), strategy="sharded")

    whole = run(tf.keras.optimizers.Adam(0.01), epochs=3)
    path = str(tmp_path / "m.keras")
    run(sharded(), epochs=2, save=path)
    resumed = run(sharded(), epochs=3, initial_epoch=2, load=path)
    for a, b in zip(resumed, whole, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    fresh = run(sharded(), epochs=3, initial_epoch=2, load=path, drop_state=True)
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(fresh, whole, strict=True)) > 1e-3
