"""The strategies a user picks, as objects: each takes only the settings that mean something
for it, so a setting passed where it has no use is a ``TypeError`` when the object is made.

    Layerwise(bucket_bytes=8 << 20)        Hybrid(defer=2)
    Sharded(gather_with="alltoall", exchange=Exchange(forward="rows"))
    Auto()                                 StockHorovod(num_groups=2)

Strings are sugar for the same objects, with one spelling shared by ``DistributedOptimizer``,
the simulator, the bench and the CLI: ``hvd_overlap.core.spelling`` (``sharded+exchange+rows``,
``hybrid+defer=2+bucket=8M``); :meth:`Strategy.spec` writes it.

Pure Python: no TensorFlow, no Horovod. The runtime reads a strategy's plan from
``hvd_overlap.core.strategies`` by its ``name`` with :meth:`Strategy.plan_options`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from hvd_overlap.core.exchange import ALWAYS, AUTO, FORWARD_MODES, NEVER
from hvd_overlap.core.plan import DEFAULT_BUCKET_BYTES, GATHER_METHODS
from hvd_overlap.core.strategies import SHARD_ALL, PlanOptions, check_shard

BucketBytes = int | str  # bytes, or "auto"
Defer = int | str | None  # input-side buckets deferred; None: half the bytes; "auto": chosen


def _check_bucket_bytes(value: BucketBytes) -> None:
    if value != AUTO and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        raise ValueError(f"bucket_bytes must be a positive int (bytes) or 'auto', got {value!r}")


def _check_defer(value: Defer) -> None:
    if value not in (None, AUTO) and (not isinstance(value, int) or value < 0):
        raise ValueError(f"defer must be a number of buckets >= 0 or 'auto', got {value!r}")


@dataclass(frozen=True)
class Exchange:
    """The dense factor exchange of the sharded update: a ``Dense`` kernel's gradient computed
    from exchanged inputs and output errors, each rank computing only its rows.

    ``layers``: ``"auto"`` (each layer where it moves fewer bytes, decided from the first
    step's batch) or ``"always"``. ``forward``: how an exchanged kernel's forward gets its
    weights: ``"gather"`` (all-gathered as any sharded bucket), ``"rows"`` (each rank's rows
    stay put; the forward multiplies them by exchanged inputs) or ``"auto"`` (per layer, the
    one that moves fewer bytes)."""

    layers: str = AUTO
    forward: str = AUTO

    def __post_init__(self) -> None:
        if self.layers not in (AUTO, ALWAYS):
            raise ValueError(f"exchange={self.layers!r}: choose one of never, auto, always")
        if self.forward not in FORWARD_MODES:
            raise ValueError(f"exchange_forward={self.forward!r}: choose one of "
                             f"{', '.join(FORWARD_MODES)}")


@dataclass(frozen=True)
class Strategy:
    """What every strategy has: a registry name and the facts that pick its executor and checks."""

    name: ClassVar[str]
    defers: ClassVar[bool] = False  # some buckets travel at the start of the next step
    shards: ClassVar[bool] = False  # each rank updates only its slice of every bucket
    #: the optimizer's update itself is applied bucket by bucket (not only the all-gathers),
    #: which an optimizer that updates every variable at once (Nadam) cannot follow exactly
    splits_update: ClassVar[bool] = False

    @property
    def tuned(self) -> bool:
        """True if ``auto`` chooses part of the plan by timing candidates during the first
        steps (``Auto``, or ``bucket_bytes``/``defer`` set to ``"auto"``)."""
        return AUTO in (getattr(self, "bucket_bytes", None), getattr(self, "defer", None))

    def plan_options(self, ranks: int = 1) -> PlanOptions:
        """The plan builder's options (``hvd_overlap.core.strategies``) for ``ranks``."""
        size = getattr(self, "bucket_bytes", DEFAULT_BUCKET_BYTES)
        exchange: Exchange | None = getattr(self, "exchange", None)
        defer = getattr(self, "defer", None)
        return PlanOptions(
            bucket_bytes=DEFAULT_BUCKET_BYTES if size == AUTO else size,
            defer=None if defer == AUTO else defer,
            gather_with=getattr(self, "gather_with", GATHER_METHODS[0]),
            exchange=exchange.layers if exchange else NEVER,
            exchange_forward=exchange.forward if exchange else AUTO,
            ranks=ranks, shard=getattr(self, "shard", SHARD_ALL))

    def keywords(self) -> dict[str, object]:
        """The ``DistributedOptimizer`` keywords besides ``strategy=self.name`` that make this
        strategy (its settings that differ from their defaults)."""
        out: dict[str, object] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value == f.default:
                continue
            if isinstance(value, Exchange):
                out["exchange"] = value.layers
                if value.forward != AUTO:
                    out["exchange_forward"] = value.forward
            else:
                out[f.name] = value
        return out

    def spec(self) -> str:
        """This strategy in the one string spelling (``core.spelling.parse`` reads it back)."""
        return "+".join([self.name, *self._options()])

    def _options(self) -> list[str]:
        out = []
        exchange: Exchange | None = getattr(self, "exchange", None)
        if exchange is not None:
            out.append("exchange" if exchange.layers == AUTO else f"exchange={exchange.layers}")
            if exchange.forward != AUTO:
                out.append(exchange.forward)
        if getattr(self, "shard", SHARD_ALL) != SHARD_ALL:
            out.append(f"shard={self.shard}")  # type: ignore[attr-defined]
        if getattr(self, "gather_with", GATHER_METHODS[0]) != GATHER_METHODS[0]:
            out.append(self.gather_with)  # type: ignore[attr-defined]
        size = getattr(self, "bucket_bytes", DEFAULT_BUCKET_BYTES)
        if size == AUTO:
            out.append(AUTO)
        elif size != DEFAULT_BUCKET_BYTES:
            out.append(f"bucket={_fmt_bytes(size)}")
        if getattr(self, "defer", None) is not None:
            out.append(f"defer={self.defer}")  # type: ignore[attr-defined]
        if getattr(self, "ordered", False):
            out.append("ordered")
        if getattr(self, "num_groups", 0):
            out.append(f"groups={self.num_groups}")  # type: ignore[attr-defined]
        if getattr(self, "groups", None) is not None:
            raise ValueError("explicit groups= (lists of variables) have no string spelling; "
                             "use the StockHorovod object")
        return out

    def __str__(self) -> str:
        return self.spec()


@dataclass(frozen=True)
class StockHorovod(Strategy):
    """Stock Horovod's gradient path: one allreduce per gradient, fused by readiness.
    ``num_groups``/``groups`` as Horovod's (manual grouping)."""

    name: ClassVar[str] = "horovod"
    num_groups: int = 0
    groups: object = None


@dataclass(frozen=True)
class _Bucketed(Strategy):
    """Layer-ordered buckets of at most ``bucket_bytes`` (``"auto"``: chosen by timing);
    ``ordered``: each backprop bucket's collective waits for the previous one."""

    bucket_bytes: BucketBytes = DEFAULT_BUCKET_BYTES
    ordered: bool = False

    def __post_init__(self) -> None:
        _check_bucket_bytes(self.bucket_bytes)


@dataclass(frozen=True)
class Layerwise(_Bucketed):
    """Each bucket allreduced as soon as its gradients exist (overlap with backprop)."""

    name: ClassVar[str] = "layerwise"


@dataclass(frozen=True)
class Deferred(_Bucketed):
    """Every bucket allreduced and applied at the start of the next step, input side first
    (overlap with the next forward)."""

    name: ClassVar[str] = "deferred"
    defers: ClassVar[bool] = True
    splits_update: ClassVar[bool] = True


@dataclass(frozen=True)
class Hybrid(_Bucketed):
    """Output-side buckets during backprop; the ``defer`` input-side ones (None: half the
    bytes; ``"auto"``: chosen by timing) in the next forward."""

    name: ClassVar[str] = "hybrid"
    defers: ClassVar[bool] = True
    splits_update: ClassVar[bool] = True
    defer: Defer = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_defer(self.defer)


@dataclass(frozen=True)
class Sharded(_Bucketed):
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


#: Every strategy by its registry name.
REGISTRY: dict[str, type[Strategy]] = {c.name: c for c in (
    StockHorovod, Layerwise, Deferred, Hybrid, Sharded, ShardedHybrid, Auto)}

def get(name: str) -> type[Strategy]:
    """The strategy class called ``name``, or a ValueError listing the names."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown strategy {name!r}; choose one of: "
                         f"{', '.join(sorted(REGISTRY))}") from None


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
    if isinstance(chosen, Auto):
        return StockHorovod()
    size = getattr(chosen, "bucket_bytes", DEFAULT_BUCKET_BYTES)
    return Layerwise(bucket_bytes=DEFAULT_BUCKET_BYTES if size == AUTO else size,
                     ordered=getattr(chosen, "ordered", False))


def _fmt_bytes(n: int) -> str:
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


__all__ = ["Auto", "Deferred", "Exchange", "Hybrid", "Layerwise", "REGISTRY", "Sharded",
           "ShardedHybrid", "StockHorovod", "Strategy", "for_accumulation", "get"]
