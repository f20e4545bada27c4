"""Shared by the multi-rank tests: small models, per-rank data, and two ways to train.

Every rank calls the same functions in the same order; data differ per rank (seeded by rank),
initial weights are equal on every rank (same seed), as in a real Horovod job after broadcast.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from pathlib import Path

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

import hvd_overlap.keras as hvdo
from hvd_overlap.core import choice, spelling

BATCH = 16
STEPS_PER_EPOCH = 12
EPOCHS = 2  # 24 steps in all


def cnn_bn() -> tf.keras.Model:
    L = tf.keras.layers
    return tf.keras.Sequential([
        # no bias before BatchNorm: its gradient would be rounding noise, which RMSprop and
        # Adagrad scale up to learning-rate-sized steps (different noise, different weights)
        L.Conv2D(8, 3, padding="same", use_bias=False, input_shape=(12, 12, 1)),
        L.BatchNormalization(), L.ReLU(), L.MaxPool2D(),
        L.Conv2D(16, 3, padding="same", use_bias=False), L.BatchNormalization(), L.ReLU(),
        L.Flatten(), L.Dense(32, activation="relu"), L.Dense(10),
    ])


def shared_layer() -> tf.keras.Model:
    """Functional model applying one Dense layer to two inputs (one variable, two uses)."""
    L = tf.keras.layers
    a, b = L.Input((12, 12, 1)), L.Input((12, 12, 1))
    shared = L.Dense(24, activation="tanh", name="shared")
    ha, hb = shared(L.Flatten()(a)), shared(L.Flatten()(b))
    out = L.Dense(10)(L.Concatenate()([ha, hb]))
    return tf.keras.Model([a, b], out)


def embedding() -> tf.keras.Model:
    L = tf.keras.layers
    return tf.keras.Sequential([
        L.Embedding(50, 8, input_length=6), L.GlobalAveragePooling1D(),
        L.Dense(16, activation="relu"), L.Dense(10),
    ])


class _UnusedBranch(tf.keras.Model):
    """A layer that is built and trainable but never on the loss path: its gradients are None."""

    def __init__(self):
        super().__init__()
        self.flat = tf.keras.layers.Flatten()
        self.hidden = tf.keras.layers.Dense(16, activation="relu")
        self.unused = tf.keras.layers.Dense(7)
        self.out = tf.keras.layers.Dense(10)

    def call(self, x):
        h = self.hidden(self.flat(x))
        _ = self.unused(h)  # built, but its output does not reach the loss
        return self.out(h)


def unused_branch() -> tf.keras.Model:
    m = _UnusedBranch()
    m(tf.zeros((1, 12, 12, 1)))
    return m


def odd_sizes() -> tf.keras.Model:
    """Layers with an odd number of elements: sharded buckets need padding on 2 ranks."""
    L = tf.keras.layers
    return tf.keras.Sequential([L.Flatten(input_shape=(12, 12, 1)),
                                L.Dense(15, activation="tanh"), L.Dense(9, activation="tanh"),
                                L.Dense(10)])


def dense_mix() -> tf.keras.Model:
    """Dense layers wide and narrow, row counts even and odd (33, 17: uneven rows on 2 ranks),
    with and without bias and activation, and a frozen one."""
    L = tf.keras.layers
    frozen = L.Dense(12, activation="relu", name="frozen")
    frozen.trainable = False
    return tf.keras.Sequential([
        L.Flatten(input_shape=(12, 12, 1)),
        L.Dense(33, activation="tanh", name="wide"),          # 144 x 33
        L.Dense(17, use_bias=False, name="nobias"),           # 33 x 17
        frozen,                                               # 17 x 12, not trained
        L.Dense(10, name="logits"),                           # 12 x 10
    ])


def dense_big() -> tf.keras.Model:
    """A 1024x1024 Dense layer: at 16 per rank on 2 ranks the exchange's cost model puts its
    forward on the rows (and keeps the gather for the 144x1024 one)."""
    L = tf.keras.layers
    return tf.keras.Sequential([
        L.Flatten(input_shape=(12, 12, 1)),
        L.Dense(1024, activation="relu", name="first"),
        L.Dense(1024, activation="tanh", name="big"),
        L.Dense(10, name="logits"),
    ])


def dense_l2() -> tf.keras.Model:
    """Dense layers with L2 kernel regularizers (a loss term on the whole kernel)."""
    L = tf.keras.layers
    return tf.keras.Sequential([
        L.Flatten(input_shape=(12, 12, 1)),
        L.Dense(31, activation="relu", kernel_regularizer=tf.keras.regularizers.L2(0.01)),
        L.Dense(10, kernel_regularizer=tf.keras.regularizers.L2(0.01)),
    ])


MODELS: dict[str, Callable[[], tf.keras.Model]] = {
    "cnn_bn": cnn_bn, "shared_layer": shared_layer,
    "embedding": embedding, "unused_branch": unused_branch, "odd_sizes": odd_sizes,
    "dense_mix": dense_mix, "dense_l2": dense_l2, "dense_big": dense_big,
}


def rank_data(model_name: str, n: int, seed: int = 7):
    """Different samples on every rank, learnable labels."""
    rng = np.random.default_rng(seed + 1000 * hvd.rank())
    y = rng.integers(0, 10, n).astype("int64")
    if model_name == "embedding":
        x = (rng.integers(0, 50, (n, 6)) + y[:, None] * 3) % 50
        return x.astype("int64"), y
    x = rng.normal(size=(n, 12, 12, 1)).astype("float32") + y[:, None, None, None] / 5.0
    if model_name == "shared_layer":
        return (x, np.flip(x, axis=1).copy()), y
    return x, y


def _decay():
    return tf.keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=5, decay_rate=0.7)


def _adamw():
    """AdamW whose decoupled decay skips biases and BatchNorm (excluded by name)."""
    opt = tf.keras.optimizers.AdamW(0.003, weight_decay=0.05)
    opt.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    return opt


OPTIMIZERS: dict[str, Callable[[], tf.keras.optimizers.Optimizer]] = {
    "sgd": lambda: tf.keras.optimizers.SGD(0.05),
    "sgd_momentum": lambda: tf.keras.optimizers.SGD(0.05, momentum=0.9),
    "sgd_nesterov": lambda: tf.keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True),
    "sgd_schedule": lambda: tf.keras.optimizers.SGD(_decay(), momentum=0.9),
    "rmsprop": lambda: tf.keras.optimizers.RMSprop(0.003),
    "adagrad": lambda: tf.keras.optimizers.Adagrad(0.02),  # 0.05: chaotic, ulps grow to 1e-3
    "adam_schedule": lambda: tf.keras.optimizers.Adam(_decay()),
    # (Adam from a learning rate of 0.1 is chaotic on dense_big: the factor exchange's own
    # rounding -- one GEMM over the global batch -- grows to O(1) differences; from 0.003
    # the exchange matches stock to 2e-7)
    "adam_decay": lambda: tf.keras.optimizers.Adam(
        tf.keras.optimizers.schedules.ExponentialDecay(0.003, decay_steps=5, decay_rate=0.7)),
    "adam": lambda: tf.keras.optimizers.Adam(0.003),
    "adamw": _adamw,
    "legacy_sgd_nesterov": lambda: tf.keras.optimizers.legacy.SGD(0.05, momentum=0.9,
                                                                  nesterov=True),
    "legacy_adam": lambda: tf.keras.optimizers.legacy.Adam(0.003),
    "nadam": lambda: tf.keras.optimizers.Nadam(0.003),
    "legacy_nadam": lambda: tf.keras.optimizers.legacy.Nadam(0.003),
    "adadelta": lambda: tf.keras.optimizers.Adadelta(1.0),
    "adamax": lambda: tf.keras.optimizers.Adamax(0.003),
    "ftrl": lambda: tf.keras.optimizers.Ftrl(0.05),
    "lion": lambda: tf.keras.optimizers.Lion(0.001),
    "legacy_rmsprop": lambda: tf.keras.optimizers.legacy.RMSprop(0.003),
    "legacy_adagrad": lambda: tf.keras.optimizers.legacy.Adagrad(0.02),
    "legacy_adadelta": lambda: tf.keras.optimizers.legacy.Adadelta(1.0),
    "legacy_adamax": lambda: tf.keras.optimizers.legacy.Adamax(0.003),
    "legacy_ftrl": lambda: tf.keras.optimizers.legacy.Ftrl(0.05),
    "sgd_clipvalue": lambda: tf.keras.optimizers.SGD(0.05, momentum=0.9, clipvalue=0.01),
}

LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def stock(opt, **kw):
    """The reference: stock Horovod's Keras DistributedOptimizer."""
    return hvd.DistributedOptimizer(opt, **kw)


def ours(strategy: str, **kw):
    """The plugin's optimizer; plan keywords the strategy has no use for (``bucket_bytes`` for
    ``"horovod"``, a ``TypeError`` if passed) are left out, so one call covers every strategy."""
    fields = {f.name for f in dataclasses.fields(choice.get(strategy.split("+")[0]))}
    kw = {k: v for k, v in kw.items()
          if k not in spelling.KEYWORDS or spelling.KEYWORDS[k][0] in fields}
    return lambda opt: hvdo.DistributedOptimizer(opt, strategy=strategy, **kw)


class Result:
    """What a run leaves: all weights (BN moving statistics are per rank) and trainable ones;
    for ``train_fit`` also what ``fit`` showed on the way (see :class:`Observer`)."""

    def __init__(self, model: tf.keras.Model, observed: Observer | None = None):
        self.weights = model.get_weights()
        self.trainable = [v.numpy() for v in model.trainable_variables]
        self.optimizer = getattr(model, "optimizer", None)  # None: never compiled
        self.deferred_steps = observed.deferred_steps if observed else 0
        self.val_loss = observed.val_loss if observed else []
        self.predictions = observed.predictions if observed else []


class Observer(tf.keras.callbacks.Callback):
    """Listed after ``OverlapCallback``: counts the steps whose update was still pending when
    the step ended (the deferral really happened), keeps the validation losses ``fit``'s own
    evaluate reported, and predicts ``x_val`` from a callback at every epoch end."""

    def __init__(self, x_val=None):
        super().__init__()
        self.x_val = x_val
        self.deferred_steps = 0
        self.val_loss: list[float] = []
        self.predictions: list[np.ndarray] = []

    def on_train_batch_end(self, batch, logs=None):
        self.deferred_steps += int(bool(getattr(self.model.optimizer, "pending", False)))

    def on_epoch_end(self, epoch, logs=None):
        if logs and "val_loss" in logs:
            self.val_loss.append(float(logs["val_loss"]))
        if self.x_val is not None:
            self.predictions.append(self.model.predict(self.x_val, verbose=0))


def train_fit(model_name: str, opt_name: str, wrap, seed: int = 3, epochs: int = EPOCHS,
              initial_epoch: int = 0, callbacks=(), validation: bool = False,
              restore: str | None = None, restore_optimizer: bool = True,
              check_steps: bool = True) -> Result:
    """``model.fit`` for ``epochs`` x STEPS_PER_EPOCH steps, with ``OverlapCallback`` (a no-op
    for strategies that defer nothing, and for stock Horovod) and Horovod's broadcast."""
    tf.keras.utils.set_random_seed(seed)
    model = MODELS[model_name]()
    opt = wrap(OPTIMIZERS[opt_name]())
    model.compile(optimizer=opt, loss=LOSS)
    if restore:
        model.load_weights(restore)
        if not restore_optimizer:  # negative control: drop the restored sharded slot state
            opt._hvdo.checkpoint_entry.pending = None
    x, y = rank_data(model_name, BATCH * STEPS_PER_EPOCH)
    val = rank_data(model_name, BATCH * 2, seed=99) if validation else None
    observer = Observer(val[0] if validation else None)
    model.fit(x, y, batch_size=BATCH, epochs=epochs, initial_epoch=initial_epoch, shuffle=False,
              verbose=0, validation_data=val,
              callbacks=[hvdo.OverlapCallback(), hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         *callbacks, observer])
    if check_steps:
        assert int(opt.iterations.numpy()) == epochs * STEPS_PER_EPOCH
    return Result(model, observer)


_stock_runs: dict[tuple[str, str], Result] = {}


def stock_reference(model_name: str, opt_name: str) -> Result:
    """Stock Horovod's ``train_fit`` run, computed once per (model, optimizer) on every rank
    alike (ranks run the same tests in the same order, so they hit the cache alike)."""
    key = (model_name, opt_name)
    if key not in _stock_runs:  # validation and predictions inside fit change no weight
        _stock_runs[key] = train_fit(model_name, opt_name, stock, validation=True)
    return _stock_runs[key]


def assert_fit_saw_stocks_weights(got: Result, ref: Result) -> None:
    """``evaluate`` (validation) and ``predict`` (a callback's, at epoch end) inside ``fit``
    gave what they give with stock Horovod."""
    assert len(got.val_loss) == len(ref.val_loss) > 0
    np.testing.assert_allclose(got.val_loss, ref.val_loss, rtol=1e-5, atol=1e-6)
    assert len(got.predictions) == len(ref.predictions) > 0
    for a, b in zip(got.predictions, ref.predictions, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def step_for(model: tf.keras.Model, opt):
    """A custom-loop step of ``model`` with ``opt`` (``minimize`` on a tape)."""
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = LOSS(yb, model(xb, training=True))
        opt.minimize(loss, model.trainable_variables, tape=tape)
    return step


def step_pair(opt_factory: Callable[[], tf.keras.optimizers.Optimizer], wrap_ours,
              model_name: str = "cnn_bn", steps: int = 6):
    """The same custom-loop steps with ``wrap_ours`` (through ``make_train_step``) and with
    stock Horovod, seed 5; no flush. Returns (model, opt, ref_model, ref_opt)."""
    tf.keras.utils.set_random_seed(5)
    model = MODELS[model_name]()
    opt = wrap_ours(opt_factory())
    tf.keras.utils.set_random_seed(5)
    ref_model = MODELS[model_name]()
    ref_opt = hvd.DistributedOptimizer(opt_factory())
    x, y = rank_data(model_name, BATCH * steps)
    run = opt.make_train_step(step_for(model, opt))
    ref_run = tf.function(step_for(ref_model, ref_opt))
    for i in range(steps):
        xb, yb = x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]
        run(xb, yb)
        ref_run(xb, yb)
    return model, opt, ref_model, ref_opt


def train_loop(model_name: str, opt_name: str, wrap, tape_wrap=None,
               seed: int = 3) -> Result:
    """A custom ``tf.GradientTape`` loop in a ``tf.function``: ``apply_gradients`` per step."""
    tf.keras.utils.set_random_seed(seed)
    model = MODELS[model_name]()
    opt = wrap(OPTIMIZERS[opt_name]())
    x, y = rank_data(model_name, BATCH * STEPS_PER_EPOCH)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat(EPOCHS)

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = LOSS(yb, model(xb, training=True))
        if tape_wrap is not None:
            tape = tape_wrap(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    # the documented custom-loop pair for deferring strategies: make_train_step ... flush
    run = opt.make_train_step(step, model) if hasattr(opt, "make_train_step") else \
        tf.function(step)
    for xb, yb in ds:
        run(xb, yb)
    if hasattr(opt, "flush"):
        opt.flush()
    assert int(opt.iterations.numpy()) == EPOCHS * STEPS_PER_EPOCH
    result = Result(model)
    result.optimizer = opt
    return result


def assert_weights_close(actual: Result, expected: Result, rtol=1e-5, atol=1e-6,
                         trainable_only: bool = False):
    """Every weight (BN statistics included, unless ``trainable_only``) equal to fp32 tolerance."""
    pairs = (zip(actual.trainable, expected.trainable, strict=True) if trainable_only
             else zip(actual.weights, expected.weights, strict=True))
    assert len(actual.weights) == len(expected.weights)
    for i, (a, e) in enumerate(pairs):
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=f"weight {i}")


def max_abs_diff(a: Result, b: Result) -> float:
    pairs = zip(a.weights, b.weights, strict=True)
    return max(float(np.max(np.abs(x - y))) if x.size else 0.0 for x, y in pairs)


def same_on_all_ranks(result: Result) -> bool:
    """True if every rank holds bitwise the same trainable weights (rank 0's, broadcast)."""
    flat = np.concatenate([w.ravel().astype("float64") for w in result.trainable])
    root = hvd.broadcast(tf.constant(flat), 0, name="same_on_all_ranks").numpy()
    ok = np.array_equal(flat, root)
    return bool(hvd.allreduce(tf.constant(int(not ok)), op=hvd.Sum, name="same_ok").numpy() == 0)


class ModelCheckpointInTmp:
    """A ModelCheckpoint (weights + optimizer state, every epoch unless
    ``save_freq`` says otherwise), in a temporary directory named by rank 0."""

    def __init__(self, save_freq: str | int = "epoch"):
        base = hvd_tf.broadcast_object(tempfile.mkdtemp(), 0, name="ckpt_dir")
        self.path = str(Path(base) / f"rank{hvd.rank()}" / "ckpt")
        self.count = 0
        outer = self

        class Counting(tf.keras.callbacks.ModelCheckpoint):
            def _save_model(self, epoch, batch, logs):
                outer.count += 1
                super()._save_model(epoch, batch, logs)

        self.callback = Counting(self.path, save_weights_only=True, save_freq=save_freq)

    def saved(self) -> int:
        return self.count

