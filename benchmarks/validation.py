"""What the simulator is fed and what it prints: measured overheads, validation against
benchmark runs, tables and scaling plots (``hvd-overlap simulate``).
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hvd_overlap.core.simulate import (
    RUNTIME_STRATEGIES,
    SHIPPED,
    STRATEGIES,
    Cluster,
    ExchangeChoice,
    StepResult,
    load_profile,
    simulate,
)
from hvd_overlap.tools.profile import parse_bandwidth

OVERHEADS = SHIPPED / "overheads-gloo-2rank.json"
OVERHEADS_FORMAT = "hvd-overlap-overheads/1"
TOLERANCE = 0.15
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


def load_overheads(path: str | Path = OVERHEADS) -> dict[str, Any]:
    """The measured per-collective costs (``hvd-overlap calibrate``), by network name."""
    d = json.loads(Path(path).read_text())
    if d.get("format") != OVERHEADS_FORMAT:
        raise ValueError(f"{path}: not written by `hvd-overlap calibrate`")
    return d


def net_key(net: str, net_model: str = "loopback") -> str:
    """The calibration's key of a network: ``plain``, ``1gbit hosts``, ``1gbit loopback``."""
    return net if net == "plain" else f"{net} {net_model}"


def measured_cluster(net: str, ranks: int = 2, overheads: dict[str, Any] | None = None,
                     net_model: str = "loopback", **changes: Any) -> Cluster:
    """A cluster with every parameter measured on this host for ``net`` of ``net_model``
    (2 ranks, Gloo). Calibrations made before network models existed are keyed by the bare
    rate; they were measured on one shaped loopback."""
    d = overheads or load_overheads()
    key = net_key(net, net_model)
    if key not in d["nets"] and net_model == "loopback" and net in d["nets"]:
        key = net
    if key not in d["nets"]:
        raise ValueError(f"no calibration for net {key!r} (have {', '.join(d['nets'])}): run "
                         f"`hvd-overlap calibrate --net {net} --net-model {net_model} --merge`")
    f = d["nets"][key]["fit"]
    return replace(Cluster(ranks=ranks, bandwidth=f["bandwidth"], latency=0.0,
                           negotiation_s=f["overhead_s"], tensor_s=f["tensor_s"],
                           cpu_steal=f["cpu_steal"], comm_slowdown=max(f["comm_slowdown"], 1.0),
                           reduce_scatter_bandwidth=f.get("reduce_scatter_bandwidth"),
                           allgather_bandwidth=f.get("allgather_bandwidth"),
                           alltoall_bandwidth=f.get("alltoall_gather_bandwidth")),
                   **changes)


# --- validation against `hvd-overlap bench --json` files ---------------------------------------

@dataclass(frozen=True)
class Check:
    """One strategy of one bench run: measured and predicted seconds per step (``predicted``
    None: a strategy the simulator does not model)."""

    model: str
    net: str
    strategy: str
    measured: float | None
    predicted: float | None
    measured_wire: float | None = None
    predicted_wire: float | None = None

    @property
    def error(self) -> float | None:
        if self.measured is None or self.predicted is None:
            return None
        return self.predicted / self.measured - 1


def bench_profile_name(model: str, batch: int) -> str:
    """The shipped measured profile of a bench model (``hvd-overlap profile``): the one of
    ``batch`` if shipped, else the model's at another batch (validation rescales a profile's
    compute to the run's ``local`` time anyway: the profile gives the layers' shares)."""
    from hvd_overlap.core.simulate import shipped_profiles

    exact = f"{model}-b{batch}-cpu"
    others = sorted(p for p in shipped_profiles()
                    if p.startswith(f"{model}-b") and p.endswith("-cpu"))
    return exact if exact in shipped_profiles() or not others else others[0]


def validate_run(bench: dict[str, Any], overheads: dict[str, Any] | None = None,
                 strategies: Sequence[str] = RUNTIME_STRATEGIES) -> tuple[list[Check], float]:
    """Predict every strategy of one bench run. The measured profile's compute is scaled so a
    step without communication takes the run's ``local`` time (the profile gives the shape,
    the run the level); returns the checks and that scale. A strategy the run measured that
    the simulator does not know gets a check without a prediction."""
    raw, summary = bench["raw"], bench["strategies"]
    cfg = raw["config"]
    profile = load_profile(bench_profile_name(cfg["model"], cfg["batch_size"]))
    local = statistics.median(raw["step_times"]["local"])
    scale = local / profile.compute_s
    profile = profile.scaled(scale)
    net_model = cfg.get("net_model", "loopback")
    cluster = measured_cluster(cfg["net"], raw["ranks"], overheads, net_model)
    checks = []
    unknown = [s for s in summary if s not in strategies and s not in STRATEGIES
               and s not in ("local", "stock")]
    baseline = ["stock"] if "stock" in summary else []
    for s in [*baseline, *strategies, *unknown]:
        model = "horovod" if s == "stock" else s  # real stock Horovod: the stock model
        r = simulate(profile, model, cluster) if model in STRATEGIES else None
        m = summary.get(s)
        checks.append(Check(cfg["model"], net_key(cfg["net"], net_model), s,
                            m["step_time_s"] if m else None, r.step_s if r else None,
                            m.get("wire_s") if m else None, r.wire_s if r else None))
    return checks, scale


def validation_markdown(paths: Sequence[str | Path], overheads_path: str | Path = OVERHEADS,
                        ) -> tuple[str, list[Check]]:
    """The validation table over bench JSON files, and the checks."""
    overheads = load_overheads(overheads_path)
    lines = ["| model | network | strategy | measured ms | predicted ms | error | "
             "measured wire ms | predicted wire ms |", "|---|---|---|---|---|---|---|---|"]
    notes, every = [], []
    for p in paths:
        bench = json.loads(Path(p).read_text())
        try:
            checks, scale = validate_run(bench, overheads)
        except (FileNotFoundError, ValueError) as e:  # no shipped profile / no calibration
            notes.append(f"- `{p}`: not validated ({e})")
            continue
        every += checks
        notes.append(f"- `{p}`: profile compute x {scale:.2f} to the run's `local` "
                     f"{statistics.median(bench['raw']['step_times']['local']) * 1e3:.0f} ms"
                     + (f"; `{bench['command']}`" if "command" in bench else ""))
        for c in checks:
            err = "not modelled" if c.predicted is None else "not measured yet" \
                if c.error is None else \
                f"{c.error:+.1%}{'' if abs(c.error) <= TOLERANCE else ' **>15%**'}"
            lines.append(
                f"| {c.model} | {c.net} | {c.strategy} | "
                f"{'-' if c.measured is None else f'{c.measured * 1e3:.0f}'} | "
                f"{'-' if c.predicted is None else f'{c.predicted * 1e3:.0f}'} | {err} | "
                f"{'-' if not c.measured_wire else f'{c.measured_wire * 1e3:.0f}'} | "
                f"{'-' if c.predicted_wire is None else f'{c.predicted_wire * 1e3:.0f}'} |")
    measured = [c for c in every if c.error is not None]
    inside = sum(abs(c.error) <= TOLERANCE for c in measured)
    lines += ["", f"{inside} of {len(measured)} measured (run, strategy) pairs within "
              f"{TOLERANCE:.0%}; mean |error| "
              f"{statistics.fmean(abs(c.error) for c in measured):.1%}." if measured else "",
              "", *notes]
    return "\n".join(lines) + "\n", every


# --- output ------------------------------------------------------------------------------------

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
    ``reference``: published points per title (``{title: efficiency}``, at the largest P)."""
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


def plot_validation(path: str | Path, checks: Sequence[Check]) -> None:
    """Measured and predicted step times side by side, one group per (model, network)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((c.model, c.net) for c in checks))
    fig, axes = plt.subplots(1, len(groups), figsize=(3.6 * len(groups), 3.6), squeeze=False)
    for ax, (model, net) in zip(axes[0], groups, strict=True):
        rows = [c for c in checks if (c.model, c.net) == (model, net)]
        xs = range(len(rows))
        ax.bar([x - 0.2 for x in xs], [(c.measured or 0) * 1e3 for c in rows], 0.4,
               label="measured", color="0.55")
        ax.bar([x + 0.2 for x in xs], [(c.predicted or 0) * 1e3 for c in rows], 0.4,
               label="predicted", color="C0")
        for x, c in zip(xs, rows, strict=True):
            if c.predicted is None:
                ax.annotate("not\nmodelled", (x + 0.2, 0), ha="center", va="bottom", fontsize=6)
            elif c.error is not None:
                ax.annotate(f"{c.error:+.0%}", (x, max(c.measured, c.predicted) * 1e3),
                            ha="center", va="bottom", fontsize=7)
        ax.set_xticks(list(xs), [c.strategy for c in rows], rotation=30, fontsize=8)
        ax.set_title(f"{model}, net {net}", fontsize=9)
        ax.set_ylabel("ms / step")
        ax.margins(y=0.12)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", ncol=2, fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cluster_from_options(ranks: int, bandwidth: str, latency: str, **knobs: Any) -> Cluster:
    """A cluster from command-line strings; negotiation and per-tensor costs default to the
    calibration's ``cluster_defaults`` (measured on plain loopback, 2 ranks; else its current
    ``plain`` network)."""
    try:
        d = load_overheads()
        fit = d.get("cluster_defaults") or d["nets"]["plain"]["fit"]
    except (OSError, KeyError, ValueError):
        fit = {"overhead_s": 0.0, "tensor_s": 0.0}
    knobs = {k: v for k, v in knobs.items() if v is not None}
    knobs.setdefault("negotiation_s", fit["overhead_s"])
    knobs.setdefault("tensor_s", fit["tensor_s"])
    return Cluster(ranks=ranks, bandwidth=parse_bandwidth(bandwidth),
                   latency=parse_duration(latency), **knobs)
