"""Predicted wall time of a training run whose batch grows (``hvd-overlap simulate --growth``):
per phase of the schedule, the step of stock Horovod and of the plan ``strategy="auto"``
would choose again for that batch (``autoplan.choose`` on the profile scaled to the batch),
times the phase's steps; then the time to a target epoch, with the growth and with the first
batch throughout.

The schedule is in global batches, as ``BatchGrowth``'s ``initial_batch`` (``"3x32,3x64,12x128"``:
3 epochs at 32, 3 at 64, 12 at 128); on P ranks each rank's batch is the global one over P, and
an epoch of ``samples`` takes ``samples // global batch`` steps (the remainder dropped, as the
growth data loop does). What is not modelled:
tracing, ``auto``'s settling trials, evaluation and callbacks (``epoch_overhead_s`` adds a fixed
cost per epoch), and a compute that does not grow linearly with the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from hvd_overlap.core import autoplan
from hvd_overlap.core.autoplan import Candidate
from hvd_overlap.core.simulate import Cluster, Profile


@dataclass(frozen=True)
class Phase:
    """``epochs`` epochs at a global batch of ``batch``."""

    epochs: int
    batch: int


def parse_schedule(text: str) -> tuple[Phase, ...]:
    """``"3x32,3x64,12x128"`` -> phases (epochs x global batch)."""
    phases = []
    for part in text.split(","):
        try:
            epochs, batch = (int(x) for x in part.strip().lower().split("x"))
        except ValueError:
            raise ValueError(f"--growth {text!r}: write it as EPOCHSxBATCH,... (global "
                             "batches), e.g. 3x32,3x64,12x128") from None
        if epochs < 1 or batch < 1:
            raise ValueError(f"--growth {text!r}: epochs and batches of at least 1")
        phases.append(Phase(epochs, batch))
    return tuple(phases)


@dataclass(frozen=True)
class PhaseTime:
    """One phase on one cluster: steps per epoch, stock's step, the re-chosen plan's step."""

    phase: Phase
    per_rank_batch: int
    steps_per_epoch: int
    stock_s: float
    plugin_s: float
    plan: Candidate

    def epoch_s(self, plugin: bool, overhead_s: float = 0.0) -> float:
        return self.steps_per_epoch * (self.plugin_s if plugin else self.stock_s) + overhead_s


def phase_times(profile: Profile, cluster: Cluster, phases: Sequence[Phase],
                samples: int) -> tuple[PhaseTime, ...] | None:
    """Each phase on ``cluster`` (None: a global batch does not split over its ranks)."""
    out = []
    for ph in phases:
        if ph.batch % cluster.ranks:
            return None
        per_rank = ph.batch // cluster.ranks
        at = autoplan.at_batch(profile, per_rank / profile.batch_size)
        choice = autoplan.choose(at, cluster, family="every")
        out.append(PhaseTime(ph, per_rank, max(samples // ph.batch, 1), choice.stock.step_s,
                             choice.result.step_s, choice.best))
    return tuple(out)


def seconds_to_epoch(pts: Sequence[PhaseTime], epoch: int, plugin: bool,
                     overhead_s: float = 0.0) -> float:
    """Seconds from the start to the end of ``epoch`` (1-based) through the phases ``pts``,
    stock's steps or (``plugin``) the re-chosen plan's, ``overhead_s`` per epoch besides."""
    left, s = epoch, 0.0
    for pt in pts:
        n = min(pt.phase.epochs, left)
        s += n * pt.epoch_s(plugin, overhead_s)
        left -= n
    return s


@dataclass(frozen=True)
class RunTimes:
    """Seconds to the end of the target epoch: stock and the plugin, each with the growth
    schedule and with its first batch throughout."""

    ranks: int
    target_epoch: int
    stock_small: float
    stock_growth: float
    plugin_small: float
    plugin_growth: float
    phases: tuple[PhaseTime, ...]


def run_times(profile: Profile, cluster: Cluster, phases: Sequence[Phase], samples: int,
              target_epoch: int | None = None, epoch_overhead_s: float = 0.0
              ) -> RunTimes | None:
    """Time to the end of epoch ``target_epoch`` (1-based; default: the schedule's last) on
    ``cluster``; None where a batch does not split over its ranks."""
    total = sum(ph.epochs for ph in phases)
    target = total if target_epoch is None else target_epoch
    if not 1 <= target <= total:
        raise ValueError(f"--target-epoch {target}: the schedule has epochs 1 to {total}")
    times = phase_times(profile, cluster, phases, samples)
    if times is None:
        return None
    first = times[0]  # the first batch throughout: its phase, as long as the target
    small = (replace(first, phase=replace(first.phase, epochs=target)),)

    def until(pts: Sequence[PhaseTime], plugin: bool) -> float:
        return seconds_to_epoch(pts, target, plugin, epoch_overhead_s)

    return RunTimes(cluster.ranks, target, until(small, False), until(times, False),
                    until(small, True), until(times, True), times)
