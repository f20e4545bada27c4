"""How ``auto`` ranks its plans after the probe's first trial: the link measured (a few
collectives, every rank), the model's profile scaled to the compute timed in the probe's steps
(or fitted to its step), the usable pool
ranked by the simulator; the chooser (``core.chooser``) picks the trials from the ranking."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import horovod.tensorflow as hvd

from hvd_overlap.comm.link import agree, cluster_of, measure_link
from hvd_overlap.core import autoplan
from hvd_overlap.core.strategy import Strategy
from hvd_overlap.keras.executors.auto_pool import dense_batches, usable_pool
from hvd_overlap.keras.flops import layer_flops_by_name


def rank_trials(ex: Any, probe_s: float) -> list[Strategy]:
    """The candidates ``ex`` (an ``AutoExecutor``) measures after its probe's first trial of
    ``probe_s``: the link measured, the model's profile scaled to the probe, the pool ranked by
    the simulator, and the chooser's pick of trials (or ``ex.forced_trials``)."""
    chooser = ex.chooser
    if hvd.size() == 1:
        chooser.reason = "one rank: nothing to communicate"
        return []
    if not math.isfinite(probe_s):
        chooser.reason = "no steady step could be timed (epochs too short): keeping the probe"
        return []
    if ex.forced_trials is not None:
        return [c for c in ex.forced_trials if c != chooser.probe]
    plan = ex.child().last_plan
    flops = layer_flops_by_name(ex.model) if ex.model is not None else None
    batches = dense_batches(ex.dense_layers, plan.variables, f"{ex.settings.name}.auto.batch")
    profile = autoplan.profile_from_specs(plan.variables, flops, dense=batches)
    # the candidates depend on the layers and their bytes, not on the compute set below
    candidates = ex.pool(profile)
    # the sharded plans and the exchange run on reduce-scatter, all-gather and alltoall:
    # time them too (the same pool, so the same answer, on every rank)
    sharded = any(c.shards for c in candidates)
    link = measure_link(f"{ex.settings.name}.auto.link", phases=sharded)
    probe = chooser.probe
    if "allreduce" in link.unmeasured:  # no rate to predict any plan with
        chooser.reason = ("the link probe could not tell a 64 MiB allreduce from a 4-byte one "
                          f"({link.per_collective_s * 1e3:.2f} ms): nothing to predict, "
                          f"keeping {probe.describe()}")
        ex.say(f"{ex.label}: {chooser.reason}")
        return []
    cluster = cluster_of(link)
    compute_s = measured_compute(ex)
    if compute_s is not None:  # timed inside the probe's steps
        fitted, how = profile.scaled(compute_s / profile.compute_s), "measured"
    else:  # the compute that makes the simulator's probe step the measured one
        fitted, how = autoplan.fit_compute(profile, cluster, probe, probe_s), "fitted"
    pool, ex.left_out = usable_pool(candidates, ex.loop, ex.settings, ex.local_refs)
    pool, unpriced = priced(pool, link.unmeasured, ex.settings.gather_with)
    ex.left_out += unpriced
    ranked = autoplan.rank(fitted, cluster, pool)
    chooser.fitted = (fitted, cluster, pool)
    order = chooser.trials_from(ranked, probe_s)
    rates = [f"{k} {r / 1e6:.0f}" if r is not None else f"{k} unmeasured" for k, r, phase
             in (("reduce-scatter", link.reduce_scatter_bandwidth, "reducescatter"),
                 ("all-gather", link.allgather_bandwidth, "allgather"),
                 ("alltoall", link.alltoall_bandwidth, "alltoall"))
             if r is not None or phase in link.unmeasured]
    ex.say(f"{ex.label}: link {link.bandwidth / 1e6:.0f} MB/s"
           + (f" ({', '.join(rates)} MB/s)" if rates else "") + ", "
           f"{link.per_collective_s * 1e3:.2f} ms per collective; probe "
           f"{probe.describe()} {probe_s * 1e3:.1f} ms/step (compute {how}: "
           f"{fitted.compute_s * 1e3:.1f} ms); predicted: " + "; ".join(
               f"{c.describe()} {r.step_s * 1e3:.1f} ms" for c, r in ranked[:3])
           + (f"; measuring {', '.join(c.describe() for c in order)}" if order
              else f"; none {chooser.predicted_gain:.0%} faster: measuring nothing more"))
    return order


def measured_compute(ex: Any) -> float | None:
    """The probe's compute per step, timed in its steps (``ComputeClock``), averaged over
    the ranks; None where any rank timed none (every rank calls this at the same step)."""
    mine = ex.compute_clock.estimate()
    value, timed = agree([mine or 0.0, 1.0 if mine else 0.0],
                         f"{ex.settings.name}.auto.compute")
    return value if timed == 1.0 and value > 0 else None


def priced(pool: Sequence[Strategy], unmeasured: Sequence[str], gather_with: str
            ) -> tuple[list[Strategy], list[str]]:
    """The candidates whose collectives the link probe measured, and what was left out: the
    sharded plans need the reduce-scatter and the gather (``gather_with``), the exchange the
    alltoall and the all-gather. (Ranked by a rate not measured, they would be ranked by the
    allreduce's, which Gloo's phases do not run at.)"""
    if not unmeasured:
        return list(pool), []
    gather = "alltoall" if gather_with == "alltoall" else "allgather"

    def needs(c: Strategy) -> set[str]:
        used = {"reducescatter", gather} if c.shards else set()
        return used | ({"alltoall", "allgather"} if c.exchanges else set())
    kept = [c for c in pool if not needs(c) & set(unmeasured)]
    if len(kept) == len(pool):
        return kept, []
    return kept, [f"the plans on {', '.join(sorted(set(unmeasured)))}: the link probe could not "
                  "measure their rate"]
