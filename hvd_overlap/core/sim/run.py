"""One simulated step of a strategy on a cluster, and a sweep over strategies and rank counts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from hvd_overlap.core.margin import as_share_of_incumbent, keep_unless_faster
from hvd_overlap.core.sim.cluster import Cluster
from hvd_overlap.core.sim.events import run_step
from hvd_overlap.core.sim.plans import STRATEGIES, strategy_of
from hvd_overlap.core.sim.profile import Profile
from hvd_overlap.core.sim.steps import build_step
from hvd_overlap.core.strategy import Strategy
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



def simulate(profile: Profile, strategy: str | Strategy, cluster: Cluster,
             defer: int | None = None) -> StepResult:
    """One steady-state step of ``strategy`` on ``cluster``: an object's own plan, or a name's
    built with the cluster's bucket size and ``defer`` (input-side buckets deferred to the
    next step, as ``DistributedOptimizer(defer=...)``). A strategy with an online check (the
    exchange's ``forward="auto"``: ``Strategy.online_alternative``) runs the faster of its
    plan and the alternative, as the check keeps it (``core.trial.MARGIN``)."""
    label = strategy if isinstance(strategy, str) else strategy.spec()
    compute = profile.compute_s  # the compute-only baseline: local training, full update
    if cluster.ranks == 1:
        return StepResult(label, 1, compute, compute, 0.0, 0, 0.0)
    chosen = strategy_of(strategy, cluster.bucket_bytes, defer)
    best = _step(profile, chosen, cluster)
    other = chosen.online_alternative()
    if other is not None:
        alt = _step(profile, other, cluster)
        if not keep_unless_faster(alt.step_s, best.step_s, as_share_of_incumbent(MARGIN)):
            best = alt
    return replace(best, strategy=label)


def _step(profile: Profile, chosen: Strategy, cluster: Cluster) -> StepResult:
    """The simulated step of ``chosen``'s plan alone."""
    tasks, reqs = build_step(profile, chosen, cluster)
    out = run_step(tasks, reqs, cluster)
    sent = sum(cluster.wire_bytes(r.kind, r.nbytes) for r in reqs)
    return StepResult(chosen.spec(), cluster.ranks, out["end"], profile.compute_s, out["wire"],
                      out["collectives"], sent)


def sweep(profile: Profile, cluster: Cluster, ranks: Sequence[int],
          strategies: Sequence[str] = STRATEGIES, defer: int | None = None) -> list[StepResult]:
    """Every strategy at every rank count (``defer``: see ``simulate``)."""
    return [simulate(profile, s, replace(cluster, ranks=p), defer)
            for p in ranks for s in strategies]
