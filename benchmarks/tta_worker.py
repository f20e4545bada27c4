"""One rank of a time-to-accuracy run (``python -m benchmarks time-to-accuracy`` starts it on
every emulated host): digits, a wide MLP, SGD with momentum, the small batch or the growth
policy of the batch-growth study, stock Horovod or the plugin's ``strategy="auto"``.

    python -m benchmarks.tta_worker --config auto-growth --seed 1 --out run.json

Rank 0 writes, per epoch: the wall time since training began (tracing, ``auto``'s settling and
the validation included: what a user waits for), the test accuracy, the optimizer steps so far
(= communication rounds), the global batch and the median step; with the plugin, every plan it
chose. ``--config local-small`` times the compute-only step (each rank's plain optimizer, no
collective) at every per-rank batch of the growth schedule, its tracing and each epoch's time
outside the steps, and writes them instead (``probe``).

Stock runs never import the plugin's runtime (``hvd_overlap.keras``): they use only its growth
policy and data loop (``hvd_overlap.growth``), which stock Horovod lacks; the JSON records which
plugin modules the process loaded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

from benchmarks.tta_task import CONFIGS, LOCAL, WIDTH, load, schedule
from hvd_overlap.core.growth_time import parse_schedule
from hvd_overlap.growth.callback import BatchSizeScheduler
from hvd_overlap.growth.data import ShardedDataset, fit_with_growth
from hvd_overlap.growth.policy import BatchGrowth, Periodic


def make_model(seed: int, width: int = WIDTH) -> tf.keras.Model:
    tf.keras.utils.set_random_seed(seed)
    L = tf.keras.layers
    return tf.keras.Sequential([L.Dense(width, activation="relu", input_shape=(64,)),
                                L.Dense(width, activation="relu"), L.Dense(10)])


def make_policy(config: str, args: argparse.Namespace) -> BatchGrowth:
    """The study's small batch, or its recommended growth (x2 every ``every`` epochs up to
    ``factor`` times the small batch, linear LR, ``warmup`` steps of ramp after each growth)."""
    common = dict(num_ranks=hvd.size(), base_lr=args.lr, initial_batch=args.small)
    if config.endswith("-small"):
        return BatchGrowth(None, **common)
    return BatchGrowth(Periodic(args.every, factor=2), **common, lr_scaling="linear",
                       warmup_steps=args.warmup, max_global_batch=args.small * args.factor)


class Record(tf.keras.callbacks.Callback):
    """Per epoch: wall time since ``t0``, test accuracy, optimizer steps, batch, median step."""

    def __init__(self, t0: float):
        super().__init__()
        self.t0 = t0
        self.epochs: list[dict] = []
        self._steps: list[float] = []
        self.all_steps: list[float] = []  # every step's time, all epochs
        self._start = 0.0

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self._steps.append(time.perf_counter() - self._start)
        self.all_steps.append(self._steps[-1])

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        self.epochs.append({
            "epoch": epoch, "wall_s": time.perf_counter() - self.t0,
            "val_accuracy": float(logs.get("val_accuracy", float("nan"))),
            "rounds": int(self.model.optimizer.iterations.numpy()),
            "global_batch": int(logs.get("batch_size", 0)),
            "step_ms": 1e3 * statistics.median(self._steps) if self._steps else None})
        self._steps = []


def probe_batches(args: argparse.Namespace) -> list[int]:
    """The per-rank batches a growth run passes through (its ``schedule``), the small one
    first."""
    return [p.batch // hvd.size() for p in parse_schedule(schedule(vars(args)))]


def probe(args: argparse.Namespace) -> dict:
    """The compute-only step (the plain optimizer, no collective) at every per-rank batch of the
    growth schedule, in its order, as a growth run meets them: each batch's median steady step
    (``--probe-steps`` at the small batch, at least 20 at the others), its first step (the
    train function traced: at the start, again at the first new batch) and the time each epoch
    spends outside its steps (``fit``'s set-up, the validation; the median over the batch's
    epochs after its first)."""
    x_train, x_test, y_train, y_test = load()
    model = make_model(args.seed, args.width)
    model.compile(optimizer=tf.keras.optimizers.SGD(args.lr, momentum=0.9), metrics=["accuracy"],
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = ShardedDataset(x_train, y_train, seed=args.seed)
    epoch, batches = 0, {}
    for i, per_rank in enumerate(probe_batches(args)):
        rec = Record(time.perf_counter())
        outside: list[float] = []
        while len(rec.all_steps) < (args.probe_steps if i == 0 else 20):
            before, start = len(rec.all_steps), time.perf_counter()
            model.fit(data.for_epoch(epoch, per_rank), verbose=0, callbacks=[rec],
                      validation_data=(x_test, y_test))
            outside.append(time.perf_counter() - start - sum(rec.all_steps[before:]))
            epoch += 1
        times = rec.all_steps
        batches[per_rank] = {"compute_step_s": statistics.median(times[5:] or times[1:]),
                             "first_step_s": times[0], "steps": len(times),
                             "epoch_overhead_s": statistics.median(outside[1:] or outside)}
    first = next(iter(batches.values()))
    return {"compute_step_s": first["compute_step_s"], "steps": first["steps"],
            "batches": batches, "stock_traces": stock_traces(args, data, x_test, y_test),
            "grad_bytes": 4 * sum(int(np.prod(v.shape)) for v in model.trainable_variables)}


def stock_traces(args: argparse.Namespace, data: ShardedDataset, x_test, y_test) -> dict:
    """What stock Horovod's ``DistributedOptimizer`` costs besides its steps when it starts, in
    the run that the probe is: one epoch at the small batch, then one at twice it. ``first_s``:
    the first epoch's wall time less its steps at its median step and less a steady epoch's
    time outside the steps (the train function's trace, the first evaluation's, the first
    broadcast); ``again_s``: the first step at the new batch less that batch's median."""
    model = make_model(args.seed, args.width)
    model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(args.lr,
                                                                             momentum=0.9)),
                  metrics=["accuracy"],
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    small = args.small // hvd.size()
    walls, medians, recs = [], [], []
    broadcast = hvd.callbacks.BroadcastGlobalVariablesCallback(0)
    for epoch, per_rank in enumerate((small, small, 2 * small)):
        rec = Record(time.perf_counter())
        start = time.perf_counter()
        model.fit(data.for_epoch(epoch, per_rank), verbose=0, callbacks=[broadcast, rec],
                  validation_data=(x_test, y_test))
        walls.append(time.perf_counter() - start)
        medians.append(statistics.median(rec.all_steps[1:]))
        recs.append(rec.all_steps)
    steady_outside = walls[1] - sum(recs[1])
    return {"first_s": walls[0] - medians[0] * len(recs[0]) - steady_outside,
            "again_s": recs[2][0] - medians[2], "epoch_walls_s": walls}


def train(args: argparse.Namespace) -> dict:
    x_train, x_test, y_train, y_test = load()
    model = make_model(args.seed, args.width)
    opt = tf.keras.optimizers.SGD(args.lr, momentum=0.9)
    callbacks: list[tf.keras.callbacks.Callback] = []
    if args.config.startswith("stock"):
        opt = hvd.DistributedOptimizer(opt)
    else:
        import hvd_overlap.keras as hvdo

        opt = hvdo.DistributedOptimizer(opt, strategy="auto")
        callbacks.append(hvdo.OverlapCallback())
    model.compile(optimizer=opt, metrics=["accuracy"],
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    scheduler = BatchSizeScheduler(make_policy(args.config, args))
    t0 = time.perf_counter()
    record = Record(t0)
    fit_with_growth(model, x_train, y_train, scheduler=scheduler, epochs=args.epochs,
                    seed=args.seed, validation_data=(x_test, y_test),
                    callbacks=[*callbacks, hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               record])
    out = {"epochs": record.epochs, "total_s": time.perf_counter() - t0,
           "plugin_modules": sorted(m for m in sys.modules if m.startswith("hvd_overlap.keras"))}
    if not args.config.startswith("stock"):
        out["plan_choices"] = [{k: c[k] for k in ("why", "chosen", "steps", "seconds")}
                               for c in model.optimizer.plan_choices]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", choices=(*CONFIGS, LOCAL), required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=24)
    ap.add_argument("--small", type=int, default=32, help="the small global batch")
    ap.add_argument("--factor", type=int, default=16, help="growth cap: factor x small")
    ap.add_argument("--every", type=int, default=3, help="epochs between doublings")
    ap.add_argument("--warmup", type=int, default=50, help="LR ramp steps after each growth")
    ap.add_argument("--lr", type=float, default=0.04, help="the LR at the small batch")
    ap.add_argument("--probe-steps", type=int, default=60)
    ap.add_argument("--width", type=int, default=WIDTH, help="the hidden layers' width")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    hvd.init()
    result = probe(args) if args.config == LOCAL else train(args)
    if hvd.rank() == 0:
        Path(args.out).write_text(json.dumps({"config": vars(args), **result}, indent=1))


if __name__ == "__main__":
    main()
