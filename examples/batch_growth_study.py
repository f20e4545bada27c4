"""Convergence study of run-time batch-size growth on scikit-learn's digits (no downloads).

Run on 2 ranks (``scripts/batch-study``)::

    horovodrun -np 2 -H localhost:2 --gloo python examples/batch_growth_study.py --out docs

Each rank trains on its shard of the training split
(``hvd_overlap.growth.data.fit_with_growth``), with stock ``hvd.DistributedOptimizer`` (one
gradient allreduce per optimizer step, so communication rounds = optimizer steps). The held-out
test split is evaluated after every epoch.
Configurations (global batches; LR coupled to the batch relative to the small batch):

- ``small``: fixed small batch;
- ``large``: fixed batch ``factor`` times larger, linearly scaled LR (Goyal et al.);
  ``large-none``: the same batch with the small batch's LR;
- ``growth-<scaling>``: small batch doubled every ``--every`` epochs up to the large one, with
  ``linear``, ``sqrt`` or ``none`` LR scaling and a short linear warm-up after each growth.

Rank 0 writes ``batch_growth.md`` (table) and ``batch_growth.png`` (accuracy and batch size vs
epoch) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from hvd_overlap.growth.callback import BatchSizeScheduler
from hvd_overlap.growth.data import fit_with_growth
from hvd_overlap.growth.policy import BatchGrowth, Periodic

hvd.init()


def load(seed: int = 0):
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    return train_test_split(x, y.astype("int64"), test_size=0.25, stratify=y, random_state=seed)


def make_model(seed: int) -> tf.keras.Model:
    tf.keras.utils.set_random_seed(seed)
    L = tf.keras.layers
    return tf.keras.Sequential([L.Dense(128, activation="relu", input_shape=(64,)),
                                L.Dense(64, activation="relu"), L.Dense(10)])


def policy(name: str, args: argparse.Namespace) -> BatchGrowth:
    small, large = args.small, args.small * args.factor
    common = dict(num_ranks=hvd.size(), base_lr=args.lr, initial_batch=small)
    if name == "small":
        return BatchGrowth(None, **common)
    if name.startswith("large"):  # "large": linearly scaled lr, "large-none": small's lr
        lr = args.lr if name == "large-none" else args.lr * args.factor
        return BatchGrowth(None, **common | dict(initial_batch=large, base_lr=lr))
    scaling = name.split("-", 1)[1]
    return BatchGrowth(Periodic(args.every, factor=2), **common, lr_scaling=scaling,
                       warmup_steps=args.warmup, max_global_batch=large)


def run(name: str, seed: int, data, args: argparse.Namespace) -> dict:
    x_train, x_test, y_train, y_test = data
    tf.keras.backend.clear_session()
    model = make_model(seed)
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(args.lr, momentum=0.9))
    model.compile(optimizer=opt, metrics=["accuracy"],
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    sched = BatchSizeScheduler(policy(name, args))
    start = time.perf_counter()
    h = fit_with_growth(model, x_train, y_train, scheduler=sched, epochs=args.epochs,
                        seed=seed, validation_data=(x_test, y_test), verbose=0,
                        validation_batch_size=len(x_test),
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    return {"config": name, "seed": seed, "acc": h.history["val_accuracy"],
            "batch": h.history["batch_size"], "lr": h.history["lr"],
            "rounds": int(opt.iterations.numpy()), "seconds": time.perf_counter() - start}


def report(results: list[dict], args: argparse.Namespace, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = list(dict.fromkeys(r["config"] for r in results))
    by = {c: [r for r in results if r["config"] == c] for c in configs}
    final = {c: np.array([r["acc"][-1] for r in rs]) * 100 for c, rs in by.items()}
    half = args.epochs // 2
    mid = {c: np.array([r["acc"][half - 1] for r in rs]) * 100 for c, rs in by.items()}
    base_acc, base_rounds = final["small"].mean(), by["small"][0]["rounds"]
    rows = ["| config | global batch | LR | test accuracy % (mean ± std) | Δ vs small (points) "
            "| communication rounds | fewer rounds than small "
            f"| test accuracy % after epoch {half} |",
            "|---|---|---|---|---|---|---|---|"]
    for c in configs:
        r0 = by[c][0]
        batches = f"{r0['batch'][0]}" if r0["batch"][0] == r0["batch"][-1] else \
            " → ".join(str(b) for b in dict.fromkeys(r0["batch"]))
        lrs = f"{r0['lr'][0]:.3g}" if r0["lr"][0] == r0["lr"][-1] else \
            f"{r0['lr'][0]:.3g} → {r0['lr'][-1]:.3g}"
        rounds = sorted({r["rounds"] for r in by[c]})
        rounds_s = "/".join(str(v) for v in rounds)
        rows.append(f"| {c} | {batches} | {lrs} | {final[c].mean():.2f} ± {final[c].std():.2f} "
                    f"| {final[c].mean() - base_acc:+.2f} | {rounds_s} "
                    f"| {base_rounds / np.mean(rounds):.2f}x "
                    f"| {mid[c].mean():.2f} ± {mid[c].std():.2f} |")
    per_seed = ["| config | " + " | ".join(f"seed {r['seed']}" for r in by["small"]) + " |",
                "|---|" + "---|" * len(by["small"])]
    for c in configs:
        per_seed.append(f"| {c} | " + " | ".join(f"{a:.2f}" for a in final[c]) + " |")
    seconds = sum(r["seconds"] for r in results)
    text = "\n".join([
        "# Batch-size growth on digits (2 ranks)", "",
        f"Generated by `scripts/batch-study` ({hvd.size()} ranks, Gloo, CPU). Digits "
        f"(scikit-learn), {args.n_train} training samples sharded over the ranks, "
        f"{args.n_test} held-out test samples; MLP 64-128-64-10, SGD momentum 0.9, "
        f"{args.epochs} epochs, seeds {args.seeds}. Small global batch {args.small} "
        f"(lr {args.lr}); large {args.small * args.factor}; growth doubles the batch every "
        f"{args.every} epochs up to the large batch, with a {args.warmup}-step linear LR "
        "warm-up after each growth. Accuracy is the test accuracy after the last epoch; a "
        "communication round is one optimizer step (one gradient allreduce).", "",
        *rows, "", "Final test accuracy (%) per seed:", "", *per_seed, "",
        f"Training time of all runs: {seconds:.0f} s.", "",
        "![accuracy and batch size vs epoch](batch_growth.png)", ""])
    (out / "batch_growth.md").write_text(text)

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 7), sharex=True,
                                   gridspec_kw={"height_ratios": [3, 2]})
    for c in configs:
        acc = np.array([r["acc"] for r in by[c]]) * 100
        epochs = np.arange(1, acc.shape[1] + 1)
        line, = ax1.plot(epochs, acc.mean(0), label=c)
        ax1.fill_between(epochs, acc.min(0), acc.max(0), color=line.get_color(), alpha=0.15)
        ax2.step(epochs, by[c][0]["batch"], where="mid", color=line.get_color(), label=c)
    ax1.set_ylabel("test accuracy % (mean, min-max over seeds)")
    ax1.set_ylim(max(80.0, ax1.get_ylim()[0]), 100)
    ax1.legend(loc="lower right")
    ax1.grid(alpha=0.3)
    ax2.set_yscale("log", base=2)
    ax2.set_ylabel("global batch")
    ax2.set_xlabel("epoch")
    ax2.grid(alpha=0.3)
    ax2.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(out / "batch_growth.png", dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--epochs", type=int, default=24)
    ap.add_argument("--small", type=int, default=32, help="small global batch")
    ap.add_argument("--factor", type=int, default=8, help="large batch = small x factor")
    ap.add_argument("--lr", type=float, default=0.04, help="lr at the small batch")
    ap.add_argument("--every", type=int, default=3, help="growth period (epochs)")
    ap.add_argument("--warmup", type=int, default=20, help="warm-up steps after a growth")
    ap.add_argument("--configs", nargs="+",
                    default=["small", "large", "large-none", "growth-linear", "growth-sqrt",
                             "growth-none"])
    args = ap.parse_args()
    data = load()
    args.n_train, args.n_test = len(data[0]), len(data[1])
    results = []
    for seed in args.seeds:
        for name in args.configs:
            r = run(name, seed, data, args)
            results.append(r)
            if hvd.rank() == 0:
                print(json.dumps({k: r[k] for k in ("config", "seed", "rounds", "seconds")}
                                 | {"acc": round(r["acc"][-1], 4)}), flush=True)
    if hvd.rank() == 0 and "small" in args.configs:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        report(results, args, out)
        print((out / "batch_growth.md").read_text())


if __name__ == "__main__":
    main()
