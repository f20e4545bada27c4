"""``load_model``: a saved model back with its optimizer wrapped, as ``hvd.load_model``."""

from __future__ import annotations

from hvd_overlap.adapters import keras_api
from hvd_overlap.keras.optimizer import DistributedOptimizer


def load_model(filepath, custom_optimizers=None, custom_objects=None, compile: bool = True,
               legacy_opts: bool = False, **options):
    """Load a saved model whose optimizer comes back wrapped, with its saved state, as
    ``hvd.load_model`` does: ``DistributedOptimizer(<saved optimizer>, **options)``
    (``strategy=`` and the other keywords of ``DistributedOptimizer``). A plain
    ``tf.keras.models.load_model`` gives the plain optimizer, which no longer averages.
    ``legacy_opts``: the file holds a ``tf.keras.optimizers.legacy`` optimizer."""
    classes = keras_api.optimizer_classes(legacy_opts)
    classes.update({c.__name__: c for c in custom_optimizers or ()})
    objects = {name: _Wrapping(c, options) for name, c in classes.items()}
    objects.update(custom_objects or {})
    return keras_api.keras.models.load_model(filepath, custom_objects=objects, compile=compile)


class _Wrapping:
    """What ``load_model``'s custom objects resolve an optimizer's class name to."""

    def __init__(self, cls: type, options: dict):
        self.cls, self.options = cls, options

    def from_config(self, config, custom_objects=None):
        return DistributedOptimizer(self.cls.from_config(config), **self.options)
