"""Keras API: ``DistributedOptimizer`` (drop-in for ``horovod.tensorflow.keras``'s)."""

from hvd_overlap.keras.optimizer import DistributedOptimizer

__all__ = ["DistributedOptimizer"]
