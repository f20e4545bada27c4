"""Keras callback of the cross-iteration strategies: :class:`OverlapCallback` installs the
pre-forward phase into ``model.fit``'s train step and flushes pending updates (the batch-size
growth callback is ``hvd_overlap.growth.BatchSizeScheduler``)."""

from __future__ import annotations

import statistics
import time

from hvd_overlap.adapters import keras_api
from hvd_overlap.keras.executors.step_state import (
    StepFunction,
    StepKind,
    TrainLoop,
    function_kind,
    step_context,
)

__all__ = ["OverlapCallback"]


class OverlapCallback(keras_api.keras.callbacks.Callback):
    """Installs the pre-forward phase into ``model.fit``'s train step and flushes pending
    updates whenever someone could look at the weights.

    With ``strategy="deferred"`` or ``"hybrid"`` the update of step t is applied at the start
    of step t+1. This callback flushes it (applies it now, on every rank) at the end of every
    epoch -- so validation, ``ModelCheckpoint(save_freq="epoch")`` and ``EarlyStopping`` see
    current weights --, before ``evaluate``/``predict`` run with it, and at the end of ``fit``.
    For checkpoints every N batches, pass ``flush_every=N``. With other strategies it does
    nothing.

    With ``strategy="sharded"`` it also gathers every rank's optimizer-state slices at those
    points (end of epoch, every ``flush_every`` batches, end of fit), so a checkpoint saved there
    is complete; ``gather_state=False`` skips that (saves bandwidth and host memory when no
    checkpoint holds optimizer state).
    """

    def __init__(self, flush_every: int | None = None, gather_state: bool = True):
        super().__init__()
        # the batch logs as tensors: Keras then does not turn them into numbers (a host sync)
        # at every step for this callback; it ends a step itself only while a check times it
        self._supports_tf_logs = True
        if flush_every is not None and (not isinstance(flush_every, int) or flush_every < 1):
            raise ValueError(f"flush_every must be a positive number of batches, got "
                             f"{flush_every!r}")
        self.flush_every = flush_every
        self.gather_state = gather_state
        self._patched = False
        self._replaced = None
        self._kind = StepKind.DEFER  # the kind of the function the current step runs
        self._functions: dict[StepKind, object] = {}
        self._keras_function = None  # the one fit made, put back at its end (see on_train_end)
        self._started = 0.0
        self._steps_done = 0  # in this fit, across epochs (as ModelCheckpoint's save_freq)
        self._epoch_steps: list[float] = []  # this epoch's step times (s)

    def _optimizer(self):
        opt = keras_api.wrapped_optimizer(getattr(self.model, "optimizer", None))
        return opt if getattr(opt, "defers", False) else None

    def on_train_begin(self, logs=None):
        self._steps_done, self._epoch_steps = 0, []
        opt = self._optimizer()
        if opt is None or self._patched:
            return
        # fit kept its train function since our last fit (no compile, no make_train_function
        # since) and the model's own train_step is the same: ours, traced then, still hold
        made = self.model.train_function
        again = bool(self._functions) and made is not None and made is self._keras_function \
            and vars(self.model).get("train_step") is self._replaced
        original = self.model.train_step

        def train_step(data):
            # the kind of the function being traced (``_make_train_functions`` built each
            # function for its kind): a landing step brings its own deferred part in at its end
            with step_context(function_kind()) as step:
                opt.pre_forward()
                out = original(data)
                if step.kind is StepKind.LAND:
                    opt.pre_forward(landing=True)
            return out

        # a train_step set on the model itself (enable_gradient_accumulation's) comes back after
        self._replaced = keras_api.patch_method(self.model, "train_step", train_step)
        own = self._replaced is not None or \
            type(self.model).train_step is not keras_api.keras.Model.train_step
        loop = TrainLoop.OWN_TRAIN_STEP if own else TrainLoop.KERAS_FIT
        # weights loaded during fit (a callback's set_weights/load_weights) must not have a
        # pending update land on top of them: flush first, on every rank; load_weights may
        # restore the optimizer's state too: attach again after it (auto's sharded plan
        # re-reads the state)
        for method in ("set_weights", "load_weights"):
            keras_api.patch_method(self.model, method, _flushing_first(
                opt, getattr(self.model, method), lambda: opt.attach_model(self.model, loop)))
        self._patched = True
        opt.attach_model(self.model, loop)
        self._keras_function = made
        if not again:  # (a switch asked for since is taken at the first batch)
            self._make_train_functions()

    def _make_train_functions(self) -> None:
        """Two train functions, each traced at its first call: one that defers (the usual
        step) and one that also brings its own deferred part in at its end, for the steps
        after which someone may read the weights (every ``flush_every``-th batch, the last of
        an epoch), so that a checkpoint there is current whatever the callbacks' order. ``fit``
        made its train function before ``on_train_begin`` and reads it again every step.
        While the plan running defers nothing (``strategy="auto"`` on stock's fusion), both
        kinds are one function: one trace instead of two (a switch makes them again)."""
        opt = self._optimizer()
        if opt is not None and not opt.defers_now:
            one = StepFunction(keras_api.new_train_function(self.model), StepKind.DEFER)
            self._functions = dict.fromkeys(StepKind, one)
            return
        self._functions = {kind: StepFunction(keras_api.new_train_function(self.model), kind)
                           for kind in StepKind}

    def _checkpoint_due(self, batch: int) -> bool:
        """After every ``flush_every``-th step of the fit, counted across epochs as
        ``ModelCheckpoint(save_freq=N)`` counts them, and after an epoch's last step."""
        steps = self.params.get("steps") if self.params else None
        return bool((self.flush_every and (self._steps_done + 1) % self.flush_every == 0)
                    or (steps and batch + 1 == steps))

    def on_train_batch_begin(self, batch, logs=None):
        if self._patched:
            opt = self._optimizer()
            if opt is not None and opt.take_retrace():  # a plan switched between steps
                self._make_train_functions()             # (auto's reconsider at a growth)
            self._kind = StepKind.LAND if self._checkpoint_due(batch) else StepKind.DEFER
            fn = self._functions[self._kind]
            if self.model.train_function is not fn:  # Keras tracks every attribute set on a
                keras_api.set_train_function(self.model, fn)  # model: ms per step on deep ones
        self._started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        opt = self._optimizer()
        if opt is not None:
            if opt.checking:  # the step's outputs exist: it ended (on GPUs, not before)
                _sync(logs)
            took = time.perf_counter() - self._started
            self._epoch_steps.append(took)
            # steady steps only: the first of an epoch follows a flush, a landing step lands
            # twice
            opt.observe_step(took,
                             usable=batch > 0 and self._kind is StepKind.DEFER)
            if opt.take_retrace():  # the first trace could not defer yet
                self._make_train_functions()
            if self._checkpoint_due(batch):
                self._checkpoint_point()  # (sharded) gathers the optimizer state
        self._steps_done += 1

    def _flush(self, *_args, **_kwargs):
        opt = self._optimizer()
        if opt is not None:
            opt.flush()

    def _checkpoint_point(self, *_args, **_kwargs):
        """Where a checkpoint may be saved: current weights, and (sharded) gathered state."""
        opt = self._optimizer()
        if opt is not None:
            opt.flush()
            if self.gather_state:
                opt.gather_state()

    on_test_begin = on_predict_begin = _flush

    def on_epoch_end(self, epoch, logs=None):
        """A checkpoint point; adds ``step_time_ms`` (the epoch's median train step, traces
        and flushes aside) to ``logs`` for History, CSVLogger and TensorBoard (list this
        callback before them)."""
        self._checkpoint_point()
        if logs is not None and self._epoch_steps:
            logs["step_time_ms"] = 1e3 * statistics.median(self._epoch_steps)
        self._epoch_steps = []

    def on_train_end(self, logs=None):
        self._checkpoint_point()
        if self._patched:
            # the train_step the model itself held, or (none) the class's method, is back
            keras_api.restore_method(self.model, "train_step", self._replaced)
            for method in ("set_weights", "load_weights"):
                keras_api.restore_method(self.model, method)
            # fit's own function, never called, traces the model's train_step if a later fit
            # runs without this callback; with it, that fit finds its functions again: no
            # retrace per fit (a fixed plan without the callback keeps Keras's as well)
            if self._keras_function is not None:
                keras_api.set_train_function(self.model, self._keras_function)
            else:
                keras_api.forget_train_function(self.model)
            self._patched = False


def _sync(logs) -> None:
    """Wait for the step whose outputs ``logs`` holds (one is enough: they end together)."""
    for value in (logs or {}).values():
        if hasattr(value, "numpy"):
            value.numpy()
            return


def _flushing_first(opt, method, after):
    """``method`` (a model's ``set_weights``/``load_weights``) after ``opt.flush()``, then
    ``after()``."""
    def call(*args, **kwargs):
        opt.flush()
        out = method(*args, **kwargs)
        after()
        return out
    return call
