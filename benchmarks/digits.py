"""The demo's digits harness: a CNN on scikit-learn's bundled digits, trained with stock Horovod
and hvd-overlap's strategies under horovodrun, side by side (``scripts/demo``, part 1).

    horovodrun -np 2 -H localhost:2 --gloo python benchmarks/digits.py --strategies layerwise

Each rank trains on its own shard of the training split. For every strategy named, a fresh model
(same seed) is trained; strategies are interleaved ``--repeats`` times so that a noisy machine
affects them alike. Rank 0 prints held-out accuracy and samples/s side by side.

``stock`` is stock Horovod itself (``hvd.DistributedOptimizer``). A process asked for ``stock``
alone never imports the plugin, so it is a clean baseline: ``scripts/demo`` launches it on its
own, interleaved with launches of the plugin's strategies, collects every launch's ``--json`` and
prints them side by side with ``--summarize FILE...`` (no Horovod needed for that). Run it as a
file, not as ``python -m benchmarks.digits``: the package ``benchmarks`` imports the plugin's
pure modules, which a stock launch must not. (The user's example is ``examples/quickstart.py``.)
On Keras 3, where Horovod's Keras optimizer averages nothing, ``stock`` is the plugin's
``horovod`` strategy standing in for it (``STAND_IN``; the table says so).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

STOCK = "stock"
#: Keras 3: what runs for ``stock`` (Horovod's own Keras optimizer averages nothing there)
STAND_IN = ("stand-in for stock: the plugin's `horovod` strategy (stock's fusion through the "
            "plugin; Horovod's own Keras optimizer averages no gradients on Keras 3)")


def keras_generation() -> int:
    """2 or 3: the Keras generation ``tf.keras`` is (without importing the plugin)."""
    package = sys.modules.get(tf.keras.__name__.split(".")[0])
    return 3 if str(getattr(package, "__version__", "2")).startswith("3") else 2


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
    broadcast = hvd.callbacks.BroadcastGlobalVariablesCallback
    if strategy == STOCK and keras_generation() == 2:
        opt = hvd.DistributedOptimizer(opt)
    else:  # the migration from stock Horovod is this one line (and the import)
        import hvd_overlap.keras

        # Keras 3: Horovod's optimizer and broadcast do not work; stock is the stand-in
        # (the plugin's copy of stock's fusion) and the broadcast is the plugin's
        name, extra = ("horovod", {}) if strategy == STOCK else (strategy, args.options)
        opt = hvd_overlap.keras.DistributedOptimizer(opt, strategy=name, **extra)
        broadcast = hvd_overlap.keras.BroadcastGlobalVariablesCallback
    model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    meter = Throughput(args.batch_size * hvd.size())
    callbacks = [broadcast(0), meter]
    model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, shuffle=True,
              callbacks=callbacks, verbose=0)
    _, acc = model.evaluate(x_te, y_te, verbose=0)
    return {"strategy": strategy, "accuracy": float(acc), "samples_per_sec": meter.samples_per_sec,
            "steps": int(opt.iterations.numpy()),
            "plan_buckets": len(opt.plan.buckets) if strategy != STOCK else None,
            "keras": keras_generation()}


def summarize(runs: list[dict], header: str) -> str:
    """Accuracy and samples/s per strategy (mean over repeats), and the ratio to ``stock``."""
    names = list(dict.fromkeys(r["strategy"] for r in runs))
    rows = []
    for s in names:
        mine = [r for r in runs if r["strategy"] == s]
        rows.append({"strategy": s, "runs": len(mine),
                     "accuracy": float(np.mean([r["accuracy"] for r in mine])),
                     "samples_per_sec": float(np.mean([r["samples_per_sec"] for r in mine])),
                     "steps": mine[0]["steps"], "buckets": mine[0]["plan_buckets"]})
    base = next((r["samples_per_sec"] for r in rows if r["strategy"] == STOCK), None)
    lines = [header, f"{'strategy':<10} {'runs':>4} {'accuracy':>8} {'samples/s':>10} "
             f"{'vs stock':>9} {'steps':>6} {'buckets':>7}"]
    for r in rows:
        ratio = r["samples_per_sec"] / base if base else float("nan")
        lines.append(f"{r['strategy']:<10} {r['runs']:>4} {r['accuracy']:>8.4f} "
                     f"{r['samples_per_sec']:>10.1f} {ratio:>8.3f}x {r['steps']:>6} "
                     f"{r['buckets'] if r['buckets'] is not None else '-':>7}")
    if any(r.get("keras") == 3 for r in runs):
        lines.append(f"vs stock: samples/s / those of the {STAND_IN}")
        return "\n".join(lines)
    lines.append("vs stock: samples/s / those of stock Horovod (hvd.DistributedOptimizer"
                 + (" in processes that never imported the plugin)" if all(
                     r.get("clean", True) for r in runs if r["strategy"] == STOCK)
                    else ", run in the same process as the plugin)"))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategies", default="stock,layerwise",
                   help="comma-separated: stock (hvd.DistributedOptimizer) and/or the plugin's")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.01, help="per rank; scaled by the rank count")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bucket-bytes", type=int, help="bucket budget of the plugin's strategies")
    p.add_argument("--json", help="rank 0 writes the runs here")
    p.add_argument("--summarize", nargs="+", metavar="JSON",
                   help="print the table of earlier runs' --json files and exit")
    args = p.parse_args()
    if args.summarize:
        runs = [r for path in args.summarize for r in json.load(open(path))["runs"]]
        print(summarize(runs, f"digits CNN, {runs[0]['ranks']} ranks, "
                              f"{runs[0]['batch_size']}/rank, {runs[0]['epochs']} epochs"))
        return
    args.options = {"bucket_bytes": args.bucket_bytes} if args.bucket_bytes else {}

    hvd.init()
    data = digits(hvd.rank(), hvd.size())
    strategies = [s for s in args.strategies.split(",") if s]
    runs = [train(s, args, data) for _ in range(args.repeats) for s in strategies]
    clean = "hvd_overlap" not in sys.modules
    for r in runs:
        r.update(ranks=hvd.size(), batch_size=args.batch_size, epochs=args.epochs, clean=clean)
    if hvd.rank() != 0:
        return
    print(summarize(runs, f"digits CNN, {hvd.size()} ranks, {args.batch_size}/rank, "
                          f"{args.epochs} epochs, {args.repeats} interleaved repeat(s)"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs}, f, indent=2)


if __name__ == "__main__":
    main()
