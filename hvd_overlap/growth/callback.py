"""Keras callback of the batch-size growth feature: :class:`BatchSizeScheduler` (the policy is
``hvd_overlap.growth.policy``; the data side, per-epoch re-batching and gradient accumulation,
``hvd_overlap.growth.data``)."""

from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_overlap.adapters import keras_api
from hvd_overlap.comm import collectives
from hvd_overlap.core import mutants
from hvd_overlap.growth.policy import BatchGrowth, Growth

__all__ = ["BatchSizeScheduler"]


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

    Thin glue over a :class:`~hvd_overlap.growth.policy.BatchGrowth` policy (``self.policy``):

    - ``on_epoch_end``: adds ``batch_size`` (global), ``per_rank_batch_size``,
      ``accumulation_steps`` and ``lr`` (the values used in that epoch) to ``logs``, so
      History, CSVLogger and TensorBoard record them (put this callback before them), then lets
      the policy decide. With more than one rank the decision is made on rank 0 and its state
      is broadcast (``hvd.broadcast_object``), so every rank grows at the same epoch even when
      the monitored value (e.g. a rank-local ``loss``) differs between ranks.
    - ``on_train_batch_begin``: sets the optimizer's lr (per step during a warm-up ramp); the
      optimizer must hold a float lr, and no other callback should set it.

    Growing the batch itself needs the data pipeline to follow ``policy.per_rank_batch`` /
    ``policy.accumulation_steps``: use ``hvd_overlap.growth.data.fit_with_growth`` (``model.fit``
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
            state = collectives.broadcast_object(p.state_dict(),
                                                 "hvd_overlap.BatchSizeScheduler.state")
            p.load_state_dict(state)
        if len(p.events) > before:
            self._announce(p.events[-1])
            self._reconsider_plan(p.events[-1])
        self._apply_lr()

    def _reconsider_plan(self, event: Growth) -> None:
        """An ``hvd-overlap`` optimizer choosing its plan (``strategy="auto"``) chooses again
        for the new batch (every rank: the policy's state was just broadcast), told how many
        steps the new batch will run (None: unknown) and by what factor it grew."""
        if mutants.off("reconsider"):
            return
        opt = keras_api.wrapped_optimizer(self.model.optimizer)
        reconsider = getattr(opt, "reconsider", None)
        if reconsider is None:
            return
        params = self.params or {}
        epochs = self.policy.phase_epochs(event.epoch, params.get("epochs") or event.epoch)
        steps = params.get("steps")
        horizon = None if epochs is None or not steps else \
            epochs * max(1, steps * event.old_batch // event.new_batch)
        reconsider(f"epoch {event.epoch}: global batch {event.old_batch} -> {event.new_batch}",
                   batch_factor=event.new_batch / event.old_batch, horizon_steps=horizon)

    def _announce(self, event: Growth) -> None:
        if self.verbose and _world_rank() == 0:
            p = self.policy
            print(f"\nBatchSizeScheduler: epoch {event.epoch}: global batch {event.old_batch} -> "
                  f"{event.new_batch} ({p.per_rank_batch}/rank x {p.accumulation_steps} "
                  f"micro-batches x {p.num_ranks} ranks), lr {event.old_lr:.4g} -> "
                  f"{event.new_lr:.4g}" + (f" over {p.warmup_steps} steps"
                                           if p.warmup_steps else ""))
