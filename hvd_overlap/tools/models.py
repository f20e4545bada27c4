"""Benchmark models for 10 classes, and synthetic data for them (each model's own inputs).

- ``vgg``: communication-heavy VGG-style CNN, 6.4 M parameters (4.2 M in one 4096x1024 dense
  layer), the model of BRIEF.md's measurements.
- ``resnet20``: the CIFAR ResNet-20 (He et al. 2016), 0.27 M parameters: compute-heavy.
- ``resnet56``: the CIFAR ResNet-56, 0.86 M parameters in 173 trainable variables, 114 of them
  small batch-norm ones: many small tensors, as deep CNNs have (Horovod negotiates and fuses
  each one).
- ``mlp``: large dense layers (3072-2048-2048-10), 10.5 M parameters: communication-bound.
- ``cnn``: the CNN of ``examples/keras_digits.py`` / ``scripts/demo`` (4 conv+BN blocks, dense
  512), 1.1 M parameters.
- ``text``: a text classifier on integer token ids (sequences of 64 from a vocabulary of 20000):
  embedding 64 wide, average pooling, dense 256, 1.3 M parameters (1.28 M in the embedding, whose
  gradient is sparse: ``tf.IndexedSlices`` of the tokens a batch holds).

The image models take 32x32x3 inputs. ``tiny=True`` divides every width by 16 (the vocabulary
too; for fast tests).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

L = tf.keras.layers
INPUT_SHAPE = (32, 32, 3)
NUM_CLASSES = 10
VOCAB = 20000  # the text model's vocabulary
SEQUENCE = 64  # tokens per text example


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


def _cifar_resnet(blocks: int, name: str, tiny: bool) -> tf.keras.Model:
    """The CIFAR ResNet (He et al. 2016): a 3x3 conv, three stages of ``blocks`` basic blocks
    (16, 32, 64 filters), global pooling, the classifier."""
    inputs = L.Input(INPUT_SHAPE)
    x = L.ReLU()(L.BatchNormalization()(
        L.Conv2D(_w(16, tiny), 3, padding="same", use_bias=False)(inputs)))
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(blocks):
            x = _residual(x, _w(filters, tiny), 2 if stage and not block else 1)
    x = L.GlobalAveragePooling2D()(x)
    return tf.keras.Model(inputs, L.Dense(NUM_CLASSES)(x), name=name)


def resnet20(tiny: bool = False) -> tf.keras.Model:
    """ResNet-20 for CIFAR: three stages of three basic blocks; 65 trainable variables."""
    return _cifar_resnet(3, "resnet20", tiny)


def resnet56(tiny: bool = False) -> tf.keras.Model:
    """ResNet-56 for CIFAR: three stages of nine basic blocks; 173 trainable variables, 114 of
    them batch norm's (57 layers' gamma and beta, 64 floats or fewer each)."""
    return _cifar_resnet(9, "resnet56", tiny)


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


def text(tiny: bool = False) -> tf.keras.Model:
    """Embedding (VOCAB x 64) of SEQUENCE tokens, average over them, dense 256 ReLU, 10."""
    return tf.keras.Sequential([
        L.Input((SEQUENCE,), dtype="int32"), L.Embedding(_w(VOCAB, tiny), _w(64, tiny)),
        L.GlobalAveragePooling1D(), L.Dense(_w(256, tiny), activation="relu"),
        L.Dense(NUM_CLASSES)], name="text")


def images(rng: np.random.Generator, batch_size: int, tiny: bool) -> np.ndarray:
    """Random 32x32x3 images in [0, 1)."""
    return rng.random((batch_size, *INPUT_SHAPE), dtype=np.float32)


def tokens(rng: np.random.Generator, batch_size: int, tiny: bool) -> np.ndarray:
    """Random token ids of the text model's vocabulary, SEQUENCE per example."""
    return rng.integers(0, _w(VOCAB, tiny), (batch_size, SEQUENCE)).astype(np.int32)


@dataclass(frozen=True)
class BenchModel:
    """A bench model: how to build it and what its synthetic inputs are."""

    build: Callable[[bool], tf.keras.Model]
    inputs: Callable[[np.random.Generator, int, bool], np.ndarray] = images


MODELS: dict[str, BenchModel] = {
    "vgg": BenchModel(vgg), "resnet20": BenchModel(resnet20), "resnet56": BenchModel(resnet56),
    "mlp": BenchModel(mlp),
    "cnn": BenchModel(cnn), "text": BenchModel(text, tokens)}


def _bench_model(name: str) -> BenchModel:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    return MODELS[name]


def build_model(name: str, tiny: bool = False) -> tf.keras.Model:
    """The model called ``name`` (see ``MODELS``), freshly initialised."""
    return _bench_model(name).build(tiny)


def synthetic_batch(batch_size: int, seed: int = 0, model: str = "vgg", tiny: bool = False
                    ) -> tuple[np.ndarray, np.ndarray]:
    """One batch of ``model``'s random inputs (images in [0, 1), or token ids) and random
    integer labels."""
    rng = np.random.default_rng(seed)
    x = _bench_model(model).inputs(rng, batch_size, tiny)
    return x, rng.integers(0, NUM_CLASSES, batch_size).astype(np.int32)


def gradient_bytes(model: tf.keras.Model) -> int:
    """Bytes of one full gradient: the sum of the trainable variables' sizes."""
    return sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in model.trainable_variables)
