"""Benchmark models for 32x32x3 inputs, 10 classes, and synthetic data for them.

- ``vgg``: communication-heavy VGG-style CNN, 6.4 M parameters (4.2 M in one 4096x1024 dense
  layer), the model of BRIEF.md's measurements.
- ``resnet20``: the CIFAR ResNet-20 (He et al. 2016), 0.27 M parameters: compute-heavy.
- ``mlp``: large dense layers (3072-2048-2048-10), 10.5 M parameters: communication-bound.
- ``cnn``: the CNN of ``examples/keras_digits.py`` / ``scripts/demo`` (4 conv+BN blocks, dense
  512), 1.1 M parameters.

``tiny=True`` divides every width by 16 (for fast tests).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

L = tf.keras.layers
INPUT_SHAPE = (32, 32, 3)
NUM_CLASSES = 10


def _w(width: int, tiny: bool) -> int:
    return max(2, width // 16) if tiny else width


def vgg(tiny: bool = False) -> tf.keras.Model:
    """Three VGG blocks (64, 128, 256 filters, two 3x3 convs each), then dense 1024-1024-10."""
    layers: list[L.Layer] = [L.Input(INPUT_SHAPE)]
    for filters in (64, 128, 256):
        layers += [L.Conv2D(_w(filters, tiny), 3, padding="same", activation="relu"),
                   L.Conv2D(_w(filters, tiny), 3, padding="same", activation="relu"),
                   L.MaxPool2D()]
    layers += [L.Flatten(), L.Dense(_w(1024, tiny), activation="relu"),
               L.Dense(_w(1024, tiny), activation="relu"), L.Dense(NUM_CLASSES)]
    return tf.keras.Sequential(layers, name="vgg")


def _residual(x: tf.Tensor, filters: int, stride: int) -> tf.Tensor:
    shortcut = x
    y = L.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
    y = L.ReLU()(L.BatchNormalization()(y))
    y = L.BatchNormalization()(L.Conv2D(filters, 3, padding="same", use_bias=False)(y))
    if stride != 1 or shortcut.shape[-1] != filters:
        shortcut = L.Conv2D(filters, 1, strides=stride, use_bias=False)(shortcut)
        shortcut = L.BatchNormalization()(shortcut)
    return L.ReLU()(L.Add()([y, shortcut]))


def resnet20(tiny: bool = False) -> tf.keras.Model:
    """ResNet-20 for CIFAR: a 3x3 conv, three stages of three basic blocks (16, 32, 64)."""
    inputs = L.Input(INPUT_SHAPE)
    x = L.ReLU()(L.BatchNormalization()(
        L.Conv2D(_w(16, tiny), 3, padding="same", use_bias=False)(inputs)))
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(3):
            x = _residual(x, _w(filters, tiny), 2 if stage and not block else 1)
    x = L.GlobalAveragePooling2D()(x)
    return tf.keras.Model(inputs, L.Dense(NUM_CLASSES)(x), name="resnet20")


def mlp(tiny: bool = False) -> tf.keras.Model:
    """Flatten, two 2048-wide ReLU layers, then the classifier."""
    return tf.keras.Sequential([
        L.Input(INPUT_SHAPE), L.Flatten(),
        L.Dense(_w(2048, tiny), activation="relu"), L.Dense(_w(2048, tiny), activation="relu"),
        L.Dense(NUM_CLASSES)], name="mlp")


def cnn(tiny: bool = False) -> tf.keras.Model:
    """The demo's CNN: conv-BN-ReLU x4 (32, 32, 64, 128 filters, pooled), dense 512, 10."""
    layers: list[L.Layer] = [L.Input(INPUT_SHAPE)]
    for filters, pool in ((32, False), (32, True), (64, True), (128, True)):
        layers += [L.Conv2D(_w(filters, tiny), 3, padding="same"), L.BatchNormalization(),
                   L.ReLU()] + ([L.MaxPool2D()] if pool else [])
    layers += [L.Flatten(), L.Dense(_w(512, tiny), activation="relu"), L.Dense(NUM_CLASSES)]
    return tf.keras.Sequential(layers, name="cnn")


MODELS: dict[str, Callable[[bool], tf.keras.Model]] = {
    "vgg": vgg, "resnet20": resnet20, "mlp": mlp, "cnn": cnn}


def build_model(name: str, tiny: bool = False) -> tf.keras.Model:
    """The model called ``name`` (see ``MODELS``), freshly initialised."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    return MODELS[name](tiny)


def synthetic_batch(batch_size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """One batch of random images in [0, 1) and random integer labels."""
    rng = np.random.default_rng(seed)
    x = rng.random((batch_size, *INPUT_SHAPE), dtype=np.float32)
    return x, rng.integers(0, NUM_CLASSES, batch_size).astype(np.int32)


def gradient_bytes(model: tf.keras.Model) -> int:
    """Bytes of one full gradient: the sum of the trainable variables' sizes."""
    return sum(int(np.prod(v.shape)) * v.dtype.size for v in model.trainable_variables)
