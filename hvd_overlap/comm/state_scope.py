"""Where the plugin creates its own variables (buffers, slices, slots, flags, gradient sums)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import tensorflow as tf


@contextmanager
def plugin_state() -> Iterator[None]:
    """Eagerly, outside the function being traced, and at the top name scope: a variable made
    at the first step -- possibly inside a ``tf.cond`` branch, as the loss-scale optimizer's --
    gets the same name as one made before training (slot names are parsed from them)."""
    with tf.init_scope(), tf.compat.v1.name_scope(None):
        yield
