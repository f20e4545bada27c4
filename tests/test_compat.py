"""The Keras/TF/Horovod internals ``hvd_overlap/keras/keras_api.py`` relies on still exist.

Single process. On a Keras (or TF, Horovod) upgrade this file fails first, naming the version or
the attribute: re-check ``hvd_overlap/keras/keras_api.py`` against the new release.
"""

import importlib
import inspect
import re
import sys
from pathlib import Path

import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf

import hvd_overlap
from hvd_overlap.adapters import keras_api
from hvd_overlap.adapters.generation import keras_behind_tf_keras
from hvd_overlap.keras.sharded_state import ShardedCheckpoint
from hvd_overlap.keras.wrapper import DistributedMixin

RECHECK = "re-check hvd_overlap/keras/keras_api.py against the installed Keras/TF/Horovod"
pytestmark = pytest.mark.skipif(keras_api.GENERATION != 2, reason=(
    "Keras 2 internals; tests/test_keras3_local.py checks the Keras 3 adapter's"))


def _has(obj, name: str) -> None:
    assert hasattr(obj, name), f"{type(obj).__name__} has no {name!r}: {RECHECK}"


def _built_adam():
    var = tf.Variable(tf.zeros([2, 3]), name="compat_kernel")
    opt = tf.keras.optimizers.AdamW(0.1, weight_decay=0.01)
    opt.build([var])
    return opt, var


def test_the_installed_keras_is_a_version_the_adapter_was_checked_with():
    keras = sys.modules[tf.keras.__name__.split(".")[0]]  # keras (or tf_keras) behind tf.keras
    minor = ".".join(keras.__version__.split(".")[:2])
    assert minor in keras_api.KERAS_VERSIONS, (
        f"tf.keras is {keras.__name__} {keras.__version__}, hvd_overlap/keras/keras_api.py was "
        f"checked with {', '.join(keras_api.KERAS_VERSIONS)}: {RECHECK}, then add it to "
        f"KERAS_VERSIONS")
    assert keras_behind_tf_keras() == (keras.__name__, keras.__version__)


def test_keras_optimizers_keep_the_internals_the_adapter_uses():
    opt, var = _built_adam()
    for name in ("_variables", "_built", "_learning_rate", "_use_weight_decay",
                 "_apply_weight_decay", "_trackable_children", "_track_trackable"):
        _has(opt, name)
    assert opt.variables[0] is opt.iterations, f"variables no longer start with iterations: " \
        f"{RECHECK}"
    assert list(opt.variables) == list(opt._variables), RECHECK
    _has(var, "_shared_name")
    slots = keras_api.slot_variables(opt)
    assert [keras_api.slot_of(v, {keras_api.shared_name(var)}) for v in slots] == [
        ("m", keras_api.shared_name(var)), ("v", keras_api.shared_name(var))], (
        f"Keras names slots differently ({[v.name for v in slots]}): {RECHECK}")
    assert keras_api.uses_weight_decay(opt, var) is True
    assert [h.name for h in keras_api.hyper_variables(opt)] == [opt._learning_rate.name]
    assert keras_api.legacy_compute_gradients(super(type(opt), opt)) is None


def test_keras_optimizers_save_their_variables_in_the_layout_the_adapter_writes():
    opt, _ = _built_adam()
    store: dict = {}
    opt.save_own_variables(store)
    ours: dict = {}
    keras_api.fill_store(ours, [v.numpy() for v in opt.variables])
    assert sorted(store) == sorted(ours), RECHECK
    assert all(np.array_equal(a, b) for a, b in zip(keras_api.read_store(store),
                                                     keras_api.read_store(ours), strict=True))


def test_legacy_optimizers_keep_the_internals_the_adapter_uses():
    var = tf.Variable(tf.zeros([3]), name="compat_legacy")
    opt = tf.keras.optimizers.legacy.Adam(0.1)
    assert keras_api.is_legacy_optimizer(opt)
    for name in ("_create_all_weights", "_create_hypers", "_hyper", "_slots", "_weights",
                 "_compute_gradients", "_trackable_children"):
        _has(opt, name)
    keras_api.create_legacy_slots(opt, [var])
    assert opt.get_slot(var, "m") is not None
    assert {id(v) for d in opt._slots.values() for v in d.values()} >= {
        id(opt.get_slot(var, "m")), id(opt.get_slot(var, "v"))}, RECHECK
    names = sorted(h.name.split(":")[0].split("/")[-1] for h in keras_api.hyper_variables(opt))
    assert names == ["beta_1", "beta_2", "decay", "learning_rate"], RECHECK
    nadam = tf.keras.optimizers.legacy.Nadam(0.1)
    cache = keras_api.momentum_schedule(nadam, [var])
    assert isinstance(cache, tf.Variable), f"legacy Nadam has no _m_cache variable: {RECHECK}"


def test_tf_and_keras_keep_the_graph_layer_and_trackable_internals():
    layer = tf.keras.layers.Dense(2)
    _has(layer, "_compute_dtype_object")
    assert keras_api.compute_dtype_object(layer) == tf.float32
    for name in ("_serialize_to_tensors", "_restore_from_tensors", "_trackable_children",
                 "_track_trackable"):
        assert hasattr(keras_api.Trackable, name), f"Trackable has no {name!r}: {RECHECK}"


def test_horovod_keeps_its_gradient_function():
    fn = getattr(hvd, "_make_allreduce_grads_fn", None)
    assert fn is not None, f"horovod.tensorflow has no _make_allreduce_grads_fn: {RECHECK}"
    assert list(inspect.signature(fn).parameters) == [
        "name", "device_dense", "device_sparse", "compression", "sparse_as_dense", "op",
        "gradient_predivide_factor", "groups", "process_set"], RECHECK
    assert "_agg_helper" in inspect.getsource(importlib.import_module("horovod._keras")), RECHECK


def test_every_hook_name_is_defined_by_us_and_called_by_keras_tf_or_horovod():
    ours = {"DistributedMixin": DistributedMixin, "ShardedCheckpoint": ShardedCheckpoint}
    bases = {"_trackable_children": keras_api.Trackable,
             "_apply_weight_decay": tf.keras.optimizers.Optimizer,
             "_compute_gradients": tf.keras.optimizers.legacy.Optimizer,
             "_serialize_to_tensors": keras_api.Trackable,
             "_restore_from_tensors": keras_api.Trackable}
    for owner, name, _caller in keras_api.HOOK_NAMES:
        assert name in vars(ours[owner]), (owner, name)
        if name in bases:
            assert hasattr(bases[name], name), f"{bases[name].__name__}.{name}: {RECHECK}"


def test_patching_a_keras_method_takes_effect_and_is_undone():
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
    model.compile("sgd", "mse")
    calls = {"step": 0, "function": 0}
    original = model.train_step

    def train_step(data):
        calls["step"] += 1
        return original(data)

    assert keras_api.patch_method(model, "train_step", train_step) is None

    class Choose(tf.keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.fn = self.model.make_train_function()

        def on_train_batch_begin(self, batch, logs=None):
            def counted(iterator):
                calls["function"] += 1
                return self.fn(iterator)
            keras_api.set_train_function(self.model, counted)

    x = np.ones((4, 2), np.float32)
    model.fit(x, x[:, :1], batch_size=2, epochs=1, verbose=0, callbacks=[Choose()])
    assert calls["step"] >= 1, f"make_train_function ignored the patched train_step: {RECHECK}"
    assert calls["function"] == 2, f"fit no longer reads train_function per step: {RECHECK}"
    keras_api.restore_method(model, "train_step")
    assert "train_step" not in vars(model)
    keras_api.forget_train_function(model)
    assert model.train_function is None


@pytest.mark.parametrize("pattern", [r"^\s*(from|import)\s+tensorflow\.python",
                                     r"^\s*(from|import)\s+keras\.src", r"\btf\.python\.",
                                     r"\bhvd\._[a-z]", r"__mro__"])
def test_only_the_adapter_reaches_tf_keras_or_horovod_internals(pattern):
    root = Path(hvd_overlap.__file__).parent
    for package in ("comm", "keras", "growth"):
        for f in sorted((root / package).rglob("*.py")):  # only hvd_overlap/adapters may
            hits = [line for line in f.read_text().splitlines() if re.search(pattern, line)]
            assert not hits, (f, hits)
