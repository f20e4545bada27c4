"""One executor per mode, chosen once when the optimizer is created.

- ``ImmediateExecutor`` (horovod, layerwise): reduce every bucket during backprop, apply once;
- ``AccumulatingExecutor`` (either, with ``backward_passes_per_step > 1``): sum N passes, then
  reduce and apply as the immediate one;
- ``DeferringExecutor`` (deferred, hybrid): backward-phase buckets now, forward-phase ones at
  the start of the next step;
- ``ShardedExecutor`` (sharded, sharded_hybrid): reduce-scatter, update this rank's slice,
  all-gather; ``MirroredShardedExecutor``: the same as a plan of ``auto``, its state mirrored
  in the optimizer's own whole slots.
"""

from __future__ import annotations

from typing import Any

from hvd_overlap.comm.methods import CommSettings, GradientMethod, SliceMethod
from hvd_overlap.comm.planner import Planner
from hvd_overlap.core.strategy import Strategy
from hvd_overlap.keras.executors.accumulating import AccumulatingExecutor
from hvd_overlap.keras.executors.base import Executor, Plain
from hvd_overlap.keras.executors.deferring import DeferringExecutor
from hvd_overlap.keras.executors.immediate import ImmediateExecutor
from hvd_overlap.keras.executors.mirrored import MirroredShardedExecutor
from hvd_overlap.keras.executors.sharded import ShardedExecutor

__all__ = ["AccumulatingExecutor", "DeferringExecutor", "Executor", "ImmediateExecutor",
           "MirroredShardedExecutor", "Plain", "ShardedExecutor", "make_executor"]


def make_executor(strategy: Strategy, opt: Any, plain: Plain, planner: Planner,
                  method: GradientMethod | SliceMethod, settings: CommSettings,
                  backward_passes_per_step: int = 1,
                  average_aggregated_gradients: bool = False,
                  sharded: type[ShardedExecutor] = ShardedExecutor) -> Executor:
    """The executor of ``strategy``'s mode (the combinations were validated before);
    ``sharded``: the class a sharded mode runs (``auto``'s: ``MirroredShardedExecutor``)."""
    args = (opt, plain, planner, method, settings)
    if strategy.shards:
        return sharded(*args)
    if strategy.defers:
        return DeferringExecutor(*args)
    if backward_passes_per_step > 1:
        return AccumulatingExecutor(*args, passes=backward_passes_per_step,
                                    average=average_aggregated_gradients)
    return ImmediateExecutor(*args)
