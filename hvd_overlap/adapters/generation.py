"""Which Keras generation ``tf.keras`` is, and what to say when an object comes from the other
one. Pure rules (tested with any versions) plus one lookup of the loaded package."""

from __future__ import annotations

import sys
from typing import Any


def keras_behind_tf_keras() -> tuple[str, str]:
    """(package, version) of the Keras that ``tf.keras`` resolves to: ``keras`` 2.15 on TF
    2.15; on TF >= 2.16 ``keras`` 3.x, or ``tf_keras`` 2.x with ``TF_USE_LEGACY_KERAS=1``.
    TF's lazy ``tf.keras`` loads that package on first use."""
    import tensorflow as tf

    package = tf.keras.__name__.split(".")[0]
    return package, str(getattr(sys.modules.get(package), "__version__", "unknown"))


def generation_of(version: str) -> int:
    """2 or 3: the Keras generation of a Keras version string."""
    return 3 if version.split(".")[0] == "3" else 2


def other_generation_message(obj: Any, running: int) -> str | None:
    """The fix, if ``obj``'s class comes from the Keras generation the plugin does not run on
    in this process (``running``: the generation behind ``tf.keras``), else None. Mixing them
    happens when tf-keras and Keras 3 are both installed: ``keras.optimizers.Adam`` is Keras 3
    whatever ``TF_USE_LEGACY_KERAS`` says."""
    package = type(obj).__module__.split(".")[0]
    version = str(getattr(sys.modules.get(package), "__version__", ""))
    if not version or package not in ("keras", "tf_keras") or generation_of(version) == running:
        return None
    name = type(obj).__name__
    if running == 2:
        return (f"{name} is a Keras 3 object ({package} {version}) but tf.keras is Keras 2 here "
                f"(TF_USE_LEGACY_KERAS=1 with tf-keras): use tf.keras.optimizers.{name} and "
                "tf.keras models throughout, or unset TF_USE_LEGACY_KERAS (or uninstall "
                "tf-keras) to train Keras 3 models")
    return (f"{name} is a Keras 2 object ({package} {version}) but tf.keras is Keras 3 here: use "
            f"keras.optimizers.{name} and Keras 3 models throughout, or export "
            "TF_USE_LEGACY_KERAS=1 before TensorFlow is imported to train tf-keras models")
