"""Keras 3's optimizer internals the sharded update uses: its slice variables, the slots Keras 3
builds for them (found again by name), the variables before the slots in a ``.keras`` file, and
taking slots out of ``opt.variables``. Part of the ``keras3`` adapter, which re-exports it."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import keras
import numpy as np

__all__ = ["create_legacy_slots", "forget_legacy_slots", "head_variables",
           "hide_optimizer_variables", "make_variable", "mark_unbuilt", "shared_name", "slot_of",
           "slot_variables"]


def make_variable(value: np.ndarray, name: str) -> Any:
    """A variable the plugin keeps (a parameter slice, a stand-in): a ``keras.Variable``, which
    Keras 3 optimizers build slots for (``add_variable_from_reference`` reads its ``path``)."""
    return keras.Variable(value, dtype=value.dtype.name, trainable=False, name=name)


def create_legacy_slots(opt: Any, variables: Sequence[Any]) -> None:
    raise TypeError("Keras 3 has no legacy optimizers")  # (``is_legacy_optimizer`` is False)


def forget_legacy_slots(opt: Any, dropped: set[int]) -> None:
    """Nothing: a Keras 3 optimizer replaces its slot lists when built again."""


def mark_unbuilt(opt: Any) -> None:
    """``build`` returns at once once ``built``; clear it so a later plan's slices (auto's plan
    switch) get slots too (the base ``build`` resets ``_trainable_variables``)."""
    opt.built = False


def shared_name(var: Any) -> str:
    """What Keras 3 puts before a slot's name: ``add_variable_from_reference`` names a slot
    ``<path of its variable, '/' -> '_'>_<slot>``."""
    return var.path.replace("/", "_")


def slot_of(v: Any, owners: Collection[str]) -> tuple[str, str] | None:
    """(slot name, owner) of an optimizer variable named ``<owner>_<slot>`` (``owners``: the
    ``shared_name`` of the variables it may belong to; the longest that fits), else None."""
    for owner in sorted(owners, key=len, reverse=True):
        if v.name.startswith(owner + "_"):
            return v.name[len(owner) + 1:], owner
    return None


def head_variables(opt: Any) -> list[Any]:
    """The optimizer's variables made at construction, first in ``variables`` and in
    ``save_own_variables``'s layout: ``iteration``, then the learning rate unless a schedule."""
    lr = getattr(opt, "_learning_rate", None)
    return [opt._iterations] + ([lr] if isinstance(lr, keras.Variable) else [])


def slot_variables(opt: Any) -> list[Any]:
    """A built optimizer's variables after ``head_variables``: the slots in ``build`` order."""
    head = {id(v) for v in head_variables(opt)}
    return [v for v in opt.variables if id(v) not in head]


def hide_optimizer_variables(opt: Any, hidden: set[int]) -> None:
    """Drop the variables with these ids from ``opt.variables`` (its ``_variables`` list, in
    place: Keras's tracker appends to that list object), and so from broadcasts and saving.
    One ``del`` at a time: TF's list wrapper compares the elements of a slice assignment, and
    a Keras variable compares element-wise."""
    for i in reversed(range(len(opt._variables))):
        if id(opt._variables[i]) in hidden:
            del opt._variables[i]
