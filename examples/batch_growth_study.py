"""Convergence study of run-time batch-size growth on scikit-learn's digits (no downloads).

Run on 2 ranks (``scripts/batch-study``; ``--quick`` is the short variant the tests run)::

    horovodrun -np 2 -H localhost:2 --gloo python examples/batch_growth_study.py --out docs

The task: digits (1347 training images sharded over the ranks, 450 held out), an MLP, SGD with
momentum, a fixed budget of epochs, and a large batch that is 16x the small one (512 of the
1347 samples per step). Every policy sees the same samples per epoch; they differ in how many
optimizer steps (= communication rounds) they take and how the learning rate follows the
batch. The plugin trains (``--strategy hybrid`` by default, with ``OverlapCallback``; its
weights equal stock Horovod's, see the tests), so a round is one exchange of the gradients.

Policies (global batches, LR coupled to the batch relative to the small one, ``lr`` at 32):

- ``small``: fixed small batch, ``lr``;
- ``large``: fixed 16x batch, linear LR (16 ``lr``) after Goyal et al.'s 5-epoch warm-up;
  ``large-sqrt``: the same with the gentler square-root coupling (4 ``lr``);
- ``growth`` (the project's recommended policy): double every 3 epochs up to the large batch,
  linear LR, a 50-step linear warm-up after each growth;
- ``adabatch``: double every 3 epochs with the LR doubled at once (AdaBatch keeps LR/batch
  equal to its baseline's; the small baseline here has no decay);
- ``smith``: double every 3 epochs at a constant LR (Smith et al.: grow the batch instead of
  decaying the LR);
- ``growth-sqrt``: ``growth`` with square-root coupling;
- the sweep around ``growth``: ``growth-w<W>`` (warm-up steps; ``adabatch`` is ``w0``) and
  ``growth-e<E>`` (period).

Rank 0 writes ``batch_growth_study.md`` (tables) and ``batch_growth.png`` (accuracy vs epoch
and vs communication rounds, batch vs epoch) into ``--out``, and ``batch_growth.json`` (every
run's per-epoch accuracy, batch, LR and rounds) to ``--json``: by default beside them, or, with
the default ``--out docs``, into the repository's results folder
(``benchmarks/results/batch_growth/``). ``--from-json`` redraws the report from a
``batch_growth.json`` without training.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hvd_overlap.keras as hvdo
from hvd_overlap.growth.callback import BatchSizeScheduler
from hvd_overlap.growth.data import fit_with_growth
from hvd_overlap.growth.policy import BatchGrowth, Periodic

hvd.init()
_gpus = tf.config.list_physical_devices("GPU")
if _gpus:  # one GPU per rank, as with Horovod
    tf.config.experimental.set_memory_growth(_gpus[hvd.local_rank()], True)
    tf.config.set_visible_devices(_gpus[hvd.local_rank()], "GPU")

POLICIES = ["small", "large", "large-sqrt", "growth", "adabatch", "smith", "growth-sqrt"]
SWEEP = ["growth-w20", "growth-w100", "growth-e2", "growth-e4"]  # w0 is adabatch
GOYAL_WARMUP_EPOCHS = 5
ROOT = Path(__file__).resolve().parent.parent
#: where the raw results of the docs' report (``--out docs``) go
RESULTS = ROOT / "benchmarks" / "results" / "batch_growth" / "batch_growth.json"


def load(seed: int = 0):
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    return train_test_split(x, y.astype("int64"), test_size=0.25, stratify=y, random_state=seed)


def make_model(seed: int) -> tf.keras.Model:
    tf.keras.utils.set_random_seed(seed)
    L = tf.keras.layers
    return tf.keras.Sequential([L.Dense(128, activation="relu", input_shape=(64,)),
                                L.Dense(64, activation="relu"), L.Dense(10)])


def growth_params(name: str, args: argparse.Namespace) -> tuple[str, int, int]:
    """``(lr_scaling, warmup_steps, every)`` of a growth-family config name."""
    if name == "adabatch":
        return "linear", 0, args.every
    if name == "smith":
        return "none", 0, args.every
    scaling, warmup, every = "linear", args.warmup, args.every
    for part in name.split("-")[1:]:
        if part[0] == "w" and part[1:].isdigit():
            warmup = int(part[1:])
        elif part[0] == "e" and part[1:].isdigit():
            every = int(part[1:])
        elif part in ("linear", "sqrt", "none"):
            scaling = part
        else:
            raise SystemExit(f"unknown config {name!r}: growth[-linear|-sqrt|-none][-wW][-eE]")
    return scaling, warmup, every


def policy(name: str, args: argparse.Namespace) -> BatchGrowth:
    small, large = args.small, args.small * args.factor
    common = dict(num_ranks=hvd.size(), base_lr=args.lr, initial_batch=small)
    if name == "small":
        return BatchGrowth(None, **common)
    if name in ("large", "large-sqrt"):
        scale = args.factor if name == "large" else args.factor ** 0.5
        warmup = GOYAL_WARMUP_EPOCHS * max(1, args.n_train // large)
        return BatchGrowth(None, num_ranks=hvd.size(), initial_batch=large,
                           base_lr=args.lr * scale, warmup_steps=warmup, start_lr=args.lr)
    if name in ("adabatch", "smith") or name.startswith("growth"):
        scaling, warmup, every = growth_params(name, args)
        return BatchGrowth(Periodic(every, factor=2), **common, lr_scaling=scaling,
                           warmup_steps=warmup, max_global_batch=large)
    raise SystemExit(f"unknown config {name!r}; known: {POLICIES + SWEEP}")


def wrap(opt: tf.keras.optimizers.Optimizer, strategy: str):
    if strategy == "stock":
        return hvd.DistributedOptimizer(opt), []
    return hvdo.DistributedOptimizer(opt, strategy=strategy), [hvdo.OverlapCallback()]


def run(name: str, seed: int, data, args: argparse.Namespace) -> dict:
    x_train, x_test, y_train, y_test = data
    tf.keras.backend.clear_session()
    model = make_model(seed)
    opt, extra = wrap(tf.keras.optimizers.SGD(args.lr, momentum=0.9), args.strategy)
    model.compile(optimizer=opt, metrics=["accuracy"],
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rounds: list[int] = []
    count = tf.keras.callbacks.LambdaCallback(
        on_epoch_end=lambda e, logs: rounds.append(int(opt.iterations.numpy())))
    start = time.perf_counter()
    h = fit_with_growth(model, x_train, y_train, scheduler=BatchSizeScheduler(policy(name, args)),
                        epochs=args.epochs, seed=seed, validation_data=(x_test, y_test),
                        verbose=0, validation_batch_size=len(x_test),
                        callbacks=[*extra, hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   count])
    return {"config": name, "seed": seed, "acc": h.history["val_accuracy"],
            "batch": h.history["batch_size"], "lr": h.history["lr"], "rounds_by_epoch": rounds,
            "rounds": rounds[-1], "seconds": time.perf_counter() - start}


def _describe(r0: dict) -> tuple[str, str]:
    batches = str(r0["batch"][0]) if r0["batch"][0] == r0["batch"][-1] else \
        " → ".join(str(b) for b in dict.fromkeys(r0["batch"]))
    lrs = f"{r0['lr'][-1]:.3g}" if r0["lr"][0] == r0["lr"][-1] else \
        f"{r0['lr'][0]:.3g} → {r0['lr'][-1]:.3g}"
    return batches, lrs


def _table(configs: list[str], by: dict, base_acc: float, base_rounds: float,
           names: dict[str, str] | None = None) -> list[str]:
    rows = ["| config | global batch | LR (end of epoch 1 → last) | test accuracy % (mean ± std) "
            "| Δ vs small (points) | communication rounds | fewer rounds than small "
            "| wall time per run (s) |",
            "|---|---|---|---|---|---|---|---|"]
    for c in configs:
        acc = np.array([r["acc"][-1] for r in by[c]]) * 100
        batches, lrs = _describe(by[c][0])
        rounds = np.mean([r["rounds"] for r in by[c]])
        seconds = np.mean([r["seconds"] for r in by[c]])
        rows.append(f"| {(names or {}).get(c, c)} | {batches} | {lrs} "
                    f"| {acc.mean():.2f} ± {acc.std():.2f} "
                    f"| {acc.mean() - base_acc:+.2f} | {rounds:.0f} "
                    f"| {base_rounds / rounds:.2f}x | {seconds:.1f} |")
    return rows


def raw_path(out: Path, json_path: str | None) -> Path:
    """Where the raw results go: ``--json``, else RESULTS for the docs, else OUT's."""
    if json_path:
        return Path(json_path)
    return RESULTS if out.resolve() == ROOT / "docs" else out / "batch_growth.json"


def report(results: list[dict], args: argparse.Namespace, out: Path, raw: Path) -> None:
    """Tables, raw results (to ``raw``) and plot of the runs (``args``: the study's
    settings)."""
    configs = list(dict.fromkeys(r["config"] for r in results))
    by = {c: [r for r in results if r["config"] == c] for c in configs}
    base_acc = np.mean([r["acc"][-1] for r in by["small"]]) * 100
    base_rounds = np.mean([r["rounds"] for r in by["small"]])
    main = [c for c in configs if c in POLICIES]
    sweep = [c for c in configs if c not in POLICIES or c in ("growth", "adabatch")]
    seeds = [r["seed"] for r in by["small"]]
    per_seed = ["| config | " + " | ".join(f"seed {s}" for s in seeds) + " |",
                "|---|" + "---|" * len(seeds)]
    for c in configs:
        per_seed.append(f"| {c} | " + " | ".join(f"{r['acc'][-1] * 100:.2f}" for r in by[c])
                        + " |")
    large = args.small * args.factor
    text = "\n".join([
        f"# Batch-size growth on digits ({args.ranks} ranks)", "",
        f"Generated by `scripts/batch-study` ({args.ranks} ranks, Gloo, CPU, strategy "
        f"`{args.strategy}`). Digits (scikit-learn), {args.n_train} training samples sharded "
        f"over the ranks, {args.n_test} held-out test samples; MLP 64-128-64-10, SGD momentum "
        f"0.9, {args.epochs} epochs, seeds {seeds}. Small global batch {args.small} (lr "
        f"{args.lr}); large {large}; growth doubles the batch every {args.every} epochs up to "
        f"{large} with a {args.warmup}-step linear LR warm-up after each growth; the fixed "
        f"large batch warms up over its first {GOYAL_WARMUP_EPOCHS} epochs from lr {args.lr}. "
        "Accuracy is the test accuracy after the last epoch; a communication round is one "
        "optimizer step (one exchange of the gradients). The LR column shows the LR at the end "
        "of the first and of the last epoch: a warm-up counted in steps may still be ramping "
        "at the end (the largest batch makes few steps per epoch).", "",
        "## Policies", "", *_table(main, by, base_acc, base_rounds), "",
        "## Sweep around `growth` (warm-up steps `w`, growth period in epochs `e`)", "",
        *_table(sweep, by, base_acc, base_rounds, {"adabatch": "adabatch (= growth-w0)"}),
        "",
        "## Final test accuracy (%) per seed", "", *per_seed, "",
        f"Training time of all runs: {sum(r['seconds'] for r in results):.0f} s.", "",
        f"Raw results: [{raw.name}]({Path(os.path.relpath(raw, out)).as_posix()}); "
        "`python examples/batch_growth_study.py --from-json "
        f"{Path(os.path.relpath(raw)).as_posix()} --out {Path(os.path.relpath(out)).as_posix()}`"
        " redraws this report and its plot from them without training.", "",
        "![accuracy vs epoch and vs communication rounds](batch_growth.png)", ""])
    (out / "batch_growth_study.md").write_text(text)
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text(json.dumps(
        {"args": {k: v for k, v in vars(args).items()
                  if k not in ("out", "from_json", "json_path")},
         "runs": results}, indent=1))
    plot(by, main, out / "batch_growth.png")


def plot(by: dict, configs: list[str], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(7, 10),
                                        gridspec_kw={"height_ratios": [3, 3, 2]})
    for c in configs:
        acc = np.array([r["acc"] for r in by[c]]) * 100
        epochs = np.arange(1, acc.shape[1] + 1)
        line, = ax1.plot(epochs, acc.mean(0), label=f"{c} ({acc[:, -1].mean():.1f} %)")
        ax1.fill_between(epochs, acc.min(0), acc.max(0), color=line.get_color(), alpha=0.15)
        ax2.plot(by[c][0]["rounds_by_epoch"], acc.mean(0), marker=".", color=line.get_color(),
                 label=c)
        ax3.step(epochs, by[c][0]["batch"], where="mid", color=line.get_color(), label=c)
    for ax in (ax1, ax2):
        ax.set_ylabel("test accuracy %")
        ax.set_ylim(85, 100)
        ax.grid(alpha=0.3)
    ax1.set_xlabel("epoch (mean; band: min-max over seeds; legend: final accuracy)")
    ax1.legend(loc="lower right", fontsize="small")
    ax2.set_xscale("log")
    ax2.set_xlabel("communication rounds (optimizer steps), log scale")
    ax3.set_yscale("log", base=2)
    ax3.set_ylabel("global batch")
    ax3.set_xlabel("epoch")
    ax3.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--epochs", type=int, default=24)
    ap.add_argument("--small", type=int, default=32, help="small global batch")
    ap.add_argument("--factor", type=int, default=16, help="large batch = small x factor")
    ap.add_argument("--lr", type=float, default=0.04, help="lr at the small batch")
    ap.add_argument("--every", type=int, default=3, help="growth period (epochs)")
    ap.add_argument("--warmup", type=int, default=50, help="warm-up steps after a growth")
    ap.add_argument("--strategy", default="hybrid",
                    help="plugin strategy, or 'stock' for hvd.DistributedOptimizer")
    ap.add_argument("--configs", nargs="+", default=POLICIES + SWEEP)
    ap.add_argument("--quick", action="store_true",
                    help="the tests' variant: 1 seed, 4 epochs, small/large/growth every epoch")
    ap.add_argument("--json", dest="json_path",
                    help="raw results (default: OUT/batch_growth.json; with --out docs, "
                         "benchmarks/results/batch_growth/batch_growth.json)")
    ap.add_argument("--from-json", help="redraw the report from a batch_growth.json (no runs)")
    args = ap.parse_args()
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        report(saved["runs"], argparse.Namespace(**saved["args"]), out,
               raw_path(out, args.json_path))
        print((out / "batch_growth_study.md").read_text())
        return
    args.ranks = hvd.size()
    if args.quick:
        args.seeds, args.epochs, args.every = [1], 4, 1
        args.configs = ["small", "large", "growth"]
    data = load()
    args.n_train, args.n_test = len(data[0]), len(data[1])
    results = []
    for seed in args.seeds:
        for name in args.configs:
            r = run(name, seed, data, args)
            results.append(r)
            if hvd.rank() == 0:
                print(json.dumps({k: r[k] for k in ("config", "seed", "rounds", "batch")}
                                 | {"acc": round(r["acc"][-1], 4),
                                    "seconds": round(r["seconds"], 1)}), flush=True)
    if hvd.rank() == 0 and "small" in args.configs:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        report(results, args, out, raw_path(out, args.json_path))
        print((out / "batch_growth_study.md").read_text())


if __name__ == "__main__":
    main()
