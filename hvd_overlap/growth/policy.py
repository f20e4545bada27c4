"""Run-time batch-size growth: the policy, in pure Python (no TensorFlow).

A :class:`BatchGrowth` holds the *global* batch (summed over ranks and accumulation
micro-batches), decides at each epoch end whether to grow it (a :class:`Milestones`,
:class:`Periodic` or :class:`Plateau` trigger), couples the learning rate to it and splits it
into what each rank runs::

    global_batch == per_rank_batch * accumulation_steps * num_ranks      (always exact)

How the split stays exact: growth factors are integers, the initial and the maximal global
batch must be multiples of ``num_ranks``, so ``global_batch / num_ranks`` is an integer ``b``.
If ``b`` exceeds ``max_per_rank_batch``, the rank runs ``accumulation_steps`` micro-batches
of ``per_rank_batch`` samples per optimizer step, where ``per_rank_batch`` is the largest
divisor of ``b`` not above the ceiling (powers of two give ``per_rank_batch == ceiling``).

Epochs are 0-based as in Keras. ``end_epoch(e)`` is called after epoch ``e``; a growth it
decides applies from epoch ``e + 1``. ``step()`` is called after every optimizer step (it
advances the LR warm-up). ``state_dict()`` / ``load_state_dict()`` make resuming exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hvd_overlap.growth.triggers import Milestones, Periodic, Plateau, Trigger

__all__ = ["BatchGrowth", "Growth", "Milestones", "Periodic", "Plateau", "Trigger", "split_batch"]

LR_SCALINGS = ("linear", "sqrt", "none")
STATE_VERSION = 1


def split_batch(global_batch: int, num_ranks: int,
                max_per_rank_batch: int | None = None) -> tuple[int, int]:
    """``(per_rank_batch, accumulation_steps)`` with product times ``num_ranks`` == global.

    ``per_rank_batch`` is the largest divisor of ``global_batch / num_ranks`` that does not
    exceed ``max_per_rank_batch`` (so ``accumulation_steps`` is as small as it can be).
    """
    if global_batch % num_ranks:
        raise ValueError(f"global batch {global_batch} is not a multiple of num_ranks="
                         f"{num_ranks}: use a multiple of {num_ranks}")
    per_rank = global_batch // num_ranks
    if max_per_rank_batch is None or per_rank <= max_per_rank_batch:
        return per_rank, 1
    steps = math.ceil(per_rank / max_per_rank_batch)
    while per_rank % steps:
        steps += 1
    return per_rank // steps, steps


@dataclass(frozen=True)
class Growth:
    """One growth event: ``epoch`` is the first epoch run with ``new_batch``."""

    epoch: int
    old_batch: int
    new_batch: int
    old_lr: float
    new_lr: float


class BatchGrowth:
    """Global batch, learning rate and per-rank split over a run (see the module docstring).

    Args:
        trigger: when and by how much to grow (``None``: never; a fixed-batch baseline).
        initial_batch: global batch of epoch 0, a multiple of ``num_ranks``.
        base_lr: learning rate at ``initial_batch``.
        num_ranks: data-parallel ranks (``hvd.size()``).
        lr_scaling: ``"linear"`` (Goyal et al.: lr proportional to the batch), ``"sqrt"``
            (lr proportional to its square root) or ``"none"`` (constant lr: Smith et al.'s
            "increase the batch instead of decaying the lr").
        warmup_steps: after each growth, the lr ramps linearly from the old to the new value
            over this many optimizer steps (step ``s = 0, 1, ...`` after the growth uses
            ``old + (new - old) * (s + 1) / warmup_steps``); 0 switches at once.
        max_per_rank_batch: per-rank memory ceiling; beyond it, gradient accumulation.
        max_global_batch: growth never goes beyond this (the last step is clipped to it);
            a multiple of ``num_ranks``.
        start_lr: if given, the run also begins with a warm-up: the first ``warmup_steps``
            steps ramp linearly from ``start_lr`` to ``base_lr`` (Goyal et al.'s gradual
            warm-up for a large initial batch, e.g. ``start_lr = base_lr / k``).
    """

    def __init__(self, trigger: Trigger | None, *, initial_batch: int, base_lr: float,
                 num_ranks: int = 1, lr_scaling: str = "linear", warmup_steps: int = 0,
                 max_per_rank_batch: int | None = None, max_global_batch: int | None = None,
                 start_lr: float | None = None):
        if num_ranks < 1:
            raise ValueError(f"num_ranks must be >= 1, got {num_ranks}")
        if initial_batch < 1 or initial_batch % num_ranks:
            raise ValueError(
                f"initial_batch={initial_batch} must be a positive multiple of num_ranks="
                f"{num_ranks} (the global batch is split evenly): use e.g. "
                f"{max(1, round(initial_batch / num_ranks)) * num_ranks}")
        if lr_scaling not in LR_SCALINGS:
            raise ValueError(f"lr_scaling must be one of {LR_SCALINGS}, not {lr_scaling!r}")
        if not base_lr > 0:
            raise ValueError(f"base_lr must be > 0, got {base_lr}")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if start_lr is not None and not (start_lr > 0 and warmup_steps > 0):
            raise ValueError(f"start_lr={start_lr} needs start_lr > 0 and warmup_steps > 0 "
                             "(the number of steps of the initial ramp to base_lr)")
        if max_per_rank_batch is not None and max_per_rank_batch < 1:
            raise ValueError(f"max_per_rank_batch must be >= 1, got {max_per_rank_batch}")
        if max_global_batch is not None:
            if max_global_batch < initial_batch:
                raise ValueError(f"max_global_batch={max_global_batch} is below initial_batch="
                                 f"{initial_batch}: raise it or lower initial_batch")
            if max_global_batch % num_ranks:
                raise ValueError(
                    f"max_global_batch={max_global_batch} is not a multiple of num_ranks="
                    f"{num_ranks}, so it cannot be split exactly: use "
                    f"{max_global_batch // num_ranks * num_ranks}")
        self.trigger = trigger
        self.initial_batch, self.base_lr, self.num_ranks = initial_batch, float(base_lr), num_ranks
        self.lr_scaling, self.warmup_steps = lr_scaling, warmup_steps
        self.max_per_rank_batch, self.max_global_batch = max_per_rank_batch, max_global_batch
        self.global_batch = initial_batch
        self.last_epoch = -1          # last epoch end seen
        self.steps = 0                # optimizer steps seen (all epochs)
        self.lr_from = self.lr_to = self.base_lr
        self.warmup_pos = warmup_steps  # steps done in the current ramp (complete at start)
        if start_lr is not None:        # ... unless the run starts with a warm-up
            self.lr_from, self.warmup_pos = float(start_lr), 0
        self.events: list[Growth] = []

    # -- derived quantities -----------------------------------------------------------------

    def lr_for(self, global_batch: int) -> float:
        """The coupled (target) learning rate for a global batch."""
        ratio = global_batch / self.initial_batch
        scale = {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[self.lr_scaling]
        return self.base_lr * scale

    @property
    def split(self) -> tuple[int, int]:
        return split_batch(self.global_batch, self.num_ranks, self.max_per_rank_batch)

    @property
    def per_rank_batch(self) -> int:
        """Samples per rank per micro-batch (one forward/backward)."""
        return self.split[0]

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per optimizer step (and per collective)."""
        return self.split[1]

    @property
    def samples_per_rank_step(self) -> int:
        """Samples each rank consumes per optimizer step (``per_rank * accumulation``)."""
        return self.global_batch // self.num_ranks

    @property
    def target_lr(self) -> float:
        return self.lr_to

    @property
    def lr(self) -> float:
        """Learning rate for the next optimizer step (inside a warm-up ramp or not)."""
        if self.warmup_pos >= self.warmup_steps:
            return self.lr_to
        frac = (self.warmup_pos + 1) / self.warmup_steps
        return self.lr_from + (self.lr_to - self.lr_from) * frac

    @property
    def can_accumulate(self) -> bool:
        """True if some reachable batch may need gradient accumulation."""
        return self.max_per_rank_batch is not None

    # -- progress ---------------------------------------------------------------------------

    def step(self, n: int = 1) -> None:
        """Record ``n`` optimizer steps (advances the warm-up)."""
        self.steps += n
        self.warmup_pos = min(self.warmup_steps, self.warmup_pos + n)

    def end_epoch(self, epoch: int, metric: float | None = None) -> Growth | None:
        """Decide after epoch ``epoch``; returns the growth applied from ``epoch + 1``, if any.

        An epoch already seen (``epoch <= last_epoch``, e.g. replayed after a resume) is
        ignored, so the call is idempotent.
        """
        if epoch <= self.last_epoch:
            return None
        self.last_epoch = epoch
        if self.trigger is None:
            return None
        factor = self.trigger.factor(epoch, metric)
        if factor == 1:
            return None
        new = self.global_batch * factor
        if self.max_global_batch is not None:
            new = min(new, self.max_global_batch)
        if new == self.global_batch:
            return None
        event = Growth(epoch + 1, self.global_batch, new, self.lr, self.lr_for(new))
        self.global_batch = new
        self.lr_from, self.lr_to = event.old_lr, event.new_lr
        self.warmup_pos = 0
        self.events.append(event)
        return event

    def phase_epochs(self, first: int, end: int) -> int | None:
        """How many epochs from ``first`` (up to ``end``, the fit's) run at the current batch
        before the next growth; None where a metric decides when (``Plateau``)."""
        capped = self.max_global_batch is not None and self.global_batch >= self.max_global_batch
        if self.trigger is None or capped:
            return max(end - first, 0)
        if self.trigger.needs_metric:
            return None
        for epoch in range(first, end):
            if self.trigger.factor(epoch, None) > 1:  # decided after ``epoch``
                return epoch + 1 - first
        return max(end - first, 0)

    # -- checkpointing ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state; the configuration itself is not included."""
        return {
            "version": STATE_VERSION, "global_batch": self.global_batch,
            "initial_batch": self.initial_batch, "last_epoch": self.last_epoch,
            "steps": self.steps, "lr_from": self.lr_from, "lr_to": self.lr_to,
            "warmup_pos": self.warmup_pos,
            "events": [vars(e).copy() for e in self.events],
            "trigger": self.trigger.state_dict() if self.trigger is not None else {},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state_dict()``; ``num_ranks`` may differ if the batch splits."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unknown BatchGrowth state version {state.get('version')!r}")
        if state["initial_batch"] != self.initial_batch:
            raise ValueError(f"state was saved with initial_batch={state['initial_batch']}, "
                             f"this policy has {self.initial_batch}: use the same configuration")
        split_batch(state["global_batch"], self.num_ranks)  # raises if it cannot be split
        self.global_batch = int(state["global_batch"])
        self.last_epoch, self.steps = int(state["last_epoch"]), int(state["steps"])
        self.lr_from, self.lr_to = float(state["lr_from"]), float(state["lr_to"])
        self.warmup_pos = int(state["warmup_pos"])
        self.events = [Growth(**e) for e in state["events"]]
        if self.trigger is not None:
            self.trigger.load_state_dict(state["trigger"])
