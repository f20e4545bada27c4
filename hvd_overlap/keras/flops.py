"""Forward FLOPs of a Keras layer, and whether a ``Dense`` layer's kernel can be exchanged: read
from the layer's shapes. ``strategy="auto"`` weighs its profile's layers with them at run time;
``hvd_overlap.tools.flops`` builds whole-model profiles from them.

Convolutions and dense layers count from their kernel and output shapes (a multiply-add is 2
FLOPs); every other layer (BatchNormalization, activations, pooling, Add, padding) a few FLOPs
per output element.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from hvd_overlap.core.plan import layer_of


def shape_of(s: Any) -> tuple[int, ...]:
    """One output shape without the batch dimension (the first of several)."""
    if isinstance(s, list):
        s = s[0]
    return tuple(int(d) for d in s[1:])


def layer_flops(layer: Any, batch: int) -> float:
    """Forward FLOPs of ``layer`` on a batch of ``batch`` samples."""
    import tensorflow as tf

    L = tf.keras.layers
    out = shape_of(layer.output_shape)
    elements = float(np.prod(out)) if out else 1.0
    if isinstance(layer, L.DepthwiseConv2D):
        kh, kw = layer.kernel_size
        return batch * elements * 2 * kh * kw
    if isinstance(layer, L.Conv2D):  # also Conv2DTranspose (same count)
        kh, kw = layer.kernel_size
        cin = int(layer.kernel.shape[-2]) if not isinstance(layer, L.Conv2DTranspose) \
            else int(layer.kernel.shape[-1])
        bias = 1 if layer.use_bias else 0
        return batch * elements * (2 * kh * kw * cin + bias)
    if isinstance(layer, L.Dense):
        fan_in = int(layer.kernel.shape[0])
        return batch * elements * (2 * fan_in + (1 if layer.use_bias else 0))
    if isinstance(layer, L.MaxPooling2D | L.AveragePooling2D):
        ph, pw = layer.pool_size
        return batch * elements * ph * pw
    if isinstance(layer, L.BatchNormalization):
        return batch * elements * 4
    return batch * elements  # activations, Add, padding, flatten, global pooling (approx.)


def dense_kernel(layer: Any) -> tuple[int, int] | None:
    """``(n_in, n_out)`` of a ``Dense`` layer applied to rows (a 2-D input): a kernel the factor
    exchange can carry (``Layer.dense``); None for any other layer (or a frozen one)."""
    import tensorflow as tf

    if not isinstance(layer, tf.keras.layers.Dense) or not layer.trainable:
        return None
    try:
        rows = len(shape_of(layer.input_shape)) == 1
    except (AttributeError, RuntimeError):  # not called yet, or called on several shapes
        return None
    n_in, n_out = (int(d) for d in layer.kernel.shape)
    return (n_in, n_out) if rows else None


def layer_flops_by_name(model: Any) -> dict[str, float]:
    """Forward FLOPs at batch 1 of every layer with trainable weights, by the layer name its
    variables carry (``core.plan.layer_of``); a layer without weights adds its FLOPs to the next
    one that has some. Layers whose shapes are unknown (subclassed models) are left out."""
    out: dict[str, float] = {}
    carried = 0.0
    for layer in _leaf_layers(model):
        try:
            f = float(layer_flops(layer, 1))
        except Exception:  # noqa: BLE001 -- no static shapes: leave it to the parameter count
            f = 0.0
        weights = layer.trainable_weights
        if weights:
            out[layer_of(weights[0].name)] = f + carried if f else 0.0
            carried = 0.0
        else:
            carried += f
    return {k: v for k, v in out.items() if v > 0}


def _leaf_layers(layer: Any):
    subs = getattr(layer, "layers", None)
    if not subs:
        if not isinstance(layer, tf.keras.layers.InputLayer):
            yield layer
        return
    for sub in subs:
        yield from _leaf_layers(sub)
