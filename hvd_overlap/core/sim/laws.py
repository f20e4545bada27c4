"""How Horovod's measured costs grow with the number of ranks: laws fitted to calibrations at
2-4 ranks (``python -m benchmarks calibrate --np 2 --np 3 --np 4``), which the simulator then
uses instead of assumed ones.

- **Coordination costs** (``overhead_s``: one collective's negotiation and round trip;
  ``tensor_s``: each extra tensor of a fused collective) are fitted as ``c x growth(law, P)``
  for every law of ``hvd_overlap.core.sim.cluster.GROWTH_LAWS`` (least squares on relative
  error); the law with the smallest worst error is kept, each law's error is recorded. The
  simulator uses the measured costs between the calibrated rank counts and grows the largest
  one's by that law beyond them (``Cluster.measured_costs``).
- **Rates** (``bandwidth`` of the allreduce and each phase's, all in ring terms) are shares of
  the link's nominal rate. The ring model says one share per collective for all P; the fit
  records that share and its error at each P, and the simulator uses the share measured at the
  nearest calibrated rank count (Gloo's all-gather runs at half the rate at 2 ranks and near
  its ring rate from 3). A rate the repository never calibrated is predicted with the shares
  measured at the nearest calibrated rate.
- **Small collectives' extra cost** (``small_excess_s``: what a collective below a few MiB took
  beyond the line, per kind and size) is the 2-rank calibration's; the simulator grows it with
  the ring's P-1 steps (``Cluster.excess``).
- **Host effects** (``cpu_steal``, ``comm_slowdown``: communication and compute on the same
  cores) are the ones measured at the nearest calibrated rank count: they describe this
  machine's cores, not the network.

Pure Python: no TensorFlow, no Horovod.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hvd_overlap.core.sim.cluster import GROWTH_LAWS, growth

GROWN = ("overhead_s", "tensor_s")
RATES = ("bandwidth", "reduce_scatter_bandwidth", "allgather_bandwidth",
         "alltoall_gather_bandwidth")
HOST = ("cpu_steal", "comm_slowdown")


def fit_growth(values: Mapping[int, float]) -> dict[str, Any]:
    """The growth law that best explains ``values`` (rank count -> seconds): its name, its
    value at 2 ranks, its relative error at each rank count, and every law's worst error."""
    points = {p: v for p, v in values.items() if p >= 2 and v > 0}
    if not points:
        raise ValueError("fit_growth needs a positive cost at 2 or more ranks")
    fits = {}
    for law in GROWTH_LAWS:
        g = {p: growth(law, p) for p in points}
        # minimises sum((c g / v - 1)^2): c = sum(g / v) / sum(g^2 / v^2)
        c = sum(g[p] / v for p, v in points.items()) / sum((g[p] / v) ** 2
                                                            for p, v in points.items())
        errors = {p: c * g[p] / v - 1 for p, v in points.items()}
        fits[law] = {"law": law, "at_2_ranks": c, "errors": errors,
                     "worst": max(abs(e) for e in errors.values()), "measured": points}
    best = min(fits.values(), key=lambda f: f["worst"])
    return {**best, "laws": {law: f["worst"] for law, f in fits.items()}}


def fit_share(values: Mapping[int, float], rate: float) -> dict[str, Any]:
    """One share of the nominal ``rate`` (bytes/s) for every rank count of ``values`` (rank
    count -> bytes/s in ring terms): the mean share, and its relative error at each count."""
    shares = {p: v / rate for p, v in values.items()}
    mean = sum(shares.values()) / len(shares)
    return {"share": mean, "shares": shares,
            "errors": {p: mean / s - 1 for p, s in shares.items()}}


def fit_laws(by_ranks: Mapping[int, Mapping[str, float]], rate: float | None) -> dict[str, Any]:
    """The laws from each rank count's calibration fit (``calibrate.fit``) on a link of
    ``rate`` bytes/s (None: unshaped, whose rates are the host's, kept per rank count)."""
    if 2 not in by_ranks or len(by_ranks) < 2:
        raise ValueError("the laws need calibrations at 2 ranks and at least one more count")
    laws: dict[str, Any] = {"ranks": sorted(by_ranks), "rate": rate}
    for name in GROWN:
        laws[name] = fit_growth({p: f[name] for p, f in by_ranks.items()})
    for name in RATES:
        have = {p: f[name] for p, f in by_ranks.items() if name in f}
        if have and rate is not None:
            laws[name] = fit_share(have, rate)
        elif have:
            laws[name] = {"by_ranks": have}
    for name in HOST:
        laws[name] = {"by_ranks": {p: f[name] for p, f in by_ranks.items()}}
    if "small_excess_s" in by_ranks[2]:
        laws["small_excess_s"] = by_ranks[2]["small_excess_s"]
    return laws


def small_excess(measured: Mapping[str, Mapping[str, float]] | None
                 ) -> tuple[tuple[str, tuple[tuple[int, float], ...]], ...]:
    """A calibration's ``small_excess_s`` (kind -> bytes as text -> seconds) as
    ``Cluster.small_excess`` (the simulator's kind names, sizes in order)."""
    return tuple(("alltoall" if kind == "alltoall_gather" else kind,
                  tuple(sorted((int(n), s) for n, s in by_size.items())))
                 for kind, by_size in sorted((measured or {}).items()))


def _nearest(table: Mapping[Any, float], ranks: int) -> float:
    key = min(table, key=lambda p: (abs(int(p) - ranks), -int(p)))
    return table[key]


def cluster_fields(laws: Mapping[str, Any], ranks: int, rate: float | None) -> dict[str, Any]:
    """The simulator's ``Cluster`` fields at ``ranks`` ranks on a link of ``rate`` bytes/s from
    ``laws`` (``fit_laws``, possibly read back from JSON: rank counts as strings)."""
    neg, per = laws["overhead_s"], laws["tensor_s"]
    out: dict[str, Any] = {
        "negotiation_s": neg["at_2_ranks"],
        "negotiation_growth": neg["law"],
        "tensor_s": per["at_2_ranks"],
        "tensor_growth": per["law"],
        "measured_costs": tuple((int(p), v, per["measured"][p])
                                for p, v in sorted(neg["measured"].items(),
                                                   key=lambda kv: int(kv[0]))),
        "cpu_steal": _nearest(laws["cpu_steal"]["by_ranks"], ranks),
        "comm_slowdown": max(_nearest(laws["comm_slowdown"]["by_ranks"], ranks), 1.0),
        "small_excess": small_excess(laws.get("small_excess_s")),
    }
    for name in RATES:
        law = laws.get(name)
        if law is None:
            continue
        field = "alltoall_bandwidth" if name == "alltoall_gather_bandwidth" else name
        if "shares" in law:
            out[field] = _nearest(law["shares"], ranks) * (rate or laws["rate"])
        else:
            out[field] = _nearest(law["by_ranks"], ranks)
    return out
