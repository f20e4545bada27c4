"""Keras 3, one process: the internals the Keras 3 adapter reads still exist (on an upgrade this
fails first, naming the attribute), and what Keras 3 cannot run is refused before any
collective, naming the fix. The 2-rank exactness tests are tests/multirank/test_keras3.py."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from hvd_overlap.adapters import keras_api

pytestmark = pytest.mark.skipif(keras_api.GENERATION != 3, reason=(
    "Keras 3 only: scripts/test runs it on the keras3 stack (TF 2.18 + Keras 3)"))

if keras_api.GENERATION == 3:
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    import hvd_overlap.keras as hvdo

    hvd.init()

RECHECK = "re-check hvd_overlap/adapters/keras3.py against the installed Keras"


def _model() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])


def test_keras_3_optimizers_keep_the_internals_the_adapter_uses():
    model = _model()
    nadam = keras.optimizers.Nadam(0.1)
    nadam.build(model.trainable_variables)
    for name in ("_apply_weight_decay", "_learning_rate", "_use_weight_decay",
                 "_trainable_variables", "built", "apply", "iterations"):
        assert hasattr(nadam, name), f"{name}: {RECHECK}"
    assert isinstance(keras_api.momentum_schedule(nadam, []), keras.Variable), RECHECK
    assert keras_api.hyper_variables(nadam) == [nadam._learning_rate], RECHECK
    kernel = model.trainable_variables[0]
    assert isinstance(keras_api.tf_variable(kernel), tf.Variable), RECHECK
    assert keras_api.var_name(kernel) == kernel.path and "/" in kernel.path, RECHECK
    assert keras_api.var_key(kernel) == keras_api.var_key(kernel), RECHECK


def test_keras_3_names_and_lists_slots_as_the_sharded_update_reads_them():
    """The sharded update builds the optimizer for its slice variables and finds each slot's
    slice by name; a ``.keras`` file lists the head variables, then the slots."""
    slices = [keras_api.make_variable(np.zeros([4], np.float32), f"hvdo_s{i}") for i in (1, 10)]
    adam = keras.optimizers.Adam(0.1)
    adam.build(slices)
    owners = {keras_api.shared_name(v) for v in slices}
    assert [keras_api.slot_of(v, owners) for v in keras_api.slot_variables(adam)] == [
        ("momentum", "hvdo_s1"), ("velocity", "hvdo_s1"),
        ("momentum", "hvdo_s10"), ("velocity", "hvdo_s10")], RECHECK
    assert keras_api.head_variables(adam) == [adam.iterations, adam._learning_rate], RECHECK
    assert adam.variables == keras_api.head_variables(adam) + keras_api.slot_variables(adam)
    store: dict = {}
    adam.save_own_variables(store)
    assert len(store) == len(adam.variables), RECHECK
    keras_api.hide_optimizer_variables(adam, {id(v) for v in keras_api.slot_variables(adam)})
    assert adam.variables == keras_api.head_variables(adam), RECHECK
    scheduled = keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, 2, 0.5))
    assert keras_api.head_variables(scheduled) == [scheduled.iterations]


def test_exclusions_from_weight_decay_survive_the_wrapping():
    """``get_config`` leaves out ``exclude_from_weight_decay``; the wrapped copy keeps it."""
    model = _model()
    adamw = keras.optimizers.AdamW(0.1, weight_decay=0.1)
    adamw.exclude_from_weight_decay(var_names=["bias"])
    opt = hvdo.DistributedOptimizer(adamw, strategy="sharded")
    kernel, bias = model.trainable_variables
    assert keras_api.uses_weight_decay(opt, kernel)
    assert not keras_api.uses_weight_decay(opt, bias)


def test_a_sharded_model_saves_the_plain_optimizer_layout(tmp_path):
    """One rank: the sharded update is the plain one; its ``.keras`` file loads into plain
    Keras with the optimizer state plain Keras computes, and back into the plugin."""
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(8, 3)
    y = x[:, :2] * 2.0
    model, plain = _model(), _model()
    model.compile(hvdo.DistributedOptimizer(keras.optimizers.Adam(0.1), strategy="sharded"),
                  "mse")
    plain.compile(keras.optimizers.Adam(0.1), "mse")
    for m in (model, plain):
        m.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0,
              callbacks=[hvdo.OverlapCallback()] if m is model else [])
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert len(loaded.optimizer.variables) == len(plain.optimizer.variables) == 2 + 2 * 2
    for a, b in zip(loaded.optimizer.variables, plain.optimizer.variables, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, err_msg=a.path)
    back = hvdo.load_model(str(tmp_path / "m.keras"), strategy="sharded")
    for m in (back, plain):
        m.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvdo.OverlapCallback()] if m is back else [])
    for a, b in zip(back.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_make_train_function_stores_the_function_fit_reads():
    model = _model()
    model.compile("sgd", "mse")
    fn = keras_api.new_train_function(model)
    assert fn is not None and fn is model.train_function, RECHECK


def test_the_wrapped_optimizer_takes_keras_3_apply():
    """A custom loop calling ``apply`` (not ``apply_gradients``) reaches the plugin: on one
    rank it is the plain update, counted once."""
    model = _model()
    opt = hvdo.DistributedOptimizer(keras.optimizers.SGD(0.5), strategy="layerwise")
    before = [w.numpy() for w in model.trainable_variables]
    grads = [tf.ones_like(w) for w in model.trainable_variables]
    opt.apply(grads, model.trainable_variables)
    assert int(opt.iterations.numpy()) == 1
    for b, w in zip(before, model.trainable_variables, strict=True):
        np.testing.assert_allclose(w.numpy(), b - 0.5)
    assert opt.plan is not None  # the plugin planned it


def test_mixed_precision_puts_the_loss_scale_optimizer_inside():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        opt = hvdo.DistributedOptimizer(keras.optimizers.Adam(0.1))
        model = _model()
        model.compile(opt, "mse")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert isinstance(opt, keras.optimizers.LossScaleOptimizer)
    assert model.optimizer is opt


@pytest.mark.parametrize("strategy", ["deferred", "hybrid", "sharded", "sharded_hybrid", "auto"])
def test_mixed_precision_with_a_split_update_is_refused_or_left_out(strategy):
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        if strategy == "auto":  # auto keeps to what can run: no deferring plan in its pool
            from hvd_overlap.keras.executors.auto_pool import can_defer
            assert not can_defer(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()))
            return
        with pytest.raises(ValueError, match="strategy='layerwise' or 'horovod'"):
            hvdo.DistributedOptimizer(keras.optimizers.Adam(0.1), strategy=strategy)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_xla_is_refused_naming_the_fix():
    model = _model()
    model.compile(hvdo.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse",
                  jit_compile=True)
    x = np.ones((4, 3), np.float32)
    with pytest.raises(ValueError, match=r"jit_compile=False"):
        model.fit(x, x[:, :2], batch_size=2, epochs=1, verbose=0)


def test_legacy_optimizers_are_refused_by_load_model(tmp_path):
    with pytest.raises(ValueError, match="Keras 3 has no legacy optimizers"):
        hvdo.load_model(str(tmp_path / "none.keras"), legacy_opts=True)


def test_a_saved_model_comes_back_with_its_optimizer_wrapped(tmp_path):
    model = _model()
    model.compile(hvdo.DistributedOptimizer(keras.optimizers.Adam(0.1), strategy="hybrid"),
                  "mse")
    x = np.ones((4, 3), np.float32)
    model.fit(x, x[:, :2], batch_size=2, epochs=1, verbose=0,
              callbacks=[hvdo.OverlapCallback()])
    model.save(tmp_path / "m.keras")
    back = hvdo.load_model(str(tmp_path / "m.keras"), strategy="hybrid")
    assert back.optimizer.strategy == "hybrid"
    assert int(back.optimizer.iterations.numpy()) == 2
    plain = keras.models.load_model(tmp_path / "m.keras")
    assert not hasattr(plain.optimizer, "strategy")  # restores without the plugin
    for a, b in zip(back.optimizer.variables, plain.optimizer.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_doctor_names_keras_3_and_what_it_cannot_run():
    from hvd_overlap.tools.doctor import collect, format_report

    report = format_report(collect())
    assert "(Keras 3: the plugin's Keras 3 adapter)" in report, report
    assert "run here: horovod, layerwise, deferred, hybrid, sharded, sharded_hybrid, auto" \
        in report, report
    assert "not available on Keras 3" not in report, report


NO_TF_KERAS_JOB = """
import sys
sys.modules["tf_keras"] = None  # `import tf_keras` now fails, as where it is not installed
import numpy as np
import horovod.tensorflow as hvd
import keras
import hvd_overlap.keras as hvdo
from hvd_overlap.adapters import keras_api
hvd.init()
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
model.compile(hvdo.DistributedOptimizer(keras.optimizers.Adam(0.1), strategy="layerwise"), "mse")
x = np.ones((8, 3), "float32")
model.fit(x, np.zeros((8, 2), "float32"), batch_size=4, verbose=0)
print("generation", keras_api.GENERATION, "steps", int(model.optimizer.iterations.numpy()))
"""


def test_the_plugin_never_needs_tf_keras(tmp_path):
    """Where tf-keras is not installed (hidden here: the whole run's TF 2.18 venv has it), the
    plugin imports, picks the Keras 3 adapter and trains."""
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    done = subprocess.run([sys.executable, "-c", NO_TF_KERAS_JOB], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "generation 3 steps 2" in done.stdout, done.stdout
