"""Predictions made before the measurement: the simulator's step times for a bench
configuration, written (and committed) before the bench runs, then checked against it.

``python -m benchmarks predict`` measures only the compute-only step (``local``, no
communication: the profile's level on this machine that day, the one input the simulator takes
from the run), chooses the link rate (``--regime``, as the bench does) and predicts every asked
strategy from the measured profile's shape, the calibration's fitted laws at that rank count
(``hvd_overlap.core.sim.laws``) and the rate. ``python -m benchmarks check-predictions`` compares
them with a bench run of the same configuration, beside the trivial predictor (every strategy
takes the compute-only step: what the simulator must beat to mean anything).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.config import LOCAL, STOCK, base_name

PREDICTION_FORMAT = "hvd-overlap-prediction/1"
#: the allreduce plans among which "the best allreduce plan" is the predicted fastest
ALLREDUCE_PLANS = ("layerwise", "hybrid")
#: a row counts as communication-heavy when stock's exposed share is at least this
COMM_SHARE = 1 / 3


def simulator_name(strategy: str) -> str:
    """A bench strategy as the simulator names it (real stock Horovod: ``horovod``)."""
    base = base_name(strategy)
    return "horovod" if base == STOCK else base


def predict(model: str, batch_size: int, compute_s: float, net: str, ranks: int,
            net_model: str, strategies: Sequence[str],
            overheads: dict[str, Any] | None = None) -> dict[str, Any]:
    """Predicted seconds per step of each strategy (bench names), and of the best allreduce
    plan, with the measured profile of ``model`` scaled to ``compute_s``."""
    from benchmarks.validation import (
        OVERHEADS_BY_RANKS,
        bench_profile,
        bench_profile_name,
        load_overheads,
        measured_cluster,
    )
    from hvd_overlap.core.simulate import simulate

    name = bench_profile_name(model, batch_size)
    profile = bench_profile(model, batch_size)
    profile = profile.scaled(compute_s / profile.compute_s)
    cluster = measured_cluster(net, ranks, overheads or load_overheads(OVERHEADS_BY_RANKS),
                               net_model)
    out: dict[str, dict[str, float]] = {}
    for s in (*strategies, *ALLREDUCE_PLANS):
        if base_name(s) == LOCAL or s in out:
            continue
        r = simulate(profile, simulator_name(s), cluster)
        out[s] = {"step_s": r.step_s, "wire_s": r.wire_s, "sent_bytes": r.wire_bytes}
    best = min(ALLREDUCE_PLANS, key=lambda s: out[s]["step_s"])
    return {"profile": name, "compute_s": compute_s, "cluster": asdict(cluster),
            "predicted": out, "best_allreduce": best}


def host_rate(ranks: int, net_model: str, overheads: dict[str, Any] | None = None) -> float | None:
    """The allreduce rate (bytes/s, ring terms) this host carries between ``ranks`` ranks
    without a link limit (the calibration's ``plain``), or None where it was not calibrated."""
    from benchmarks.validation import OVERHEADS_BY_RANKS, load_overheads, measured_cluster

    d = overheads or load_overheads(OVERHEADS_BY_RANKS)
    if "plain" not in d["nets"]:
        return None
    return measured_cluster("plain", ranks, d, net_model).bandwidth


@dataclass(frozen=True)
class Row:
    """One strategy of one configuration: measured, predicted and the trivial predictor."""

    model: str
    net: str
    strategy: str
    measured_s: float
    predicted_s: float
    trivial_s: float
    stock_exposed_share: float

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1

    @property
    def trivial_error(self) -> float:
        return self.trivial_s / self.measured_s - 1

    @property
    def communication_heavy(self) -> bool:
        return self.stock_exposed_share >= COMM_SHARE


def check(prediction: dict[str, Any], bench: dict[str, Any]) -> list[Row]:
    """The prediction's rows against a bench run (``bench --json``) of its configuration."""
    from benchmarks import report

    raw = bench["raw"]
    cfg, want = raw["config"], prediction["config"]
    for k in ("model", "batch_size", "np", "net", "net_model"):
        if cfg[k] != want[k]:
            raise ValueError(f"the bench run's {k} is {cfg[k]!r}, the prediction's {want[k]!r}")
    steps = {s: report.step_time(raw, s) for s in raw["step_times"]}
    stock = steps[STOCK]
    trivial = prediction["compute_s"]
    share = max(0.0, stock - steps.get(LOCAL, trivial)) / stock
    return [Row(cfg["model"], cfg["net"], s, steps[s], p["step_s"], trivial, share)
            for s, p in prediction["predicted"].items() if s in steps]


def markdown(rows: Sequence[Row]) -> str:
    """The table of rows, with the summary the issue of record asks for."""
    lines = ["| model | link | strategy | measured ms | predicted ms | error | "
             "trivial error | comm. >= 1/3 of stock |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        beat = abs(r.error) < abs(r.trivial_error)
        lines.append(f"| {r.model} | {r.net} | {r.strategy} | {r.measured_s * 1e3:.0f} | "
                     f"{r.predicted_s * 1e3:.0f} | {r.error:+.1%} | {r.trivial_error:+.1%} | "
                     f"{'yes' if r.communication_heavy else 'no'}"
                     f"{'' if beat or not r.communication_heavy else ' (trivial closer)'} |")
    if rows:
        inside = sum(abs(r.error) <= 0.15 for r in rows)
        heavy = [r for r in rows if r.communication_heavy]
        beaten = sum(abs(r.error) < abs(r.trivial_error) for r in heavy)
        lines += ["", f"{inside} of {len(rows)} rows within 15% (mean |error| "
                  f"{statistics.fmean(abs(r.error) for r in rows):.1%}; the trivial "
                  f"predictor's {statistics.fmean(abs(r.trivial_error) for r in rows):.1%}); "
                  f"the simulator closer than the trivial predictor on {beaten} of {len(heavy)} "
                  "rows where communication is at least a third of stock's step."]
    return "\n".join(lines) + "\n"
