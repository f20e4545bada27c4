"""Per-layer profiles derived from layer shapes: exact gradient bytes, compute from FLOPs.

Forward FLOPs per layer for one batch (a multiply-add is 2 FLOPs): convolutions and dense layers
from their kernel and output shapes; every other layer (BatchNormalization, activations,
pooling, Add, padding) a few FLOPs per output element, which a FLOP rate makes nearly free
(they are memory-bound on a real device: fold that into the ``device_tflops`` you choose).
Backward = 2 x forward for a layer with weights (input and weight gradients), 1 x otherwise,
and 1 x for the first weighted layer (no input gradient is needed). Times are FLOPs / rate.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hvd_overlap.core.simulate import Layer, Profile
from hvd_overlap.keras.flops import dense_kernel, layer_flops, shape_of

APPLICATIONS = ("resnet50", "resnet101", "vgg16")
UPDATE_FLOPS_PER_PARAM = 4  # SGD with momentum: ~2 multiply-adds per parameter


def build_application(name: str, image_size: int = 224):
    """A ``tf.keras.applications`` model with random weights (nothing is downloaded)."""
    import tensorflow as tf

    apps = {"resnet50": tf.keras.applications.ResNet50,
            "resnet101": tf.keras.applications.ResNet101,
            "vgg16": tf.keras.applications.VGG16}
    if name not in apps:
        raise ValueError(f"unknown application {name!r}; choose one of {', '.join(apps)}")
    return apps[name](weights=None, input_shape=(image_size, image_size, 3), classes=1000)


def flops_profile(model: Any, batch_size: int, device_tflops: float,
                  name: str | None = None) -> Profile:
    """The profile of ``model`` at ``batch_size`` per rank on a device doing
    ``device_tflops`` x 1e12 FLOP/s. Gradient bytes are exact (trainable variable shapes)."""
    import tensorflow as tf

    if device_tflops <= 0 or batch_size < 1:
        raise ValueError("device_tflops must be > 0 and batch_size >= 1")
    rate = device_tflops * 1e12
    layers: list[Layer] = []
    seen_weights = False
    for layer in model.layers:
        if isinstance(layer, tf.keras.layers.InputLayer):
            continue
        f = layer_flops(layer, batch_size)
        weights = layer.trainable_weights
        nbytes = sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in weights)
        factor = (2.0 if seen_weights else 1.0) if weights else 1.0
        seen_weights = seen_weights or bool(weights)
        layers.append(Layer(layer.name, f / rate, factor * f / rate, nbytes,
                            weights[0].dtype.name if weights else "float32", len(weights), f,
                            dense_kernel(layer)))
    params = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    return Profile(
        model=name or model.name, batch_size=batch_size, layers=tuple(layers),
        update_s=params * UPDATE_FLOPS_PER_PARAM / rate,
        meta={"source": "flops", "device_tflops": device_tflops,
              "input_shape": list(shape_of(model.input_shape)), "trainable_params": params,
              "total_params": int(model.count_params()),
              "forward_flops": sum(la.flops or 0.0 for la in layers),
              "note": "compute = FLOPs / device rate; backward = 2 x forward (1 x for layers "
                      "without weights and for the first weighted layer); gradient bytes exact"})
