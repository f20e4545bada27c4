"""The per-step protocol as named states, read and set while a train step is traced.

TensorFlow runs a train step's Python once, when it traces it; what the plugin decides there
(which gradients ``apply_gradients`` got, whether the plan is known yet, whether this train
function lands its own deferred part) is held here, one value per question:

- :class:`Gradients`: what ``apply_gradients`` receives -- local ones (the executor reduces
  them) or the global ones this optimizer's ``compute_gradients`` returned (sent no more).
  :class:`Handoff` carries it from ``compute_gradients`` to the ``apply_gradients`` after it.
- :class:`Stage`: where a next-step strategy is -- no step traced (the plan unknown), the first
  step traced without deferring (the train function must be traced again), or steady.
- :class:`StepKind`: what a ``model.fit`` train function does at its end -- leave the deferred
  part for the next step, or land it (a step after which the weights may be read).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from contextlib import contextmanager


class Gradients(enum.Enum):
    """What ``apply_gradients`` receives."""

    LOCAL = "local"    # as the tape computed them: the executor reduces them
    GLOBAL = "global"  # from this optimizer's compute_gradients, reduced already: sent no more


class Stage(enum.Enum):
    """Where a strategy that defers into the next step is (``ForwardPhase.stage``)."""

    UNPLANNED = "no step traced: the plan is unknown"
    RETRACE = ("the first step was traced without deferring (the plan was unknown when its "
               "pre-forward phase was traced): the train function must be traced again")
    STEADY = "the plan is fixed and traced into the train function: steps defer"


class StepKind(enum.Enum):
    """What a ``model.fit`` train function does at its end (``OverlapCallback``)."""

    DEFER = "leave the deferred part for the next step's pre-forward phase"
    LAND = "land the deferred part too: the weights may be read after this step"


class Handoff:
    """From ``compute_gradients`` to the ``apply_gradients`` after it, as traced.

    Inside ``minimize`` (``model.fit``'s path) the gradients stay local and ``apply_gradients``
    reduces them with the strategy's overlap. Called directly -- by user code, or by the
    mixed-precision loss-scale optimizer, whose finiteness check must see the same gradients on
    every rank -- ``compute_gradients`` returns global gradients, as stock Horovod's does, and
    the next ``apply_gradients`` sends nothing again."""

    def __init__(self) -> None:
        self._minimizing = False
        self._next = Gradients.LOCAL

    @contextmanager
    def minimizing(self) -> Iterator[None]:
        """``minimize``: its ``compute_gradients`` keeps the gradients local."""
        self._minimizing = True
        try:
            yield
        finally:
            self._minimizing = False

    @property
    def computes(self) -> Gradients:
        """What ``compute_gradients`` returns now."""
        return Gradients.LOCAL if self._minimizing else Gradients.GLOBAL

    def returned(self, gradients: Gradients) -> None:
        """``compute_gradients`` returned ``gradients``."""
        self._next = gradients

    def take(self) -> Gradients:
        """What this ``apply_gradients`` receives (the next one receives local ones again)."""
        got, self._next = self._next, Gradients.LOCAL
        return got


class TrainLoop(enum.Enum):
    """Who runs the train step, as ``attach_model`` is told: what user code can see of the
    gradients and the optimizer state between steps (``auto`` leaves out the plans it could
    not keep invisible)."""

    KERAS_FIT = "model.fit with Keras's own train_step"
    OWN_TRAIN_STEP = "model.fit with a train_step of the model's own"
    CUSTOM = "a custom loop (make_train_step)"
