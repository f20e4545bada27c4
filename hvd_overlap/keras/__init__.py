"""Keras API: ``DistributedOptimizer`` (drop-in for Horovod's) and callbacks."""

# first: the stack (hvd_overlap.comm checks TensorFlow and Horovod), then the refusal of a
# tf.keras that is Keras 3 (TF >= 2.16 without TF_USE_LEGACY_KERAS=1), each naming the fix,
# before anything else is imported or run
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
from hvd_overlap.keras.callbacks import OverlapCallback
from hvd_overlap.keras.loading import load_model
from hvd_overlap.keras.optimizer import DistributedOptimizer

__all__ = ["Auto", "BatchSizeScheduler", "Deferred", "DistributedOptimizer", "Exchange",
           "Hybrid", "Layerwise", "OverlapCallback", "Sharded", "ShardedHybrid", "StockHorovod",
           "load_model"]
