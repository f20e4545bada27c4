"""The strategies a user picks, as objects: each takes only the settings that mean something
for it, so a setting passed where it has no use is a ``TypeError`` when the object is made.

    Layerwise(bucket_bytes=8 << 20)        Hybrid(defer=2)
    Sharded(gather_with="alltoall", exchange=Exchange(forward="rows"))
    Auto()                                 StockHorovod(num_groups=2)

Strings are sugar for the same objects, with one spelling shared by ``DistributedOptimizer``,
the simulator, the bench and the CLI (:func:`parse`, :meth:`Strategy.spec`)::

    NAME[+OPTION...]   e.g.  sharded+exchange+rows+alltoall,  hybrid+defer=2+bucket=8M

OPTION is ``exchange`` (``exchange=always``), ``gather``/``rows`` (the exchanged kernels'
forward), ``alltoall`` (slices travel by alltoall), ``auto`` (``bucket_bytes="auto"``),
``ordered``, ``bucket=BYTES`` (``K``/``M`` suffixes), ``defer=N|auto`` or ``groups=N``
(stock Horovod's ``num_groups``).

Pure Python: no TensorFlow, no Horovod. The runtime reads a strategy's plan from
``hvd_overlap.core.strategies`` by its ``name`` with :meth:`Strategy.plan_options`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from hvd_overlap.core.exchange import ALWAYS, AUTO, FORWARD_MODES, NEVER
from hvd_overlap.core.plan import DEFAULT_BUCKET_BYTES, GATHER_METHODS
from hvd_overlap.core.strategies import PlanOptions

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
    """What every strategy has: a registry name and the two facts that pick its executor."""

    name: ClassVar[str]
    defers: ClassVar[bool] = False  # some buckets travel at the start of the next step
    shards: ClassVar[bool] = False  # each rank updates only its slice of every bucket

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
            ranks=ranks)

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
        """This strategy in the one string spelling (:func:`parse` reads it back)."""
        return "+".join([self.name, *self._options()])

    def _options(self) -> list[str]:
        out = []
        exchange: Exchange | None = getattr(self, "exchange", None)
        if exchange is not None:
            out.append("exchange" if exchange.layers == AUTO else f"exchange={exchange.layers}")
            if exchange.forward != AUTO:
                out.append(exchange.forward)
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


@dataclass(frozen=True)
class Hybrid(_Bucketed):
    """Output-side buckets during backprop; the ``defer`` input-side ones (None: half the
    bytes; ``"auto"``: chosen by timing) in the next forward."""

    name: ClassVar[str] = "hybrid"
    defers: ClassVar[bool] = True
    defer: Defer = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_defer(self.defer)


@dataclass(frozen=True)
class Sharded(_Bucketed):
    """Reduce-scatter during backprop, update one's 1/P slice, all-gather the slices in the
    next forward (``gather_with``: ``"allgather"`` or ``"alltoall"``), optionally with the dense
    factor ``exchange``."""

    name: ClassVar[str] = "sharded"
    defers: ClassVar[bool] = True
    shards: ClassVar[bool] = True
    gather_with: str = GATHER_METHODS[0]
    exchange: Exchange | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gather_with not in GATHER_METHODS:
            raise ValueError(f"gather_with={self.gather_with!r}: choose "
                             f"{' or '.join(GATHER_METHODS)}")
        if self.exchange is not None and not isinstance(self.exchange, Exchange):
            raise TypeError(f"exchange must be an Exchange(...) or None, got {self.exchange!r}")
        if self.exchange is not None and self.tuned:
            raise ValueError(f"bucket_bytes/defer='auto' with strategy {self.name!r} does not "
                             "combine with the exchange (it patches the model's dense layers "
                             "for one plan): pass a bucket size, or exchange='never'")


@dataclass(frozen=True)
class ShardedHybrid(Sharded):
    """Sharded, the output-side slices all-gathered during backprop and the ``defer``
    input-side ones (None: half the bytes) in the next forward."""

    name: ClassVar[str] = "sharded_hybrid"
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

#: ``DistributedOptimizer``'s plan keywords -> (the field they set, its default).
KEYWORDS: dict[str, tuple[str, object]] = {
    "bucket_bytes": ("bucket_bytes", DEFAULT_BUCKET_BYTES), "ordered": ("ordered", False),
    "defer": ("defer", None), "gather_with": ("gather_with", GATHER_METHODS[0]),
    "exchange": ("exchange", NEVER), "exchange_forward": ("exchange", AUTO),
    "num_groups": ("num_groups", 0), "groups": ("groups", None),
}


_HINTS = {
    "groups": " (stock Horovod's manual grouping; the plan groups by bucket_bytes instead)",
    "num_groups": " (stock Horovod's manual grouping; the plan groups by bucket_bytes instead)",
    ("auto", "bucket_bytes"): " (auto chooses bucket_bytes and defer itself; to fix them, name "
                              "the strategy, e.g. Hybrid(bucket_bytes=8 << 20, defer='auto'))",
    ("auto", "defer"): " (auto chooses bucket_bytes and defer itself; to fix them, name the "
                       "strategy, e.g. Hybrid(bucket_bytes=8 << 20, defer='auto'))",
    ("sharded", "defer"): " (sharded gathers every slice in the next forward; "
                          "ShardedHybrid(defer=N) gathers N input-side buckets there)",
}


def _settable(cls: type[Strategy]) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _make(cls: type[Strategy], settings: dict[str, object]) -> Strategy:
    """``cls(**settings)``, a setting it has no use for refused naming who takes it."""
    for key in settings:
        if key not in _settable(cls):
            takers = [n for n, c in REGISTRY.items() if key in _settable(c)]
            raise TypeError(f"strategy {cls.name!r} has no setting {key!r}"
                            + (f"; it applies to {', '.join(takers)}" if takers else "")
                            + _HINTS.get((cls.name, key), _HINTS.get(key, "")))
    return cls(**settings)


def get(name: str) -> type[Strategy]:
    """The strategy class called ``name``, or a ValueError listing the names."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown strategy {name!r}; choose one of: "
                         f"{', '.join(sorted(REGISTRY))}") from None


def parse(text: str) -> Strategy:
    """The strategy a string spells (``NAME[+OPTION...]``, module docstring)."""
    name, *options = str(text).split("+")
    cls = get(name)
    settings: dict[str, object] = {}
    exchange: dict[str, str] = {}
    for option in options:
        key, _, value = option.partition("=")
        if key == "exchange":
            exchange["layers"] = value or AUTO
        elif key in ("gather", "rows") and not value:
            exchange["forward"] = key
        elif key in GATHER_METHODS and not value:
            settings["gather_with"] = key
        elif key == AUTO and not value:
            settings["bucket_bytes"] = AUTO
        elif key == "ordered" and not value:
            settings["ordered"] = True
        elif key == "bucket" and value:
            settings["bucket_bytes"] = value if value == AUTO else _parse_bytes(value, text)
        elif key == "groups" and value:
            settings["num_groups"] = _parse_int(value, text)
        elif key == "defer" and value:
            settings["defer"] = value if value == AUTO else _parse_int(value, text)
        else:
            raise ValueError(f"strategy {text!r}: unknown option {option!r} (options: exchange, "
                             "exchange=always, gather, rows, alltoall, auto, ordered, "
                             "bucket=BYTES, defer=N|auto, groups=N)")
    if exchange:
        if "layers" not in exchange:
            raise ValueError(f"strategy {text!r}: {exchange['forward']!r} is the exchange's "
                             "forward; add +exchange")
        settings["exchange"] = Exchange(**exchange)
    return _make(cls, settings)


def resolve(strategy: str | Strategy, **keywords: object) -> Strategy:
    """The strategy of ``DistributedOptimizer(strategy=..., **keywords)``: an object as given,
    or a string with the plan keywords that differ from their defaults (``KEYWORDS``)."""
    given = {k: v for k, v in keywords.items() if v is not KEYWORDS[k][1]
             and not (v == KEYWORDS[k][1] and type(v) is type(KEYWORDS[k][1]))}
    if isinstance(strategy, Strategy):
        if given:
            raise TypeError(f"{', '.join(given)} given beside a strategy object: pass them to "
                            f"{type(strategy).__name__}(...) itself")
        return strategy
    if isinstance(strategy, type) and issubclass(strategy, Strategy):
        strategy = strategy.name
    if not isinstance(strategy, str):
        raise TypeError(f"strategy must be a name or a strategy object (hvd_overlap.Layerwise, "
                        f"...), got {strategy!r}")
    base = parse(strategy)
    settings = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)
                if getattr(base, f.name) != f.default}
    forward = given.pop("exchange_forward", AUTO)
    if "exchange" in given:
        layers = given.pop("exchange")
        if layers != NEVER:
            if layers not in (AUTO, ALWAYS):
                raise ValueError(f"exchange={layers!r}: choose one of never, auto, always")
            settings["exchange"] = Exchange(str(layers), str(forward))
        else:
            settings.pop("exchange", None)
    elif forward != AUTO:
        if isinstance(settings.get("exchange"), Exchange):
            settings["exchange"] = dataclasses.replace(settings["exchange"], forward=forward)
        else:
            Exchange(forward=str(forward))  # a bad mode is a ValueError first
            raise TypeError("exchange_forward goes with exchange ('auto' or 'always') on a "
                            "sharded strategy; add exchange=")
    for key, value in given.items():
        settings[KEYWORDS[key][0]] = value
    return _make(type(base), settings)


def _fmt_bytes(n: int) -> str:
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def _parse_bytes(value: str, text: str) -> int:
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(value[-1:].upper(), 1)
    return _parse_int(value[:-1] if scale > 1 else value, text) * scale


def _parse_int(value: str, text: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"strategy {text!r}: {value!r} is not a whole number") from None


__all__ = ["Auto", "Deferred", "Exchange", "Hybrid", "Layerwise", "REGISTRY", "Sharded",
           "ShardedHybrid", "StockHorovod", "Strategy", "get", "parse", "resolve"]
