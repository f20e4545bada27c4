"""Keras callback of the cross-iteration strategies: :class:`OverlapCallback` installs the
pre-forward phase into ``model.fit``'s train step and flushes pending updates (the batch-size
growth callback is ``hvd_overlap.growth.BatchSizeScheduler``)."""

from __future__ import annotations

import tensorflow as tf

__all__ = ["OverlapCallback"]


class OverlapCallback(tf.keras.callbacks.Callback):
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
        if flush_every is not None and (not isinstance(flush_every, int) or flush_every < 1):
            raise ValueError(f"flush_every must be a positive number of batches, got "
                             f"{flush_every!r}")
        self.flush_every = flush_every
        self.gather_state = gather_state
        self._patched = False

    def _optimizer(self):
        opt = getattr(self.model, "optimizer", None)
        # mixed precision: compile wraps ours in a LossScaleOptimizer
        opt = getattr(opt, "inner_optimizer", opt)
        return opt if getattr(opt, "defers", False) else None

    def on_train_begin(self, logs=None):
        opt = self._optimizer()
        if opt is None or self._patched:
            return
        original = self.model.train_step

        def train_step(data):
            opt.pre_forward()
            return original(data)

        self.model.train_step = train_step
        self._patched = True
        # fit made its train function before on_train_begin; it reads it again every step
        self.model.train_function = self.model.make_train_function(force=True)

    def on_train_batch_end(self, batch, logs=None):
        opt = self._optimizer()
        if opt is None:
            return
        if opt.take_retrace():  # the first trace could not defer yet
            self.model.train_function = self.model.make_train_function(force=True)
        steps = self.params.get("steps") if self.params else None
        if (self.flush_every and (batch + 1) % self.flush_every == 0) or \
                (steps and batch + 1 == steps):
            self._checkpoint_point()

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
    on_epoch_end = _checkpoint_point

    def on_train_end(self, logs=None):
        self._checkpoint_point()
        if self._patched:
            del self.model.train_step  # the instance attribute; the class's method is back
            self.model.train_function = None
            self._patched = False
