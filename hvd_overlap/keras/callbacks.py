"""Keras callbacks of hvd-overlap.

- :class:`OverlapCallback`: the pre-forward phase and the flushes of the cross-iteration
  strategies (``deferred``, ``hybrid``); harmless with the others.
- :class:`BatchSizeScheduler`: run-time batch-size growth (policy in ``hvd_overlap.batching``;
  the data side, per-epoch re-batching and gradient accumulation, in ``hvd_overlap.data``).
"""

from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_overlap.batching import BatchGrowth, Growth

__all__ = ["BatchSizeScheduler", "OverlapCallback"]


def _world_size() -> int:
    return hvd.size() if hvd.is_initialized() else 1


def _world_rank() -> int:
    return hvd.rank() if hvd.is_initialized() else 0


def _set_lr(optimizer: Any, value: float) -> None:
    """Assign a float learning rate to a Keras (new or legacy, Horovod-wrapped) optimizer."""
    current = getattr(optimizer, "learning_rate", None)
    if isinstance(current, tf.keras.optimizers.schedules.LearningRateSchedule):
        raise TypeError("BatchSizeScheduler sets the learning rate itself: give the optimizer "
                        "a float learning rate, not a LearningRateSchedule")
    optimizer.learning_rate = value


class BatchSizeScheduler(tf.keras.callbacks.Callback):
    """Grows the global batch at epoch ends and couples the optimizer's learning rate to it.

    Thin glue over a :class:`~hvd_overlap.batching.BatchGrowth` policy (``self.policy``):

    - ``on_epoch_end``: adds ``batch_size`` (global), ``per_rank_batch_size``,
      ``accumulation_steps`` and ``lr`` (the values used in that epoch) to ``logs``, so
      History, CSVLogger and TensorBoard record them (put this callback before them), then lets
      the policy decide. With more than one rank the decision is made on rank 0 and its state
      is broadcast (``hvd.broadcast_object``), so every rank grows at the same epoch even when
      the monitored value (e.g. a rank-local ``loss``) differs between ranks.
    - ``on_train_batch_begin``: sets the optimizer's lr (per step during a warm-up ramp); the
      optimizer must hold a float lr, and no other callback should set it.

    Growing the batch itself needs the data pipeline to follow ``policy.per_rank_batch`` /
    ``policy.accumulation_steps``: use ``hvd_overlap.data.fit_with_growth`` (``model.fit``
    fixes its batches when it starts).

    Resume: save ``get_state()`` (a JSON-serialisable dict) with the checkpoint and call
    ``set_state()`` on a scheduler built with the same configuration before training again.

    Args:
        policy: the growth policy (its ``num_ranks`` should be ``hvd.size()``).
        monitor: logs key fed to a metric-driven trigger (``Plateau``), e.g. ``"loss"``.
        verbose: 1 prints growth events on rank 0.
    """

    def __init__(self, policy: BatchGrowth, monitor: str = "loss", verbose: int = 0):
        super().__init__()
        self.policy = policy
        self.monitor = monitor
        self.verbose = verbose
        self._lr_set: float | None = None

    # -- state ------------------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        return self.policy.state_dict()

    def set_state(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state)
        self._lr_set = None

    # -- hooks ------------------------------------------------------------------------------

    def _apply_lr(self) -> None:
        lr = self.policy.lr
        if lr != self._lr_set:
            _set_lr(self.model.optimizer, lr)
            self._lr_set = lr

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._lr_set = None
        self._apply_lr()

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self._apply_lr()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.policy.step()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        p = self.policy
        if logs is not None:
            logs.update(batch_size=p.global_batch, per_rank_batch_size=p.per_rank_batch,
                        accumulation_steps=p.accumulation_steps,
                        lr=self._lr_set if self._lr_set is not None else p.lr)
        metric = None
        needs_metric = p.trigger is not None and p.trigger.needs_metric
        if needs_metric:
            if logs is None or self.monitor not in logs:
                raise ValueError(f"BatchSizeScheduler: monitor {self.monitor!r} is not in the "
                                 f"epoch logs ({sorted(logs or {})})")
            metric = float(logs[self.monitor])
        before = len(p.events)
        if _world_size() == 1:
            p.end_epoch(epoch, metric)
        else:
            if _world_rank() == 0:
                p.end_epoch(epoch, metric)
            state = hvd.broadcast_object(p.state_dict(), root_rank=0,
                                         name="hvd_overlap.BatchSizeScheduler.state")
            p.load_state_dict(state)
        if len(p.events) > before:
            self._announce(p.events[-1])
        self._apply_lr()

    def _announce(self, event: Growth) -> None:
        if self.verbose and _world_rank() == 0:
            p = self.policy
            print(f"\nBatchSizeScheduler: epoch {event.epoch}: global batch {event.old_batch} -> "
                  f"{event.new_batch} ({p.per_rank_batch}/rank x {p.accumulation_steps} "
                  f"micro-batches x {p.num_ranks} ranks), lr {event.old_lr:.4g} -> "
                  f"{event.new_lr:.4g}" + (f" over {p.warmup_steps} steps"
                                           if p.warmup_steps else ""))


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
        if opt._hvdo.deferral.needs_retrace:  # the first trace could not defer yet
            opt._hvdo.deferral.needs_retrace = False
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
