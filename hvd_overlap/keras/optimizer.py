"""``DistributedOptimizer``: the drop-in replacement for ``hvd.DistributedOptimizer`` (Keras).

The wrapper is a class generated from the user's optimizer class (so saved models restore without
the plugin, as with Horovod), with a mixin in front of it that reduces gradients in
``apply_gradients``. Reducing there, inside the same train-step graph as ``tape.gradient``,
keeps the overlap with backprop (each collective depends only on its own gradients) and covers
``model.fit``, ``optimizer.minimize`` and custom loops that call ``apply_gradients`` alike.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_overlap import _env
from hvd_overlap.keras.deferral import Deferral
from hvd_overlap.plan import BACKWARD, DEFAULT_BUCKET_BYTES, FORWARD, Plan
from hvd_overlap.reducer import GradientReducer
from hvd_overlap.strategies import CommSettings, get_strategy

_counter = itertools.count()
_classes: dict[type, type] = {}


class _State:
    """Plugin state kept on the optimizer as one plain object (not tracked by Keras)."""

    def __init__(self, reducer: GradientReducer, backward_passes_per_step: int,
                 average_aggregated_gradients: bool, sparse_as_dense: bool):
        self.reducer = reducer
        self.backward_passes_per_step = backward_passes_per_step
        self.average_aggregated_gradients = average_aggregated_gradients
        self.sparse_as_dense = sparse_as_dense
        self.accumulators: dict[Any, tf.Variable] = {}
        self.counter: tf.Variable | None = None
        self.deferral = Deferral()


class _DistributedMixin:
    """Placed before the wrapped optimizer class in the MRO; only ``apply_gradients`` changes."""

    _hvdo: _State

    @property
    def strategy(self) -> str:
        return self._hvdo.reducer.strategy.name

    @property
    def plan(self) -> Plan:
        """The plan of the last variable list seen (after one step or ``build_plan``)."""
        plan = self._hvdo.reducer.last_plan
        if plan is None:
            raise RuntimeError(
                "no plan yet: call opt.build_plan(model.trainable_variables) or run one step")
        return plan

    def build_plan(self, variables) -> Plan:
        """Build (without any collective) and return the plan for these variables."""
        return self._hvdo.reducer.plan_for(list(variables), check_ranks=False)

    @property
    def defers(self) -> bool:
        """True if this optimizer defers buckets into the next forward (needs OverlapCallback)."""
        return self._hvdo.reducer.strategy.defers

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        grads = [g for g, _ in grads_and_vars]
        variables = [v for _, v in grads_and_vars]
        if self._hvdo.backward_passes_per_step > 1:
            return self._hvdo_accumulate_and_apply(grads, variables, args, kwargs)
        if self.defers:
            return self._hvdo_apply_deferring(grads, variables, args, kwargs)
        reduced = self._hvdo.reducer.reduce(grads, variables)
        return super().apply_gradients(list(zip(reduced, variables, strict=True)), *args, **kwargs)

    # -- cross-iteration overlap (strategies "deferred" and "hybrid") ---------------------------

    def pre_forward(self) -> None:
        """Start of a train step: reduce and apply the previous step's deferred buckets, in
        forward order, each layer's forward waiting only for its own bucket's update.

        ``OverlapCallback`` calls it inside ``model.fit``'s train step; in custom loops use
        ``make_train_step``. Harmless (a no-op) for strategies that defer nothing.
        """
        d = self._hvdo.deferral
        d.mark_pre_forward()
        if not self.defers or d.plan is None:
            return  # nothing traced yet, so nothing can be pending in this graph
        forward = d.plan.phase_buckets(FORWARD)
        strategy = self._hvdo.reducer.strategy
        variables = d.variables
        previous: list = []
        for k, bucket in enumerate(forward):
            last = k == len(forward) - 1

            def run(bucket=bucket, last=last):
                grads: list = [None] * len(variables)
                for v in bucket.variables:
                    if v.index in d.buffers:
                        grads[v.index] = d.buffers[v.index].read_value()
                out = list(grads)
                strategy.reduce_bucket(bucket, grads, out)
                pairs = [(out[v.index], variables[v.index]) for v in bucket.variables
                         if v.index in d.buffers]
                self._hvdo_apply_counted(pairs, count=last)
                return tf.constant(True)

            with tf.control_dependencies(previous):
                previous = [tf.cond(d.pending, run, lambda: tf.constant(False))]
        d.pending.assign(False)

    def flush(self) -> None:
        """Apply any pending deferred update now. Call it on every rank before anyone
        looks at the weights: evaluate, predict, save, checkpoint, end of training.
        ``OverlapCallback`` does so in ``model.fit``."""
        d = self._hvdo.deferral
        if self.defers and d.pending is not None and bool(d.pending.numpy()):
            if d.flush_fn is None:  # a graph, like the train step: the same kernels, same bits
                d.flush_fn = tf.function(self.pre_forward)
            d.flush_fn()

    def make_train_step(self, step_fn):
        """Wrap a custom-loop step (which ends with ``apply_gradients``) in a ``tf.function``
        that starts with the pre-forward phase. Call ``flush()`` after the loop."""
        return _OverlapTrainStep(self, step_fn)

    def _hvdo_apply_counted(self, pairs, count: bool) -> None:
        """Apply some buckets' updates; ``iterations`` advances only if ``count``, so that every
        bucket of a step sees the same step number (LR schedules, Adam's bias correction)."""
        if not pairs:
            if count:
                self.iterations.assign_add(1)
            return
        super().apply_gradients(pairs)
        if not count:
            self.iterations.assign_sub(1)

    def _hvdo_apply_deferring(self, grads, variables, args, kwargs):
        d = self._hvdo.deferral
        if not d.has_pre_forward():
            raise ValueError(
                f"strategy {self.strategy!r} defers updates into the next step: add "
                "hvd_overlap.keras.callbacks.OverlapCallback() to model.fit's callbacks, or build "
                "custom-loop steps with opt.make_train_step(step_fn) and call opt.flush() after")
        plan = self._hvdo.reducer.plan_for(variables, grads)
        if d.plan is None:
            # First trace: the plan was unknown when the pre-forward phase was traced, so this
            # graph reduces every bucket now (exact); the next trace defers (retrace requested).
            d.create(plan, variables)
            reduced = self._hvdo.reducer.strategy.reduce(
                grads, variables, plan, phases=(BACKWARD, FORWARD))
            return super().apply_gradients(
                list(zip(reduced, variables, strict=True)), *args, **kwargs)
        if plan is not d.plan:
            raise ValueError("a deferring DistributedOptimizer serves one model: create one "
                             "optimizer per model (the variable list changed)")
        strategy = self._hvdo.reducer.strategy
        reduced = strategy.reduce(grads, variables, plan)  # BACKWARD buckets only
        backward = {v.index for b in plan.phase_buckets(BACKWARD) for v in b.variables}
        pairs = [(reduced[i], variables[i]) for i in sorted(backward) if grads[i] is not None]
        self._hvdo_apply_counted(pairs, count=not d.buffers)  # nothing deferred: count now
        for i, buf in d.buffers.items():
            buf.assign(_dense(grads[i]))
        d.pending.assign(True)
        return self.iterations

    def _hvdo_accumulate_and_apply(self, grads, variables, args, kwargs):
        """Local accumulation for ``backward_passes_per_step`` passes, then one reduction and
        one update, as Horovod does it (``iterations`` still advances on every pass)."""
        st = self._hvdo
        n = st.backward_passes_per_step
        grads = [_densify(g, st.sparse_as_dense) for g in grads]
        with tf.init_scope():
            if st.counter is None:
                st.counter = tf.Variable(0, dtype=tf.int64, trainable=False,
                                         name="hvd_overlap_pass_counter")
            for g, v in zip(grads, variables, strict=True):
                if g is not None and v.ref() not in st.accumulators:
                    st.accumulators[v.ref()] = tf.Variable(
                        tf.zeros(v.shape, g.dtype), trainable=False,
                        name="hvd_overlap_acc_" + v.name.split(":")[0].replace("/", "_"))
        accs = [st.accumulators[v.ref()] if g is not None else None
                for g, v in zip(grads, variables, strict=True)]
        updates = [a.assign_add(g) for a, g in zip(accs, grads, strict=True) if g is not None]
        with tf.control_dependencies(updates):
            count = st.counter.assign_add(1)

        def communicate_and_apply():
            div = float(n) if st.average_aggregated_gradients else 1.0
            summed = [a.read_value() / div if a is not None else None for a in accs]
            reduced = st.reducer.reduce(summed, variables)
            super(_DistributedMixin, self).apply_gradients(
                list(zip(reduced, variables, strict=True)), *args, **kwargs)
            with tf.control_dependencies([r for r in reduced if r is not None]):
                resets = [a.assign(tf.zeros_like(a)) for a in accs if a is not None]
                resets.append(st.counter.assign(0))
            return tf.group(resets)

        def just_count():
            return tf.group(self.iterations.assign_add(1))

        return tf.cond(tf.equal(count, n), communicate_and_apply, just_count)


class _OverlapTrainStep:
    """A custom-loop step with the pre-forward phase first; retraced once, after the first call
    (when the plan, unknown at the first trace, becomes known)."""

    def __init__(self, opt, step_fn):
        self.opt, self.step_fn = opt, step_fn
        self._fn = self._trace()

    def _trace(self):
        def step(*args, **kwargs):
            self.opt.pre_forward()
            return self.step_fn(*args, **kwargs)
        return tf.function(step)

    def __call__(self, *args, **kwargs):
        out = self._fn(*args, **kwargs)
        d = self.opt._hvdo.deferral
        if d.needs_retrace:
            d.needs_retrace = False
            self._fn = self._trace()
        return out


def _dense(g):
    return tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g


def _densify(g, sparse_as_dense: bool):
    if isinstance(g, tf.IndexedSlices):
        if not sparse_as_dense:
            raise ValueError("sparse gradients (IndexedSlices) with backward_passes_per_step > 1 "
                             "need sparse_as_dense=True, as in Horovod")
        return tf.convert_to_tensor(g)
    return g


def _distributed_class(base: type) -> type:
    cls = _classes.get(base)
    if cls is None:
        cls = type(base.__name__, (_DistributedMixin, base),
                   {"__module__": base.__module__, "__doc__": base.__doc__})
        _classes[base] = cls
    return cls


def DistributedOptimizer(  # noqa: N802 -- same name as Horovod's factory
    optimizer,
    strategy: str = "layerwise",
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    ordered: bool = False,
    defer: int | None = None,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression=hvd.Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op=hvd.Average,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups=None,
    process_set=hvd.global_process_set,
    scale_local_gradients: bool = True,
):
    """Wrap a Keras optimizer so its gradients are averaged across ranks by ``strategy``.

    Same keywords and defaults as ``horovod.tensorflow.keras.DistributedOptimizer``, plus
    ``strategy`` ("layerwise" or "horovod"), ``bucket_bytes`` (the byte budget of a bucket) and
    ``ordered`` (each backprop bucket's collective waits for the previous one, so they go out in
    plan order; off by default: measured slower, see README)
    and ``defer`` (hybrid: how many input-side buckets to defer into the next forward).
    ``num_groups``/``groups`` apply to ``strategy="horovod"`` only (the plan replaces them);
    ``process_set`` must be the global one; ``scale_local_gradients`` is accepted for
    compatibility (the plugin has no ``register_local_var``).
    """
    strategy_cls = get_strategy(strategy)
    _validate(optimizer, strategy, bucket_bytes, op, gradient_predivide_factor,
              backward_passes_per_step, num_groups, groups, process_set)
    if strategy_cls.defers:
        _validate_deferring(optimizer, strategy, backward_passes_per_step, defer)
    if not hvd.is_initialized():
        raise RuntimeError("Horovod is not initialised: call hvd.init() (or hvd_overlap.init()) "
                           "before creating the DistributedOptimizer")
    if strategy == "horovod":
        prefix = name or f"Distributed{type(optimizer).__name__}"
    else:
        prefix = name or f"hvdo{next(_counter)}"
        if not _env.bucket_fusion_disabled() and hvd.size() > 1 and hvd.rank() == 0:
            warnings.warn(
                "HOROVOD_DISABLE_GROUP_FUSION was not 1 when Horovod initialised, so Horovod may "
                "fuse several buckets into one collective. Import hvd_overlap before hvd.init() "
                "(or call hvd_overlap.init()) to keep buckets apart.", stacklevel=2)
    settings = CommSettings(
        name=prefix, op=op, compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, device_dense=device_dense,
        device_sparse=device_sparse, bucket_bytes=bucket_bytes, ordered=ordered, defer=defer,
        groups=groups if groups is not None else (num_groups or None),
    )
    cls = _distributed_class(type(optimizer))
    wrapped = cls.from_config(optimizer.get_config())
    wrapped._hvdo = _State(GradientReducer(strategy_cls(settings)), backward_passes_per_step,
                           average_aggregated_gradients, sparse_as_dense)
    return wrapped


def _validate_deferring(optimizer, strategy, backward_passes_per_step, defer) -> None:
    """What deferring updates bucket by bucket cannot do exactly, refused up front."""
    if backward_passes_per_step > 1:
        raise ValueError(f"strategy {strategy!r} does not combine with backward_passes_per_step"
                         " > 1; use strategy='layerwise' for gradient accumulation")
    if getattr(optimizer, "global_clipnorm", None):
        raise ValueError(f"global_clipnorm needs every gradient at once, but strategy "
                         f"{strategy!r} applies updates bucket by bucket; use clipnorm (per "
                         "variable) or strategy='layerwise'")
    if defer is not None and (not isinstance(defer, int) or defer < 0):
        raise ValueError(f"defer must be a number of buckets >= 0, got {defer!r}")


def _validate(optimizer, strategy, bucket_bytes, op, gradient_predivide_factor,
              backward_passes_per_step, num_groups, groups, process_set) -> None:
    """Every check is local (no collective), so a bad argument fails on every rank alike."""
    legacy = tf.keras.optimizers.legacy.Optimizer
    if not isinstance(optimizer, tf.keras.optimizers.Optimizer | legacy):
        raise TypeError(f"expected a Keras optimizer (tf.keras.optimizers.*), got "
                        f"{type(optimizer).__name__}")
    if isinstance(optimizer, _DistributedMixin):
        raise TypeError("this optimizer is already a hvd_overlap DistributedOptimizer; "
                        "wrap the plain optimizer once")
    if op not in (hvd.Average, hvd.Sum):
        raise ValueError("op must be hvd.Average or hvd.Sum (as in Horovod's Keras optimizer)")
    if not isinstance(bucket_bytes, int) or bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be a positive int (bytes), got {bucket_bytes!r}")
    if gradient_predivide_factor <= 0:
        raise ValueError("gradient_predivide_factor must be > 0")
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be an int >= 1, got "
                         f"{backward_passes_per_step!r}")
    if strategy != "horovod" and (num_groups or groups is not None):
        raise ValueError(f"groups/num_groups are Horovod's manual grouping; strategy "
                         f"{strategy!r} groups by its plan (tune bucket_bytes instead), or use "
                         "strategy='horovod'")
    if process_set is not hvd.global_process_set:
        raise ValueError("only the global process set is supported; drop process_set=")
