"""What ``DistributedOptimizer`` refuses of the optimizer and Horovod's keywords, checked at
creation on every rank (no collective), so a bad argument fails everywhere alike, with the fix
named. What a strategy accepts is its object's business (``hvd_overlap.core.choice``)."""

from __future__ import annotations

import os

import horovod.tensorflow as hvd

from hvd_overlap.adapters import keras_api
from hvd_overlap.core import choice, mutants


def _refuse(problem: str | None) -> None:
    if problem:
        raise ValueError(problem)


def validate_sharding(optimizer) -> None:
    """What updating 1/P of each flattened bucket cannot do exactly, refused up front."""
    _refuse(keras_api.generation_problem(optimizer, "sharded", shards=True, splits=True))
    known = keras_api.element_wise_optimizers()
    if type(optimizer) not in known:
        raise ValueError(
            f"strategy='sharded' updates a slice of each flattened bucket, which is exact only "
            f"for element-wise optimizers ({', '.join(sorted({k.__name__ for k in known}))}); "
            f"{type(optimizer).__name__} is not one of them (an update that needs whole "
            "tensors, like Adafactor's factored moments or a trust ratio, would be wrong). Use "
            "strategy='deferred' or 'layerwise'")
    if not mutants.off("nadam_refusal"):
        _refuse(keras_api.split_update_problem(optimizer, "sharded"))
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
    _refuse(keras_api.generation_problem(optimizer, strategy, splits=True))
    if splits and not mutants.off("nadam_refusal"):
        _refuse(keras_api.split_update_problem(optimizer, strategy))
    if getattr(optimizer, "global_clipnorm", None):
        raise ValueError(f"global_clipnorm needs every gradient at once, but strategy "
                         f"{strategy!r} applies updates bucket by bucket; use clipnorm (per "
                         "variable) or strategy='layerwise'")


def validate(optimizer, op, gradient_predivide_factor, backward_passes_per_step,
             process_set) -> None:
    """Horovod's own keywords and the optimizer itself. Every check is local (no collective),
    so a bad argument fails on every rank alike. (What a strategy accepts is checked when its
    object is made: ``hvd_overlap.core.choice``.)"""
    problem = keras_api.optimizer_problem(optimizer)
    if problem:
        raise TypeError(problem)
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
