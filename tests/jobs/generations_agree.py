"""One rank of the Keras 2 / Keras 3 comparison (``tests/test_generations_agree.py``): train
every case below with the plugin on whatever Keras ``tf.keras`` is in this process
(``TF_USE_LEGACY_KERAS=1``: tf-keras; unset: Keras 3), from starting weights and data made
with numpy alone, so both generations start from the same numbers; save each case's final
weights as ``OUT/<case>.rank<R>.npz``.

Usage: ``horovodrun -np 2 ... python generations_agree.py OUT``
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

PER_RANK = 8    # rows per rank per step
STEPS = 6       # steps per epoch
EPOCHS = 2
FEATURES, CLASSES, VOCAB, TOKENS = 6, 3, 40, 5
STRATEGIES = ("horovod", "layerwise", "deferred", "hybrid", "sharded", "sharded_hybrid",
              "sharded+exchange=always+rows")
OPTIMIZERS = ("sgd_momentum", "adam")
MODELS = ("mlp", "embedding")


def cases() -> list[tuple[str, str, str]]:
    """Every (model, strategy, optimizer) compared. The embedding with SGD only: on its sparse
    gradients plain tf-keras's Adam and Keras 3's differ by themselves (one process, no
    Horovod, these data: 0.038 in the embedding after 12 steps), so no plugin could make
    those agree."""
    return [(m, s, o) for m in MODELS for s in STRATEGIES for o in OPTIMIZERS
            if m == "mlp" or o == "sgd_momentum"]


def case_name(model: str, strategy: str, optimizer: str) -> str:
    return f"{model}-{strategy}-{optimizer}"


def data(model: str, rank: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """This rank's rows (rank-interleaved rows of one global set)."""
    rng = np.random.default_rng(7)
    rows = PER_RANK * STEPS * size
    if model == "mlp":
        x = rng.normal(size=(rows, FEATURES)).astype("float32")
    else:
        x = rng.integers(0, VOCAB, size=(rows, TOKENS)).astype("int32")
    y = rng.integers(0, CLASSES, size=rows).astype("int32")
    return x[rank::size], y[rank::size]


def build(keras, model: str):
    if model == "mlp":
        layers = [keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu"),
                  keras.layers.Dense(CLASSES)]
    else:
        layers = [keras.Input((TOKENS,), dtype="int32"), keras.layers.Embedding(VOCAB, 8),
                  keras.layers.Flatten(), keras.layers.Dense(CLASSES)]
    net = keras.Sequential(layers)
    rng = np.random.default_rng(11)
    net.set_weights([rng.normal(scale=0.3, size=w.shape).astype("float32")
                     for w in net.get_weights()])
    return net


def optimizer(keras, name: str):
    if name == "sgd_momentum":
        return keras.optimizers.SGD(0.05, momentum=0.9)
    return keras.optimizers.Adam(0.01)


def main(out: Path) -> None:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    import hvd_overlap.keras as hvdo
    from hvd_overlap.adapters import keras_api

    hvd.init()
    keras = tf.keras
    for model_name, strategy, opt_name in cases():
        x, y = data(model_name, hvd.rank(), hvd.size())
        net = build(keras, model_name)
        extra = {"bucket_bytes": 256} if "hybrid" in strategy else {}  # so that it splits
        opt = hvdo.DistributedOptimizer(optimizer(keras, opt_name), strategy=strategy, **extra)
        net.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        net.fit(x, y, batch_size=PER_RANK, epochs=EPOCHS, shuffle=False, verbose=0,
                callbacks=[hvdo.OverlapCallback()])
        name = case_name(model_name, strategy, opt_name)
        np.savez(out / f"{name}.rank{hvd.rank()}.npz", *net.get_weights(),
                 iterations=int(net.optimizer.iterations.numpy()),
                 generation=keras_api.GENERATION)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
