"""Shared by the multi-rank tests: small models, per-rank data, and two ways to train.

Every rank calls the same functions in the same order; data differ per rank (seeded by rank),
initial weights are equal on every rank (same seed), as in a real Horovod job after broadcast.
"""

from __future__ import annotations

import atexit
import dataclasses
import sys
import tempfile
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, TypeVar

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
    """The reference: stock Horovod's Keras DistributedOptimizer -- with the variables the
    user excluded from weight decay excluded again: its wrapper is made ``from_config``,
    which drops ``exclude_from_weight_decay`` (measured: 0.28.1 on Keras 2.15), and the
    reference computes what the user asked for."""
    wrapped = hvd.DistributedOptimizer(opt, **kw)
    names = getattr(opt, "_exclude_from_weight_decay_names", None)
    if names:
        wrapped.exclude_from_weight_decay(var_names=list(names))
    return wrapped


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
        self.names = [v.name for v in model.trainable_variables]
        self.optimizer = getattr(model, "optimizer", None)  # None: never compiled
        self.deferred_steps = observed.deferred_steps if observed else 0
        self.pending: list[bool] = observed.pending if observed else []
        self.steps: list[list[np.ndarray]] = observed.steps if observed else []
        self.val_loss = observed.val_loss if observed else []
        self.predictions = observed.predictions if observed else []


class Observer(tf.keras.callbacks.Callback):
    """Listed after ``OverlapCallback``: counts the steps whose update was still pending when
    the step ended (the deferral really happened), keeps the validation losses ``fit``'s own
    evaluate reported, and predicts ``x_val`` from a callback at every epoch end. With
    ``record_steps``, also the trainable weights as they were at the start and at every step's
    end (``steps[0]``: before the first step), which is when a deferred update is visible."""

    def __init__(self, x_val=None, record_steps: bool = False):
        super().__init__()
        self.x_val = x_val
        self.record_steps = record_steps
        self.deferred_steps = 0
        self.pending: list[bool] = []
        self.steps: list[list[np.ndarray]] = []
        self.val_loss: list[float] = []
        self.predictions: list[np.ndarray] = []

    def _record(self) -> None:
        if self.record_steps:
            self.steps.append([v.numpy() for v in self.model.trainable_variables])

    def on_train_begin(self, logs=None):
        self._record()

    def on_train_batch_end(self, batch, logs=None):
        pending = bool(getattr(self.model.optimizer, "pending", False))
        self.pending.append(pending)
        self.deferred_steps += int(pending)
        self._record()

    def on_epoch_end(self, epoch, logs=None):
        if logs and "val_loss" in logs:
            self.val_loss.append(float(logs["val_loss"]))
        if self.x_val is not None:
            self.predictions.append(self.model.predict(self.x_val, verbose=0))


# -- stock references, computed once per launch ---------------------------------------------

T = TypeVar("T")


class ReferenceRuns:
    """Stock Horovod's reference runs, each computed once per launch and kept by a key naming
    everything that changes the run. Every rank runs the same tests in the same order, so every
    rank hits or misses alike (a miss runs collectives). Counts what it served, and what the
    same requests computed before this cache (``stock_reference``'s own cache by (model,
    optimizer) only): printed by rank 0 when the process ends."""

    def __init__(self) -> None:
        self.runs: dict[Hashable, Any] = {}
        self.requested = 0
        self.computed = 0
        self._before_keys: set[Hashable] = set()  # stock_reference's old cache keys
        self._before_other = 0                    # requests no cache served before
        self._rank: int | None = None

    def get(self, key: Hashable, run: Callable[[], T], old_key: Hashable | None = None) -> T:
        """The run kept under ``key``, computed by ``run()`` if none is kept yet. ``old_key``:
        the key the request had in ``stock_reference``'s cache before this one (the count)."""
        if self._rank is None:
            self._rank = hvd.rank()
            atexit.register(self.report)
        self.requested += 1
        if old_key is None:
            self._before_other += 1
        else:
            self._before_keys.add(old_key)
        if key not in self.runs:
            self.computed += 1
            self.runs[key] = run()
        return self.runs[key]

    @property
    def computed_before(self) -> int:
        """How many of the requests served were computed before this cache."""
        return self._before_other + len(self._before_keys)

    def report(self) -> None:
        if self._rank == 0:
            print(f"stock reference runs: {self.requested} requested, {self.computed} computed "
                  f"({self.computed_before} before the per-launch cache)", file=sys.stderr,
                  flush=True)


REFERENCES = ReferenceRuns()
#: the stock runs of models up to this many trainable parameters keep their weights at every
#: step (``Observer(record_steps=True)``: 24 copies), so a test can compare step by step
STEP_RECORD_MAX_PARAMS = 100_000


def train_fit(model_name: str, opt_name: str, wrap, seed: int = 3, epochs: int = EPOCHS,
              initial_epoch: int = 0, callbacks=(), validation: bool = False,
              restore: str | None = None, restore_optimizer: bool = True,
              check_steps: bool = True, record_steps: bool = False) -> Result:
    """``model.fit`` for ``epochs`` x STEPS_PER_EPOCH steps, with ``OverlapCallback`` (a no-op
    for strategies that defer nothing, and for stock Horovod) and Horovod's broadcast.
    ``restore_optimizer=False``: a negative control, the checkpoint's weights and step count
    restored, its optimizer state not. ``record_steps``: see :class:`Observer`.

    Stock Horovod (``wrap`` is ``stock``) without callbacks or a checkpoint to restore is a
    reference: computed once per launch (``REFERENCES``), with validation and, for small
    models, the weights at every step (neither changes a weight)."""
    if wrap is stock and not callbacks and restore is None:
        got = REFERENCES.get(("fit", model_name, opt_name, seed, epochs, initial_epoch),
                             lambda: _stock_fit(model_name, opt_name, seed, epochs, initial_epoch))
        assert not record_steps or got.steps, f"{model_name} is too big to record every step"
        return got
    return _train_fit(model_name, opt_name, wrap, seed, epochs, initial_epoch, callbacks,
                      validation, restore, restore_optimizer, check_steps, record_steps)


def _train_fit(model_name: str, opt_name: str, wrap, seed: int = 3, epochs: int = EPOCHS,
               initial_epoch: int = 0, callbacks=(), validation: bool = False,
               restore: str | None = None, restore_optimizer: bool = True,
               check_steps: bool = True, record_steps: bool = False) -> Result:
    tf.keras.utils.set_random_seed(seed)
    model = MODELS[model_name]()
    opt = wrap(OPTIMIZERS[opt_name]())
    model.compile(optimizer=opt, loss=LOSS)
    if restore and restore_optimizer:
        model.load_weights(restore)
    elif restore and getattr(getattr(opt, "_hvdo", None), "checkpoint_entry", None) is not None:
        model.load_weights(restore)  # sharded: drop the restored slot state
        opt._hvdo.checkpoint_entry.pending = None
    elif restore:  # the weights (through a model without optimizer) and the step count only
        donor = MODELS[model_name]()
        donor.load_weights(restore).expect_partial()
        model.set_weights(donor.get_weights())
        opt.iterations.assign(initial_epoch * STEPS_PER_EPOCH)
    x, y = rank_data(model_name, BATCH * STEPS_PER_EPOCH)
    val = rank_data(model_name, BATCH * 2, seed=99) if validation else None
    observer = Observer(val[0] if validation else None, record_steps=record_steps)
    model.fit(x, y, batch_size=BATCH, epochs=epochs, initial_epoch=initial_epoch, shuffle=False,
              verbose=0, validation_data=val,
              callbacks=[hvdo.OverlapCallback(), hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         *callbacks, observer])
    if check_steps:
        assert int(opt.iterations.numpy()) == epochs * STEPS_PER_EPOCH
    return Result(model, observer)


def _stock_fit(model_name: str, opt_name: str, seed: int = 3, epochs: int = EPOCHS,
               initial_epoch: int = 0) -> Result:
    """A stock reference run: with validation, and the weights at every step if small."""
    size = sum(int(np.prod(v.shape)) for v in MODELS[model_name]().trainable_variables)
    return _train_fit(model_name, opt_name, stock, seed, epochs, initial_epoch,
                      validation=True, record_steps=size <= STEP_RECORD_MAX_PARAMS)


def stock_reference(model_name: str, opt_name: str) -> Result:
    """Stock Horovod's ``train_fit`` run (with validation; the weights at every step for
    small models), computed once per launch on every rank alike."""
    return REFERENCES.get(("fit", model_name, opt_name, 3, EPOCHS, 0),
                          lambda: _stock_fit(model_name, opt_name),
                          old_key=(model_name, opt_name))


def deferred_variables(opt) -> list[str]:
    """The names of the variables whose buckets the plan brings in at the next step's start
    (its forward phase), in forward order."""
    return [v.name for b in opt.plan.phase_buckets("forward") for v in b.variables
            if v.has_grad]


def assert_updates_landed_a_step_late(got: Result, ref: Result, deferred: list[str]) -> None:
    """Step by step (both runs with ``record_steps``): at the end of a step that left its
    update pending, the ``deferred`` variables hold stock's weights of the step before (their
    update not applied yet) and the others stock's weights of this step; at the end of the next
    step the deferred ones hold at least this step's (it came in during that step). At the
    end of a step with nothing pending every weight is stock's. And the deferral was visible:
    some deferred update moved a weight by far more than the tolerance."""
    assert len(got.steps) == len(ref.steps) == len(got.pending) + 1 > 1
    assert deferred and set(deferred) <= set(got.names), (deferred, got.names)
    late = {got.names.index(name) for name in deferred}
    seen = 0.0
    for t, pending in enumerate(got.pending, start=1):
        for i, (a, now, before) in enumerate(zip(got.steps[t], ref.steps[t], ref.steps[t - 1],
                                                 strict=True)):
            want = before if pending and i in late else now
            np.testing.assert_allclose(a, want, rtol=1e-5, atol=1e-6,
                                       err_msg=f"step {t}, {got.names[i]}, pending {pending}")
            if pending and i in late:
                seen = max(seen, float(np.max(np.abs(now - before))))
    assert seen > 1e-3, "no deferred update moved a weight: the check could not fail"


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
    stock Horovod, seed 5; no flush. Returns (model, opt, ref_model, ref_opt); the stock pair
    is computed once per launch for an optimizer of that class and configuration."""
    tf.keras.utils.set_random_seed(5)
    model = MODELS[model_name]()
    opt = wrap_ours(opt_factory())
    x, y = rank_data(model_name, BATCH * steps)
    batches = [(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH])
               for i in range(steps)]
    run = opt.make_train_step(step_for(model, opt))
    for xb, yb in batches:
        run(xb, yb)
    plain = opt_factory()

    def reference() -> tuple[tf.keras.Model, Any]:
        tf.keras.utils.set_random_seed(5)
        ref_model = MODELS[model_name]()
        ref_opt = stock(plain)
        ref_run = tf.function(step_for(ref_model, ref_opt))
        for xb, yb in batches:
            ref_run(xb, yb)
        return ref_model, ref_opt
    key = ("step_pair", model_name, steps, type(plain).__qualname__, repr(plain.get_config()))
    ref_model, ref_opt = REFERENCES.get(key, reference)
    return model, opt, ref_model, ref_opt


def stock_loop(model_name: str, opt_name: str, seed: int = 3) -> Result:
    """The custom-loop reference: the plain optimizer, gradients averaged by Horovod's
    ``DistributedGradientTape`` (computed once per launch, see ``train_loop``)."""
    return train_loop(model_name, opt_name, lambda o: o, tape_wrap=hvd_tf.DistributedGradientTape,
                      seed=seed)


def train_loop(model_name: str, opt_name: str, wrap, tape_wrap=None,
               seed: int = 3) -> Result:
    """A custom ``tf.GradientTape`` loop in a ``tf.function``: ``apply_gradients`` per step;
    ``deferred_steps`` counts the steps after which an update was pending. The stock
    reference (``tape_wrap`` is Horovod's ``DistributedGradientTape`` and ``wrap`` returns the
    optimizer as it is) is computed once per launch (``REFERENCES``)."""
    if tape_wrap is hvd_tf.DistributedGradientTape:
        plain = OPTIMIZERS[opt_name]()
        if wrap(plain) is plain:
            return REFERENCES.get(("loop", model_name, opt_name, seed),
                                  lambda: _train_loop(model_name, opt_name, wrap, tape_wrap, seed))
    return _train_loop(model_name, opt_name, wrap, tape_wrap, seed)


def _train_loop(model_name: str, opt_name: str, wrap, tape_wrap=None,
                seed: int = 3) -> Result:
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
    deferred = 0
    for xb, yb in ds:
        run(xb, yb)
        deferred += int(bool(getattr(opt, "pending", False)))
    if hasattr(opt, "flush"):
        opt.flush()
    assert int(opt.iterations.numpy()) == EPOCHS * STEPS_PER_EPOCH
    result = Result(model)
    result.optimizer = opt
    result.deferred_steps = deferred
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

