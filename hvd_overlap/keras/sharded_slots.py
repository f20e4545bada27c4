"""The optimizer slots of the sharded mode's parameter slices: built for the slices only and
hidden from ``opt.variables()``, found again by slot name, masked for weight decay, released at a
plan switch; and the plain optimizer's slot order (a ``.keras`` file's layout)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from hvd_overlap.adapters import keras_api
from hvd_overlap.comm.state_scope import plugin_state
from hvd_overlap.core.sharding import ShardLayout, own_slice


def build_slice_slots(opt, params: dict[int, tf.Variable],
                      build: Callable[[list[tf.Variable]], Any]
                      ) -> dict[int, dict[str, tf.Variable]]:
    """Build the optimizer's slots for the slice variables (``build``: the plain optimizer's),
    then take them out of ``opt.variables()`` (and so out of broadcasts and the optimizer's own
    checkpoint entries)."""
    shard_vars = list(params.values())
    if keras_api.is_legacy_optimizer(opt):  # slots via add_slot, found by get_slot
        keras_api.create_legacy_slots(opt, shard_vars)
        slots = dict(zip(params, legacy_slots(opt, shard_vars), strict=True))
    else:  # slots appended to opt.variables, found by name
        before = {id(v) for v in opt.variables}
        keras_api.mark_unbuilt(opt)  # an earlier plan's slices had slots built (auto's switch)
        build(shard_vars)
        slots = slots_by_slice(opt, params, [v for v in opt.variables if id(v) not in before])
    keras_api.hide_optimizer_variables(opt, {id(v) for d in slots.values() for v in d.values()})
    return slots


def legacy_slots(opt, variables: Sequence[tf.Variable]) -> list[dict[str, tf.Variable]]:
    """A legacy optimizer's slots of each variable, by slot name (those it made)."""
    out = []
    for v in variables:
        got = {}
        for n in opt.get_slot_names():
            try:
                got[n] = opt.get_slot(v, n)
            except KeyError:
                pass
        out.append(got)
    return out


def slots_by_slice(opt, params: dict[int, tf.Variable], made: Sequence[tf.Variable]
                   ) -> dict[int, dict[str, tf.Variable]]:
    """Keras 2.11+ (and Keras 3) slots just ``made`` for the slice variables ``params``, by
    bucket and slot name (a slot is named after its variable)."""
    owner = {keras_api.shared_name(p): b for b, p in params.items()}
    slots: dict[int, dict[str, tf.Variable]] = {b: {} for b in params}
    for v in made:
        found = keras_api.slot_of(v, owner)
        if found is None:
            raise TypeError(f"{type(opt).__name__} made variable {v.name} that is not a slot "
                            "of one parameter slice; the sharded strategy cannot split it")
        slot, var_name = found
        slots[owner[var_name]][slot] = v
    return slots


def release_slots(opt, slots: dict[int, dict[str, tf.Variable]]) -> None:
    """Forget the slots ``build_slice_slots`` made once their slices are dropped (a switch):
    a legacy optimizer keeps them in its slot registry; a Keras 2.11+ one replaces its slot
    lists when built again."""
    keras_api.forget_legacy_slots(opt, {id(v) for d in slots.values() for v in d.values()})


def decay_masks(opt, layout: ShardLayout, variables, rank: int) -> dict[int, tf.Tensor]:
    """Keras's decoupled weight decay skips the variables excluded by name or identity; on a
    slice spanning several variables that is a 0/1 mask (only where some are excluded)."""
    if getattr(opt, "weight_decay", None) is None:
        return {}
    masks = {}
    for b in layout.buckets:
        use = {s.index: keras_api.uses_weight_decay(opt, variables[s.index]) for s in b.segments}
        if all(use.values()):
            continue
        ones = {s.index: np.full(s.shape, 1.0 if use[s.index] else 0.0, b.dtype)
                for s in b.segments}
        masks[b.bucket] = tf.constant(own_slice(b, ones, rank))
    return masks


def stale_state_error(weights_step: int, state_step: int | None) -> ValueError:
    return ValueError(
        f"weights of step {weights_step} but sharded optimizer state of step {state_step} "
        "(None: never gathered): the state was not gathered before saving. Save where "
        "OverlapCallback gathers it (end of epoch, or pass OverlapCallback(flush_every=N) for "
        "ModelCheckpoint(save_freq=N)), or call opt.flush(); opt.gather_state() on every rank "
        "before saving.")


def plain_order(plain_class: type, opt,
                variables: Sequence[tf.Variable]) -> list[tuple[str, int, float]]:
    """(slot name, variable index, initial value) of every variable the plain optimizer (the
    user's class, configured as ``opt``) would keep after its step counter, in its order (that
    of ``save_own_variables``); found by building one on 1-element stand-ins, so no full-size
    slot is ever allocated."""
    plain = plain_class.from_config(opt.get_config())
    with plugin_state():
        probes = [keras_api.make_variable(np.zeros([1], numpy_dtype(v)), f"hvdo_probe{i}")
                  for i, v in enumerate(variables)]
        plain.build(probes)
    index = {keras_api.shared_name(p): i for i, p in enumerate(probes)}
    order = []
    for v in keras_api.slot_variables(plain):
        found = keras_api.slot_of(v, index)
        if found is None:
            raise TypeError(f"{plain_class.__name__} made variable {v.name} that is not a slot "
                            "of one variable; its state cannot be saved per variable")
        order.append((found[0], index[found[1]], float(v.numpy()[0])))
    return order


def numpy_dtype(v: Any) -> np.dtype:
    """A variable's dtype as numpy's (Keras 3 variables name theirs as a string)."""
    return np.dtype(tf.as_dtype(v.dtype).as_numpy_dtype)
