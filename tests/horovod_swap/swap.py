"""A pytest plugin that runs a Horovod test file with the plugin swapped in, as a user would.

``hvd.DistributedOptimizer`` (``horovod.tensorflow.keras`` and ``horovod.keras``) becomes
``hvd_overlap.keras.DistributedOptimizer(..., strategy=$HVDO_STRATEGY)``, and ``Model.fit`` gets
``OverlapCallback()`` appended when the compiled optimizer is one of the plugin's -- the whole
migration the README asks of a ``fit`` script. Used by ``scripts/horovod-own-tests``; Horovod's
test files are not part of this repository.
"""

from __future__ import annotations

import os

import horovod.keras
import horovod.tensorflow.keras as hvd
import tensorflow as tf

import hvd_overlap.keras as hvdo

STRATEGY = os.environ.get("HVDO_STRATEGY", "layerwise")


def _ours(optimizer, *args, **kwargs):
    return hvdo.DistributedOptimizer(optimizer, *args, strategy=STRATEGY, **kwargs)


_fit = tf.keras.Model.fit


def _fit_with_callback(self, *args, callbacks=None, **kwargs):
    callbacks = list(callbacks or [])
    if hasattr(getattr(self, "optimizer", None), "register_bucket_method") and not any(
            isinstance(c, hvdo.OverlapCallback) for c in callbacks):
        callbacks.append(hvdo.OverlapCallback())
    return _fit(self, *args, callbacks=callbacks, **kwargs)


def pytest_configure(config):
    hvd.DistributedOptimizer = _ours
    horovod.keras.DistributedOptimizer = _ours
    tf.keras.Model.fit = _fit_with_callback
