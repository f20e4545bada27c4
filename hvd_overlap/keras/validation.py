"""What ``DistributedOptimizer`` refuses of the optimizer and Horovod's keywords, checked at
creation on every rank (no collective), so a bad argument fails everywhere alike, with the fix
named. What a strategy accepts is its object's business (``hvd_overlap.core.choice``)."""

from __future__ import annotations

import os

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_overlap.adapters import keras_api
from hvd_overlap.core import choice, mutants

#: Keras 2.15's Nadam multiplies its momentum-schedule product once per variable whose traced
#: Python counter differs from the step, so stock Horovod's own weights change with the number
#: of times the train function was traced (measured: one extra trace after 3 of 10 steps took the
#: product from 1.8e-10 to 7.4e-11; the formula gives 2.0e-3). The legacy Nadam keeps it in a
#: variable: the executors advance it once per step, exactly.
_NADAM = ("tf.keras.optimizers.Nadam keeps its momentum-schedule product in a Python counter "
          "that each trace of the train function bakes in, so even stock Horovod's weights "
          "depend on how often the train function was traced; strategy {strategy!r} traces it "
          "again and applies a step in parts, so no run can be compared with stock's. Use "
          "tf.keras.optimizers.legacy.Nadam (exact with every strategy), Adam, or "
          "strategy='layerwise'")


def element_wise_optimizers() -> tuple[type, ...]:
    """Optimizers whose update of an element reads only that element's gradient and state."""
    o, legacy = tf.keras.optimizers, tf.keras.optimizers.legacy
    return (o.SGD, o.Adam, o.AdamW, o.RMSprop, o.Adagrad, o.Adadelta, o.Adamax, o.Nadam, o.Ftrl,
            o.Lion, legacy.SGD, legacy.Adam, legacy.RMSprop, legacy.Adagrad, legacy.Adadelta,
            legacy.Adamax, legacy.Nadam, legacy.Ftrl)


def validate_sharding(optimizer) -> None:
    """What updating 1/P of each flattened bucket cannot do exactly, refused up front."""
    known = element_wise_optimizers()
    if type(optimizer) not in known:
        raise ValueError(
            f"strategy='sharded' updates a slice of each flattened bucket, which is exact only "
            f"for element-wise optimizers ({', '.join(sorted({k.__name__ for k in known}))}); "
            f"{type(optimizer).__name__} is not one of them (an update that needs whole "
            "tensors, like Adafactor's factored moments or a trust ratio, would be wrong). Use "
            "strategy='deferred' or 'layerwise'")
    if type(optimizer) is tf.keras.optimizers.Nadam and not mutants.off("nadam_refusal"):
        raise ValueError(_NADAM.format(strategy="sharded"))
    if getattr(optimizer, "clipnorm", None) or getattr(optimizer, "global_clipnorm", None):
        raise ValueError(
            "clipnorm/global_clipnorm need whole-tensor norms, but with strategy='sharded' each "
            "rank holds only a slice of every gradient; use clipvalue (element-wise), or "
            "strategy='layerwise' or 'deferred'")
    if getattr(optimizer, "use_ema", False):
        raise ValueError("use_ema keeps a whole-model moving average, which strategy='sharded' "
                         "does not shard; use strategy='deferred' or 'layerwise'")


def validate_deferring(optimizer, strategy: str) -> None:
    """What deferring updates cannot do exactly, refused up front: a strategy that applies
    the update itself bucket by bucket (``Strategy.splits_update``) cannot run Nadam."""
    splits = choice.get(strategy).splits_update
    if splits and isinstance(optimizer, tf.keras.optimizers.Nadam) \
            and not mutants.off("nadam_refusal"):
        raise ValueError(_NADAM.format(strategy=strategy))
    if getattr(optimizer, "global_clipnorm", None):
        raise ValueError(f"global_clipnorm needs every gradient at once, but strategy "
                         f"{strategy!r} applies updates bucket by bucket; use clipnorm (per "
                         "variable) or strategy='layerwise'")


def validate(optimizer, op, gradient_predivide_factor, backward_passes_per_step,
             process_set) -> None:
    """Horovod's own keywords and the optimizer itself. Every check is local (no collective),
    so a bad argument fails on every rank alike. (What a strategy accepts is checked when its
    object is made: ``hvd_overlap.core.choice``.)"""
    keras_api.require_keras_2()
    legacy = tf.keras.optimizers.legacy.Optimizer
    if not isinstance(optimizer, tf.keras.optimizers.Optimizer | legacy):
        keras_3 = keras_api.keras_3_object_message(optimizer)
        if keras_3:
            raise TypeError(keras_3)
        raise TypeError(f"expected a Keras optimizer (tf.keras.optimizers.*), got "
                        f"{type(optimizer).__name__}")
    if hasattr(optimizer, "register_bucket_method"):
        raise TypeError("this optimizer is already a hvd_overlap DistributedOptimizer; "
                        "wrap the plain optimizer once")
    if op not in (hvd.Average, hvd.Sum):
        raise ValueError("op must be hvd.Average or hvd.Sum (as in Horovod's Keras optimizer)")
    if gradient_predivide_factor <= 0:
        raise ValueError("gradient_predivide_factor must be > 0")
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be an int >= 1, got "
                         f"{backward_passes_per_step!r}")
    if process_set is not hvd.global_process_set:
        raise ValueError("only the global process set is supported; drop process_set=")
    if not hvd.is_initialized():
        raise RuntimeError("Horovod is not initialised: call hvd.init() "
                           "before creating the DistributedOptimizer")


def validate_elastic(strategy: str, defers: bool) -> None:
    """Horovod elastic (``horovodrun --min-np``, ``hvd.elastic.run``) restores
    ``optimizer.variables()`` on membership changes; the deferral's buffers and the sharded
    slices live outside them, and the slices are cut for the ranks of the first step."""
    if defers and os.environ.get("HOROVOD_ELASTIC") == "1":
        raise ValueError(
            f"strategy {strategy!r} keeps state outside optimizer.variables() (deferred "
            "gradients, or slices cut for the first step's number of ranks), which Horovod "
            "elastic cannot restore when ranks join or leave; use strategy='layerwise' (or "
            "'horovod') with elastic training")


def validate_exchange(compression) -> None:
    """The dense factor exchange sends activations, which gradient compression cannot cover."""
    if compression is not hvd.Compression.none:
        raise ValueError("the dense factor exchange sends activations, which gradient "
                         "compression does not cover: drop compression= or the exchange")
