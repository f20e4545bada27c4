"""Named wrappers over Horovod's TensorFlow collectives.

Every collective gets an explicit, deterministic name (``ignore_name_scope=True``) so that ranks
match it whatever the surrounding name scopes are, and callers must consume every result (Horovod
ops are not stateful: an unused result can be pruned from a ``tf.function`` on one rank only).
"""

from __future__ import annotations

from collections.abc import Sequence

import horovod.tensorflow as hvd
import tensorflow as tf


def scale_factors(op, gradient_predivide_factor: float) -> tuple[float, float]:
    """Horovod's split of averaging into pre/post scaling (the C++ side adds the 1/size)."""
    if op == hvd.Average:
        return 1.0 / gradient_predivide_factor, gradient_predivide_factor
    return 1.0, 1.0


def allreduce_bucket(
    tensors: Sequence[tf.Tensor], name: str, *, op, compression,
    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
) -> list[tf.Tensor]:
    """One fused collective for a bucket of dense tensors (a Horovod grouped allreduce)."""
    if not tensors:
        return []
    return list(hvd.grouped_allreduce(
        list(tensors), op=op, compression=compression,
        prescale_factor=prescale_factor, postscale_factor=postscale_factor,
        name=name, ignore_name_scope=True,
    ))


def allreduce_sparse(grad: tf.IndexedSlices, name: str, *, op) -> tf.IndexedSlices:
    """A sparse gradient travels as Horovod does it: allgather of values and of indices."""
    values = hvd.allgather(grad.values, name=f"{name}.values", ignore_name_scope=True)
    indices = hvd.allgather(grad.indices, name=f"{name}.indices", ignore_name_scope=True)
    if op == hvd.Average:
        values = values / tf.cast(hvd.size(), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=grad.dense_shape)


def reduce_scatter(tensor: tf.Tensor, name: str, *, op, compression=hvd.Compression.none,
                   prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduce a flat vector whose length every rank's count divides; each rank gets its
    ``1/size`` slice (rank r: the r-th) of the reduced result."""
    return hvd.reducescatter(
        tensor, op=op, compression=compression, name=name, ignore_name_scope=True,
        prescale_factor=prescale_factor, postscale_factor=postscale_factor)


def all_gather(tensor: tf.Tensor, name: str, method: str = "allgather",
               uneven: bool = False) -> tf.Tensor:
    """Concatenate every rank's slice (1-D), rank 0's first. ``method="alltoall"`` sends the
    slice repeated ``size`` times through an alltoall (chunk r goes to rank r, and the output
    is the chunks received, in rank order): the same result and bytes per rank as an
    all-gather, by another algorithm (pairwise exchange instead of a ring); which is faster
    depends on the backend and network (measured on Gloo here: not alltoall, see README).
    ``uneven``: the ranks' slices may differ in length (the alltoall then names its splits)."""
    if method == "alltoall":
        size = hvd.size()
        if not uneven:
            return hvd.alltoall(tf.tile(tensor, [size]), name=name, ignore_name_scope=True)
        splits = tf.fill([size], tf.shape(tensor)[0])
        out, _ = hvd.alltoall(tf.tile(tensor, [size]), splits=splits, name=name,
                              ignore_name_scope=True)
        return out
    return hvd.allgather(tensor, name=name, ignore_name_scope=True)


def allreduce(tensor: tf.Tensor, name: str, *, op) -> tf.Tensor:
    """One tensor reduced over the ranks (``op``: ``hvd.Sum``, ``hvd.Average``, ``hvd.Max``)."""
    return hvd.allreduce(tensor, op=op, name=name, ignore_name_scope=True)


def alltoall(tensor: tf.Tensor, name: str) -> tf.Tensor:
    """Equal chunks along the first axis, chunk r to rank r; the chunks received, rank order."""
    return hvd.alltoall(tensor, name=name, ignore_name_scope=True)


def alltoall_splits(tensor: tf.Tensor, splits: tf.Tensor, name: str
                    ) -> tuple[tf.Tensor, tf.Tensor]:
    """``splits[r]`` rows to rank r; (the rows received in rank order, how many from each)."""
    return hvd.alltoall(tensor, splits=splits, name=name, ignore_name_scope=True)


def grouped_allgather(tensors: Sequence[tf.Tensor], name: str) -> list[tf.Tensor]:
    """Every rank's copy of each tensor, concatenated along the first axis (one collective)."""
    return list(hvd.grouped_allgather(list(tensors), name=name, ignore_name_scope=True))


def allgather_object(obj: object, name: str) -> list:
    """Every rank's picklable ``obj``, in rank order (eager)."""
    return hvd.allgather_object(obj, name=name)


def broadcast_object(obj: object, name: str, root_rank: int = 0) -> object:
    """Rank ``root_rank``'s picklable ``obj`` on every rank (eager)."""
    return hvd.broadcast_object(obj, root_rank=root_rank, name=name)


def broadcast(tensor: tf.Tensor, name: str, root_rank: int = 0) -> tf.Tensor:
    """Rank ``root_rank``'s ``tensor`` on every rank."""
    return hvd.broadcast(tensor, root_rank, name=name, ignore_name_scope=True)
