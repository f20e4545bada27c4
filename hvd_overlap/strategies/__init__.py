"""Strategies: how each bucket travels and when. ``get_strategy(name)`` looks one up."""

from __future__ import annotations

from hvd_overlap.strategies.base import CommSettings, Strategy
from hvd_overlap.strategies.deferred import DeferredStrategy, HybridStrategy
from hvd_overlap.strategies.horovod import HorovodStrategy
from hvd_overlap.strategies.layerwise import LayerwiseStrategy
from hvd_overlap.strategies.sharded import ShardedHybridStrategy, ShardedStrategy

STRATEGIES: dict[str, type[Strategy]] = {
    HorovodStrategy.name: HorovodStrategy,
    LayerwiseStrategy.name: LayerwiseStrategy,
    DeferredStrategy.name: DeferredStrategy,
    HybridStrategy.name: HybridStrategy,
    ShardedStrategy.name: ShardedStrategy,
    ShardedHybridStrategy.name: ShardedHybridStrategy,
}


def get_strategy(name: str) -> type[Strategy]:
    """The strategy class called ``name``, or a ValueError listing the valid names."""
    try:
        return STRATEGIES[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown strategy {name!r}; choose one of: {', '.join(sorted(STRATEGIES))}"
        ) from None


__all__ = ["STRATEGIES", "CommSettings", "Strategy", "get_strategy"]
