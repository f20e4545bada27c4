"""Shared by the Keras 3 multi-rank tests: a small model, per-rank data, and the reference.

Stock Horovod cannot train Keras 3 models (its Keras optimizer never averages there), so the
reference is what synchronous SGD computes: one process, plain Keras 3, the same model trained
on the global batch (every rank's batch of the step, concatenated in rank order) with the mean
loss. No batch-statistics layers, so the global batch's gradient is the mean of the ranks'.
Every rank computes the reference itself (no collective).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import horovod.tensorflow as hvd
import keras
import numpy as np

BATCH = 8           # per rank
STEPS = 6           # per epoch
EPOCHS = 2
FEATURES, CLASSES = 12, 4
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def mlp(seed: int = 1) -> keras.Model:
    """Three Dense layers (an Embedding-free, batch-norm-free model: the reference is exact)."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(CLASSES)])


def with_embedding(seed: int = 1) -> keras.Model:
    """An embedding (sparse gradients) before two Dense layers."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((6,), dtype="int32"), keras.layers.Embedding(30, 8),
        keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(CLASSES)])


OPTIMIZERS: dict[str, Callable[[], keras.optimizers.Optimizer]] = {
    "sgd_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "nadam": lambda: keras.optimizers.Nadam(0.01),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.005),
    "adamw_no_bias": lambda: _no_bias_decay(keras.optimizers.AdamW(0.01, weight_decay=0.05)),
    "sgd_schedule": lambda: keras.optimizers.SGD(
        keras.optimizers.schedules.ExponentialDecay(0.2, decay_steps=3, decay_rate=0.7),
        momentum=0.9),
}


def _no_bias_decay(opt: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """``opt`` with its biases left out of decoupled weight decay (by name)."""
    opt.exclude_from_weight_decay(var_names=["bias"])
    return opt


def global_data(ints: bool = False, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """An epoch's global batches, in order: ``STEPS * size * BATCH`` rows."""
    rng = np.random.default_rng(seed)
    rows = STEPS * hvd.size() * BATCH
    x = rng.integers(0, 30, size=(rows, 6)).astype("int32") if ints else \
        rng.normal(size=(rows, FEATURES)).astype("float32")
    return x, rng.integers(0, CLASSES, size=(rows,))


def rank_rows(rows: int, rank: int | None = None) -> np.ndarray:
    """The rows of the global data this rank trains on: its ``BATCH`` of every global batch."""
    rank = hvd.rank() if rank is None else rank
    step = hvd.size() * BATCH
    return np.concatenate([np.arange(s + rank * BATCH, s + (rank + 1) * BATCH)
                           for s in range(0, rows, step)])


def reference(build: Callable[[], keras.Model], opt: keras.optimizers.Optimizer,
              x: np.ndarray, y: np.ndarray, epochs: int = EPOCHS, **fit: Any) -> keras.Model:
    """Plain Keras 3, one process, the global batch: what synchronous SGD computes."""
    model = build()
    model.compile(opt, LOSS)
    model.fit(x, y, batch_size=hvd.size() * BATCH, epochs=epochs, shuffle=False, verbose=0,
              **fit)
    return model


def max_difference(a: keras.Model, b: keras.Model) -> float:
    return max(float(np.max(np.abs(u - v))) for u, v in
               zip(a.get_weights(), b.get_weights(), strict=True))


def assert_same_weights(got: keras.Model, want: keras.Model, what: str = "") -> None:
    for u, v, w in zip(got.get_weights(), want.get_weights(), got.weights, strict=True):
        np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6, err_msg=f"{what} {w.path}")


def assert_equal_on_every_rank(model: keras.Model) -> None:
    """Every rank holds rank 0's weights, bit for bit."""
    for w in model.get_weights():
        np.testing.assert_array_equal(hvd.broadcast(w, 0, name="k3.same").numpy(), w)
