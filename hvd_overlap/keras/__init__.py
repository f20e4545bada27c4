"""Keras API: ``DistributedOptimizer`` (drop-in for Horovod's) and callbacks."""

# first: the stack (hvd_overlap.comm checks TensorFlow and Horovod, naming the fix), then the
# adapter of the Keras generation tf.keras is, before anything else is imported or run
import hvd_overlap.comm  # noqa: F401
from hvd_overlap.adapters import keras_api  # noqa: F401

# isort: split
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
from hvd_overlap.keras.broadcast import BroadcastGlobalVariablesCallback, broadcast_variables
from hvd_overlap.keras.callbacks import OverlapCallback
from hvd_overlap.keras.loading import load_model
from hvd_overlap.keras.optimizer import DistributedOptimizer

__all__ = ["Auto", "BatchSizeScheduler", "BroadcastGlobalVariablesCallback", "Deferred",
           "DistributedOptimizer", "Exchange", "Hybrid", "Layerwise", "OverlapCallback", "Sharded",
           "ShardedHybrid", "StockHorovod", "broadcast_variables", "load_model"]
