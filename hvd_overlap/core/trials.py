"""An online check between a few settings of one run, as ``core.chooser.Chooser`` runs it: each
setting in turn trains ``warm`` steps (the first one retraces) and then ``timed`` steps; the
ranks agree on each one's median step; the fastest is kept -- the first (the model's choice)
unless another is faster by more than ``margin``. No second probe trial, no confirmation, no
early end: one trial each. Every rank counts the same steps, so every rank switches alike.

Pure Python: the agreement across ranks (an allreduce of a few numbers) is passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hvd_overlap.core.chooser import Chooser
from hvd_overlap.core.margin import as_share_of_incumbent
from hvd_overlap.core.trial import MARGIN, TrialClock


@dataclass(frozen=True)
class Setting:
    """One of the settings checked, as the chooser's plan (``describe``: its name)."""

    name: str

    def describe(self) -> str:
        return self.name


class Trials:
    """Which of ``names`` runs now (``running``), what each measured, and whether the check
    is over (``settled``). ``margin`` is stated on the challenger's side (``measured * (1 +
    margin) < first``); ``forced`` (tests) is kept whatever the timings."""

    def __init__(self, names: Sequence[str], agree: Callable[[list[float]], list[float]],
                 warm: int = 2, timed: int = 5, margin: float = MARGIN,
                 forced: str | None = None):
        self.names, self.forced = tuple(names), forced
        self._switched: str | None = None
        first, *rest = (Setting(n) for n in self.names)
        self.chooser = Chooser(
            first, "trials", TrialClock(warm + timed, agree, skip_first=warm), self._perform,
            lambda _probe_s: rest, say=lambda _: None, clear_gain=None,
            margin=as_share_of_incumbent(margin), probe_again=False, confirm=False,
            forced=None if forced is None else Setting(forced))

    def _perform(self, setting: Setting) -> bool:
        self._switched = setting.name
        return True

    @property
    def running(self) -> str:
        return self.chooser.current.name

    @property
    def settled(self) -> bool:
        return self.chooser.settled

    @property
    def measured(self) -> dict[str, float]:
        """Each measured setting's agreed step (seconds; ``inf``: no rank timed a step)."""
        return {s.name: t for s, t in self.chooser.measured.items()}

    def observe(self, seconds: float, usable: bool = True) -> str | None:
        """Count one train step of ``seconds`` (``usable``: a steady one); the setting to
        switch to now, if any."""
        self._switched = None
        self.chooser.observe(seconds, usable)
        return self._switched

    def describe(self) -> str:
        """``rows 241.0 ms, gather 485.0 ms: rows`` (after the check)."""
        measured = self.measured
        parts = ", ".join(f"{n} {measured[n] * 1e3:.1f} ms" for n in self.names
                          if n in measured)
        return f"{parts}: {self.running}" + (" (forced)" if self.forced else "")
