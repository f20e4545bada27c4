"""hvd-overlap: layer-ordered, overlapped gradient communication for Horovod + TensorFlow/Keras.

Importing the package (or any pure module: ``plan``, ``sharding``, ``batching``, ``simulate``)
loads neither TensorFlow nor Horovod, and nothing in the plugin changes Horovod's environment:
Horovod runs with the settings the user gave it. The Keras API is ``hvd_overlap.keras``.
"""

from __future__ import annotations

from typing import Any

from hvd_overlap.plan import DEFAULT_BUCKET_BYTES, Plan

__version__ = "0.2.0.dev0"
__all__ = ["DEFAULT_BUCKET_BYTES", "STRATEGIES", "Plan", "__version__", "init"]


def __getattr__(name: str) -> Any:
    # STRATEGIES needs TensorFlow and Horovod: loaded on first use only.
    if name == "STRATEGIES":
        from hvd_overlap.strategies import STRATEGIES

        return STRATEGIES
    raise AttributeError(f"module 'hvd_overlap' has no attribute {name!r}")


def init(*args: Any, **kwargs: Any) -> None:
    """``hvd.init()`` itself (kept so scripts written for 0.1 still run; the plugin no longer
    needs any Horovod setting, so ``hvd.init()`` is all a script has to call)."""
    import horovod.tensorflow as hvd

    hvd.init(*args, **kwargs)
