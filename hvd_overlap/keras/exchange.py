"""The dense factor exchange at run time (``strategy="sharded", exchange=...``).

A ``Dense`` layer whose kernel the exchange carries computes ``x @ kernel`` through a custom
gradient: in backprop, instead of the local ``x^T dY`` (never computed), it sends its input
with an all-to-all -- each rank receives, for the whole global batch, the columns of ``x`` that
belong to its own rows of the kernel -- and all-gathers the output errors ``dY``; one local GEMM
then gives the exact global gradient of the rank's own rows. The gradient the tape returns for
the kernel is those rows (averaged like Horovod's ``op``) as ``tf.IndexedSlices`` (no zeros
are written for the others); the sharded executor updates them, and the updated rows are
all-gathered as any sharded bucket. The numbers (row split, bytes, when it pays) are
``hvd_overlap.core.exchange``.

With the forward on the rows (``EXCHANGE_ROWS``) the updated rows are not gathered: the layer's
forward reads this rank's rows from the slice the optimizer updates (``read_rows``, given at
``activate``), sends the input's column blocks to their rows' owners (that all-to-all's result
serves backprop too), multiplies them by its rows, and sends each partial output back to its
batch's rank, which sums them. Backprop all-gathers ``dY`` as above and sends each rank the
input gradient of its own columns back. The kernel itself is written only when the weights are
read (a flush gathers it whole).

Until ``activate`` (after the first step, when the batch is known and the plan decided) a
patched layer computes as Keras does and only records its batch size. ``activate`` is the
layer's declaration, made between steps, before the next trace: from then on it produces its
kernel's gradient rows (``declared``), which the sharded executor takes as global instead of
reduce-scattering them. Only train steps (a step body the plugin made runs:
``step_state.step_context``) take the patched path; anything else -- ``predict``, ``evaluate``,
tracing for export -- gets Keras's own ``call``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_overlap.adapters import keras_api
from hvd_overlap.comm import collectives
from hvd_overlap.comm.state_scope import plugin_state
from hvd_overlap.core import mutants
from hvd_overlap.core.exchange import (
    row_sizes,
)
from hvd_overlap.keras.executors.step_state import current_step

#: a kernel -> this rank's current rows of it (``[rows, n_out]``), read in a train step's forward
ReadRows = Callable[[tf.Variable], tf.Tensor]


def exchangeable_layers(model: Any) -> list[Any]:
    """The layers of ``model`` (nested ones too) whose kernel the exchange can carry exactly:
    Keras ``Dense`` (or a subclass that keeps its ``call``), trainable, with a 2-D kernel and
    the same compute and variable dtype (not under a mixed-precision policy)."""
    out = []
    for layer in _all_layers(model):
        if not keras_api.is_plain_dense(layer):
            continue
        policy = layer.dtype_policy
        if layer.trainable and policy.compute_dtype == policy.variable_dtype:
            out.append(layer)
    return out


def _all_layers(model: Any) -> Iterable[Any]:
    seen: set[int] = set()
    for layer in keras_api.all_layers(model):
        if id(layer) not in seen and isinstance(layer, keras_api.keras.layers.Layer):
            seen.add(id(layer))
            yield layer


class ExchangedDense:
    """One patched ``Dense`` layer: its ``call`` replaced (an instance attribute), its batch
    size recorded, and, once active, its kernel gradient computed by the exchange."""

    def __init__(self, layer: Any, name: str, average: bool,
                 in_train_step: Callable[[], bool]):
        self.layer = layer
        self.name = name
        self.average = average
        self.in_train_step = in_train_step  # the graph being built is a train step's
        self.active = False
        self.rows: tuple[int, int] | None = None
        self.read_rows: ReadRows | None = None  # on the rows: what the forward multiplies by
        with plugin_state():
            self.batch = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}_batch")
        self.calls = 0  # most calls in one traced step (a shared layer: more than one)
        keras_api.patch_method(layer, "call", self.call)  # Keras's __call__ calls self.call

    @property
    def kernel(self) -> tf.Variable | None:
        return getattr(self.layer, "kernel", None)

    @property
    def keep(self) -> bool:
        """The forward runs on this rank's rows (they are not gathered)."""
        return self.read_rows is not None

    def activate(self, rows: tuple[int, int], read_rows: ReadRows | None = None) -> None:
        """From the next trace on, this rank owns kernel rows ``[start, stop)`` and the kernel
        gradient comes from the exchange; with ``read_rows`` (the kernel -> this rank's current
        rows, read in the forward) the forward too runs on the rows."""
        if mutants.off("exchange"):
            return
        self.rows, self.active, self.read_rows = rows, True, read_rows

    # -- what the executor reads --------------------------------------------------------------

    def declared(self) -> tuple[int, int] | None:
        """The kernel rows whose global gradient this layer produces in train steps (set by
        ``activate``, between steps), or None: its kernel is reduced as any variable."""
        return self.rows if self.active else None

    def input_gradients(self) -> list[tf.Tensor]:
        """The input gradients the step being traced sent back by all-to-all (forward on the
        rows) and that backprop uses below this layer: the next layers' backprop waits for
        them. (A model's first layer's is never used, so never computed.)"""
        step = current_step()
        return [t for t in (step.sent_back(self) if step else []) if t.consumers()]

    # -- the layer's call --------------------------------------------------------------------

    def call(self, inputs: Any, **kwargs: Any) -> Any:
        """``kwargs``: what Keras passes besides (Keras 3: ``training``; ``Dense`` ignores it)."""
        layer, step = self.layer, current_step()
        if not (tf.inside_function() and step is not None and self.in_train_step()):
            # inference, tracing for export: Keras's own
            return type(layer).call(layer, inputs, **kwargs)
        two_d = isinstance(inputs, tf.Tensor) and inputs.shape.rank == 2
        use = step.next_call(self)  # this call's number in the step (its collectives' names)
        self.calls = max(self.calls, step.calls(self))
        if self.active and not two_d:
            raise ValueError(
                f"layer {self.layer.name!r} is called both on 2-D inputs (whose kernel gradient "
                "the dense factor exchange computes) and on other inputs in one train step; "
                "its gradients cannot be combined. Pass exchange='never' to "
                "DistributedOptimizer")
        if not self.active:
            if two_d:
                self.batch.assign(tf.shape(inputs, out_type=tf.int64)[0])
            return type(layer).call(layer, inputs, **kwargs)
        dtype = keras_api.compute_dtype_object(layer)
        if inputs.dtype.base_dtype != dtype.base_dtype:
            inputs = tf.cast(inputs, dtype=dtype)
        name = f"{self.name}.{use}"
        if self.keep:
            outputs = self._rows_matmul(inputs, self.read_rows(layer.kernel), name)
        else:
            outputs = self._matmul(inputs, tf.convert_to_tensor(layer.kernel), name)
        if layer.use_bias:
            outputs = tf.nn.bias_add(outputs, layer.bias)
        if layer.activation is not None:
            outputs = layer.activation(outputs)
        return outputs

    def _matmul(self, x: tf.Tensor, kernel: tf.Tensor, name: str) -> tf.Tensor:
        @tf.custom_gradient
        def matmul(x, kernel):
            def grad(dy):
                return tf.matmul(dy, kernel, transpose_b=True), self._kernel_grad(x, dy, name)
            return tf.matmul(x, kernel), grad
        return matmul(x, kernel)

    def _rows_matmul(self, x: tf.Tensor, mine: tf.Tensor, name: str) -> tf.Tensor:
        """``x @ kernel`` from this rank's rows ``mine`` of the kernel (every rank's batch may
        differ: the all-to-alls carry their sizes). The kernel (read, not copied) is the
        custom gradient's input only so that the tape asks this layer for its gradient."""
        ranks = hvd.size()
        sizes = row_sizes(int(self.layer.kernel.shape[0]), ranks)
        n_mine, n_out = int(mine.shape[0]), int(mine.shape[1])
        step = current_step()  # (its backprop runs in the same step body)
        below = _computed_from_variables(x)  # backprop goes on below this layer

        @tf.custom_gradient
        def matmul(x, kernel):
            batch = tf.shape(x)[0]
            x_mine, got = self._columns_to_owners(x, sizes, f"{name}.x")
            batches = got // n_mine                                  # every rank's batch
            partial = tf.matmul(x_mine, mine)                        # my rows' share, all batches
            shares = self._to_batch_owners(partial, batches * n_out, f"{name}.y")
            y = tf.reduce_sum(tf.reshape(shares, [ranks, batch, n_out]), 0)

            def grad(dy):
                dy_all = collectives.all_gather(dy, f"{name}.dy")
                dx_mine = tf.matmul(dy_all, mine, transpose_b=True)  # my columns, all batches
                back = self._to_batch_owners(dx_mine, batches * n_mine, f"{name}.dx")
                parts = tf.split(back, [batch * s for s in sizes])    # from each rank: its columns
                dx = tf.concat([tf.reshape(p, [batch, s]) for p, s in zip(parts, sizes,
                                                                          strict=True)], 1)
                step.send_back(self, dx)
                # the input gradient first: its all-to-all is on backprop's critical path, this
                # rank's kernel rows are not (their product runs while it travels)
                with tf.control_dependencies([dx_mine] if below else []):
                    return dx, self._rows_grad(x_mine, dy_all)
            return y, grad
        return matmul(x, tf.convert_to_tensor(self.layer.kernel))

    @staticmethod
    def _columns_to_owners(x: tf.Tensor, sizes: list[int], name: str) -> tuple[tf.Tensor, Any]:
        """Column block r of ``x`` to rank r: this rank's columns for the global batch (rank
        order), and the elements received from each rank."""
        batch = tf.shape(x)[0]
        send = tf.concat([tf.reshape(part, [-1]) for part in tf.split(x, sizes, axis=1)], 0)
        received, got = collectives.alltoall_splits(
            send, tf.stack([batch * s for s in sizes]), name)
        mine = sizes[hvd.rank()]
        return tf.reshape(received, [-1, mine]), got

    @staticmethod
    def _to_batch_owners(rows: tf.Tensor, splits: tf.Tensor, name: str) -> tf.Tensor:
        """Each rank's block of ``rows`` (global batch, rank order) sent back to it: what every
        rank computed for this rank's batch, flat, in rank order."""
        back, _ = collectives.alltoall_splits(tf.reshape(rows, [-1]), splits, name)
        return back

    def _rows_grad(self, x_mine: tf.Tensor, dy_all: tf.Tensor) -> tf.IndexedSlices:
        """This rank's rows of the global kernel gradient (averaged like Horovod's ``op``), as
        the kernel's gradient: the rows, and where they are."""
        rows = tf.matmul(x_mine, dy_all, transpose_a=True)
        rows = rows / tf.cast(hvd.size(), rows.dtype) if self.average else rows
        start, stop = self.rows  # set by activate, before any trace takes this path
        shape = self.layer.kernel.shape
        return tf.IndexedSlices(rows, tf.range(start, stop),
                                dense_shape=tf.constant(shape.as_list(), tf.int64))

    def _kernel_grad(self, x: tf.Tensor, dy: tf.Tensor, name: str) -> tf.IndexedSlices:
        """This rank's rows of the global kernel gradient (``_rows_grad``)."""
        x_mine, _ = self._columns_to_owners(
            x, row_sizes(int(self.layer.kernel.shape[0]), hvd.size()), f"{name}.x")
        dy_all = collectives.all_gather(dy, f"{name}.dy")  # rank order
        return self._rows_grad(x_mine, dy_all)


def _computed_from_variables(t: tf.Tensor) -> bool:
    """Whether graph tensor ``t`` is computed from a variable (a read of one among its
    ancestors): a layer's input gradient is then used by backprop below it. A model's first
    layer's input is data: its input gradient is never computed."""
    seen, todo = set(), [t.op]
    while todo:
        op = todo.pop()
        if op.type in _VARIABLE_READS:
            return True
        for parent in (i.op for i in op.inputs):
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return False


#: ops that read a variable in a traced graph (a captured handle is a resource placeholder,
#: as the data iterator's is: the read tells them apart)
_VARIABLE_READS = frozenset({"ReadVariableOp", "ResourceGather"})
