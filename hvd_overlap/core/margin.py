"""The one rule every choice between plans follows: keep the plan in use (the incumbent)
unless another measured (or predicted) faster by more than a margin -- timing noise and
rounding must not move the plan. Each site keeps its own margin; the rule is shared."""

from __future__ import annotations


def keep_unless_faster(measured: float, incumbent: float, margin: float) -> bool:
    """True if the incumbent stays: ``measured`` (the challenger's step) is not shorter than
    ``incumbent``'s by more than the share ``margin`` (``measured > incumbent * (1 -
    margin)``; at exactly that share, or below, the challenger wins)."""
    return measured > incumbent * (1 - margin)


def as_share_of_incumbent(margin: float) -> float:
    """A margin stated on the challenger's side (``measured * (1 + margin) < incumbent``) as
    :func:`keep_unless_faster`'s share of the incumbent: ``margin / (1 + margin)``."""
    return margin / (1 + margin)
