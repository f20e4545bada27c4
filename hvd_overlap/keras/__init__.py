"""Keras API: ``DistributedOptimizer`` (drop-in for Horovod's) and callbacks."""

from hvd_overlap.core.choice import (
    Auto,
    Deferred,
    Exchange,
    Hybrid,
    Layerwise,
    Sharded,
    ShardedHybrid,
    StockHorovod,
)
from hvd_overlap.growth.callback import BatchSizeScheduler
from hvd_overlap.keras.callbacks import OverlapCallback
from hvd_overlap.keras.loading import load_model
from hvd_overlap.keras.optimizer import DistributedOptimizer

__all__ = ["Auto", "BatchSizeScheduler", "Deferred", "DistributedOptimizer", "Exchange",
           "Hybrid", "Layerwise", "OverlapCallback", "Sharded", "ShardedHybrid", "StockHorovod",
           "load_model"]
