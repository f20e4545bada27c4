"""The sharded state of a plan ``strategy="auto"`` chose: the slices and their slots beside the
optimizer's own whole slots, which stay what checkpoints, ``.keras`` files and broadcasts see.

``strategy="sharded"`` keeps only the slices (1/P of the slot memory) and checkpoints them
through an entry of its own. ``auto`` may move into and out of sharded plans during a run, so
it keeps the layout a user of stock Horovod would find: the whole slots are the state between
sharded episodes, the slices are cut from them when a sharded plan starts (local, no
collective), and gathered back into them when it ends and at every checkpoint point
(``gather_state``). The cost: the slices' slots on top of the whole ones (1/P more slot memory
than stock while a sharded plan runs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from hvd_overlap.adapters import keras_api
from hvd_overlap.keras.sharded_slots import legacy_slots, plain_order, slots_by_slice
from hvd_overlap.keras.sharded_state import ShardedState


class MirroredState(ShardedState):
    """Sharded slices whose slots start from, and go back to, the optimizer's whole slots."""

    def __init__(self, name: str, opt: Any, plain_class: type) -> None:
        super().__init__(name, opt, plain_class)
        self.whole: dict[str, dict[int, tf.Variable]] = {}  # slot name -> variable index -> slot
        self.gathered_at: int | None = None  # the step whose slices the whole slots hold
        self.build: Callable[[list[tf.Variable]], Any] | None = None

    def _make_slots(self, build: Callable[[list[tf.Variable]], Any]
                    ) -> dict[int, dict[str, tf.Variable]]:
        """Slots for the model's variables (their values kept) and for the slices, in one
        build; the slices' hidden from ``variables()``."""
        self.build = build
        params = list(self.params.values())
        if keras_api.is_legacy_optimizer(self.opt):
            keras_api.create_legacy_slots(self.opt, self.variables)  # (only those not made yet)
            keras_api.create_legacy_slots(self.opt, params)
            slots = dict(zip(self.params, legacy_slots(self.opt, params), strict=True))
            self.whole = {}
            for i, by_name in enumerate(legacy_slots(self.opt, self.variables)):
                for n, var in by_name.items():
                    self.whole.setdefault(n, {})[i] = var
        else:
            slots = slots_by_slice(self.opt, self.params, self._rebuild(params))
        keras_api.hide_optimizer_variables(self.opt,
                                         {id(v) for d in slots.values() for v in d.values()})
        return slots

    def _rebuild(self, extra: list[tf.Variable]) -> list[tf.Variable]:
        """Keras 2.11+: build the optimizer again for the model's variables and ``extra``, the
        whole slots keeping their values (the replaced ones dropped from ``variables()``).
        Returns the slots made for ``extra``."""
        order = plain_order(self.plain_class, self.opt, self.variables)
        before = keras_api.slot_variables(self.opt)
        values = [v.numpy() for v in before] if len(before) == len(order) else None
        known = {id(v) for v in self.opt.variables}
        keras_api.mark_unbuilt(self.opt)
        self.build(list(self.variables) + extra)
        made = [v for v in self.opt.variables if id(v) not in known]
        keras_api.hide_optimizer_variables(self.opt, {id(v) for v in before})
        whole, rest = made[:len(order)], made[len(order):]
        self.whole = {}
        for k, ((slot, index, _), var) in enumerate(zip(order, whole, strict=True)):
            if values is not None:
                var.assign(values[k])
            self.whole.setdefault(slot, {})[index] = var
        return rest

    def _initial_state(self) -> None:
        self.from_whole()

    def from_whole(self) -> None:
        """Cut the slices' slots from the whole ones (eager, local)."""
        self.load_state({n: {i: v.numpy() for i, v in by_index.items()}
                         for n, by_index in self.whole.items()})
        self.gathered_at = self.step

    def to_whole(self) -> None:
        """Gather every rank's slices into the whole slots (eager; every rank)."""
        if self.gathered_at == self.step:
            return
        for n, by_index in self.gather_state().items():
            for i, value in by_index.items():
                self.whole[n][i].assign(value)
        self.gathered_at = self.step

    def release(self) -> None:
        """The sharded plan ends: its slices' state goes back into the whole slots (every
        rank), and the optimizer keeps slots for the model's variables only."""
        if self.layout is None:
            return
        self.to_whole()
        dropped = {id(v) for d in self.slots.values() for v in d.values()}
        if keras_api.is_legacy_optimizer(self.opt):
            keras_api.forget_legacy_slots(self.opt, dropped)
        else:
            self._rebuild([])
        self.slots, self.params = {}, {}
        self.layout = None

