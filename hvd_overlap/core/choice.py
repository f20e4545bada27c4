"""The strategies a user picks, as objects: each takes only the settings that mean something
for it (a setting passed where it has no use is a ``TypeError`` when the object is made) and
builds its own plan (``build_plan``).

    Layerwise(bucket_bytes=8 << 20)        Hybrid(defer=2)
    Sharded(gather_with="alltoall", exchange=Exchange(forward="rows"))
    Auto()                                 StockHorovod(num_groups=2)

Strings are sugar for the same objects, with one spelling shared by ``DistributedOptimizer``,
the simulator, the bench and the CLI: ``hvd_overlap.core.spelling`` (``sharded+exchange+rows``,
``hybrid+defer=2+bucket=8M``); :meth:`Strategy.spec` writes it. What every strategy has, and
``register`` for a new one: ``hvd_overlap.core.strategy``. Pure Python: no TensorFlow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from hvd_overlap.core.exchange import AUTO, GATHER, NEVER, DenseShape
from hvd_overlap.core.plan import (
    DEFAULT_BUCKET_BYTES,
    GATHER_METHODS,
    Plan,
    VarSpec,
    build_layerwise_plan,
)
from hvd_overlap.core.plan_builders import (
    SHARD_ALL,
    check_shard,
    default_half,
    horovod_plan,
    label_for_batch,
    sharded_plan,
)
from hvd_overlap.core.strategy import (
    REGISTRY,
    CommOptions,
    Exchange,
    Strategy,
    get,
    register,
    unregister,
)

BucketBytes = int | str  # bytes, or "auto"
Defer = int | str | None  # input-side buckets deferred; None: half the bytes; "auto": chosen


def _check_bucket_bytes(value: BucketBytes) -> None:
    if value != AUTO and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        raise ValueError(f"bucket_bytes must be a positive int (bytes) or 'auto', got {value!r}")


def _check_defer(value: Defer) -> None:
    if value not in (None, AUTO) and (not isinstance(value, int) or value < 0):
        raise ValueError(f"defer must be a number of buckets >= 0 or 'auto', got {value!r}")


@register
@dataclass(frozen=True)
class StockHorovod(Strategy):
    """Stock Horovod's gradient path: one allreduce per gradient, fused by readiness.
    ``num_groups``/``groups`` as Horovod's (manual grouping)."""

    name: ClassVar[str] = "horovod"
    num_groups: int = 0
    groups: object = None

    def build_plan(self, specs: Sequence[VarSpec], ranks: int = 1) -> Plan:
        return horovod_plan(specs)

    def comm_options(self) -> CommOptions:
        return CommOptions(groups=self.groups or self.num_groups or None)

    def describe(self) -> str:
        return "horovod (stock fusion)"


@dataclass(frozen=True)
class Bucketed(Strategy):
    """Layer-ordered buckets of at most ``bucket_bytes`` (``"auto"``: chosen by timing);
    ``ordered``: each backprop bucket's collective waits for the previous one."""

    bucket_bytes: BucketBytes = DEFAULT_BUCKET_BYTES
    ordered: bool = False

    def __post_init__(self) -> None:
        _check_bucket_bytes(self.bucket_bytes)

    @property
    def size(self) -> int:
        """The bucket budget a plan is built with (``"auto"``: the default, the probe's)."""
        return DEFAULT_BUCKET_BYTES if self.bucket_bytes == AUTO else int(self.bucket_bytes)

    def comm_options(self) -> CommOptions:
        return CommOptions(ordered=self.ordered)


@register
@dataclass(frozen=True)
class Layerwise(Bucketed):
    """Each bucket allreduced as soon as its gradients exist (overlap with backprop)."""

    name: ClassVar[str] = "layerwise"

    def build_plan(self, specs: Sequence[VarSpec], ranks: int = 1) -> Plan:
        return build_layerwise_plan(specs, self.size, self.name)


@register
@dataclass(frozen=True)
class Deferred(Bucketed):
    """Every bucket allreduced and applied at the start of the next step, input side first
    (overlap with the next forward)."""

    name: ClassVar[str] = "deferred"
    defers: ClassVar[bool] = True
    splits_update: ClassVar[bool] = True

    def build_plan(self, specs: Sequence[VarSpec], ranks: int = 1) -> Plan:
        return build_layerwise_plan(specs, self.size, self.name, defer=-1)


@register
@dataclass(frozen=True)
class Hybrid(Bucketed):
    """Output-side buckets during backprop; the ``defer`` input-side ones (None: half the
    bytes; ``"auto"``: chosen by timing) in the next forward."""

    name: ClassVar[str] = "hybrid"
    defers: ClassVar[bool] = True
    splits_update: ClassVar[bool] = True
    defer: Defer = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_defer(self.defer)

    def build_plan(self, specs: Sequence[VarSpec], ranks: int = 1) -> Plan:
        defer = None if self.defer == AUTO else self.defer
        return build_layerwise_plan(specs, self.size, self.name,
                                    defer=default_half(specs, self.size, defer))


@register
@dataclass(frozen=True)
class Sharded(Bucketed):
    """Reduce-scatter during backprop, update one's 1/P slice, all-gather the slices in the
    next forward (``gather_with``: ``"allgather"`` or ``"alltoall"``), optionally with the dense
    factor ``exchange``. ``shard="dense"`` (with the exchange): only the dense kernels the
    exchange may carry are sharded; every other bucket is allreduced during backprop and
    updated whole on every rank, as ``Layerwise``."""

    name: ClassVar[str] = "sharded"
    defers: ClassVar[bool] = True
    shards: ClassVar[bool] = True
    gather_with: str = GATHER_METHODS[0]
    exchange: Exchange | None = None
    shard: str = SHARD_ALL

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gather_with not in GATHER_METHODS:
            raise ValueError(f"gather_with={self.gather_with!r}: choose "
                             f"{' or '.join(GATHER_METHODS)}")
        if self.exchange is not None and not isinstance(self.exchange, Exchange):
            raise TypeError(f"exchange must be an Exchange(...) or None, got {self.exchange!r}")
        check_shard(self.shard, self.exchange is not None)
        if self.exchange is not None and self.tuned:
            raise ValueError(f"bucket_bytes/defer='auto' with strategy {self.name!r} does not "
                             "combine with the exchange (it patches the model's dense layers "
                             "for one plan): pass a bucket size, or exchange='never'")

    def deferred_buckets(self, specs: Sequence[VarSpec]) -> int:
        """The input-side buckets whose slices are gathered in the next forward (-1: all)."""
        return -1

    def build_plan(self, specs: Sequence[VarSpec], ranks: int = 1) -> Plan:
        return sharded_plan(self.name, specs, self.size, self.deferred_buckets(specs),
                            self.gather_with, *self.exchange_modes(), self.shard, ranks)

    def exchange_modes(self) -> tuple[str, str]:
        ex = self.exchange
        return (ex.layers, ex.forward) if ex else (NEVER, AUTO)

    def label(self, plan: Plan, shapes: Mapping[int, DenseShape], ranks: int) -> Plan:
        if not self.exchanges:
            return plan
        return label_for_batch(plan, shapes, ranks, *self.exchange_modes(), self.shard)

    def comm_options(self) -> CommOptions:
        return CommOptions(ordered=self.ordered, gather_with=self.gather_with)

    def online_alternative(self) -> Strategy | None:
        if self.exchange is None or self.exchange.forward != AUTO:
            return None
        return dataclasses.replace(self, exchange=dataclasses.replace(self.exchange,
                                                                      forward=GATHER))


@register
@dataclass(frozen=True)
class ShardedHybrid(Sharded):
    """Sharded, the output-side slices all-gathered during backprop and the ``defer``
    input-side ones (None: half the bytes) in the next forward."""

    name: ClassVar[str] = "sharded_hybrid"
    splits_update: ClassVar[bool] = True
    defer: Defer = None

    def __post_init__(self) -> None:
        _check_defer(self.defer)
        super().__post_init__()

    def deferred_buckets(self, specs: Sequence[VarSpec]) -> int:
        return default_half(specs, self.size, None if self.defer == AUTO else self.defer)


@register
@dataclass(frozen=True)
class Auto(Strategy):
    """The fastest whole-state plan, predicted from the model then timed against stock
    Horovod's fusion during the first steps (needs ``OverlapCallback`` or
    ``make_train_step``)."""

    name: ClassVar[str] = "auto"
    defers: ClassVar[bool] = True  # it may choose a deferring plan

    @property
    def tuned(self) -> bool:
        return True


#: The runtime strategies that build a plan themselves, by name (``hvd_overlap.STRATEGIES``).
STRATEGIES: dict[str, type[Strategy]] = {n: c for n, c in REGISTRY.items() if c is not Auto}


def for_accumulation(chosen: Strategy) -> Strategy:
    """The strategy that runs with ``backward_passes_per_step > 1``, which sums several passes
    before one reduction, within the pass that completes them (as Horovod): nothing is left to
    defer into the next forward or to shard, so a strategy that would do either runs as
    ``Layerwise`` (``Auto``: as ``StockHorovod``, stock's fusion), with the same weights."""
    if not (chosen.defers or chosen.shards):
        if chosen.tuned:
            raise ValueError("'auto' times and switches plans step by step, which "
                             "backward_passes_per_step > 1 does not combine with; pass a "
                             "bucket size for gradient accumulation")
        return chosen
    if not isinstance(chosen, Bucketed):
        return StockHorovod()
    return Layerwise(bucket_bytes=chosen.size, ordered=chosen.ordered)


__all__ = ["REGISTRY", "STRATEGIES", "Auto", "Bucketed", "Deferred", "Exchange", "Hybrid",
           "Layerwise", "Sharded", "ShardedHybrid", "StockHorovod", "Strategy",
           "for_accumulation", "get", "register", "unregister"]
