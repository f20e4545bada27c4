"""What this machine feeds the simulator and how well it predicts it: the measured
per-collective costs (``python -m benchmarks calibrate``, ``profiles/overheads-gloo-2rank.json``),
the bench models' measured profiles (``profiles/*-cpu.json``) and the validation of the
simulator against bench runs (``python -m benchmarks validate``).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hvd_overlap.core.autoplan import at_batch
from hvd_overlap.core.simulate import (
    RUNTIME_STRATEGIES,
    STRATEGIES,
    Cluster,
    Profile,
    load_profile,
    simulate,
)
from hvd_overlap.tools.collective_costs import OVERHEADS_FORMAT

#: measured profiles of the bench models and the calibration, made on this repository's machine
PROFILES = Path(__file__).with_name("profiles")
OVERHEADS = PROFILES / "overheads-gloo-2rank.json"
#: the calibration at 2, 3 and 4 ranks with its fitted laws (``calibrate --np 2 --np 3 --np 4``),
#: which the predictions beyond 2 ranks use; the 2-rank file stays what the 2-rank validation
#: was made with
OVERHEADS_BY_RANKS = PROFILES / "overheads-gloo-2to4ranks.json"
TOLERANCE = 0.15


def bench_profiles() -> list[str]:
    """Names of the bench models' measured profiles (``benchmarks/profiles``)."""
    return sorted(p.stem for p in PROFILES.glob("*.json") if not p.stem.startswith("overheads"))


def lab_profile(name: str | Path) -> Profile:
    """A profile from a file, a bench model's measured one by name (``vgg-b64-cpu``), or one
    shipped with the package (``resnet50``)."""
    lab = PROFILES / f"{name}.json"
    return load_profile(lab if lab.exists() else name)


def load_overheads(path: str | Path = OVERHEADS) -> dict[str, Any]:
    """The measured per-collective costs (``python -m benchmarks calibrate``), by network name."""
    d = json.loads(Path(path).read_text())
    if d.get("format") != OVERHEADS_FORMAT:
        raise ValueError(f"{path}: not a calibration file (hvd-overlap calibrate, python -m "
                         "benchmarks calibrate)")
    return d


def net_key(net: str, net_model: str = "loopback") -> str:
    """The calibration's key of a network: ``plain``, ``1gbit hosts``, ``1gbit loopback``."""
    return net if net == "plain" else f"{net} {net_model}"


def measured_cluster(net: str, ranks: int = 2, overheads: dict[str, Any] | None = None,
                     net_model: str = "loopback", **changes: Any) -> Cluster:
    """A cluster with every parameter measured on this host for ``net`` of ``net_model``
    (Gloo). Where the network was calibrated at several rank counts, its fitted laws
    (``hvd_overlap.core.sim.laws``) give the parameters at ``ranks``; a shaped rate never
    calibrated takes the laws of the nearest calibrated rate of the same network model, its
    rates scaled to this one, and no faster than the unshaped host's (``plain``) where that
    was calibrated with laws too. Otherwise the 2-rank calibration, with the simulator's default
    laws. Calibrations made before network models existed are keyed by the bare rate; they
    were measured on one shaped loopback."""
    from benchmarks.netns import parse_net
    from hvd_overlap.core.sim.cluster import parse_rate
    from hvd_overlap.core.sim.laws import cluster_fields, small_excess

    d = overheads or load_overheads()
    key = net_key(net, net_model)
    if key not in d["nets"] and net_model == "loopback" and net in d["nets"]:
        key = net
    rate = parse_net(net)
    if key not in d["nets"] and rate is not None and (near := _nearest_rate(d, rate, net_model)):
        key = near
    if key not in d["nets"]:
        raise ValueError(f"no calibration for net {key!r} (have {', '.join(d['nets'])}): run "
                         f"`python -m benchmarks calibrate --net {net} --net-model {net_model} "
                         "--merge`")
    entry = d["nets"][key]
    if "laws" in entry:
        fields = cluster_fields(entry["laws"], ranks, None if rate is None else parse_rate(rate))
        host = d["nets"].get("plain", {}).get("laws")
        if rate is not None and host is not None:
            fields = _capped_by_host(fields, cluster_fields(host, ranks, None))
        return replace(Cluster(ranks=ranks, latency=0.0, **fields), **changes)
    f = entry["fit"]
    return replace(Cluster(ranks=ranks, bandwidth=f["bandwidth"], latency=0.0,
                           negotiation_s=f["overhead_s"], tensor_s=f["tensor_s"],
                           cpu_steal=f["cpu_steal"], comm_slowdown=max(f["comm_slowdown"], 1.0),
                           reduce_scatter_bandwidth=f.get("reduce_scatter_bandwidth"),
                           allgather_bandwidth=f.get("allgather_bandwidth"),
                           alltoall_bandwidth=f.get("alltoall_gather_bandwidth"),
                           small_excess=small_excess(f.get("small_excess_s"))),
                   **changes)


def _capped_by_host(fields: dict[str, Any], host: dict[str, Any]) -> dict[str, Any]:
    """A shaped link's rates no faster than the same ranks' unshaped ones (``plain``): an
    emulated link cannot carry more than the host moves without a limit (a 10 Gbit/s link
    between 4 ranks on 2 cores runs at the host's rate)."""
    rates = ("bandwidth", "reduce_scatter_bandwidth", "allgather_bandwidth",
             "alltoall_bandwidth")
    return {k: min(v, host[k]) if k in rates and v and host.get(k) else v
            for k, v in fields.items()}


def _nearest_rate(d: dict[str, Any], rate: str, net_model: str) -> str | None:
    """The key of the calibrated shaped rate of ``net_model`` with fitted laws nearest to
    ``rate`` (by ratio), or None."""
    import math

    from hvd_overlap.core.sim.cluster import parse_rate

    want = parse_rate(rate)
    have = {k: v["laws"]["rate"] for k, v in d["nets"].items()
            if k.endswith(f" {net_model}") and v.get("laws", {}).get("rate")}
    return min(have, key=lambda k: abs(math.log(have[k] / want))) if have else None


# --- validation against `python -m benchmarks bench --json` files --------------------------

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
    """The measured profile of a bench model (``hvd-overlap profile``, in ``PROFILES``): the
    one of ``batch`` if there is one, else the model's at another batch (validation rescales a
    profile's compute to the run's ``local`` time anyway: the profile gives the layers'
    shares)."""
    exact = f"{model}-b{batch}-cpu"
    others = sorted(p for p in bench_profiles()
                    if p.startswith(f"{model}-b") and p.endswith("-cpu"))
    return exact if exact in bench_profiles() or not others else others[0]


def bench_profile(model: str, batch: int) -> Profile:
    """The measured profile of a bench model at ``batch`` per rank: its own, or the model's
    measured at another batch with the compute and the exchange's activations moved to
    ``batch`` (the gradients and the optimizer update do not change with it)."""
    profile = lab_profile(bench_profile_name(model, batch))
    if profile.batch_size == batch:
        return profile
    return at_batch(profile, batch / profile.batch_size)


def validate_run(bench: dict[str, Any], overheads: dict[str, Any] | None = None,
                 strategies: Sequence[str] = RUNTIME_STRATEGIES) -> tuple[list[Check], float]:
    """Predict every strategy of one bench run. The measured profile's compute is scaled so a
    step without communication takes the run's ``local`` time (the profile gives the shape,
    the run the level); returns the checks and that scale. Every other strategy the run
    measured is predicted too (the exchange's among them); one the simulator does not know
    gets a check without a prediction."""
    raw, summary = bench["raw"], bench["strategies"]
    cfg = raw["config"]
    profile = bench_profile(cfg["model"], cfg["batch_size"])
    local = statistics.median(raw["step_times"]["local"])
    scale = local / profile.compute_s
    profile = profile.scaled(scale)
    net_model = cfg.get("net_model", "loopback")
    cluster = measured_cluster(cfg["net"], raw["ranks"], overheads, net_model)
    checks = []
    others = [s for s in summary if s not in strategies and s not in ("local", "stock")]
    baseline = ["stock"] if "stock" in summary else []
    for s in [*baseline, *strategies, *others]:
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
        except (FileNotFoundError, ValueError) as e:  # no measured profile / no calibration
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
