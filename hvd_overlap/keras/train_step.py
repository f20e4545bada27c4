"""Custom training loops with a deferring strategy: the step with the pre-forward phase first."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from hvd_overlap.keras.executors.step_state import StepKind, step_context


class OverlapTrainStep:
    """A custom-loop step (ending with ``apply_gradients``) in a ``tf.function`` that starts
    with ``opt.pre_forward()``; traced again once, after the first call (when the plan, unknown
    at the first trace, becomes known). Made by ``opt.make_train_step(step_fn)``."""

    def __init__(self, opt: Any, step_fn: Callable[..., Any]):
        self.opt, self.step_fn = opt, step_fn
        self._fn = self._trace()

    def _trace(self):
        def step(*args, **kwargs):
            with step_context(StepKind.DEFER):  # a custom loop's steps all defer
                self.opt.pre_forward()
                return self.step_fn(*args, **kwargs)
        return tf.function(step)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.opt.take_retrace():  # a plan switched between steps (``opt.reconsider``)
            self._fn = self._trace()
        start = time.perf_counter()
        out = self._fn(*args, **kwargs)
        self.opt.observe_step(time.perf_counter() - start)  # the step ran: its outputs exist
        if self.opt.take_retrace():
            self._fn = self._trace()
        return out
