"""A CNN on scikit-learn's bundled digits, trained with Horovod + hvd-overlap under horovodrun.

    horovodrun -np 2 -H localhost:2 --gloo python examples/keras_digits.py

Each rank trains on its own shard of the training split. For every strategy named, a fresh model
(same seed) is trained; strategies are interleaved ``--repeats`` times so that a noisy machine
affects them alike. Rank 0 prints held-out accuracy and samples/s side by side.
"""

from __future__ import annotations

import argparse
import json
import time

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hvd_overlap.keras  # import before hvd.init(): it sets the Horovod environment it needs


def digits(rank: int, size: int):
    """Digits upsampled to 32x32 (so the CNN does real work), sharded by rank; test split whole."""
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32").reshape(-1, 8, 8, 1)
    x = np.repeat(np.repeat(x, 4, axis=1), 4, axis=2)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    n = len(x_tr) // size  # equal shards: every rank runs the same number of steps
    return (x_tr[rank * n:(rank + 1) * n], y_tr[rank * n:(rank + 1) * n]), (x_te, y_te)


def cnn() -> tf.keras.Model:
    L = tf.keras.layers
    return tf.keras.Sequential([
        L.Conv2D(32, 3, padding="same", input_shape=(32, 32, 1)), L.BatchNormalization(), L.ReLU(),
        L.Conv2D(32, 3, padding="same"), L.BatchNormalization(), L.ReLU(), L.MaxPool2D(),
        L.Conv2D(64, 3, padding="same"), L.BatchNormalization(), L.ReLU(), L.MaxPool2D(),
        L.Conv2D(128, 3, padding="same"), L.BatchNormalization(), L.ReLU(), L.MaxPool2D(),
        L.Flatten(), L.Dense(512, activation="relu"), L.Dropout(0.3), L.Dense(10),
    ])


class Throughput(tf.keras.callbacks.Callback):
    """Samples/s over all epochs but the first (tracing and warm-up excluded)."""

    def __init__(self, global_batch: int):
        super().__init__()
        self.global_batch, self.steps, self.seconds = global_batch, 0, 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._t0, self._steps0 = time.perf_counter(), 0

    def on_train_batch_end(self, batch, logs=None):
        self._steps0 = batch + 1

    def on_epoch_end(self, epoch, logs=None):
        if epoch > 0:
            self.seconds += time.perf_counter() - self._t0
            self.steps += self._steps0

    @property
    def samples_per_sec(self) -> float:
        return self.steps * self.global_batch / self.seconds if self.seconds else float("nan")


def train(strategy: str, args: argparse.Namespace, data) -> dict:
    (x, y), (x_te, y_te) = data
    tf.keras.utils.set_random_seed(args.seed)
    model = cnn()
    opt = tf.keras.optimizers.SGD(args.lr * hvd.size(), momentum=0.9)
    # The migration from stock Horovod is this one line:
    #   opt = hvd.DistributedOptimizer(opt)
    opt = hvd_overlap.keras.DistributedOptimizer(opt, strategy=strategy, **args.options)
    model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    meter = Throughput(args.batch_size * hvd.size())
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), meter]
    model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, shuffle=True,
              callbacks=callbacks, verbose=0)
    _, acc = model.evaluate(x_te, y_te, verbose=0)
    return {"strategy": strategy, "accuracy": float(acc), "samples_per_sec": meter.samples_per_sec,
            "steps": int(opt.iterations.numpy()), "plan_buckets": len(opt.plan.buckets)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategies", default="horovod,layerwise")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.01, help="per rank; scaled by the rank count")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bucket-bytes", type=int, help="bucket budget of the plugin's strategies")
    p.add_argument("--json", help="rank 0 writes the results here")
    args = p.parse_args()
    args.options = {"bucket_bytes": args.bucket_bytes} if args.bucket_bytes else {}

    hvd.init()
    data = digits(hvd.rank(), hvd.size())
    strategies = [s for s in args.strategies.split(",") if s]
    runs = [train(s, args, data) for _ in range(args.repeats) for s in strategies]
    if hvd.rank() != 0:
        return
    rows = []
    for s in strategies:
        mine = [r for r in runs if r["strategy"] == s]
        rows.append({"strategy": s, "accuracy": float(np.mean([r["accuracy"] for r in mine])),
                     "samples_per_sec": float(np.mean([r["samples_per_sec"] for r in mine])),
                     "steps": mine[0]["steps"], "buckets": mine[0]["plan_buckets"]})
    base = next((r["samples_per_sec"] for r in rows if r["strategy"] == "horovod"), None)
    print(f"\ndigits CNN, {hvd.size()} ranks, {args.batch_size}/rank, {args.epochs} epochs, "
          f"{args.repeats} interleaved repeat(s)")
    print(f"{'strategy':<10} {'accuracy':>8} {'samples/s':>10} {'vs horovod':>10} "
          f"{'steps':>6} {'buckets':>7}")
    for r in rows:
        r["ratio_to_horovod"] = r["samples_per_sec"] / base if base else float("nan")
        print(f"{r['strategy']:<10} {r['accuracy']:>8.4f} {r['samples_per_sec']:>10.1f} "
              f"{r['ratio_to_horovod']:>9.3f}x {r['steps']:>6} {r['buckets']:>7}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "summary": rows}, f, indent=2)


if __name__ == "__main__":
    main()
