"""The state of the sharded mode: this rank's parameter slices, the optimizer slots that exist
only for them, and complete checkpoints.

Each bucket has one flat ``tf.Variable`` of ``shard_size`` elements, this rank's slice of the
bucket's parameters: the wrapped optimizer updates it (so its slots -- momentum, Adam moments --
are built for the slices only, ``1/P`` of stock Horovod's memory). The model's variables stay the
source of truth between steps: every step copies this rank's slice out of them before updating it,
so broadcasts, ``load_weights`` and ``set_weights`` need nothing special -- except for the kernels
whose forward runs on the rows, whose slices are the truth until a flush
(``hvd_overlap.keras.kept_rows``).

The slots are kept out of ``optimizer.variables()`` (so ``BroadcastGlobalVariablesCallback`` does
not overwrite one rank's slots with rank 0's) and out of the optimizer's own checkpoint entries.
Instead :class:`ShardedCheckpoint` (an attribute of the optimizer, so it is saved with it) holds
the slots gathered from every rank as whole per-variable arrays, a layout that does not depend on
the number of ranks: restoring slices it for the current rank and size.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from hvd_overlap.adapters import keras_api
from hvd_overlap.comm import collectives
from hvd_overlap.comm.state_scope import plugin_state
from hvd_overlap.core import mutants
from hvd_overlap.core.sharding import ShardLayout, join_slices, own_slice
from hvd_overlap.keras.sharded_slots import (
    build_slice_slots,
    decay_masks,
    plain_order,
    release_slots,
    stale_state_error,
)

#: dtypes a checkpoint keeps slot state in (one flat array each); fixed so restores can name them
_STATE_DTYPES = ("float16", "float32", "float64")


class ShardedState:
    """One model's sharded state on this rank (kept by the sharded executor as plain data)."""

    def __init__(self, name: str, opt: Any, plain_class: type) -> None:
        self.name = name
        self.opt = opt                    # the optimizer (its step counter and configuration)
        self.plain_class = plain_class    # the user's optimizer class (checkpoint layout)
        self.layout: ShardLayout | None = None
        self.variables: list[tf.Variable] = []                 # the list the layout indexes
        self.params: dict[int, tf.Variable] = {}               # bucket -> this rank's slice
        self.slots: dict[int, dict[str, tf.Variable]] = {}     # bucket -> slot name -> slice
        self.decay_masks: dict[int, tf.Tensor] = {}            # bucket -> 1 where decay applies
        self.checkpoint = ShardedCheckpoint(self)

    @property
    def step(self) -> int | None:
        """The optimizer's step counter now (None before the first step)."""
        return int(self.opt.iterations.numpy()) if self.layout is not None else None

    def create(self, layout: ShardLayout, variables: Sequence[tf.Variable],
               build_slots: Callable[[list[tf.Variable]], Any]) -> None:
        """Slice variables, the optimizer's slots for them (made by ``build_slots``, the plain
        optimizer's ``build``, then hidden from ``variables()``), and any slot state a
        checkpoint restored before the optimizer was built."""
        rank = hvd.rank()
        self.variables = list(variables)
        with plugin_state():
            for b in layout.buckets:
                arrays = {s.index: variables[s.index].numpy() for s in b.segments}
                self.params[b.bucket] = keras_api.make_variable(
                    own_slice(b, arrays, rank), f"{self.name}_shard{b.bucket}")
            self.slots = self._make_slots(build_slots)
            self.decay_masks = decay_masks(self.opt, layout, variables, rank)
            self.layout = layout
            self._initial_state()  # eagerly, once (not an op of the train step)

    def _make_slots(self, build: Callable[[list[tf.Variable]], Any]
                    ) -> dict[int, dict[str, tf.Variable]]:
        """The optimizer's slots for the slices, by bucket and slot name."""
        return build_slice_slots(self.opt, self.params, build)

    def _initial_state(self) -> None:
        """The slots' values once made: what a checkpoint restored before, if anything."""
        self.checkpoint.apply_pending()

    def hand_over(self, successor: ShardedState) -> None:
        """A plan switch (``auto``): the successor's slices, cut by its own plan, start from
        this state's slots, gathered whole (eager, every rank; every update landed first), and
        it serves this state's checkpoint -- the one the optimizer tracks."""
        cp = self.checkpoint
        gathered = self.gather_state() if self.layout is not None else None
        release_slots(self.opt, self.slots)
        cp.serve(successor)
        if gathered is not None:  # else what a restore left pending stays so
            cp.restore(gathered, self.step)

    def recut(self, layout: ShardLayout, build_slots: Callable[[list[tf.Variable]], Any]
              ) -> None:
        """The same variables cut by ``layout`` (some buckets now whole, or sliced): every
        slot's values gathered whole, the slices and slots made again and set from them
        (eager, every rank, every update landed first)."""
        gathered = self.gather_state()
        self.release()
        self.create(layout, self.variables, build_slots)
        self.load_state(gathered)

    def release(self) -> None:
        """Drop the slices and their slots (the optimizer forgets them)."""
        release_slots(self.opt, self.slots)
        self.slots, self.params, self.layout = {}, {}, None

    def slice_of(self, bucket, variables: Sequence[tf.Variable]) -> tf.Tensor:
        """This rank's slice of the bucket's current parameters (a graph tensor); or of
        gradients, where an exchanged kernel's is its rows already (``tf.IndexedSlices``)."""
        start, stop = bucket.owned(hvd.rank())
        first = variables[bucket.segments[0].index]
        if isinstance(first, tf.IndexedSlices):
            return _own_rows(first, start // int(first.values.shape[1]), stop - start)
        parts = []
        for s in bucket.segments:  # only the variables overlapping [start, stop)
            lo, hi = max(start, s.offset), min(stop, s.offset + s.size)
            if lo < hi:
                parts.append(tf.reshape(variables[s.index], [-1])[lo - s.offset:hi - s.offset])
        padding = stop - max(start, bucket.total)
        if padding > 0:
            parts.append(tf.zeros([padding], bucket.dtype))
        return parts[0] if len(parts) == 1 else tf.concat(parts, 0)

    def decay(self, given: set[int]) -> None:
        """Decoupled weight decay on the slices among ``given`` (ids), skipping the elements of
        excluded variables, as Keras skips the variables."""
        for b, p in self.params.items():
            if id(p) not in given:
                continue
            lr = tf.cast(self.opt.learning_rate, p.dtype)
            wd = tf.cast(self.opt.weight_decay, p.dtype)
            mask = self.decay_masks.get(b)
            p.assign_sub((p if mask is None else p * mask) * wd * lr)

    def gather_state(self) -> dict[str, Any]:
        """Every rank's slot slices, all-gathered into whole per-variable arrays (eager; call on
        every rank). Returns ``{slot name: {variable index: array}}``, indexed like
        ``model.trainable_variables`` (as Keras checkpoints match by structure, not by name)."""
        assert self.layout is not None
        slots: dict[str, dict[int, np.ndarray]] = {}
        for b in self.layout.buckets:
            names = sorted(self.slots[b.bucket])
            if not names:
                continue
            mine = [keras_api.read_value(self.slots[b.bucket][n]) for n in names]
            gathered = mine if b.whole else collectives.grouped_allgather(  # (whole: every rank's)
                mine, f"{self.name}.state{b.bucket}")
            for n, g in zip(names, gathered, strict=True):
                whole = join_slices(b, g.numpy())
                for s in b.segments:
                    slots.setdefault(n, {})[s.index] = whole[s.index]
        return slots

    def load_state(self, slots: dict[str, dict[int, np.ndarray]]) -> None:
        """Set this rank's slot slices from whole per-variable arrays (any number of ranks)."""
        assert self.layout is not None
        rank = hvd.rank()
        for b in self.layout.buckets:
            for n, var in self.slots[b.bucket].items():
                saved = slots.get(n, {})
                for s in b.segments:
                    got = saved.get(s.index)
                    if got is None or tuple(got.shape) != tuple(s.shape):
                        raise ValueError(
                            f"the checkpoint's optimizer state {n!r} has no array of shape "
                            f"{list(s.shape)} for trainable variable {s.index} ({s.name}): it "
                            "was saved for a different model or optimizer")
                var.assign(own_slice(b, {s.index: saved[s.index] for s in b.segments}, rank))


class ShardedCheckpoint(keras_api.Trackable):
    """The sharded optimizer state as a checkpoint sees it: whole per-variable slot arrays,
    gathered from every rank by ``opt.gather_state()`` (``OverlapCallback`` does it at the end
    of each epoch). Saving with a stale gather is recorded and refused when restoring."""

    def __init__(self, state: ShardedState) -> None:
        self._state = state
        self.iterations: int | None = None   # the step the gathered state belongs to
        self.slots: dict[str, dict[int, np.ndarray]] = {}
        self.pending: dict[str, dict[int, np.ndarray]] | None = None  # restored, not yet set
        self.pending_plain: list[np.ndarray] | None = None  # from a .keras file, not yet set

    def set(self, iterations: int, slots: dict[str, dict[int, np.ndarray]]) -> None:
        self.iterations, self.slots = iterations, slots

    def serve(self, state: ShardedState) -> None:
        """From now on, save and restore ``state``'s slices (a plan switch's successor):
        the optimizer keeps tracking this one entry."""
        self._state, state.checkpoint = state, self

    def restore(self, slots: dict[str, dict[int, np.ndarray]], iterations: int | None) -> None:
        """Whole arrays read from a checkpoint: set now, or when the slices are built."""
        self.slots, self.iterations = slots, iterations
        self.pending = slots if slots else None
        self.apply_pending()

    def restore_plain(self, arrays: list[np.ndarray], iterations: int) -> None:
        """Slot arrays in the plain optimizer's order (a ``.keras`` file): set now, or when
        the slices are built (that order needs the model's variables)."""
        self.pending_plain, self.iterations = arrays, iterations
        self.apply_pending()

    def apply_pending(self) -> None:
        sh = self._state
        if sh.layout is None:
            return
        if self.pending_plain is not None:
            order = plain_order(sh.plain_class, sh.opt, sh.variables)
            if len(self.pending_plain) != len(order):
                raise ValueError(
                    f"the file's optimizer has {len(self.pending_plain) + 1} variables, "
                    f"{sh.plain_class.__name__} on this model would have {len(order) + 1}")
            slots: dict[str, dict[int, np.ndarray]] = {}
            for (slot, index, _), arr in zip(order, self.pending_plain, strict=True):
                slots.setdefault(slot, {})[index] = arr
            self.slots, self.pending, self.pending_plain = slots, slots, None
        if self.pending is not None and not mutants.off("resume"):
            sh.load_state(self.pending)
            self.pending = None

    # -- TF's checkpoint hooks (keras_api.HOOK_NAMES) --

    def _serialize_to_tensors(self):
        entries, data = [], {d: [] for d in _STATE_DTYPES}
        offsets = dict.fromkeys(_STATE_DTYPES, 0)
        for slot in sorted(self.slots):
            for index, arr in sorted(self.slots[slot].items()):
                d = arr.dtype.name if arr.dtype.name in data else "float32"
                entries.append([slot, index, list(arr.shape), d, offsets[d]])
                data[d].append(arr.astype(d).reshape(-1))
                offsets[d] += arr.size
        layout = {"format": 1, "entries": entries, "iterations": self.iterations,
                  "trained": self._state.layout is not None, "saved_at": self._state.step}
        out = {"layout": tf.constant(json.dumps(layout))}
        for d in _STATE_DTYPES:
            out[d] = tf.constant(np.concatenate(data[d]) if data[d] else np.zeros(0, d))
        return out

    def _restore_from_tensors(self, restored):
        layout = json.loads(restored["layout"].numpy().decode())
        if layout["trained"] and layout["iterations"] != layout["saved_at"]:
            raise stale_state_error(layout["saved_at"], layout["iterations"])
        data = {d: restored[d].numpy() for d in _STATE_DTYPES}
        slots: dict[str, dict[int, np.ndarray]] = {}
        for slot, index, shape, d, offset in layout["entries"]:
            size = int(np.prod(shape))
            slots.setdefault(slot, {})[int(index)] = data[d][offset:offset + size].reshape(shape)
        self.restore(slots, layout["iterations"])
        return tf.no_op()


def _own_rows(grad: tf.IndexedSlices, first_row: int, size: int) -> tf.Tensor:
    """A kernel's gradient given as this rank's rows (from ``first_row``; ``size`` elements),
    flat; summed where a layer called several times in the step gave them more than once."""
    values = grad.values
    if values.shape.num_elements() == size:
        return tf.reshape(values, [-1])
    rows = size // int(values.shape[1])
    return tf.reshape(tf.math.unsorted_segment_sum(values, grad.indices - first_row, rows), [-1])
