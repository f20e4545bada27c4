"""hvd-overlap: layer-ordered, overlapped gradient communication for Horovod + TensorFlow/Keras.

Import it before ``hvd.init()`` (or call ``hvd_overlap.init()``): it sets the Horovod environment
its strategies need (see ``hvd_overlap._env``).
"""

from hvd_overlap._env import init
from hvd_overlap.plan import DEFAULT_BUCKET_BYTES, Plan
from hvd_overlap.strategies import STRATEGIES

__version__ = "0.1.0"
__all__ = ["DEFAULT_BUCKET_BYTES", "STRATEGIES", "Plan", "__version__", "init"]
