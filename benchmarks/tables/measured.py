"""Tables of measured figures, each drawn from committed result files (bench JSON files,
calibrations, GPU timings, the batch-growth study, time-to-accuracy runs, the demo)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.tables.sources import ROOT

#: scripts/bench-results' runs, in its order
BENCH_RUNS = tuple(f"benchmarks/results/bench/{n}.json" for n in (
    "cnn_plain_b32", "vgg_plain_b32", "vgg_10gbit_hosts_b32", "vgg_1gbit_hosts_b32",
    "vgg_1gbit_hosts_b64", "vgg_500mbit_hosts_b32", "resnet20_1gbit_hosts_b32",
    "mlp_1gbit_hosts_b64", "vgg_1gbit_loopback_b32"))
_EXCHANGE = ("mlp_1gbit_hosts_b64", "mlp_1gbit_loopback_b64", "vgg_1gbit_hosts_b32",
             "vgg_1gbit_loopback_b32", "vgg_400mbit_hosts_b32", "resnet20_1gbit_hosts_b32")
#: scripts/exchange-bench's runs with every way of the exchange's forward (SUFFIX=_s25)
EXCHANGE_RUNS = tuple(f"benchmarks/results/exchange/{n}_s25.json" for n in _EXCHANGE)
#: the runs made before exchange_forward existed: the gather only
GATHER_RUNS = tuple(f"benchmarks/results/exchange/{n}.json" for n in _EXCHANGE)
#: docs/exchange_bench.md's runs, in its order
EXCHANGE_BENCH_RUNS = (*EXCHANGE_RUNS, "benchmarks/results/exchange/mlp_1gbit_hosts_b64_rows.json",
                       *GATHER_RUNS)
#: scripts/auto-bench's runs, in its order (docs/auto_bench.md)
AUTO_RUNS = tuple(f"benchmarks/results/auto/{model}_{net}_b{batch}.json"
                  for net in ("1gbit", "10gbit", "plain") for model in ("mlp", "vgg", "resnet20")
                  for batch in (32, 64))
DEMO = "benchmarks/results/demo/2026-12-07.json"
DEMO_OUTPUT = "benchmarks/results/demo/2026-12-07.txt"
CALIBRATION_2 = "benchmarks/profiles/overheads-gloo-2rank.json"
CALIBRATION_2TO4 = "benchmarks/profiles/overheads-gloo-2to4ranks.json"
GPU_RUNS = ("benchmarks/results/gpu_profiles/run1", "benchmarks/results/gpu_profiles/run2")
GPU_MODELS = (("vgg16", "fp32", "vgg16-h200 (b32)"), ("vgg16", "amp", "vgg16-h200-amp"),
              ("resnet50", "fp32", "resnet50-h200 (b64)"), ("resnet50", "amp", "resnet50-h200-amp"),
              ("resnet101", "fp32", "resnet101-h200 (b64)"),
              ("resnet101", "amp", "resnet101-h200-amp"))
GPU_SOURCES = tuple(f"{run}/{model}-{precision}.json" for run in GPU_RUNS
                    for model, precision, _ in GPU_MODELS)
STUDY = "benchmarks/results/batch_growth/batch_growth.json"
TTA_1024 = "benchmarks/results/time_to_accuracy/time_to_accuracy.json"
TTA_2048 = "benchmarks/results/time_to_accuracy/width_2048/time_to_accuracy.json"
FOUR_RANKS = ("mlp_b256_R0.5", "mlp_b64_R2.5", "resnet20_b32_R0.5", "resnet20_b32_R2.5",
              "vgg_b32_R0.5", "vgg_b32_R2.5")
FOUR_RANK_PAIRS = tuple(p for n in FOUR_RANKS for p in (
    f"benchmarks/results/four_ranks/predictions/{n}.json",
    f"benchmarks/results/four_ranks/bench/{n}.json"))


def _load(path: str | Path) -> Any:
    return json.loads((ROOT / path).read_text())


def _runs(paths: Sequence[str]) -> list[dict[str, Any]]:
    return [_load(p) for p in paths]


def _x(ratio: float | None, bold: bool = False) -> str:
    if ratio is None:
        return "-"
    return f"**{ratio:.2f}x**" if bold else f"{ratio:.2f}x"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.0f}"


def _net(config: dict[str, Any]) -> str:
    from benchmarks import report

    return report.net_label(config)


# --- the demo ---------------------------------------------------------------------------------

def demo() -> str:
    """``scripts/demo``'s second part: VGG at two regimes, stock against ``auto``."""
    d = _load(DEMO)
    lines = ["| regime R: asked (achieved) | stock ms | A/A: stock#2 | `auto` | compute-only "
             "bound | `auto`'s pick |", "|---|---|---|---|---|---|"]
    for r in d["regimes"]:
        stock = r.get("stock_ms")
        ratio = r.get("auto_vs_stock") or (stock / r["auto_ms"] if stock and r.get("auto_ms")
                                            else None)
        aa = stock / r["stock2_ms"] if stock and r.get("stock2_ms") else None
        bound = stock / r["local_ms"] if stock and r.get("local_ms") else None
        achieved = "not recorded" if r.get("achieved") is None else f"{r['achieved']:.2f}"
        lines.append(f"| {r['asked']:g} ({achieved}) | {stock or 'not recorded'} | "
                     f"{_x(aa) if aa else 'not recorded'} | "
                     f"{_x(ratio, bold=ratio is not None and ratio > 1.1)} | "
                     f"{_x(bound) if bound else 'not recorded'} | {r['pick']} |")
    return "\n".join(lines)


def demo_output() -> str:
    """The digits part of a demo's printed output, as the demo prints it."""
    text = (ROOT / DEMO_OUTPUT).read_text().splitlines()
    start = next(i for i, line in enumerate(text) if line.startswith("digits CNN"))
    return "```\n" + "\n".join(text[start:start + 5]) + "\n```"


# --- the bench --------------------------------------------------------------------------------

def bench() -> str:
    """Every strategy's ratio to real stock Horovod, one row per bench run."""
    from benchmarks.results import ratio_table

    return ratio_table(_runs(BENCH_RUNS)).rstrip("\n")


def _link_mib(m: dict[str, Any]) -> str:
    link = m.get("link_bytes_per_rank")
    return "-" if link is None else f"{link / 2**20:.1f}"


def _sent_mib(m: dict[str, Any]) -> str:
    sent = (m.get("sent_bytes_per_rank") or {}).get("all")
    return "-" if not sent else f"{sent / 2**20:.1f}"


def _exchange_rows(paths: Sequence[str], names: Sequence[str]) -> list[tuple]:
    rows = []
    for run in _runs(paths):
        s, c = run["strategies"], run["raw"]["config"]
        base = s["sharded"]["step_time_s"]
        cells = {n: (s[n]["ratio_to_stock"], base / s[n]["step_time_s"]) for n in names if n in s}
        best = max(r for r, _ in cells.values())
        rows.append((c, s, cells, best))
    return rows


def exchange() -> str:
    """The dense factor exchange against stock and plain ``sharded``, every way of its
    forward (``scripts/exchange-bench``, ``SUFFIX=_s25``)."""
    names = ("sharded+exchange+gather", "sharded+exchange+rows", "sharded+exchange",
             "sharded_hybrid+exchange")
    lines = ["| model | network | batch/rank | local ms | stock ms | sharded | +exchange+gather | "
             "+exchange+rows | sharded+exchange | sharded_hybrid+exchange | link MiB: stock, "
             "gather, rows |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c, s, cells, best in _exchange_rows(EXCHANGE_RUNS, names):
        exchanged = s["sharded+exchange+rows"].get("link_bytes_per_rank", 0) < \
            0.9 * s["sharded"].get("link_bytes_per_rank", 0)
        link = (", ".join(_link_mib(s[n]) for n in ("stock", "sharded+exchange+gather",
                                                    "sharded+exchange+rows"))
                if exchanged else "(no dense layer exchanged)")
        lines.append(
            f"| {c['model']} | {_net(c)} | {c['batch_size']} | {_ms(s['local']['step_time_s'])} "
            f"| {_ms(s['stock']['step_time_s'])} | {_x(s['sharded']['ratio_to_stock'])} | "
            + " | ".join(f"{_x(r, r == best and r > 1.05)} ({v:.2f}x)"
                         for r, v in (cells[n] for n in names)) + f" | {link} |")
    return "\n".join(lines)


def exchange_gather() -> str:
    """The runs with the gather only (before ``exchange_forward`` existed)."""
    names = ("sharded+exchange", "sharded_hybrid+exchange")
    lines = ["| model | network | batch/rank | local ms | stock ms | sharded | sharded+exchange "
             "(vs sharded) | sharded_hybrid+exchange (vs sharded) | sent MiB: sharded, "
             "+exchange |", "|---|---|---|---|---|---|---|---|---|"]
    for c, s, cells, best in _exchange_rows(GATHER_RUNS, names):
        lines.append(
            f"| {c['model']} | {_net(c)} | {c['batch_size']} | {_ms(s['local']['step_time_s'])} "
            f"| {_ms(s['stock']['step_time_s'])} | {_x(s['sharded']['ratio_to_stock'])} | "
            + " | ".join("-" if n not in cells else
                         f"{_x(cells[n][0], cells[n][0] == best and best > 1.05)} "
                         f"({cells[n][1]:.2f}x)" for n in names)
            + f" | {_sent_mib(s['sharded'])}, {_sent_mib(s['sharded+exchange'])} |")
    return "\n".join(lines)


# --- calibrations -----------------------------------------------------------------------------

def calibration_2rank() -> str:
    """The per-collective costs the 2-rank validation uses, per network (one Gloo rank per
    core): rates in MB/s per rank, ring terms."""
    d = _load(CALIBRATION_2)
    lines = ["| network | negotiation ms | per tensor us | allreduce MB/s | reduce-scatter MB/s | "
             "all-gather MB/s | alltoall (as a gather) MB/s | cpu steal | comm slowdown |",
             "|---|---|---|---|---|---|---|---|---|"]
    for net, v in d["nets"].items():
        f = v["fit"]
        lines.append(
            f"| {net} | {f['overhead_s'] * 1e3:.2f} | {f['tensor_s'] * 1e6:.0f} | "
            f"{f['bandwidth'] / 1e6:.0f} | {f['reduce_scatter_bandwidth'] / 1e6:.0f} | "
            f"{f['allgather_bandwidth'] / 1e6:.0f} | {f['alltoall_gather_bandwidth'] / 1e6:.0f} | "
            f"{f['cpu_steal']:.2f} | {f['comm_slowdown']:.2f} |")
    return "\n".join(lines)


def calibration_2to4() -> str:
    """The 2-4-rank calibration: negotiation, per-tensor cost, and each collective's rate as
    a share of the link (MB/s on the unshaped loopback)."""
    d = _load(CALIBRATION_2TO4)
    kinds = ("bandwidth", "reduce_scatter_bandwidth", "allgather_bandwidth",
             "alltoall_gather_bandwidth")
    lines = ["| network | ranks | negotiation ms | per tensor us | allreduce | reduce-scatter | "
             "all-gather | alltoall | cpu steal |", "|---|---|---|---|---|---|---|---|---|"]
    for net, v in d["nets"].items():
        rate = v["laws"].get("rate")
        fits = {2: v["fit"], **{int(k): r["fit"] for k, r in v.get("ranks", {}).items()}}
        for ranks, f in sorted(fits.items()):
            rates = [f"{f[k] / rate:.2f}" if rate else f"{f[k] / 1e6:.0f} MB/s" for k in kinds]
            lines.append(f"| {net} | {ranks} | {f['overhead_s'] * 1e3:.2f} | "
                         f"{f['tensor_s'] * 1e6:.0f} | " + " | ".join(rates)
                         + f" | {f['cpu_steal']:.2f} |")
    return "\n".join(lines)


# --- GPU profiles -----------------------------------------------------------------------------

def gpu_profiles() -> str:
    """Whole steps measured on the H200 (two runs), the update, and the layers timed alone
    against the whole step (run 2, the one shipped)."""
    lines = ["| profile | step ms (run 1 / run 2) | update ms | layers alone / whole step |",
             "|---|---|---|---|"]
    for model, precision, label in GPU_MODELS:
        one, two = (_load(f"{run}/{model}-{precision}.json") for run in GPU_RUNS)
        alone = sum(layer["forward_s"] + layer["backward_s"] for layer in two["layers"])
        lines.append(f"| {label} | {one['whole_step_s'] * 1e3:.2f} / "
                     f"{two['whole_step_s'] * 1e3:.2f} | {two['update_s'] * 1e3:.2f} | "
                     f"{alone / two['whole_step_s']:.2f} |")
    return "\n".join(lines)


# --- validation -------------------------------------------------------------------------------

def four_rank() -> str:
    """Predicted before measured at 4 ranks (``check-predictions`` over the pairs)."""
    from benchmarks import prediction as pred

    rows = []
    for p, b in zip(FOUR_RANK_PAIRS[::2], FOUR_RANK_PAIRS[1::2], strict=True):
        rows += pred.check(_load(p), _load(b))
    return pred.markdown(rows).rstrip("\n")


# --- batch growth -----------------------------------------------------------------------------

POLICY_LABELS = {
    "small": "small",
    "large": "large, linear LR + 5-epoch warm-up (Goyal)",
    "large-sqrt": "large, sqrt LR + warm-up",
    "growth": "**growth** (recommended: x2 every 3 epochs, linear LR, 50-step warm-up after "
              "each growth)",
    "adabatch": "AdaBatch-style (x2 every 3 epochs, LR x2 at once)",
    "smith": "Smith et al. (x2 every 3 epochs, constant LR)",
    "growth-sqrt": "growth, sqrt LR",
}


def _study() -> tuple[dict[str, list[dict]], float, float]:
    runs = _load(STUDY)["runs"]
    by: dict[str, list[dict]] = {}
    for r in runs:
        by.setdefault(r["config"], []).append(r)
    base_acc = statistics.fmean(r["acc"][-1] for r in by["small"]) * 100
    base_rounds = statistics.fmean(r["rounds"] for r in by["small"])
    return by, base_acc, base_rounds


def _acc(rs: list[dict]) -> tuple[float, float]:
    acc = [r["acc"][-1] * 100 for r in rs]
    return statistics.fmean(acc), statistics.pstdev(acc)


def growth_policies() -> str:
    """The study's policies: final test accuracy (mean ± sd over seeds), against the small
    batch, and the communication rounds."""
    by, base_acc, base_rounds = _study()
    lines = ["| policy | global batch | LR | test accuracy % | Δ vs small | communication "
             "rounds |", "|---|---|---|---|---|---|"]
    for config, label in POLICY_LABELS.items():
        rs = by[config]
        first, last = rs[0]["batch"][0], rs[0]["batch"][-1]
        lrs = rs[0]["lr"]
        mean, sd = _acc(rs)
        rounds = statistics.fmean(r["rounds"] for r in rs)
        fewer = "" if config == "small" or rounds >= base_rounds else \
            f" ({base_rounds / rounds:.1f}x fewer)"
        lines.append(
            f"| {label} | {first if first == last else f'{first} → {last}'} | "
            f"{lrs[0]:.3g}{'' if lrs[0] == lrs[-1] else f' → {lrs[-1]:.3g}'} | "
            f"{mean:.2f} ± {sd:.2f} | {'' if config == 'small' else f'{mean - base_acc:+.2f}'} "
            f"| {rounds:.0f}{fewer} |")
    return "\n".join(lines)


def growth_sweep() -> str:
    """Around the recommended policy: the warm-up after each growth, and the growth period."""
    by, base_acc, base_rounds = _study()

    def cell(config: str) -> str:
        mean, _ = _acc(by[config])
        rounds = statistics.fmean(r["rounds"] for r in by[config])
        return f"{mean - base_acc:+.2f}, {rounds:.0f} ({base_rounds / rounds:.1f}x fewer)"

    return "\n".join([
        "| sweep | | | recommended | |", "|---|---|---|---|---|",
        f"| warm-up steps after each growth | 0: {cell('adabatch')} | 20: {cell('growth-w20')} "
        f"| **50: {cell('growth')}** | 100: {cell('growth-w100')} |",
        f"| growth period (epochs) | 2: {cell('growth-e2')} | | **3: {cell('growth')}** | "
        f"4: {cell('growth-e4')} |",
        "", "Each cell: Δ test accuracy vs the small batch (points), communication rounds."])


def study_tables() -> list[str]:
    """The tables ``examples/batch_growth_study.py`` writes into docs/batch_growth_study.md
    (the page is that script's; this checks it holds these tables)."""
    by, base_acc, base_rounds = _study()
    policies = ("small", "large", "large-sqrt", "growth", "adabatch", "smith", "growth-sqrt")
    configs = list(by)
    sweep = [c for c in configs if c not in policies or c in ("growth", "adabatch")]

    def table(names: Sequence[str], rename: dict[str, str] | None = None) -> str:
        rows = ["| config | global batch | LR (end of epoch 1 → last) | test accuracy % (mean "
                "± std) | Δ vs small (points) | communication rounds | fewer rounds than "
                "small | wall time per run (s) |", "|---|---|---|---|---|---|---|---|"]
        for c in names:
            r0 = by[c][0]
            batches = str(r0["batch"][0]) if r0["batch"][0] == r0["batch"][-1] else \
                " → ".join(str(b) for b in dict.fromkeys(r0["batch"]))
            lrs = f"{r0['lr'][-1]:.3g}" if r0["lr"][0] == r0["lr"][-1] else \
                f"{r0['lr'][0]:.3g} → {r0['lr'][-1]:.3g}"
            mean, sd = _acc(by[c])
            rounds = statistics.fmean(r["rounds"] for r in by[c])
            seconds = statistics.fmean(r["seconds"] for r in by[c])
            rows.append(f"| {(rename or {}).get(c, c)} | {batches} | {lrs} | {mean:.2f} ± "
                        f"{sd:.2f} | {mean - base_acc:+.2f} | {rounds:.0f} | "
                        f"{base_rounds / rounds:.2f}x | {seconds:.1f} |")
        return "\n".join(rows)

    return [table([c for c in configs if c in policies]),
            table(sweep, {"adabatch": "adabatch (= growth-w0)"})]


# --- time to accuracy -------------------------------------------------------------------------

TTA_LABELS = {"stock-small": "stock, batch 32", "stock-growth": "stock, growth 32 → 512",
              "auto-small": "`auto`, batch 32", "auto-growth": "`auto`, growth 32 → 512"}


def _plans(row: dict[str, Any]) -> str:
    picks = {p for plan in row["plans"] for p in plan.split(" / ")}
    return "; ".join(sorted(picks)).replace("horovod (stock fusion)", "stock's fusion") or "-"


def time_to_accuracy(path: str, plans: bool = True) -> str:
    """Wall time to the target accuracy, stock against ``auto``, each with the small batch and
    with growth (3 seeds, mean ± sd)."""
    from benchmarks import time_to_accuracy as tta

    s = tta.summarize(_load(path))
    head = ["run", "time to target (s)", "vs stock, batch 32", "final accuracy %",
            "rounds to target", "whole run (s)"] + (["`auto`'s plans"] if plans else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    best = max(r["speedup"] for r in s["rows"].values())
    for config, row in s["rows"].items():
        t, sd = row["time_to_target_s"]
        acc, acc_sd = row["final_accuracy"]
        bold = row["speedup"] == best and best > 1.05
        cells = [TTA_LABELS.get(config, config),
                 f"**{t:.1f} ± {sd:.1f}**" if bold else f"{t:.1f} ± {sd:.1f}",
                 _x(row["speedup"], bold), f"{acc:.2f} ± {acc_sd:.2f}",
                 f"{row['rounds_to_target'][0]:.0f}", f"{row['total_s'][0]:.1f}",
                 *([_plans(row)] if plans else [])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def tta_steps(path: str = TTA_2048) -> str:
    """The median step per global batch, ``auto`` with growth against stock with growth."""
    d = _load(path)

    def steps(config: str) -> dict[int, float]:
        by: dict[int, list[float]] = {}
        for run in d["runs"][config]:
            for e in run["epochs"]:
                by.setdefault(e["global_batch"], []).append(e["step_ms"])
        return {b: statistics.median(v) for b, v in sorted(by.items())}

    auto, stock = steps("auto-growth"), steps("stock-growth")
    lines = ["| global batch | `auto` ms | stock ms | stock / `auto` |", "|---|---|---|---|"]
    for b in auto:
        ratio = stock[b] / auto[b]
        lines.append(f"| {b} | {auto[b]:.0f} | {stock[b]:.0f} | {_x(ratio, ratio < 0.9)} |")
    return "\n".join(lines)


TTA_1024_MD = "benchmarks/results/time_to_accuracy/time_to_accuracy.md"
TTA_2048_MD = "benchmarks/results/time_to_accuracy/width_2048/time_to_accuracy.md"


def result_table(path: str, index: int) -> str:
    """Table ``index`` (0 first) of a result page a lab command wrote beside its runs (the
    time-to-accuracy runs' prediction: the simulator's output when they were made, which the
    simulator of today would not reproduce)."""
    tables, current = [], []
    for line in (ROOT / path).read_text().splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append("\n".join(current))
            current = []
    if current:
        tables.append("\n".join(current))
    return tables[index]
