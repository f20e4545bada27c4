"""How one bucket travels: the per-bucket interface, as DDP's communication hooks.

Two kinds, by what a rank gets back:

- :class:`GradientMethod` -- ``reduce(bucket, grads)`` returns the global gradient of each of
  the bucket's variables (:class:`Allreduce`; :class:`StockHorovod`, which is Horovod's own
  gradient function and so lets Horovod fuse by readiness);
- :class:`SliceMethod` -- ``scatter(bucket, grads)`` returns this rank's slice of the bucket's
  global flat gradient and ``gather(bucket, slice)`` rebuilds the bucket's whole variables from
  every rank's updated slice (:class:`ReduceScatterGather`, the sharded strategy's).

A method decides *how*; when a bucket is issued, and in which order, is the scheduler's
(``hvd_overlap.comm.schedule``) and the executor's, read from the plan.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_overlap.adapters import keras_api
from hvd_overlap.comm.collectives import (
    all_gather,
    allreduce_bucket,
    allreduce_sparse,
    reduce_scatter,
    scale_factors,
)
from hvd_overlap.core.plan import Bucket
from hvd_overlap.core.sharding import BucketSlices, segment_sizes

Grad = tf.Tensor | tf.IndexedSlices | None


@dataclass(frozen=True)
class CommSettings:
    """Horovod-compatible knobs, named as in ``hvd.DistributedOptimizer``."""

    name: str
    op: Any
    compression: Any
    sparse_as_dense: bool = False
    gradient_predivide_factor: float = 1.0
    device_dense: str = ""
    device_sparse: str = ""
    ordered: bool = False
    groups: Any = None
    gather_with: str = "allgather"  # sharded: "allgather" or "alltoall" (see collectives)
    scale_local_gradients: bool = True  # register_local_var: local gradients / size


class GradientMethod(ABC):
    """Reduces a bucket of whole gradients; the result has the gradients' shapes."""

    def __init__(self, settings: CommSettings):
        self.settings = settings

    @abstractmethod
    def reduce(self, bucket: Bucket, grads: Sequence[Grad],
               variables: Sequence[tf.Variable]) -> dict[int, Grad]:
        """Issue the bucket's collective(s); return ``{variable index: global gradient}`` for
        the variables that have a gradient (``grads`` and ``variables`` are indexed like the
        plan's variables)."""

    def reduce_all(self, buckets: Sequence[Bucket], grads: Sequence[Grad],
                   variables: Sequence[tf.Variable]) -> dict[int, Grad]:
        """Several buckets issued together (a method that fuses across buckets overrides it)."""
        out: dict[int, Grad] = {}
        for b in buckets:
            out.update(self.reduce(b, grads, variables))
        return out


class Allreduce(GradientMethod):
    """One grouped allreduce per bucket; a sparse gradient as Horovod sends it (allgather of
    values and indices) unless ``sparse_as_dense``."""

    def reduce(self, bucket: Bucket, grads: Sequence[Grad],
               variables: Sequence[tf.Variable]) -> dict[int, Grad]:
        s = self.settings
        pre, post = scale_factors(s.op, s.gradient_predivide_factor)
        out: dict[int, Grad] = {}
        dense: list[tuple[int, tf.Tensor]] = []
        for v in bucket.variables:
            g = grads[v.index]
            if g is None:  # not on the loss path: left alone, as stock Horovod does
                continue
            if isinstance(g, tf.IndexedSlices):
                if not s.sparse_as_dense:
                    with tf.device(s.device_sparse):
                        out[v.index] = allreduce_sparse(
                            g, f"{s.name}.b{bucket.index}.v{v.index}", op=s.op)
                    continue
                g = tf.convert_to_tensor(g)
            dense.append((v.index, g))
        with tf.device(s.device_dense):
            reduced = allreduce_bucket(
                [g for _, g in dense], f"{s.name}.b{bucket.index}", op=s.op,
                compression=s.compression, prescale_factor=pre, postscale_factor=post)
        out.update((i, r) for (i, _), r in zip(dense, reduced, strict=True))
        return out


class StockHorovod(GradientMethod):
    """Exactly ``horovod.tensorflow.keras.DistributedOptimizer``'s gradient function: one
    allreduce per gradient, fused by Horovod each cycle (``groups`` as Horovod's).

    Made as stock makes it, eagerly (``hvd.DistributedOptimizer`` does so in ``__init__``):
    Horovod then wraps it in a ``tf.function``, so the train step calls it as stock's does --
    the same ops, conds and names -- instead of holding them inline (what a function made while
    the step is traced would get)."""

    def _fn(self):
        s = self.settings
        groups = s.groups  # Horovod keys its variable groups by tf.Variable.ref()
        if isinstance(groups, list):
            groups = [[keras_api.tf_variable(v) for v in g] for g in groups]
        with tf.init_scope():
            return keras_api.horovod_allreduce_grads_fn(  # the function stock Horovod uses
                s.name, s.device_dense, s.device_sparse, s.compression, s.sparse_as_dense,
                s.op, s.gradient_predivide_factor, groups,
                process_set=hvd.global_process_set)

    def reduce(self, bucket: Bucket, grads: Sequence[Grad],
               variables: Sequence[tf.Variable]) -> dict[int, Grad]:
        return self.reduce_all([bucket], grads, variables)

    def reduce_all(self, buckets: Sequence[Bucket], grads: Sequence[Grad],
                   variables: Sequence[tf.Variable]) -> dict[int, Grad]:
        index = sorted(v.index for b in buckets for v in b.variables)
        reduced = self._fn()([grads[i] for i in index],
                             [keras_api.tf_variable(variables[i]) for i in index])
        return {i: r for i, r in zip(index, reduced, strict=True) if r is not None}


class SliceMethod(ABC):
    """Reduces a bucket to this rank's slice; gathers the updated slices back."""

    def __init__(self, settings: CommSettings):
        self.settings = settings

    @abstractmethod
    def scatter(self, bucket: BucketSlices, grads: Sequence[Grad]) -> tf.Tensor:
        """This rank's slice of the bucket's global (averaged or summed) flat gradient."""

    @abstractmethod
    def gather(self, bucket: BucketSlices, piece: tf.Tensor) -> list[tf.Tensor]:
        """Every variable of the bucket, whole, from every rank's slice."""


class ReduceScatterGather(SliceMethod):
    """Reduce-scatter of the padded flat gradient; all-gather (or alltoall, ``gather_with``)
    of the updated slices, padding cut off. A ``whole`` bucket (every rank owns all of it) is
    allreduced instead, and needs no gather."""

    def scatter(self, bucket: BucketSlices, grads: Sequence[Grad]) -> tf.Tensor:
        s = self.settings
        pre, post = scale_factors(s.op, s.gradient_predivide_factor)
        if bucket.rows:  # a kernel cut by whole rows, as Horovod splits the first dimension
            tensor = tf.convert_to_tensor(grads[bucket.segments[0].index])
        else:
            parts = [tf.reshape(tf.convert_to_tensor(grads[seg.index]), [-1])
                     for seg in bucket.segments]
            if bucket.padding:
                parts.append(tf.zeros([bucket.padding], parts[0].dtype))
            tensor = parts[0] if len(parts) == 1 else tf.concat(parts, 0)
        with tf.device(s.device_dense):
            if bucket.whole:  # (no padding)
                return allreduce_bucket([tensor], f"{s.name}.b{bucket.bucket}", op=s.op,
                                        compression=s.compression, prescale_factor=pre,
                                        postscale_factor=post)[0]
            piece = reduce_scatter(tensor, f"{s.name}.b{bucket.bucket}.rs", op=s.op,
                                   compression=s.compression, prescale_factor=pre,
                                   postscale_factor=post)
        return tf.reshape(piece, [-1]) if bucket.rows else piece

    def gather(self, bucket: BucketSlices, piece: tf.Tensor) -> list[tf.Tensor]:
        if bucket.rows:  # whole rows, as many as each rank owns (uneven: no padding)
            shape = bucket.segments[0].shape
            with tf.device(self.settings.device_dense):
                whole = all_gather(piece, f"{self.settings.name}.b{bucket.bucket}.ag",
                                   self.settings.gather_with, uneven=True)
            return [tf.reshape(whole, shape)]
        if bucket.whole:  # every rank updated all of it: nothing to send
            flat = piece
        else:
            with tf.device(self.settings.device_dense):
                flat = all_gather(piece, f"{self.settings.name}.b{bucket.bucket}.ag",
                                  self.settings.gather_with)
        pieces = tf.split(flat, segment_sizes(bucket), 0)
        return [tf.reshape(p, seg.shape) for p, seg in zip(pieces, bucket.segments, strict=False)]


def default_method(settings: CommSettings, fused_by_horovod: bool,
                   shards: bool) -> GradientMethod | SliceMethod:
    """The method a strategy's buckets travel by unless the user registers another."""
    if shards:
        return ReduceScatterGather(settings)
    return StockHorovod(settings) if fused_by_horovod else Allreduce(settings)
