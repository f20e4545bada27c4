"""Predicted wall time of a training run whose batch grows (``hvd-overlap simulate --growth``):
per phase of the schedule, the step of stock Horovod and of the plan ``strategy="auto"``
would choose again for that batch (``autoplan.choose`` on the profile scaled to the batch),
times the phase's steps; then the time to a target epoch, with the growth and with the first
batch throughout.

The schedule is in global batches, as ``BatchGrowth``'s ``initial_batch`` (``"3x32,3x64,12x128"``:
3 epochs at 32, 3 at 64, 12 at 128); on P ranks each rank's batch is the global one over P, and
an epoch of ``samples`` takes ``samples // global batch`` steps (the remainder dropped, as the
growth data loop does).

Besides the steps, a run waits for what :class:`Overheads` names: each epoch's evaluation,
callbacks and ``fit`` set-up, and the train function's tracing (at the first step, and once
more at the first new batch: Keras's train function then takes any batch). A profile's compute
is scaled linearly with the batch, which is about right on a GPU at moderate batches; where the
compute-only step was measured at several per-rank batches (``compute_at``), each phase's
compute is interpolated from those instead (a CPU core used poorly at a small batch does not
slow 16x over a 16x batch). Not modelled: ``auto``'s settling trials.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from hvd_overlap.core import autoplan
from hvd_overlap.core.simulate import Cluster, Profile
from hvd_overlap.core.strategy import Strategy


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
class Overheads:
    """A run's time outside its steps: ``epoch_s`` per epoch (evaluation, callbacks, ``fit``'s
    own set-up), ``trace_s`` for the first step's trace (the first epoch's other first-time
    costs with it, as a first evaluation's trace) and ``retrace_s`` at the first new batch
    (None: ``trace_s``; a retrace reuses what the first trace converted, and costs less)."""

    epoch_s: float = 0.0
    trace_s: float = 0.0
    retrace_s: float | None = None

    @property
    def again_s(self) -> float:
        return self.trace_s if self.retrace_s is None else self.retrace_s


def interpolated(batch: int, measured: Mapping[int, float]) -> float:
    """The compute-only step at a per-rank ``batch`` from steps ``measured`` at other per-rank
    batches: linear between the two nearest, proportional to the batch beyond them."""
    xs = sorted(measured)
    if not xs:
        raise ValueError("no measured compute to interpolate from")
    if batch <= xs[0] or batch >= xs[-1]:
        edge = xs[0] if batch <= xs[0] else xs[-1]
        return measured[edge] * batch / edge
    lo = max(x for x in xs if x <= batch)
    hi = min(x for x in xs if x >= batch)
    if lo == hi:
        return measured[lo]
    return measured[lo] + (measured[hi] - measured[lo]) * (batch - lo) / (hi - lo)


@dataclass(frozen=True)
class PhaseTime:
    """One phase on one cluster: steps per epoch, the compute-only step, stock's step, the
    re-chosen plan's step."""

    phase: Phase
    per_rank_batch: int
    steps_per_epoch: int
    compute_s: float
    stock_s: float
    plugin_s: float
    plan: Strategy

    def epoch_s(self, plugin: bool, overhead_s: float = 0.0) -> float:
        return self.steps_per_epoch * (self.plugin_s if plugin else self.stock_s) + overhead_s


def phase_times(profile: Profile, cluster: Cluster, phases: Sequence[Phase], samples: int,
                compute_at: Mapping[int, float] | None = None) -> tuple[PhaseTime, ...] | None:
    """Each phase on ``cluster`` (None: a global batch does not split over its ranks), the
    compute of its per-rank batch from ``compute_at`` where given (see :func:`interpolated`),
    else the profile's scaled with the batch."""
    out = []
    for ph in phases:
        if ph.batch % cluster.ranks:
            return None
        per_rank = ph.batch // cluster.ranks
        at = autoplan.at_batch(profile, per_rank / profile.batch_size)
        if compute_at:
            at = at.scaled(interpolated(per_rank, compute_at) / at.compute_s)
        choice = autoplan.choose(at, cluster, family="every")
        out.append(PhaseTime(ph, per_rank, max(samples // ph.batch, 1), at.compute_s,
                             choice.stock.step_s, choice.result.step_s, choice.best))
    return tuple(out)


def seconds_to_epoch(pts: Sequence[PhaseTime], epoch: int, plugin: bool,
                     overheads: Overheads = Overheads()) -> float:
    """Seconds from the start to the end of ``epoch`` (1-based) through the phases ``pts``,
    stock's steps or (``plugin``) the re-chosen plan's, with ``overheads``: every epoch's, the
    first step's trace and, if reached, the first new batch's."""
    left, s = epoch, overheads.trace_s
    retrace = next((i for i, pt in enumerate(pts) if pt.phase.batch != pts[0].phase.batch), -1)
    for i, pt in enumerate(pts):
        if left <= 0:
            break
        n = min(pt.phase.epochs, left)
        s += n * pt.epoch_s(plugin, overheads.epoch_s)
        s += overheads.again_s if i == retrace else 0.0
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
              target_epoch: int | None = None, overheads: Overheads = Overheads(),
              compute_at: Mapping[int, float] | None = None) -> RunTimes | None:
    """Time to the end of epoch ``target_epoch`` (1-based; default: the schedule's last) on
    ``cluster``, ``overheads`` besides the steps (``compute_at``: see :func:`phase_times`);
    None where a batch does not split over its ranks."""
    total = sum(ph.epochs for ph in phases)
    target = total if target_epoch is None else target_epoch
    if not 1 <= target <= total:
        raise ValueError(f"--target-epoch {target}: the schedule has epochs 1 to {total}")
    times = phase_times(profile, cluster, phases, samples, compute_at)
    if times is None:
        return None
    first = times[0]  # the first batch throughout: its phase, as long as the target
    small = (replace(first, phase=replace(first.phase, epochs=target)),)

    def until(pts: Sequence[PhaseTime], plugin: bool) -> float:
        return seconds_to_epoch(pts, target, plugin, overheads)

    return RunTimes(cluster.ranks, target, until(small, False), until(times, False),
                    until(small, True), until(times, True), times)
