"""Keras's internals behind one interface per Keras generation, chosen once at import.

Every private Keras / TensorFlow / Horovod name the runtime needs is read here and nowhere else:
``keras2`` for Keras 2 (``tf.keras`` of TF 2.15, tf-keras 2.17/2.18 with
``TF_USE_LEGACY_KERAS=1``), ``keras3`` for Keras 3 (what ``tf.keras`` is on TF >= 2.16
otherwise), both re-exporting ``common``. The rest of the package calls
``keras_api.<function>`` and never asks which Keras it runs on.

Layering: this package imports ``hvd_overlap.core`` only (and TensorFlow, Horovod, Keras), so
``comm``, ``growth`` and ``keras`` all stand on it (``tests/test_layers.py``).
"""

from hvd_overlap.stack import require_stack

require_stack()  # TensorFlow and Horovod present and usable, each failure naming the fix

# isort: split
from hvd_overlap.adapters.generation import generation_of, keras_behind_tf_keras  # noqa: E402

if generation_of(keras_behind_tf_keras()[1]) == 3:
    from hvd_overlap.adapters import keras3 as keras_api
else:
    from hvd_overlap.adapters import keras2 as keras_api

__all__ = ["keras_api"]
