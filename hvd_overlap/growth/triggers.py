"""When to grow the global batch, and by how much: the triggers a ``BatchGrowth`` asks at each
epoch end (pure Python). ``Milestones`` (fixed epochs), ``Periodic`` (every K epochs) and
``Plateau`` (a monitored metric stops improving); each keeps its state for an exact resume."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol


def int_factor(factor: Any, what: str) -> int:
    if isinstance(factor, int | float) and not isinstance(factor, bool) \
            and float(factor).is_integer() and factor >= 2:
        return int(factor)
    raise ValueError(
        f"{what}: growth factor {factor!r} must be an integer >= 2 so that the global batch "
        "stays an exact multiple of the per-rank batch; use e.g. 2")


class Trigger(Protocol):
    """Decides at an epoch end by which integer factor to grow the batch (1: no growth)."""

    needs_metric: bool

    def factor(self, epoch: int, metric: float | None) -> int: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class Milestones:
    """Grow by ``milestones[e]`` so that epoch ``e`` is the first one run with the new batch.

    ``Milestones({10: 2, 20: 2})`` doubles the batch at epoch 10 and again at epoch 20.
    """

    needs_metric = False

    def __init__(self, milestones: Mapping[int, int]):
        if not milestones:
            raise ValueError("Milestones: give at least one {epoch: factor} entry")
        self.milestones: dict[int, int] = {}
        for epoch, factor in milestones.items():
            if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
                raise ValueError(f"Milestones: epoch {epoch!r} must be an integer >= 1 "
                                 "(the first epoch run with the grown batch)")
            self.milestones[epoch] = int_factor(factor, f"Milestones[{epoch}]")

    def factor(self, epoch: int, metric: float | None) -> int:
        return self.milestones.get(epoch + 1, 1)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass


class Periodic:
    """Grow by ``factor`` every ``every`` epochs (AdaBatch): at epochs ``start + every * k``."""

    needs_metric = False

    def __init__(self, every: int, factor: int = 2, start: int = 0):
        if every < 1 or start < 0:
            raise ValueError(f"Periodic: need every >= 1 and start >= 0 (got {every}, {start})")
        self.every, self.start = every, start
        self.growth = int_factor(factor, "Periodic")

    def factor(self, epoch: int, metric: float | None) -> int:
        nxt = epoch + 1 - self.start
        return self.growth if nxt > 0 and nxt % self.every == 0 else 1

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass


class Plateau:
    """Grow by ``factor`` when the monitored value stalls (Smith et al.: grow instead of decay).

    Like Keras' ``ReduceLROnPlateau``: an epoch improves if ``value < best - min_delta``
    (``mode="min"``; ``"max"`` mirrors it). After ``patience`` epochs without improvement the
    batch grows and the next ``cooldown`` epochs neither count nor trigger.
    """

    needs_metric = True

    def __init__(self, factor: int = 2, patience: int = 3, min_delta: float = 1e-3,
                 cooldown: int = 0, mode: str = "min"):
        if patience < 1 or cooldown < 0 or min_delta < 0:
            raise ValueError("Plateau: need patience >= 1, cooldown >= 0 and min_delta >= 0")
        if mode not in ("min", "max"):
            raise ValueError(f"Plateau: mode must be 'min' or 'max', not {mode!r}")
        self.growth = int_factor(factor, "Plateau")
        self.patience, self.min_delta, self.cooldown, self.mode = (
            patience, min_delta, cooldown, mode)
        self.best: float | None = None
        self.wait = 0
        self.cooldown_left = 0

    def _improved(self, value: float) -> bool:
        if self.best is None:
            return True
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def factor(self, epoch: int, metric: float | None) -> int:
        if metric is None or not math.isfinite(metric):
            raise ValueError(f"Plateau needs a finite monitored value at epoch {epoch}, "
                             f"got {metric!r}")
        in_cooldown = self.cooldown_left > 0
        if in_cooldown:
            self.cooldown_left -= 1
            self.wait = 0
        if self._improved(metric):
            self.best, self.wait = float(metric), 0
            return 1
        if in_cooldown:
            return 1
        self.wait += 1
        if self.wait < self.patience:
            return 1
        self.wait, self.cooldown_left = 0, self.cooldown
        return self.growth

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "wait": self.wait, "cooldown_left": self.cooldown_left}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.best = state["best"]
        self.wait, self.cooldown_left = int(state["wait"]), int(state["cooldown_left"])
