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
- :class:`StepContext`: one run of a train step's body, entered by that body
  (``step_context``) with the kind of the function built for it (``StepFunction``): its
  presence is what makes a traced graph a train step with the pre-forward phase.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


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


class StepContext:
    """One run of a train step's body (TensorFlow runs it when it traces the step): its kind,
    fixed by the function built for it, and the exchanged layers' records of this step (each
    call's number, for its collectives' names; the input gradients they send back)."""

    def __init__(self, kind: StepKind) -> None:
        self.kind = kind
        self._calls: dict[int, int] = {}
        self._sent_back: dict[int, list[Any]] = {}

    def next_call(self, owner: object) -> int:
        """Number ``owner``'s next call in this step (0 first)."""
        n = self._calls.get(id(owner), 0)
        self._calls[id(owner)] = n + 1
        return n

    def calls(self, owner: object) -> int:
        """``owner``'s calls in this step so far."""
        return self._calls.get(id(owner), 0)

    def send_back(self, owner: object, gradient: Any) -> None:
        """``owner`` sent an input gradient back to its batch's rank in this step."""
        self._sent_back.setdefault(id(owner), []).append(gradient)

    def sent_back(self, owner: object) -> list[Any]:
        """The input gradients ``owner`` sent back in this step."""
        return list(self._sent_back.get(id(owner), []))


_local = threading.local()  # (TensorFlow traces a function in the thread that calls it)


def _stack(name: str) -> list:
    if not hasattr(_local, name):
        setattr(_local, name, [])
    return getattr(_local, name)


_opened = 0  # step contexts opened in this process: one per run of a step's body


@contextmanager
def step_context(kind: StepKind) -> Iterator[StepContext]:
    """Run a train step's body as a step of ``kind`` (its pre-forward phase is installed)."""
    global _opened
    _opened += 1
    ctx = StepContext(kind)
    _stack("steps").append(ctx)
    try:
        yield ctx
    finally:
        _stack("steps").pop()


def traced_steps() -> int:
    """How many train step bodies ran so far in this process (``step_context``): TensorFlow
    runs one when it traces the step, so a change between two steps says one of them traced."""
    return _opened


def current_step() -> StepContext | None:
    """The train step whose body runs now, or None (no step made by the plugin runs)."""
    steps = _stack("steps")
    return steps[-1] if steps else None


def function_kind() -> StepKind:
    """The kind of the train function being called (``StepFunction``); ``DEFER`` otherwise."""
    kinds = _stack("kinds")
    return kinds[-1] if kinds else StepKind.DEFER


class StepFunction:
    """A train function built for one ``StepKind``: each call -- so each trace TensorFlow
    makes of it -- runs with that kind (``function_kind``). Other attributes are the
    function's."""

    def __init__(self, fn: Callable[..., Any], kind: StepKind) -> None:
        self.fn, self.kind = fn, kind

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _stack("kinds").append(self.kind)
        try:
            return self.fn(*args, **kwargs)
        finally:
            _stack("kinds").pop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fn, name)
