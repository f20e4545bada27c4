"""Making batch-size growth take effect: per-rank shards, per-epoch re-batching, accumulation.

``model.fit`` fixes its data iterator and its steps per epoch when it starts, so a batch that
grows during training needs a new iterator. :func:`fit_with_growth` is the outer loop that does
it: one ``model.fit(initial_epoch=e, epochs=e + 1)`` per epoch, fed by a
:class:`ShardedDataset` re-batched with the scheduler's current per-rank batch, all epochs
sharing one callback list, so callbacks see a single run (one ``on_train_begin``/``end``, one
History, CSVLogger and TensorBoard files that are not reset between epochs).

Every rank must run the same number of steps per epoch or Horovod hangs: the shards have equal
sizes (``n // size`` samples each) and the last, incomplete batch is dropped.

Past the per-rank memory ceiling, the scheduler asks for ``accumulation_steps`` micro-batches
per optimizer step. Horovod's ``DistributedOptimizer(backward_passes_per_step=N)`` fixes ``N``
when it is built, so instead :func:`enable_gradient_accumulation` replaces the model's
``train_step``: the per-rank batch is split into micro-batches run one after the other, their
gradients are averaged (mean-reduced losses: the average of equal micro-batch means is the
mean over the batch) and applied once, so there is one collective per optimizer step and the
update equals that of one big batch (BatchNormalization statistics excepted: they are
per micro-batch).
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from hvd_overlap.adapters import keras_api
from hvd_overlap.comm.accumulation import GradientSums
from hvd_overlap.growth.callback import BatchSizeScheduler

__all__ = ["GradientAccumulation", "ShardedDataset", "enable_gradient_accumulation",
           "fit_with_growth"]


class ShardedDataset:
    """This rank's equal-sized shard of a training set, batched anew for every epoch.

    ``x`` (with ``y`` and ``sample_weight``) is either in-memory arrays (nested structures of
    arrays allowed), or an *unbatched* ``tf.data.Dataset`` of ``(x, y[, sample_weight])``
    elements whose size is known (or given as ``num_samples``).

    Arrays: every epoch, all ranks draw the same permutation of the whole set (seeded by
    ``seed + epoch``) and take their own slice of it, so shards change between epochs but never
    overlap. A dataset: ``dataset.shard(size, rank)``, cut to the common size, shuffled within
    the shard every epoch (``shuffle_buffer``).

    ``autotune``: tf.data's autotuner, off by default. :func:`fit_with_growth` starts a new
    iterator every epoch, and at its end the autotuner's thread held ``fit``'s return for about
    1.2 s in a third of the epochs (measured on a 2-rank digits run: 0.8 s epochs became 2 s).
    Turn it on for a dataset whose parallel maps need tuning; without it they run at
    tf.data's default parallelism.
    """

    def __init__(self, x: Any, y: Any = None, sample_weight: Any = None, *,
                 shuffle: bool = True, seed: int = 0, rank: int | None = None,
                 size: int | None = None, num_samples: int | None = None,
                 shuffle_buffer: int = 10_000, autotune: bool = False):
        self.autotune = autotune
        self.rank = hvd.rank() if rank is None else rank
        self.size = hvd.size() if size is None else size
        self.shuffle, self.seed, self.shuffle_buffer = shuffle, seed, shuffle_buffer
        if isinstance(x, tf.data.Dataset):
            if y is not None or sample_weight is not None:
                raise ValueError("with a tf.data.Dataset, put y and sample_weight in its elements")
            n = num_samples if num_samples is not None else int(x.cardinality())
            if n < 0:
                raise ValueError("the dataset's size is unknown: pass num_samples=")
            self._dataset: tf.data.Dataset | None = x
            self._arrays: tuple | None = None
        else:
            arrays = (x,) + tuple(a for a in (y, sample_weight) if a is not None)
            if y is None and sample_weight is not None:
                raise ValueError("sample_weight needs y")
            lengths = {len(a) for a in tf.nest.flatten(arrays)}
            if len(lengths) != 1:
                raise ValueError(f"x, y and sample_weight have different lengths: {lengths}")
            n = lengths.pop()
            self._dataset, self._arrays = None, arrays
        self.samples_per_rank = n // self.size
        if self.samples_per_rank < 1:
            raise ValueError(f"{n} samples cannot be shared by {self.size} ranks")

    def steps(self, batch: int) -> int:
        """Steps per epoch with ``batch`` samples per rank per step (equal on every rank)."""
        steps = self.samples_per_rank // batch
        if steps < 1:
            raise ValueError(f"per-rank batch {batch} exceeds the {self.samples_per_rank} "
                             "samples of each rank's shard")
        return steps

    def for_epoch(self, epoch: int, batch: int) -> tf.data.Dataset:
        """Exactly ``steps(batch)`` batches of ``batch`` samples for ``epoch``."""
        steps, m = self.steps(batch), self.samples_per_rank
        if self._arrays is not None:
            n = len(tf.nest.flatten(self._arrays)[0])
            order = (np.random.default_rng(self.seed + epoch).permutation(n) if self.shuffle
                     else np.arange(n))
            idx = order[self.rank * m:(self.rank + 1) * m][: steps * batch]
            part = tf.nest.map_structure(lambda a: np.asarray(a)[idx], self._arrays)
            ds = tf.data.Dataset.from_tensor_slices(part)
        else:
            ds = self._dataset.shard(self.size, self.rank).take(m)
            if self.shuffle:
                ds = ds.shuffle(min(self.shuffle_buffer, m), seed=self.seed + epoch,
                                reshuffle_each_iteration=False)
        options = tf.data.Options()
        options.autotune.enabled = self.autotune
        return (ds.batch(batch, drop_remainder=True).take(steps).prefetch(tf.data.AUTOTUNE)
                .with_options(options))


class GradientAccumulation:
    """Handle on a model's accumulating ``train_step``: set ``steps`` between ``fit`` calls."""

    def __init__(self, model: tf.keras.Model):
        self._model = model
        self._steps = 1
        #: the micro-batch sums (the accumulator ``backward_passes_per_step`` uses too)
        self.sums = GradientSums(prefix="hvd_overlap_micro_acc_",
                                 count_name="hvd_overlap_micro_batches")

    @property
    def steps(self) -> int:
        return self._steps

    @steps.setter
    def steps(self, value: int) -> None:
        if value < 1:
            raise ValueError(f"accumulation steps must be >= 1, got {value}")
        if value != self._steps:
            self._steps = int(value)
            keras_api.forget_train_function(self._model)  # retraced by the next fit()


def _accumulating_train_step(self: tf.keras.Model, data: Any) -> dict[str, Any]:
    """``train_step`` over ``steps`` equal micro-batches, one optimizer update (and collective).

    The micro-batches run one after the other (each forward waits for the previous gradients,
    so only one micro-batch's activations are alive); their gradients are summed in the
    handle's :class:`~hvd_overlap.comm.accumulation.GradientSums` (``backward_passes_per_step``'s
    accumulator), read averaged and reset within the step. The averaged local gradient is handed to
    ``optimizer.minimize`` as the gradient of a surrogate loss ``sum(stop_gradient(g) * w)``:
    its gradient is exactly ``g``, and any Horovod wrapper (stock Horovod reduces in
    ``compute_gradients``, hvd-overlap in ``apply_gradients``) sees the usual call sequence.
    """
    steps = self._hvdo_accumulation.steps
    x, y, sample_weight = tf.keras.utils.unpack_x_y_sample_weight(data)
    n = tf.shape(tf.nest.flatten(x)[0])[0]
    micro = n // steps
    tf.debugging.assert_equal(micro * steps, n, message=(
        "per-rank batch is not a multiple of the accumulation steps"))
    variables = self.trainable_variables
    acc = self._hvdo_accumulation.sums
    sums: list[tf.Variable | None] = []
    deps: list[tf.Tensor] = []
    for i in range(steps):
        def part(t, i=i):
            return None if t is None else t[i * micro:(i + 1) * micro]
        with tf.control_dependencies(deps):
            xs, ys, ws = (tf.nest.map_structure(part, d) for d in (x, y, sample_weight))
            with tf.GradientTape() as tape:
                y_pred = self(xs, training=True)
                loss = self.compute_loss(xs, ys, y_pred, ws)
            grads = tape.gradient(loss, variables)
            self.compute_metrics(xs, ys, y_pred, ws)
        # IndexedSlices always densified: the optimizer sees the average as one dense gradient
        _, sums, count = acc.add(grads, variables, sparse_as_dense=True)
        deps = [count]
    averaged = acc.read(sums, steps)
    acc.reset(sums, after=averaged)  # zero for the next step, once read
    used = [(g, v) for g, v in zip(averaged, variables, strict=True) if g is not None]
    with tf.GradientTape() as tape:
        surrogate = tf.add_n([tf.reduce_sum(tf.stop_gradient(g) * tf.cast(v, g.dtype))
                              for g, v in used])
    self.optimizer.minimize(surrogate, variables, tape=tape)
    return self.get_metrics_result()


def enable_gradient_accumulation(model: tf.keras.Model) -> GradientAccumulation:
    """Give ``model`` an accumulating ``train_step`` (idempotent); returns its handle.

    With ``handle.steps == 1`` it trains exactly as before. Variables unused by the loss keep
    a ``None`` gradient, as in Keras' own ``train_step``.
    """
    handle = getattr(model, "_hvdo_accumulation", None)
    if handle is None:
        handle = GradientAccumulation(model)
        model._hvdo_accumulation = handle
        keras_api.patch_method(model, "train_step",
                               types.MethodType(_accumulating_train_step, model))
        keras_api.forget_train_function(model)
    return handle


class _OneRunCallbackList(tf.keras.callbacks.CallbackList):
    """A CallbackList shared by several ``fit`` calls that behaves like one run."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._begun = False
        self._end_logs: dict | None = None

    def on_train_begin(self, logs: dict | None = None) -> None:
        if not self._begun:
            self._begun = True
            super().on_train_begin(logs)

    def on_train_end(self, logs: dict | None = None) -> None:
        self._end_logs = logs  # delivered once, by finish()

    def finish(self) -> None:
        if self._begun:
            super().on_train_end(self._end_logs)


_OWNED = ("batch_size", "steps_per_epoch", "shuffle", "initial_epoch", "epochs", "callbacks",
          "sample_weight", "verbose")


def fit_with_growth(model: tf.keras.Model, x: Any, y: Any = None, *,
                    scheduler: BatchSizeScheduler, epochs: int, initial_epoch: int = 0,
                    sample_weight: Any = None, callbacks: Sequence[tf.keras.callbacks.Callback]
                    = (), verbose: int = 0, shuffle: bool = True, seed: int = 0,
                    **fit_kwargs: Any) -> tf.keras.callbacks.History:
    """``model.fit`` whose batch follows ``scheduler``: one ``fit`` call per epoch.

    ``x``/``y``/``sample_weight`` are the *whole* training set (arrays, or an unbatched
    ``tf.data.Dataset``; each rank keeps its shard) or a ready :class:`ShardedDataset`. Each
    epoch runs ``samples_per_rank // (per_rank_batch * accumulation_steps)`` optimizer steps;
    the scheduler is put first in the callback list unless it is already in it. If the
    policy has a per-rank ceiling, the model gets :func:`enable_gradient_accumulation`.
    ``fit_kwargs`` go to every ``fit`` call (e.g. ``validation_data``); returns the History of
    the whole run. To resume, restore weights and ``scheduler.set_state(...)``, then pass
    ``initial_epoch``.
    """
    clash = sorted(set(fit_kwargs) & set(_OWNED))
    if clash:
        raise TypeError(f"fit_with_growth sets {clash} itself")
    data = x if isinstance(x, ShardedDataset) else ShardedDataset(
        x, y, sample_weight, shuffle=shuffle, seed=seed)
    policy = scheduler.policy
    if policy.num_ranks != data.size:
        raise ValueError(f"the policy has num_ranks={policy.num_ranks} but {data.size} ranks "
                         "run: build it with num_ranks=hvd.size()")
    accumulation = enable_gradient_accumulation(model) if policy.can_accumulate else None
    cbs = list(callbacks)
    if scheduler not in cbs:
        cbs.insert(0, scheduler)
    cblist = _OneRunCallbackList(cbs, add_history=True, add_progbar=verbose != 0, model=model,
                                 verbose=verbose, epochs=epochs)
    for epoch in range(initial_epoch, epochs):
        if accumulation is not None:
            accumulation.steps = policy.accumulation_steps
        elif policy.accumulation_steps != 1:
            raise RuntimeError("gradient accumulation needed but not enabled")
        batch = policy.samples_per_rank_step
        steps = data.steps(batch)
        cblist.set_params({"verbose": verbose, "epochs": epochs, "steps": steps})
        model.fit(data.for_epoch(epoch, batch), initial_epoch=epoch, epochs=epoch + 1,
                  steps_per_epoch=steps, callbacks=cblist, verbose=verbose, **fit_kwargs)
        if model.stop_training:
            break
    cblist.finish()
    return model.history
