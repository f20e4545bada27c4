"""The rows a rank keeps of the dense kernels whose forward runs on them
(``exchange_forward="rows"``).

The sharded state's slice of such a kernel is this rank's rows: the forward multiplies by it,
the optimizer updates it, and the kernel itself is written only when the rows are gathered whole
(a flush, the end of a landing step). Copying the rows out of the kernel and writing them back
every step cost more than the step's matrix products on the bench's mlp: an assignment to part
of a variable copies the whole of it, and leaves TensorFlow copying it at every later read too.

Whatever may write the kernels between steps -- ``set_weights`` or ``load_weights`` (a flush
comes first), a new ``fit``, a new plan -- marks the slices stale: the next forward copies its
rows out of the kernel before reading them.
"""

from __future__ import annotations

import tensorflow as tf

from hvd_overlap.adapters import keras_api
from hvd_overlap.comm.state_scope import plugin_state
from hvd_overlap.core.sharding import BucketSlices
from hvd_overlap.keras.sharded_state import ShardedState


class KeptRows:
    """The forward's weights of the kernels on the rows: the state's slices, and a flag saying
    that the kernels may hold newer rows."""

    def __init__(self, state: ShardedState) -> None:
        self.state = state
        self.stale: tf.Variable | None = None

    def create(self) -> None:
        """The flag (with the state, at the first trace)."""
        with plugin_state():
            self.stale = tf.Variable(True, trainable=False,
                                     name=f"{self.state.name}_rows_stale")

    def mark(self) -> None:
        """The kernels may have been written since the slices were read from them (eager,
        every rank)."""
        if self.stale is not None:
            self.stale.assign(True)

    def read(self, kernel: tf.Variable) -> tf.Tensor:
        """This rank's current rows of ``kernel``, ``[rows, n_out]``, for its forward in the
        train step being traced: its slice, first copied out of the kernel if stale."""
        with tf.control_dependencies([self.refresh(kernel)]):
            rows = keras_api.read_value(self.state.params[self._bucket(kernel).bucket])
        return tf.reshape(rows, [-1, int(kernel.shape[1])])

    def refresh(self, kernel: tf.Variable) -> tf.Tensor:
        """Copy this rank's rows of ``kernel`` into its slice if stale (an op of the train step
        being traced; True where it copied)."""
        st, bucket = self.state, self._bucket(kernel)

        def copy() -> tf.Tensor:
            st.params[bucket.bucket].assign(st.slice_of(bucket, st.variables))
            return tf.constant(True)

        assert self.stale is not None, "the state is made before any forward on the rows"
        return tf.cond(self.stale, copy, lambda: tf.constant(False))

    def read_done(self) -> None:
        """The step's forwards have read the slices: current from now on (an op of the train
        step, after them)."""
        assert self.stale is not None
        self.stale.assign(False)

    def _bucket(self, kernel: tf.Variable) -> BucketSlices:
        st, key = self.state, keras_api.var_key(kernel)
        assert st.layout is not None
        for b in st.layout.buckets:
            if b.rows and keras_api.var_key(st.variables[b.segments[0].index]) == key:
                return b
        raise AssertionError(f"{kernel.name}: on the rows, but no bucket of its rows")
