"""Keras's internals behind one interface per Keras generation, chosen once at import.

Every private Keras / TensorFlow / Horovod name the runtime needs is read here and nowhere else:
``keras2`` holds them for Keras 2 (``tf.keras`` of TF 2.15, tf-keras 2.17/2.18). Importing
this package refuses a ``tf.keras`` that is Keras 3, naming the fix, before any collective.
The rest of the package calls ``keras_api.<function>`` and never asks which Keras it runs on.

Layering: this package imports ``hvd_overlap.core`` only (and TensorFlow, Horovod), so ``comm``,
``growth`` and ``keras`` all stand on it (``tests/test_layers.py``).
"""

from hvd_overlap.stack import require_stack

require_stack()  # TensorFlow and Horovod present and usable, each failure naming the fix

# isort: split
from hvd_overlap.adapters import keras2 as keras_api  # noqa: E402

__all__ = ["keras_api"]
