"""``DistributedOptimizer``: the drop-in replacement for ``hvd.DistributedOptimizer`` (Keras).

The wrapper is a class generated from the user's optimizer class (so saved models restore without
the plugin, as with Horovod), with a mixin in front of it that hands ``apply_gradients`` to the
executor of the chosen mode (``hvd_overlap.keras.executors``: immediate, accumulating, deferring,
sharded), picked once here. Reducing in ``apply_gradients``, inside the same train-step graph as
``tape.gradient``, keeps the overlap with backprop (each collective depends only on its own
gradients) and covers ``model.fit``, ``optimizer.minimize`` and custom loops alike.
"""

from __future__ import annotations

import itertools
import warnings
from dataclasses import replace

import horovod.tensorflow as hvd

from hvd_overlap.adapters import keras_api
from hvd_overlap.comm.methods import CommSettings, default_method
from hvd_overlap.comm.planner import Planner
from hvd_overlap.core.choice import Auto, StockHorovod, Strategy, for_accumulation
from hvd_overlap.core.spelling import KEYWORDS, NOT_PASSED, resolve
from hvd_overlap.keras.executors import (
    Executor,
    MirroredShardedExecutor,
    ShardedExecutor,
    make_executor,
)
from hvd_overlap.keras.executors.auto import AutoExecutor
from hvd_overlap.keras.executors.auto_pool import auto_choices
from hvd_overlap.keras.validation import (
    validate,
    validate_deferring,
    validate_elastic,
    validate_exchange,
    validate_sharding,
)
from hvd_overlap.keras.wrapper import DistributedMixin, distributed_class, plain_methods

_counter = itertools.count()


def DistributedOptimizer(  # noqa: N802 -- same name as Horovod's factory
    optimizer,
    strategy: str | Strategy = "layerwise",
    bucket_bytes: int | str = NOT_PASSED["bucket_bytes"],
    ordered: bool = NOT_PASSED["ordered"],
    defer: int | str | None = NOT_PASSED["defer"],
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression=hvd.Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op=hvd.Average,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    num_groups: int = NOT_PASSED["num_groups"],
    groups=NOT_PASSED["groups"],
    process_set=hvd.global_process_set,
    scale_local_gradients: bool = True,
    gather_with: str = NOT_PASSED["gather_with"],
    exchange: str = NOT_PASSED["exchange"],
    exchange_forward: str = NOT_PASSED["exchange_forward"],
    shard: str = NOT_PASSED["shard"],
):
    """Wrap a Keras optimizer so its gradients are averaged across ranks by ``strategy``.

    Same keywords and defaults as ``horovod.tensorflow.keras.DistributedOptimizer``, plus
    ``strategy``: an object of ``hvd_overlap.core.choice`` (``Layerwise()``, ``Deferred()``,
    ``Hybrid()``, ``Sharded()``, ``ShardedHybrid()``, ``Auto()``, ``StockHorovod()``), each
    taking only the settings it uses, or its name (``"sharded+exchange"``: the one string
    spelling, ``hvd_overlap.core.spelling.parse``). With a name, ``bucket_bytes``, ``ordered``,
    ``defer``, ``gather_with``, ``exchange``, ``exchange_forward``, ``shard``, ``num_groups``
    and ``groups`` are sugar for the object's settings: one a strategy has no use for is a
    ``TypeError``; beside a strategy object, any of them (even at its default) is a
    ``TypeError``: pass it to the object. Their defaults (``bucket_bytes=4 << 20``,
    ``ordered=False``, ``defer=None``, ``gather_with="allgather"``, ``exchange="never"``,
    ``exchange_forward="auto"``, ``shard="all"``, ``num_groups=0``, ``groups=None``) stand for
    "not passed" (``core.spelling.Default``). ``process_set`` must be the global one;
    ``scale_local_gradients`` as Horovod's (see ``register_local_var``). Deferring strategies
    and ``auto`` need ``OverlapCallback`` (``model.fit``) or ``make_train_step`` (custom loops).
    """
    given = {k: v for k, v in locals().items() if k != "optimizer"}
    chosen = resolve(strategy, **{k: given.pop(k) for k in KEYWORDS})
    # what from_config rebuilds: the strategy object, and Horovod's own keywords
    options = {**given, "strategy": chosen}
    if isinstance(backward_passes_per_step, int) and backward_passes_per_step > 1:
        chosen = _accumulating_plan(chosen, backward_passes_per_step)
    validate(optimizer, op, gradient_predivide_factor, backward_passes_per_step, process_set)
    # Keras 3 under mixed_float16: the loss-scale optimizer goes inside (it must see global
    # gradients), so compile adds none around this one
    optimizer = keras_api.wrap_for_mixed_precision(optimizer)
    if chosen.shards:
        validate_sharding(optimizer)
    if chosen.exchanges:
        validate_exchange(compression)
    if chosen.defers and not isinstance(chosen, Auto):
        validate_deferring(optimizer, chosen.name)
    validate_elastic(chosen.name, chosen.defers or chosen.tuned)
    if isinstance(chosen, StockHorovod):
        prefix = name or f"Distributed{type(optimizer).__name__}"
    else:
        prefix = name or f"hvdo{next(_counter)}"
    comm = chosen.comm_options()
    settings = CommSettings(
        name=prefix, op=op, compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, device_dense=device_dense,
        device_sparse=device_sparse, ordered=comm.ordered, gather_with=comm.gather_with,
        scale_local_gradients=scale_local_gradients, groups=comm.groups,
    )
    cls = distributed_class(type(optimizer), options, DistributedOptimizer)
    wrapped = super(DistributedMixin, cls).from_config(optimizer.get_config())
    keras_api.carry_weight_decay_exclusions(optimizer, wrapped)  # (not in the config)
    plain = plain_methods(wrapped)

    def executor(c: Strategy) -> Executor:
        """The executor of one plan (a candidate of ``auto``, or the user's own)."""
        sets = settings if not chosen.tuned else replace(
            settings, name=f"{prefix}.{c.child_name()}")
        planner = Planner(c, hvd.size(), sparse_as_dense)
        method = default_method(sets, fused_by_horovod=isinstance(c, StockHorovod),
                                shards=c.shards)
        return make_executor(c, wrapped, plain, planner, method, sets,
                             backward_passes_per_step, average_aggregated_gradients,
                             MirroredShardedExecutor if isinstance(chosen, Auto)
                             else ShardedExecutor)

    if chosen.tuned:
        probe, pool, label = auto_choices(optimizer, chosen)
        wrapped._hvdo = AutoExecutor(wrapped, plain, executor, probe, pool, settings, label)
    else:
        wrapped._hvdo = executor(chosen)
    wrapped._hvdo.chosen = chosen
    entry = wrapped._hvdo.checkpoint_entry
    if entry is not None:  # sharded state: a checkpoint dependency, saved and restored with it
        keras_api.track_child(wrapped, entry, name="hvd_overlap_sharded_state")
    return wrapped


def _accumulating_plan(chosen: Strategy, passes: int) -> Strategy:
    """``backward_passes_per_step > 1``: the strategy that runs (``choice.for_accumulation``),
    said once (rank 0) where it is not the one asked for."""
    instead = for_accumulation(chosen)
    if instead is not chosen and hvd.is_initialized() and hvd.rank() == 0:
        warnings.warn(
            f"hvd_overlap: strategy {chosen.name!r} with backward_passes_per_step={passes} runs "
            f"as strategy={instead.name!r}: the summed gradients are reduced once every "
            f"{passes} passes, within the pass, so nothing is deferred into the next forward or "
            "sharded (the weights are stock Horovod's). For both, accumulate before the "
            "optimizer with backward_passes_per_step=1 (hvd_overlap.growth.data."
            "enable_gradient_accumulation)", stacklevel=3)
    return instead
