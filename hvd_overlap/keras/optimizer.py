"""``DistributedOptimizer``: the drop-in replacement for ``hvd.DistributedOptimizer`` (Keras).

The wrapper is a class generated from the user's optimizer class (so saved models restore without
the plugin, as with Horovod), with a mixin in front of it that reduces gradients in
``apply_gradients``. Reducing there, inside the same train-step graph as ``tape.gradient``,
keeps the overlap with backprop (each collective depends only on its own gradients) and covers
``model.fit``, ``optimizer.minimize`` and custom loops that call ``apply_gradients`` alike.
"""

from __future__ import annotations

import itertools
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from hvd_overlap.keras.deferral import Deferral
from hvd_overlap.keras.sharded import Shards, plain_order, stale_state_error
from hvd_overlap.plan import BACKWARD, DEFAULT_BUCKET_BYTES, FORWARD, GATHER_METHODS, Plan
from hvd_overlap.reducer import GradientReducer
from hvd_overlap.sharding import ShardLayout, partition
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
        self.shards: Shards | None = None  # the sharded strategy's slices, slots, checkpoint


class _DistributedMixin:
    """Placed before the wrapped optimizer class in the MRO; only ``apply_gradients`` changes."""

    _hvdo: _State
    _hvdo_mixin = True  # marks the plugin's class in the MRO (the next one is the user's)

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
        if self._hvdo.shards is not None:
            return self._hvdo_apply_sharded(grads, variables)
        if self.defers:
            return self._hvdo_apply_deferring(grads, variables, args, kwargs)
        reduced = self._hvdo.reducer.reduce(grads, variables)
        return super().apply_gradients(list(zip(reduced, variables, strict=True)), *args, **kwargs)

    # -- cross-iteration overlap (strategies "deferred" and "hybrid") ---------------------------

    def pre_forward(self) -> None:
        """Start of a train step: bring in the previous step's deferred updates, in forward
        order, each layer's forward waiting only for its own bucket. (``deferred``/``hybrid``:
        reduce and apply the deferred buckets; ``sharded``: all-gather the updated slices.)

        ``OverlapCallback`` calls it inside ``model.fit``'s train step; in custom loops use
        ``make_train_step``. Harmless (a no-op) for strategies that defer nothing.
        """
        d = self._hvdo.deferral
        d.mark_pre_forward()
        if not self.defers or d.plan is None:
            return  # nothing traced yet, so nothing can be pending in this graph
        previous: list = []
        for run in self._hvdo_forward_phase():
            with tf.control_dependencies(previous):
                previous = [tf.cond(d.pending, run, lambda: tf.constant(False))]
        d.pending.assign(False)

    def _hvdo_forward_phase(self) -> list:
        """One function per deferred bucket, in forward order, that brings its update in."""
        d = self._hvdo.deferral
        if self._hvdo.shards is not None:  # the plan lists them in forward order
            return [lambda b=b: self._hvdo_gather(b)
                    for b in self._hvdo.shards.layout.buckets if b.phase == FORWARD]
        forward = d.plan.phase_buckets(FORWARD)
        strategy = self._hvdo.reducer.strategy
        variables = d.variables
        runs = []
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

            runs.append(run)
        return runs

    def flush(self) -> None:
        """Apply any pending deferred update now. Call it on every rank before anyone
        looks at the weights: evaluate, predict, save, checkpoint, end of training.
        ``OverlapCallback`` does so in ``model.fit``."""
        d = self._hvdo.deferral
        if self.defers and d.pending is not None and bool(d.pending.numpy()):
            if d.flush_fn is None:  # a graph, like the train step: the same kernels, same bits
                d.flush_fn = tf.function(self.pre_forward)
            d.flush_fn()

    def gather_state(self) -> None:
        """``sharded`` only: gather every rank's optimizer-state slices so that a checkpoint
        saved now is complete (whole per-variable arrays, restorable on any number of ranks).
        Call it on every rank, after ``flush()``; ``OverlapCallback`` does both at the end of
        every epoch (and every ``flush_every`` batches). A no-op for other strategies."""
        sh = self._hvdo.shards
        if sh is None or sh.layout is None:
            return
        step = int(self.iterations.numpy())
        if sh.checkpoint.iterations != step:
            sh.checkpoint.set(step, sh.gather_state())

    @property
    def shard_layout(self) -> ShardLayout:
        """``sharded`` only: which slice of each bucket every rank owns (after one step)."""
        sh = self._hvdo.shards
        if sh is None or sh.layout is None:
            raise RuntimeError("no shard layout: strategy='sharded' builds it at the first step")
        return sh.layout

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

    def _hvdo_require_pre_forward(self) -> None:
        if not self._hvdo.deferral.has_pre_forward():
            raise ValueError(
                f"strategy {self.strategy!r} defers updates into the next step: add "
                "hvd_overlap.keras.callbacks.OverlapCallback() to model.fit's callbacks, or build "
                "custom-loop steps with opt.make_train_step(step_fn) and call opt.flush() after")

    def _hvdo_apply_sharded(self, grads, variables):
        """Reduce-scatter every bucket, update this rank's slices; the all-gathers run at the
        start of the next step (or now, on the first trace, when none is set up yet)."""
        self._hvdo_require_pre_forward()
        d, sh = self._hvdo.deferral, self._hvdo.shards
        plan = self._hvdo.reducer.plan_for(variables, grads)
        first = d.plan is None
        if first:
            _check_shardable(variables, plan)
            d.create(plan, variables, buffers=False)
            sh.create(self, partition(plan, hvd.size()))
        elif plan is not d.plan:
            raise ValueError("a sharded DistributedOptimizer serves one model: create one "
                             "optimizer per model (the variable list changed)")
        strategy = self._hvdo.reducer.strategy
        pairs = []
        for b in sh.layout.buckets:
            piece = strategy.reduce_scatter(b, grads)
            sh.params[b.bucket].assign(sh.slice_of(b, variables))  # current weights, exactly
            pairs.append((piece, sh.params[b.bucket]))
        self._hvdo_apply_counted(pairs, count=True)
        # backward-phase buckets now; on the first trace (no pre-forward phase in this graph
        # yet) the forward-phase ones too, in forward order
        for b in sh.layout.buckets:
            if b.phase == BACKWARD:
                self._hvdo_gather(b)
        forward = [b for b in sh.layout.buckets if b.phase == FORWARD]
        if first:
            previous: list = []
            for b in forward:
                with tf.control_dependencies(previous):
                    previous = [self._hvdo_gather(b)]
        elif forward:
            d.pending.assign(True)
        return self.iterations

    def _hvdo_gather(self, bucket) -> tf.Tensor:
        """All-gather one bucket's updated slices into the model's variables."""
        sh = self._hvdo.shards
        variables = sh.variables
        whole = self._hvdo.reducer.strategy.all_gather(bucket, sh.params[bucket.bucket])
        for seg, value in zip(bucket.segments, whole, strict=True):
            variables[seg.index].assign(value)
        return tf.constant(True)

    def build(self, var_list):
        """``sharded``: slots are built for the parameter slices at the first step, not for
        the model's variables (a user's ``opt.build(model.trainable_variables)`` is a no-op)."""
        sh = getattr(self, "_hvdo", None) and self._hvdo.shards
        if sh and not sh.building:
            return None
        return super().build(var_list)

    def save_own_variables(self, store):
        """``.keras`` files: ``sharded`` saves the gathered state in the plain optimizer's own
        layout, so the file loads like one saved by stock Horovod (with or without the plugin,
        on any number of ranks)."""
        sh = self._hvdo.shards
        if sh is None or sh.layout is None or _is_legacy(self):
            parent = getattr(super(), "save_own_variables", None)  # legacy: none, as stock
            return parent(store) if parent else None
        step = int(self.iterations.numpy())
        if sh.checkpoint.iterations != step:
            raise stale_state_error(step, sh.checkpoint.iterations)
        variables = sh.variables
        store["0"] = self.iterations.numpy()
        for k, (slot, index, initial) in enumerate(plain_order(self, variables), start=1):
            saved = sh.checkpoint.slots.get(slot, {}).get(index)
            # a variable without gradient keeps its initial slot value, as in stock Horovod
            store[str(k)] = saved if saved is not None else np.full(
                variables[index].shape, initial, variables[index].dtype.as_numpy_dtype)
        return None

    def load_own_variables(self, store):
        sh = self._hvdo.shards
        if sh is None or _is_legacy(self):
            parent = getattr(super(), "load_own_variables", None)
            return parent(store) if parent else None
        arrays = [np.asarray(store[str(k)]) for k in range(len(store.keys()))]
        self.iterations.assign(arrays[0])
        sh.checkpoint.restore_plain(arrays[1:], int(self.iterations.numpy()))
        return None

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        """``sharded``: this rank's slot slices are not checkpointed as the optimizer's own
        variables (another rank, or another number of ranks, could not use them); the gathered
        whole arrays are, through ``hvd_overlap_sharded_state``."""
        children = super()._trackable_children(save_type, **kwargs)
        sh = getattr(self, "_hvdo", None) and self._hvdo.shards
        if not sh or not sh.slots:
            return children
        hidden = {id(v) for d in sh.slots.values() for v in d.values()}
        return {k: c for k, c in children.items() if not _holds_any(c, hidden)}

    def _apply_weight_decay(self, variables):
        """Decoupled weight decay (Keras optimizers' ``weight_decay``) on the slices, skipping
        the elements of excluded variables, as Keras skips the variables."""
        sh = self._hvdo.shards
        if sh is None or sh.layout is None or self.weight_decay is None:
            return super()._apply_weight_decay(variables)
        for b, p in sh.params.items():
            lr = tf.cast(self.learning_rate, p.dtype)
            wd = tf.cast(self.weight_decay, p.dtype)
            mask = sh.decay_masks.get(b)
            p.assign_sub((p if mask is None else p * mask) * wd * lr)
        return None

    def _hvdo_apply_deferring(self, grads, variables, args, kwargs):
        d = self._hvdo.deferral
        self._hvdo_require_pre_forward()
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


def _is_legacy(opt) -> bool:
    return isinstance(opt, tf.keras.optimizers.legacy.Optimizer)


def _holds_any(child, ids: set[int]) -> bool:
    """True if a trackable child is, or is a list holding, one of the variables ``ids``."""
    if id(child) in ids:
        return True
    if isinstance(child, tf.Variable) or not hasattr(child, "__iter__"):
        return False
    try:
        return any(id(item) in ids for item in child)
    except TypeError:
        return False


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
    gather_with: str = "allgather",
):
    """Wrap a Keras optimizer so its gradients are averaged across ranks by ``strategy``.

    Same keywords and defaults as ``horovod.tensorflow.keras.DistributedOptimizer``, plus
    ``strategy`` ("layerwise" or "horovod"), ``bucket_bytes`` (the byte budget of a bucket) and
    ``ordered`` (each backprop bucket's collective waits for the previous one, so they go out in
    plan order; off by default: measured slower, see README)
    and ``defer`` (hybrid: how many input-side buckets to defer into the next forward).
    ``num_groups``/``groups`` apply to ``strategy="horovod"`` only (the plan replaces them);
    ``process_set`` must be the global one; ``scale_local_gradients`` is accepted for
    compatibility (the plugin has no ``register_local_var``). ``gather_with`` (sharded): how the
    updated slices travel, ``"allgather"`` (default) or ``"alltoall"`` (the same result and
    bytes; measured no faster on Gloo here, see README "Sharded update").
    """
    strategy_cls = get_strategy(strategy)
    _validate(optimizer, strategy, bucket_bytes, op, gradient_predivide_factor,
              backward_passes_per_step, num_groups, groups, process_set)
    if gather_with not in GATHER_METHODS:
        raise ValueError(f"gather_with={gather_with!r}: choose {' or '.join(GATHER_METHODS)}")
    if strategy_cls.shards:
        _validate_sharding(optimizer)
    if strategy_cls.defers:
        _validate_deferring(optimizer, strategy, backward_passes_per_step, defer)
    if not hvd.is_initialized():
        raise RuntimeError("Horovod is not initialised: call hvd.init() "
                           "before creating the DistributedOptimizer")
    if strategy == "horovod":
        prefix = name or f"Distributed{type(optimizer).__name__}"
    else:
        prefix = name or f"hvdo{next(_counter)}"
    settings = CommSettings(
        name=prefix, op=op, compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, device_dense=device_dense,
        device_sparse=device_sparse, bucket_bytes=bucket_bytes, ordered=ordered, defer=defer,
        groups=groups if groups is not None else (num_groups or None),
        gather_with=gather_with,
    )
    cls = _distributed_class(type(optimizer))
    wrapped = cls.from_config(optimizer.get_config())
    wrapped._hvdo = _State(GradientReducer(strategy_cls(settings)), backward_passes_per_step,
                           average_aggregated_gradients, sparse_as_dense)
    if strategy_cls.shards:
        shards = wrapped._hvdo.shards = Shards(prefix)
        # a checkpoint dependency of the optimizer: saved and restored with it
        wrapped._track_trackable(shards.checkpoint, name="hvd_overlap_sharded_state")
    return wrapped


def _element_wise_optimizers() -> tuple[type, ...]:
    """Optimizers whose update of an element reads only that element's gradient and state."""
    o, legacy = tf.keras.optimizers, tf.keras.optimizers.legacy
    return (o.SGD, o.Adam, o.AdamW, o.RMSprop, o.Adagrad, o.Adadelta, o.Adamax, o.Nadam, o.Ftrl,
            o.Lion, legacy.SGD, legacy.Adam, legacy.RMSprop, legacy.Adagrad, legacy.Adadelta,
            legacy.Adamax, legacy.Nadam, legacy.Ftrl)


def _validate_sharding(optimizer) -> None:
    """What updating 1/P of each flattened bucket cannot do exactly, refused up front."""
    known = _element_wise_optimizers()
    if type(optimizer) not in known:
        raise ValueError(
            f"strategy='sharded' updates a slice of each flattened bucket, which is exact only "
            f"for element-wise optimizers ({', '.join(sorted({k.__name__ for k in known}))}); "
            f"{type(optimizer).__name__} is not one of them (an update that needs whole "
            "tensors, like Adafactor's factored moments or a trust ratio, would be wrong). Use "
            "strategy='deferred' or 'layerwise'")
    if getattr(optimizer, "clipnorm", None) or getattr(optimizer, "global_clipnorm", None):
        raise ValueError(
            "clipnorm/global_clipnorm need whole-tensor norms, but with strategy='sharded' each "
            "rank holds only a slice of every gradient; use clipvalue (element-wise), or "
            "strategy='layerwise' or 'deferred'")
    if getattr(optimizer, "use_ema", False):
        raise ValueError("use_ema keeps a whole-model moving average, which strategy='sharded' "
                         "does not shard; use strategy='deferred' or 'layerwise'")


def _check_shardable(variables, plan) -> None:
    """Checks that need the variables (first step, before any collective, on every rank)."""
    for spec in plan.variables:
        v = variables[spec.index]
        if spec.has_grad and getattr(v, "constraint", None) is not None:
            raise ValueError(
                f"variable {v.name} has a constraint, which Keras applies to the whole variable "
                "after its update; strategy='sharded' updates slices. Remove the constraint or "
                "use strategy='deferred' or 'layerwise'")


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
