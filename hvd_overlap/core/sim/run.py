"""One simulated step of a strategy on a cluster, and a sweep over strategies and rank counts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from hvd_overlap.core.sim.cluster import Cluster
from hvd_overlap.core.sim.events import run_step
from hvd_overlap.core.sim.plans import _COST_CHOICE, EXCHANGE_SUFFIX, STRATEGIES
from hvd_overlap.core.sim.profile import Profile
from hvd_overlap.core.sim.steps import build_step
from hvd_overlap.core.trial import MARGIN


@dataclass(frozen=True)
class StepResult:
    """Seconds of one simulated step, and how it was spent."""

    strategy: str
    ranks: int
    step_s: float
    compute_s: float
    wire_s: float          # seconds the channel spent transferring (slowed while compute ran)
    collectives: int
    wire_bytes: float      # bytes one rank sends per step

    @property
    def efficiency(self) -> float:
        return self.compute_s / self.step_s

    @property
    def exposed_s(self) -> float:
        return self.step_s - self.compute_s

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "efficiency": self.efficiency, "exposed_s": self.exposed_s}



def simulate(profile: Profile, strategy: str, cluster: Cluster,
             defer: int | None = None) -> StepResult:
    """One steady-state step of ``strategy`` on ``cluster``; ``defer``: input-side buckets
    deferred to the next step (``hybrid``, ``sharded``, ``sharded_hybrid``), as
    ``DistributedOptimizer(defer=...)``: the step is built from the strategy's own plan."""
    compute = profile.compute_s  # the compute-only baseline: local training, full update
    if cluster.ranks == 1:
        return StepResult(strategy, 1, compute, compute, 0.0, 0, 0.0)
    if strategy.endswith(EXCHANGE_SUFFIX):  # exchange_forward="auto": its online check too
        chosen = simulate(profile, strategy + _COST_CHOICE, cluster, defer)
        gather = simulate(profile, strategy + "+gather", cluster, defer)
        best = gather if gather.step_s * (1 + MARGIN) < chosen.step_s else chosen
        return replace(best, strategy=strategy)
    tasks, reqs = build_step(profile, strategy, cluster, defer)
    out = run_step(tasks, reqs, cluster)
    sent = sum(cluster.wire_bytes(r.kind, r.nbytes) for r in reqs)
    return StepResult(strategy, cluster.ranks, out["end"], compute, out["wire"],
                      out["collectives"], sent)


def sweep(profile: Profile, cluster: Cluster, ranks: Sequence[int],
          strategies: Sequence[str] = STRATEGIES, defer: int | None = None) -> list[StepResult]:
    """Every strategy at every rank count (``defer``: see ``simulate``)."""
    return [simulate(profile, s, replace(cluster, ranks=p), defer)
            for p in ranks for s in strategies]
