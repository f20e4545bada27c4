"""Train one epoch on 2 ranks and save, or resume that file for one more epoch on N ranks, with
a Keras 3 model: run by tests/test_keras3_resume.py under ``horovodrun``.

``keras3_resume.py train STRATEGY DIR``: 2 ranks, one epoch of ``STEPS`` steps, ``PER_RANK``
rows per rank a step; rank 0 saves ``DIR/model.keras`` and ``DIR/after_train.npz``.
``keras3_resume.py resume STRATEGY DIR N``: ``hvdo.load_model`` (the optimizer comes back
wrapped, with its state), one more epoch on the next ``STEPS`` global batches of N x
``PER_RANK`` rows; rank 0 writes the weights and the optimizer's iterations to
``DIR/resumed{N}.npz``. At every step the global batch is the ranks' batches concatenated in
rank order (``global_batches``), so a single process training on those batches is the
reference. Importing this file runs nothing: the test builds its reference from the same
``make_model``, ``make_optimizer`` and data.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

TRAIN_RANKS, PER_RANK, STEPS = 2, 8, 6
FEATURES, CLASSES = 12, 4
#: enough rows for the training epoch (2 ranks) and a resumed epoch on up to 4 ranks
POOL = STEPS * PER_RANK * (TRAIN_RANKS + 4)
#: small buckets, so each layer is its own bucket and ``hybrid`` defers some and not others
BUCKET_BYTES = 256


def dataset() -> tuple[np.ndarray, np.ndarray]:
    """One generated classification set; the rows are consumed in order, epoch after epoch."""
    rng = np.random.default_rng(11)
    y = rng.integers(0, CLASSES, POOL)
    x = rng.normal(size=(POOL, FEATURES)).astype("float32") + y[:, None].astype("float32") / 2
    return x, y.astype("int32")


def epoch_rows(phase: str, ranks: int) -> np.ndarray:
    """The pool's rows one epoch of ``phase`` uses, in global-batch order: ``STEPS`` batches of
    ``ranks`` x ``PER_RANK`` rows (``resume`` starts after the training epoch's rows)."""
    start = 0 if phase == "train" else STEPS * PER_RANK * TRAIN_RANKS
    return np.arange(start, start + STEPS * PER_RANK * ranks)


def rank_rows(phase: str, ranks: int, rank: int) -> np.ndarray:
    """The rows rank ``rank`` trains on, step after step: its ``PER_RANK`` slice of each global
    batch (the global batch of a step is every rank's batch of that step, in rank order)."""
    rows = epoch_rows(phase, ranks).reshape(STEPS, ranks, PER_RANK)
    return rows[:, rank, :].reshape(-1)


def make_model():
    """The seeded Dense 12 -> 16 -> 8 -> 4 model (logits), the same on every rank."""
    import keras

    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(CLASSES)])


def make_optimizer(strategy: str):
    """The plain Keras 3 optimizer each strategy is tested with: Adam for ``layerwise``,
    ``hybrid`` and ``sharded`` (its slices' moments saved whole, in plain Keras's layout); SGD
    with momentum and a decaying rate for ``deferred`` (the deferred update must use the rate
    of the step it belongs to)."""
    import keras

    if strategy == "deferred":
        rate = keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=2, decay_rate=0.7)
        return keras.optimizers.SGD(rate, momentum=0.9)
    return keras.optimizers.Adam(0.01)


def loss():
    """The loss (a mean over the batch, so averaged rank gradients equal the global one)."""
    import keras

    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def save_weights(model, path: Path, iterations: int | None = None) -> None:
    """``model``'s weights (and the optimizer's iterations, if given) as an ``.npz``."""
    extra = {} if iterations is None else {"iterations": np.int64(iterations)}
    np.savez(path, *[np.asarray(w) for w in model.get_weights()], **extra)


def main(argv: list[str]) -> None:
    """One rank of ``train`` or ``resume`` (see the module docstring)."""
    import horovod.tensorflow as hvd

    hvd.init()
    import hvd_overlap.keras as hvdo
    from hvd_overlap.keras.wrapper import DistributedMixin

    phase, strategy, out = argv[0], argv[1], Path(argv[2])
    size, rank = hvd.size(), hvd.rank()
    x, y = dataset()
    if phase == "train":
        assert size == TRAIN_RANKS, size
        model = make_model()
        opt = hvdo.DistributedOptimizer(make_optimizer(strategy), strategy=strategy,
                                        bucket_bytes=BUCKET_BYTES)
        model.compile(optimizer=opt, loss=loss())
        callbacks = [hvdo.BroadcastGlobalVariablesCallback(0), hvdo.OverlapCallback()]
    else:
        assert size == int(argv[3]), (size, argv[3])
        model = hvdo.load_model(str(out / "model.keras"), strategy=strategy,
                                bucket_bytes=BUCKET_BYTES)
        opt = model.optimizer
        assert isinstance(opt, DistributedMixin) and opt.strategy == strategy, type(opt).__mro__
        assert int(opt.iterations.numpy()) == STEPS, opt.iterations
        callbacks = [hvdo.OverlapCallback()]  # every rank loaded the same file
    mine = rank_rows(phase, size, rank)
    model.fit(x[mine], y[mine], batch_size=PER_RANK, epochs=1, shuffle=False, verbose=0,
              callbacks=callbacks)
    if rank == 0:
        print(f"plan: {opt.plan.describe()}", flush=True)
        if phase == "train":
            model.save(out / "model.keras")
            save_weights(model, out / "after_train.npz", int(opt.iterations.numpy()))
        else:
            save_weights(model, out / f"resumed{size}.npz", int(opt.iterations.numpy()))
    print(f"rank {rank} of {size}: {phase} {strategy} done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
