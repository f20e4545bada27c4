"""The strategies as plan builders: which buckets exist, how each travels and when.

Pure Python (no TensorFlow, no Horovod): a strategy is a name, two facts the runtime needs to
pick its executor (does it defer buckets into the next step's forward? does it shard the
update?) and a function from the variables to a :class:`~hvd_overlap.core.plan.Plan`. Everything
that follows -- which collectives run, in which phase and order -- is read from the plan, by the
runtime (``hvd_overlap.keras``) and by the simulator (``hvd_overlap.core.simulate``) alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from hvd_overlap.core import mutants
from hvd_overlap.core.exchange import AUTO, NEVER, label_exchange, split_exchangeable
from hvd_overlap.core.plan import (
    ALLREDUCE,
    BACKWARD,
    DEFAULT_BUCKET_BYTES,
    GATHER_METHODS,
    Bucket,
    Plan,
    VarSpec,
    build_layerwise_plan,
    check_dtypes,
    half_the_bytes,
    sharded_collective,
)


@dataclass(frozen=True)
class PlanOptions:
    """The user's choices that shape a plan (``DistributedOptimizer``'s keywords)."""

    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    defer: int | None = None        # hybrid/sharded: input-side buckets deferred (None: default)
    gather_with: str = "allgather"  # sharded: how the updated slices travel
    exchange: str = NEVER           # sharded: dense factor exchange (hvd_overlap.core.exchange)
    exchange_forward: str = AUTO    # sharded: the exchanged kernels' forward (gather, rows)
    ranks: int = 1                  # sharded: the number of ranks (the exchange decision)
    shard: str = "all"              # sharded: which buckets are sharded (SHARD_MODES)


#: ``shard``: every bucket is sharded (``all``), or only the dense kernels the exchange may
#: carry (``dense``), every other bucket allreduced in backprop and updated whole on each rank
SHARD_ALL, SHARD_DENSE = "all", "dense"
SHARD_MODES = (SHARD_ALL, SHARD_DENSE)


def check_shard(shard: str, exchange: bool) -> None:
    """A ValueError naming the fix for a ``shard`` mode that is unknown, or ``dense`` without
    the exchange (``exchange``: whether it is on)."""
    if shard not in SHARD_MODES:
        raise ValueError(f"shard={shard!r}: choose {' or '.join(SHARD_MODES)}")
    if shard == SHARD_DENSE and not exchange:
        raise ValueError("shard='dense' shards the dense kernels the exchange carries: add "
                         "exchange='auto' (Exchange()) or 'always', or leave shard='all'")


@dataclass(frozen=True)
class Strategy:
    """A named plan builder and the two facts that choose its executor."""

    name: str
    summary: str
    build: Callable[[Sequence[VarSpec], PlanOptions], Plan]
    defers: bool = False  # some buckets travel at the start of the next step (OverlapCallback)
    shards: bool = False  # each rank updates only its slice of every bucket

    def build_plan(self, specs: Sequence[VarSpec], options: PlanOptions = PlanOptions()) -> Plan:
        """The communication plan for these variables (no collectives)."""
        return self.build(specs, options)


def _horovod(specs: Sequence[VarSpec], options: PlanOptions) -> Plan:
    check_dtypes(specs)
    ordered = sorted(specs, key=lambda v: -v.index)  # gradients appear output layer first
    return Plan(
        strategy="horovod", bucket_bytes=0, fused_by_horovod=True,
        buckets=tuple(Bucket(index=i, variables=(v,)) for i, v in enumerate(ordered)),
        notes=("one allreduce per gradient; Horovod fuses whatever is ready each cycle "
               "(HOROVOD_CYCLE_TIME, HOROVOD_FUSION_THRESHOLD), in the order it negotiates",),
    )


def _layerwise(specs: Sequence[VarSpec], options: PlanOptions) -> Plan:
    return build_layerwise_plan(specs, options.bucket_bytes, "layerwise")


def _deferred(specs: Sequence[VarSpec], options: PlanOptions) -> Plan:
    return build_layerwise_plan(specs, options.bucket_bytes, "deferred", defer=-1)


def _default_half(specs: Sequence[VarSpec], options: PlanOptions) -> int:
    """The input-side buckets holding at most half the bytes (``half_the_bytes``)."""
    if options.defer is not None:
        return options.defer
    plan = build_layerwise_plan(specs, options.bucket_bytes)
    return half_the_bytes([b.nbytes for b in plan.buckets])


def _hybrid(specs: Sequence[VarSpec], options: PlanOptions) -> Plan:
    return build_layerwise_plan(specs, options.bucket_bytes, "hybrid",
                                defer=_default_half(specs, options))


def _sharded_plan(name: str, defer: int, specs: Sequence[VarSpec], options: PlanOptions) -> Plan:
    if options.gather_with not in GATHER_METHODS:
        raise ValueError(f"gather_with={options.gather_with!r}: choose "
                         f"{' or '.join(GATHER_METHODS)}")
    plan = build_layerwise_plan(specs, options.bucket_bytes, name, defer=defer)
    gather = options.gather_with
    plan = replace(plan, buckets=tuple(replace(b, collective=sharded_collective(gather))
                                       for b in plan.buckets),
                   notes=("sharded: every bucket is reduce-scattered during backprop and each "
                          "rank updates its 1/P slice; phase says when the updated slices are "
                          "all-gathered: 'backward' right after the update, in this step; "
                          "'forward' at the start of the next step, in forward order (input "
                          "side first)",
                          f"the slices are gathered with {gather}"
                          + (" (each rank's slice repeated P times: the all-gather's result "
                             "and bytes)" if gather == "alltoall" else "")))
    check_shard(options.shard, options.exchange != NEVER)
    if mutants.off("sharded_update"):  # whole buckets on every rank, not slices
        return _shard_dense_only(plan if options.exchange == NEVER else split_exchangeable(plan))
    if options.exchange == NEVER:
        return plan
    plan = split_exchangeable(plan)
    plan = label_exchange(plan, {}, options.exchange, options.ranks, options.exchange_forward)
    return plan if options.shard == SHARD_ALL else _shard_dense_only(plan)


def _shard_dense_only(plan: Plan) -> Plan:
    """``shard="dense"``: every bucket but the row-sliced dense kernels allreduced as its
    gradients exist and updated whole on every rank (``layerwise``'s way, exact the same)."""
    return replace(plan, buckets=tuple(
        b if b.rows else replace(b, collective=ALLREDUCE, phase=BACKWARD, whole=True)
        for b in plan.buckets),
        notes=plan.notes + ("shard='dense': only the dense kernels the exchange may carry are "
                            "sharded; every other bucket is allreduced during backprop and "
                            "updated whole on every rank",))


def _sharded(specs: Sequence[VarSpec], options: PlanOptions) -> Plan:
    defer = -1 if options.defer is None else options.defer
    return _sharded_plan("sharded", defer, specs, options)


def _sharded_hybrid(specs: Sequence[VarSpec], options: PlanOptions) -> Plan:
    return _sharded_plan("sharded_hybrid", _default_half(specs, options), specs, options)


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("horovod", "stock Horovod's gradient path (one allreduce per gradient, fused by "
             "readiness)", _horovod),
    Strategy("layerwise", "layer-ordered buckets, each allreduced as soon as its gradients "
             "exist (overlap with backprop)", _layerwise),
    Strategy("deferred", "every bucket allreduced and applied at the start of the next step, "
             "input side first (overlap with the next forward)", _deferred, defers=True),
    Strategy("hybrid", "output-side buckets during backprop, input-side ones (half the bytes) "
             "deferred into the next forward", _hybrid, defers=True),
    Strategy("sharded", "reduce-scatter during backprop, update one's 1/P slice, all-gather "
             "the slices in the next forward", _sharded, defers=True, shards=True),
    Strategy("sharded_hybrid", "sharded, output-side buckets all-gathered during backprop and "
             "the input-side ones (half the bytes) in the next forward", _sharded_hybrid,
             defers=True, shards=True),
)}


def get_strategy(name: str) -> Strategy:
    """The strategy called ``name``, or a ValueError listing the valid names."""
    try:
        return STRATEGIES[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown strategy {name!r}; choose one of: {', '.join(sorted(STRATEGIES))}"
        ) from None

