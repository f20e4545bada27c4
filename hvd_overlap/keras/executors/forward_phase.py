"""The cross-iteration bookkeeping shared by the deferring and sharded modes.

Step t leaves some buckets pending; the pre-forward phase of step t+1 (or a flush) brings them
in. ``pending`` is a variable, equal on every rank, so every rank takes the same branch. The
first traced step cannot defer (the plan is unknown when its pre-forward phase is traced), so it
brings everything in at once and asks for one retrace: ``ForwardPhase.stage`` goes from
``Stage.UNPLANNED`` to ``Stage.RETRACE`` (``create``) and, once the train function is traced
again, to ``Stage.STEADY`` (``take_retrace``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_overlap.comm.state_scope import plugin_state
from hvd_overlap.core import mutants
from hvd_overlap.core.plan import Plan
from hvd_overlap.keras.executors.base import Executor
from hvd_overlap.keras.executors.step_state import Stage, current_step


class ForwardPhase:
    """Whether the step being traced runs the pre-forward phase, the pending flag, and the
    stage (``Stage``)."""

    def __init__(self, strategy: str) -> None:
        self.strategy = strategy
        self.pending: tf.Variable | None = None
        self.stage = Stage.UNPLANNED
        self._warned = False
        self._flush_fn: Callable[[], object] | None = None

    @staticmethod
    def installed() -> bool:
        """True if a train step's body made by the plugin runs now (``step_context``: its
        pre-forward phase is installed), whatever graph -- a ``tf.cond`` branch, as the
        loss-scale optimizer's -- is being built in it."""
        return current_step() is not None

    def can_defer(self) -> bool:
        """True if this step may leave updates for the next one: its graph runs the
        pre-forward phase. Otherwise (``fit`` without ``OverlapCallback``, ``train_on_batch``,
        a custom step not made by ``make_train_step``) the step falls back to landing its whole
        update now -- exact, without the overlap with the next forward -- with one warning
        (rank 0) naming how to get the overlap back; and it checks that nothing was left
        pending by an earlier step, since this step's forward could not have seen it."""
        if mutants.off("deferral"):
            return False
        return self.installed() or not self.warn_once(
            "the step's update lands within the step (exact, but without the overlap with the "
            "next forward)")

    def warn_once(self, consequence: str) -> bool:
        """Say once (rank 0) that a step ran without the pre-forward phase, ``consequence``,
        and how to install it. True (so ``can_defer`` reads as a rule)."""
        if not self._warned:
            self._warned = True
            if hvd.rank() == 0:
                warnings.warn(
                    f"hvd_overlap: strategy {self.strategy!r} ran a step without its pre-forward "
                    f"phase, so {consequence}. To get it: add hvd_overlap.keras."
                    "OverlapCallback() to model.fit's callbacks, or build custom-loop steps with "
                    "opt.make_train_step(step_fn, model=model) (then call opt.flush() before "
                    "reading weights). train_on_batch has no such hook: it always falls back.",
                    stacklevel=5)
        return True

    def assert_not_pending(self) -> list:
        """An op (empty before the first step) that fails on every rank alike -- ``pending``
        is equal on all of them -- if an earlier step left an update pending."""
        if self.pending is None:
            return []
        return [tf.debugging.assert_equal(
            self.pending, False, message=(
                f"strategy {self.strategy!r}: an earlier step left an update pending and this "
                "step's forward ran without it; call opt.flush() on every rank after training "
                "with OverlapCallback/make_train_step and before train_on_batch or a custom step"))]

    def create(self) -> None:
        """The pending flag (first trace); the next trace can defer, so ask for it."""
        with plugin_state():
            self.pending = tf.Variable(False, trainable=False, name="hvd_overlap_pending")
        self.stage = Stage.RETRACE

    def is_pending(self) -> bool:
        return self.pending is not None and bool(self.pending.numpy())

    def take_retrace(self) -> bool:
        """True once after ``create``: the train function must be traced again (the caller
        does it), after which the stage is steady."""
        asked = self.stage is Stage.RETRACE
        if asked:
            self.stage = Stage.STEADY
        return asked

    def forget_flush(self) -> None:
        """Trace the flush function again at its next use (what it gathers changed)."""
        self._flush_fn = None

    def flush(self, land: Callable[[], None]) -> None:
        """Run the pre-forward phase now if something is pending, as a graph (the same kernels
        as in the train step, so the same bits)."""
        if self.is_pending():
            if self._flush_fn is None:
                self._flush_fn = tf.function(land)
            self._flush_fn()


class NextStepExecutor(Executor):
    """What the modes that leave part of a step for the next one share: the forward phase
    (pending flag, retrace request, flush) and the plan the first step fixed."""

    defers = True

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.phase = ForwardPhase(self.strategy)
        self.plan: Plan | None = None

    def flush(self) -> None:
        self.phase.flush(lambda: self.pre_forward(landing=True))

    def take_retrace(self) -> bool:
        return self.phase.take_retrace()

    @property
    def pending(self) -> bool:
        return self.phase.is_pending()
