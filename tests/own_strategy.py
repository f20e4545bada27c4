"""A strategy that exists only in the tests, to show that a new strategy is one class and its
registration: ``Layerwise`` with its buckets issued in reversed order (input side first).
No module of the package knows it; ``registered()`` makes it known for a test's duration."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from hvd_overlap.core.choice import Layerwise
from hvd_overlap.core.plan import Plan, VarSpec
from hvd_overlap.core.strategy import register, unregister


@dataclass(frozen=True)
class ReversedLayerwise(Layerwise):
    """Layer-ordered buckets, each allreduced as soon as its gradients exist, issued input
    side first (the reverse of ``Layerwise``'s order)."""

    name: ClassVar[str] = "reversed_layerwise"

    def build_plan(self, specs: Sequence[VarSpec], ranks: int = 1) -> Plan:
        plan = super().build_plan(specs, ranks)
        return replace(plan, buckets=tuple(replace(b, index=i) for i, b in
                                           enumerate(reversed(plan.buckets))),
                       notes=plan.notes + ("buckets issued in reversed order",))


@contextlib.contextmanager
def registered() -> Iterator[type[ReversedLayerwise]]:
    """``ReversedLayerwise`` known by its name (the spelling, the CLI) while inside."""
    register(ReversedLayerwise)
    try:
        yield ReversedLayerwise
    finally:
        unregister(ReversedLayerwise)
