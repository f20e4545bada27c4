"""The timer of an online check's trials (``TrialClock``): one trial after another, each a
fixed number of steps, the steady ones timed, the ranks agreeing on each trial's step; and the
margin (``MARGIN``) a measured setting must beat. The decisions are ``core.chooser``'s.

Pure Python: the agreement across ranks (an allreduce of a few numbers) is passed in.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

#: how much faster another setting must measure to replace the first (the model's choice):
#: ``core.trials.Trials`` states it on the challenger's side
#: (``measured * (1 + MARGIN) < first``)
MARGIN = 0.01


@dataclass
class TrialClock:
    """The timing of one trial after another, each ``length`` steps long, the same on every
    rank: the steady steps are timed (not the first ``skip_first`` of a trial, not an unusable
    one, nor a step that traced and the ``skip_after_trace`` after it), and when a trial ends
    the ranks agree on its step -- the mean over the ranks that timed any of each one's median;
    ``math.inf`` if none could. The one trial timer: ``core.chooser.Chooser`` (so ``auto``
    and the exchange's check, ``core.trials.Trials``) counts and times its trials with it."""

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
