"""hvd-overlap: layer-ordered, overlapped gradient communication for Horovod + TensorFlow/Keras.

The folder listing is the architecture:

- ``core``: the communication plan, the strategies that build it, the sharded partition (pure
  Python: importing them, or this package, loads neither TensorFlow nor Horovod);
- ``comm``: how a bucket travels and when (TensorFlow + Horovod collectives);
- ``keras``: the API users import (``DistributedOptimizer``, callbacks) and its executors;
- ``growth``: run-time batch-size growth (policy, callback, data side);
- ``tools``: the ``hvd-overlap`` CLI (plan, timeline, profile, simulate), profiles, timelines.

Nothing in the plugin changes Horovod's environment: Horovod runs with the user's settings.
"""

from __future__ import annotations

from typing import Any

from hvd_overlap.core.plan import DEFAULT_BUCKET_BYTES, Plan
from hvd_overlap.core.strategies import STRATEGIES

__version__ = "0.2.0.dev0"
__all__ = ["DEFAULT_BUCKET_BYTES", "STRATEGIES", "Plan", "__version__", "init"]


def init(*args: Any, **kwargs: Any) -> None:
    """``hvd.init()`` itself (kept so scripts written for 0.1 still run; the plugin no longer
    needs any Horovod setting, so ``hvd.init()`` is all a script has to call)."""
    import horovod.tensorflow as hvd

    hvd.init(*args, **kwargs)
