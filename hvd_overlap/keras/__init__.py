"""Keras API: ``DistributedOptimizer`` (drop-in for Horovod's) and callbacks."""

from hvd_overlap.growth.callback import BatchSizeScheduler
from hvd_overlap.keras.callbacks import OverlapCallback
from hvd_overlap.keras.optimizer import DistributedOptimizer, load_model

__all__ = ["BatchSizeScheduler", "DistributedOptimizer", "OverlapCallback", "load_model"]
