"""What ``hvd-overlap simulate`` reads from its options and prints: rank counts, durations, the
cluster, tables and scaling plots."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hvd_overlap.core.growth_time import RunTimes
from hvd_overlap.core.simulate import Cluster, ExchangeChoice, StepResult
from hvd_overlap.tools.profile import parse_bandwidth

#: Horovod's negotiation per cycle and cost per tensor that ``simulate`` assumes unless told
#: (``--negotiation-ms``, ``--tensor-us``): measured once on 2 ranks over Gloo, plain loopback,
#: 0.1 ms cycle (the repository's calibration, ``cluster_defaults``), kept fixed so documented
#: predictions stay reproducible.
NEGOTIATION_S = 0.0006579150012839818
TENSOR_S = 0.0001063601269826962
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e-?\d+)?)\s*(s|ms|us|µs|ns)?\s*$", re.IGNORECASE)


def parse_duration(text: str | float) -> float:
    """``"10us"``, ``"0.5ms"``, ``"2s"`` or seconds as a number -> seconds."""
    if isinstance(text, int | float):
        return float(text)
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"duration {text!r}: write it like '10us', '0.5ms' or seconds")
    unit = (m.group(2) or "s").lower()
    return float(m.group(1)) * {"s": 1, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}[unit]


def parse_batch_compute(text: str) -> dict[int, float]:
    """``"16=5ms,64=11ms"`` -> {per-rank batch: compute-only step in seconds}."""
    out: dict[int, float] = {}
    for part in text.split(","):
        batch, _, duration = part.strip().partition("=")
        try:
            out[int(batch)] = parse_duration(duration)
        except ValueError:
            raise ValueError(f"--batch-compute {text!r}: write it as BATCH=DURATION,... "
                             "(per-rank batches), e.g. 16=5ms,64=11ms") from None
        if int(batch) < 1 or out[int(batch)] <= 0:
            raise ValueError(f"--batch-compute {text!r}: batches and durations above 0")
    return out


def parse_ranks(text: str) -> list[int]:
    """``"64"``, ``"2,8,64"`` or a power-of-two range ``"2-4096"`` -> rank counts."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = (int(x) for x in part.split("-", 1))
            p = lo
            while p <= hi:
                out.append(p)
                p *= 2
        elif part:
            out.append(int(part))
    if not out or min(out) < 1:
        raise ValueError(f"--np {text!r}: rank counts >= 1, like 64, 2,8,64 or 2-4096")
    return out


def cluster_from_options(ranks: int, bandwidth: str, latency: str,
                         calibrated: dict[str, Any] | None = None, **knobs: Any) -> Cluster:
    """A cluster from command-line strings; negotiation and per-tensor costs default to
    ``calibrated``'s (``calibrated_knobs``), else to ``NEGOTIATION_S`` and ``TENSOR_S`` grown
    by log2 (negotiation) and not at all (per tensor). Given knobs win."""
    knobs = {k: v for k, v in knobs.items() if v is not None}
    base: dict[str, Any] = dict(calibrated or {"negotiation_s": NEGOTIATION_S,
                                               "tensor_s": TENSOR_S})
    if "negotiation_s" in knobs or "tensor_s" in knobs:
        base.pop("measured_costs", None)  # a given cost replaces the measured ones
    base.update(knobs)
    return Cluster(ranks=ranks, **{"bandwidth": parse_bandwidth(bandwidth), **base},
                   latency=parse_duration(latency))


def calibrated_knobs(path: str | Path, net: str | None, bandwidth: str) -> tuple[str, dict]:
    """``Cluster`` fields from a calibration at several rank counts (``python -m benchmarks
    calibrate --np 2 --np 3 --np 4``, the same format for any cluster): the measured negotiation
    and per-tensor costs with their fitted growth laws, and each collective's rate as the share
    of the link measured at the largest calibrated rank count, applied to ``bandwidth``. Host
    effects (CPU steal) are left out: they belong to the machine that was calibrated. Returns
    the network's key and the fields."""
    import json

    from hvd_overlap.core.sim.laws import cluster_fields

    d = json.loads(Path(path).read_text())
    nets = {k: v for k, v in d.get("nets", {}).items() if "laws" in v}
    if not nets:
        raise ValueError(f"{path}: no network calibrated at several rank counts (calibrate "
                         "with --np 2 --np 3 --np 4)")
    if net is None and len(nets) > 1:
        raise ValueError(f"{path} has several networks: choose one with --calibration-net "
                         f"({', '.join(repr(k) for k in nets)})")
    key = net if net is not None else next(iter(nets))
    if key not in nets:
        raise ValueError(f"--calibration-net {key!r}: {path} has {', '.join(map(repr, nets))}")
    laws = nets[key]["laws"]
    fields = cluster_fields(laws, max(int(p) for p in laws["ranks"]), parse_bandwidth(bandwidth))
    for host in ("cpu_steal", "comm_slowdown"):
        fields.pop(host)
    return key, fields


def format_results(results: Sequence[StepResult]) -> str:
    """Fixed-width table: one row per (ranks, strategy): the step, the MiB one rank sends, and
    the ratio to stock Horovod."""
    base = {r.ranks: r.step_s for r in results if r.strategy == "horovod"}
    w = max([14] + [len(r.strategy) for r in results])
    lines = [f"{'ranks':>6} {'strategy':<{w}} {'step ms':>9} {'efficiency':>10} "
             f"{'exposed ms':>10} {'wire ms':>9} {'sent MiB':>9} {'ops':>5} {'vs horovod':>10}"]
    for r in results:
        ratio = f"{base[r.ranks] / r.step_s:.2f}x" if r.ranks in base else "-"
        lines.append(f"{r.ranks:>6} {r.strategy:<{w}} {r.step_s * 1e3:>9.1f} "
                     f"{r.efficiency:>10.3f} {r.exposed_s * 1e3:>10.1f} {r.wire_s * 1e3:>9.1f} "
                     f"{r.wire_bytes / 2**20:>9.1f} {r.collectives:>5} {ratio:>10}")
    return "\n".join(lines)


def format_exchange(choices: Sequence[ExchangeChoice]) -> str:
    """Fixed-width table: one row per (ranks, dense kernel), the MiB one rank sends per step
    with reduce-scatter + all-gather, with the exchange (its activations) and with the forward
    on the rows, and ``exchange="auto"``'s choice."""
    lines = [f"{'ranks':>6} {'layer':<14} {'kernel':>11} {'batch':>5} {'rs+ag MiB':>10} "
             f"{'exch MiB':>9} {'(activ.)':>9} {'rows MiB':>9}  choice"]
    for c in choices:
        kernel = f"{c.shape.n_in}x{c.shape.n_out}"
        lines.append(f"{c.ranks:>6} {c.layer:<14} {kernel:>11} {c.shape.batch:>5} "
                     f"{c.sharded_bytes / 2**20:>10.1f} {c.exchange_bytes / 2**20:>9.1f} "
                     f"{c.activation_bytes / 2**20:>9.1f} {c.rows_bytes / 2**20:>9.1f}  "
                     f"{c.way if c.exchanged else 'reduce-scatter'}")
    return "\n".join(lines)


def format_growth(times: Sequence[RunTimes], ranks: Sequence[int]) -> str:
    """Fixed-width tables of a growth schedule: per rank count, the seconds to the target epoch
    (stock and ``auto``, with the growth and with the first batch), then each phase's epoch."""
    lines = [f"{'ranks':>6} {'target':>6} {'stock small':>12} {'stock growth':>12} "
             f"{'auto small':>11} {'auto growth':>11}  auto growth vs stock small"]
    for t in times:
        lines.append(f"{t.ranks:>6} {t.target_epoch:>6} {t.stock_small:>11.1f}s "
                     f"{t.stock_growth:>11.1f}s {t.plugin_small:>10.1f}s "
                     f"{t.plugin_growth:>10.1f}s  {t.stock_small / t.plugin_growth:.2f}x")
    skipped = sorted(set(ranks) - {t.ranks for t in times})
    if skipped:
        lines.append(f"(not at {', '.join(map(str, skipped))} ranks: a global batch of the "
                     "schedule does not split over them)")
    lines.append(f"\n{'ranks':>6} {'phase':>10} {'batch/rank':>10} {'steps':>6} "
                 f"{'compute ms':>10} {'stock s/epoch':>13} {'auto s/epoch':>12}  auto's plan")
    for t in times:
        for pt in t.phases:
            phase = f"{pt.phase.epochs}x{pt.phase.batch}"
            lines.append(f"{t.ranks:>6} {phase:>10} {pt.per_rank_batch:>10} "
                         f"{pt.steps_per_epoch:>6} {pt.compute_s * 1e3:>10.1f} "
                         f"{pt.epoch_s(False):>13.2f} "
                         f"{pt.epoch_s(True):>12.2f}  {pt.plan.describe()}")
    return "\n".join(lines)


def growth_dict(t: RunTimes) -> dict[str, Any]:
    """A growth prediction as JSON."""
    return {"ranks": t.ranks, "target_epoch": t.target_epoch, "stock_small_s": t.stock_small,
            "stock_growth_s": t.stock_growth,
            "auto_small_s": t.plugin_small, "auto_growth_s": t.plugin_growth,
            "phases": [{"epochs": pt.phase.epochs, "batch": pt.phase.batch,
                        "per_rank_batch": pt.per_rank_batch,
                        "steps_per_epoch": pt.steps_per_epoch, "compute_s": pt.compute_s,
                        "stock_step_s": pt.stock_s,
                        "auto_step_s": pt.plugin_s, "auto_plan": pt.plan.factory_keywords()}
                       for pt in t.phases]}


def efficiency_markdown(runs: dict[str, Sequence[StepResult]]) -> str:
    """Markdown: one row per (title, ranks), the efficiency of each strategy (step ms below)."""
    strategies = list(dict.fromkeys(r.strategy for rs in runs.values() for r in rs))
    lines = ["| setting | ranks | " + " | ".join(strategies) + " |",
             "|---|---|" + "---|" * len(strategies)]
    for title, results in runs.items():
        for p in dict.fromkeys(r.ranks for r in results):
            row = {r.strategy: r for r in results if r.ranks == p}
            best = min(row.values(), key=lambda r: r.step_s).strategy
            cells = [f"{'**' if s == best else ''}{row[s].efficiency:.2f}"
                     f"{'**' if s == best else ''} ({row[s].step_s * 1e3:.0f} ms)"
                     for s in strategies]
            lines.append(f"| {title} | {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_scaling(path: str | Path, curves: dict[str, Sequence[StepResult]],
                 reference: dict[str, float] | None = None) -> None:
    """Efficiency against ranks (log scale), one panel per title, one line per strategy;
    ``reference``: published points per title (``{title: efficiency}``, at the largest P).
    Needs matplotlib (``pip install hvd-overlap[plot]``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(4.6 * len(curves), 3.8), squeeze=False)
    for ax, (title, results) in zip(axes[0], curves.items(), strict=True):
        for i, s in enumerate(dict.fromkeys(r.strategy for r in results)):
            pts = [(r.ranks, r.efficiency) for r in results if r.strategy == s]
            ax.plot(*zip(*pts, strict=True), marker="o", ms=3, label=s, color=f"C{i}")
        if reference and title in reference:
            p_max = max(r.ranks for r in results)
            ax.plot([p_max], [reference[title]], "k*", ms=12, label="published")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("ranks")
        ax.set_ylabel("efficiency (compute-only / step)")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
