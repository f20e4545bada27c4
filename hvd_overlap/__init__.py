"""hvd-overlap: layer-ordered, overlapped gradient communication for Horovod + TensorFlow/Keras.

The folder listing is the architecture:

- ``core``: the communication plan, the strategies that build it, the sharded partition (pure
  Python: importing them, or this package, loads neither TensorFlow nor Horovod);
- ``comm``: how a bucket travels and when (TensorFlow + Horovod collectives);
- ``keras``: the API users import (``DistributedOptimizer``, callbacks) and its executors;
- ``growth``: run-time batch-size growth (policy, callback, data side);
- ``tools``: the ``hvd-overlap`` CLI (doctor, plan, timeline, profile, simulate, calibrate),
  profiles, timelines.

Nothing in the plugin changes Horovod's environment: Horovod runs with the user's settings.

The package depends on no TensorFlow, Keras, numpy or Horovod (it uses the user's); importing
``hvd_overlap.keras`` (or ``comm``) first checks that stack (``hvd_overlap.stack``) and names
what is missing or unsupported, with the fix.
"""

from __future__ import annotations

from typing import Any

from hvd_overlap.core.choice import STRATEGIES
from hvd_overlap.core.plan import DEFAULT_BUCKET_BYTES, Plan
from hvd_overlap.stack import (
    TF_RANGE,
    StackError,
    require_stack,
    stack_problems,
    tensorflow_distributions,
)

__version__ = "0.2.0.dev0"
__all__ = ["DEFAULT_BUCKET_BYTES", "STRATEGIES", "TF_RANGE", "Plan", "StackError", "__version__",
           "init", "require_stack", "stack_problems", "tensorflow_distributions"]

def init(*args: Any, **kwargs: Any) -> None:
    """``hvd.init()`` itself (kept so scripts written for 0.1 still run; the plugin no longer
    needs any Horovod setting, so ``hvd.init()`` is all a script has to call)."""
    import horovod.tensorflow as hvd

    hvd.init(*args, **kwargs)
