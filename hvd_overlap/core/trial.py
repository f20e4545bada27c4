"""An online check between a few settings of one run: each in turn trains ``warm`` steps (the
first one retraces) and then ``timed`` steps; the ranks agree on each one's median step; the
fastest is kept -- the first (the model's choice) unless another is faster by more than
``margin``. Every rank counts the same steps, so every rank switches at the same step.

Pure Python: the agreement across ranks (an allreduce of a few numbers) is passed in.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hvd_overlap.core.margin import as_share_of_incumbent, keep_unless_faster

#: how much faster another setting must measure to replace the first (the model's choice):
#: ``Trials`` states it on the challenger's side (``measured * (1 + MARGIN) < first``)
MARGIN = 0.01


@dataclass
class TrialClock:
    """The timing of one trial after another, each ``length`` steps long, the same on every
    rank: the steady steps are timed (not the first ``skip_first`` of a trial, not an unusable
    one, nor a step that traced and the ``skip_after_trace`` after it), and when a trial ends
    the ranks agree on its step -- the mean over the ranks that timed any of each one's median;
    ``math.inf`` if none could. The one trial machine: ``Trials`` below and
    ``strategy="auto"``'s executor both count and time their trials with it."""

    length: int
    agree: Callable[[list[float]], list[float]]  # the ranks' average of a few numbers
    skip_first: int = 0
    skip_after_trace: int = 0
    _steps: int = 0
    _skip: int = 0
    _samples: list[float] = field(default_factory=list)

    def observe(self, seconds: float, usable: bool = True, traced: bool = False
                ) -> float | None:
        """Count one step (``traced``: it traced a train function); the agreed step of the
        trial if this step ended it."""
        self._steps += 1
        if self._steps <= self.skip_first:
            pass
        elif traced:  # this step traced: never timed, nor the next few
            self._skip = self.skip_after_trace
        elif self._skip:
            self._skip -= 1
        elif usable:
            self._samples.append(seconds)
        if self._steps < self.length:
            return None
        mine = [statistics.median(self._samples), 1.0] if self._samples else [0.0, 0.0]
        total, timed = self.agree(mine)
        self.restart()
        return total / timed if timed else math.inf

    def restart(self) -> None:
        """Start a new trial (its steps and samples from zero)."""
        self._steps, self._samples = 0, []


@dataclass
class Trials:
    """Which of ``names`` runs now (``current``), what each measured, and whether the check
    is over (``settled``)."""

    names: Sequence[str]
    agree: Callable[[list[float]], list[float]]  # the ranks' average of a few numbers
    warm: int = 2
    timed: int = 5
    margin: float = MARGIN
    forced: str | None = None  # tests: keep this one whatever the timings
    current: int = 0
    measured: dict[str, float] = field(default_factory=dict)
    settled: bool = False
    _clock: TrialClock | None = None

    def __post_init__(self) -> None:
        self._clock = TrialClock(self.warm + self.timed, self.agree, skip_first=self.warm)

    @property
    def running(self) -> str:
        return self.names[self.current]

    def observe(self, seconds: float, usable: bool = True) -> str | None:
        """Count one train step of ``seconds`` (``usable``: a steady one); the setting to
        switch to now, if any."""
        if self.settled:
            return None
        step = self._clock.observe(seconds, usable)
        if step is None:
            return None
        self.measured[self.running] = step
        if self.current + 1 < len(self.names):
            self.current += 1
            return self.running
        self.settled = True
        best = self.pick()
        if best == self.running:
            return None
        self.current = list(self.names).index(best)
        return best

    def pick(self) -> str:
        """The first setting unless another measured faster by more than ``margin``."""
        if self.forced is not None:
            return self.forced
        first = self.names[0]
        best = min(self.names, key=lambda n: self.measured.get(n, math.inf))
        if keep_unless_faster(self.measured.get(best, math.inf),
                              self.measured.get(first, math.inf),
                              as_share_of_incumbent(self.margin)):
            return first
        return best

    def describe(self) -> str:
        """``rows 241.0 ms, gather 485.0 ms: rows`` (after the check)."""
        parts = ", ".join(f"{n} {self.measured[n] * 1e3:.1f} ms" for n in self.names
                          if n in self.measured)
        return f"{parts}: {self.running}" + (" (forced)" if self.forced else "")
