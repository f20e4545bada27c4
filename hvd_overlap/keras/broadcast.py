"""The initial broadcast, on both Keras generations: ``broadcast_variables`` and
``BroadcastGlobalVariablesCallback``, in place of Horovod's (which fail on Keras 3 variables:
they ask for ``Variable.ref()``). The same names and arguments as Horovod's, so the one-line
change is the import."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_overlap.adapters import keras_api
from hvd_overlap.comm import collectives

_calls = itertools.count()


def broadcast_variables(variables: Iterable[Any], root_rank: int = 0) -> None:
    """Set every rank's ``variables`` (Keras 2 or 3 variables, or ``tf.Variable``) to rank
    ``root_rank``'s values, as ``hvd.broadcast_variables``. Call it on every rank with the same
    variables in the same order (eagerly; the broadcasts run together, in one function)."""
    targets = [keras_api.tf_variable(v) for v in variables]
    if not targets or hvd.size() == 1:
        return
    prefix = f"hvd_overlap.broadcast{next(_calls)}"

    @tf.function(autograph=False)
    def assign_all() -> None:
        for i, v in enumerate(targets):
            v.assign(collectives.broadcast(v.read_value(), f"{prefix}.{i}", root_rank))

    assign_all()


def optimizer_variables(opt: Any) -> list[Any]:
    """An optimizer's own variables (``variables`` is a method on legacy Keras 2 optimizers,
    a property elsewhere); empty before it made any."""
    found = getattr(opt, "variables", None)
    found = found() if callable(found) else found
    return list(found or [])


class BroadcastGlobalVariablesCallback(keras_api.keras.callbacks.Callback):
    """Start every rank from rank ``root_rank``'s model and optimizer, as Horovod's callback of
    the same name: the model's variables (and the optimizer's, if it has any yet) before the
    first step, and the optimizer's again after the first step, which makes them (Keras builds
    its optimizer then). Put it first in ``callbacks``. ``device`` is Horovod's argument, kept
    for the one-line change (the broadcast runs where the variables live)."""

    def __init__(self, root_rank: int = 0, device: str = ""):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self._done_after_first = False

    def on_train_begin(self, logs=None):
        opt = getattr(self.model, "optimizer", None)
        broadcast_variables(list(self.model.variables) + optimizer_variables(opt),
                            self.root_rank)

    def on_train_batch_end(self, batch, logs=None):
        if self._done_after_first:
            return
        self._done_after_first = True
        broadcast_variables(optimizer_variables(getattr(self.model, "optimizer", None)),
                            self.root_rank)
