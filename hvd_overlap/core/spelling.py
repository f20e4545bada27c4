"""The one string spelling of a strategy, and ``DistributedOptimizer``'s keyword sugar.

    NAME[+OPTION...]   e.g.  sharded+exchange+rows+alltoall,  hybrid+defer=2+bucket=8M

OPTION is ``exchange`` (``exchange="auto"``: where the cost model says it pays) or
``exchange=always``, ``gather``/``rows`` (the exchanged kernels'
forward), ``alltoall`` (slices travel by alltoall), ``auto`` (``bucket_bytes="auto"``),
``ordered``, ``bucket=BYTES`` (``K``/``M`` suffixes), ``defer=N|auto``, ``groups=N``
(stock Horovod's ``num_groups``) or ``shard=dense`` (only the exchange's dense kernels
sharded). :func:`parse` reads it (``Strategy.spec`` writes it); :func:`resolve` turns
``DistributedOptimizer(strategy=..., **keywords)`` into one object. Both refuse a setting
the strategy has no use for with a ``TypeError`` naming who takes it.
"""

from __future__ import annotations

import dataclasses

from hvd_overlap.core.choice import REGISTRY, Exchange, Strategy, get
from hvd_overlap.core.exchange import AUTO, NEVER
from hvd_overlap.core.plan import DEFAULT_BUCKET_BYTES, GATHER_METHODS

#: ``DistributedOptimizer``'s plan keywords -> (the field they set, its default).
KEYWORDS: dict[str, tuple[str, object]] = {
    "bucket_bytes": ("bucket_bytes", DEFAULT_BUCKET_BYTES), "ordered": ("ordered", False),
    "defer": ("defer", None), "gather_with": ("gather_with", GATHER_METHODS[0]),
    "exchange": ("exchange", NEVER), "exchange_forward": ("exchange", AUTO),
    "num_groups": ("num_groups", 0), "groups": ("groups", None), "shard": ("shard", "all"),
}


_GROUPS = " (stock Horovod's manual grouping; the plan groups by bucket_bytes instead)"
_AUTO_CHOOSES = (" (auto chooses bucket_bytes and defer itself; to fix them, name the strategy, "
                 "e.g. Hybrid(bucket_bytes=8 << 20, defer='auto'))")
#: what a TypeError adds for a setting (by name, or by (strategy, name)) a strategy lacks
_HINTS = {
    "groups": _GROUPS, "num_groups": _GROUPS,
    ("auto", "bucket_bytes"): _AUTO_CHOOSES, ("auto", "defer"): _AUTO_CHOOSES,
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
        elif key == "shard" and value:
            settings["shard"] = value
        elif key == "defer" and value:
            settings["defer"] = value if value == AUTO else _parse_int(value, text)
        else:
            raise ValueError(f"strategy {text!r}: unknown option {option!r} (options: exchange, "
                             "exchange=always, gather, rows, alltoall, auto, ordered, "
                             "bucket=BYTES, defer=N|auto, groups=N, shard=dense)")
    if exchange:
        if "layers" not in exchange:
            raise ValueError(f"strategy {text!r}: {exchange['forward']!r} is the exchange's "
                             "forward; add +exchange")
        settings["exchange"] = Exchange(**exchange)
    return _make(cls, settings)


class Default:
    """A plan keyword's default in ``DistributedOptimizer``'s signature: equal to (and shown
    as) its value, yet not the value itself, so ``resolve`` tells a keyword not passed from one
    passed with its default."""

    def __init__(self, value: object):
        self.value = value

    def __eq__(self, other: object) -> bool:
        return self.value == (other.value if isinstance(other, Default) else other)

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return repr(self.value)


#: each plan keyword's default as ``DistributedOptimizer``'s signature holds it
NOT_PASSED: dict[str, Default] = {k: Default(default) for k, (_, default) in KEYWORDS.items()}


def resolve(strategy: str | Strategy, **keywords: object) -> Strategy:
    """The strategy of ``DistributedOptimizer(strategy=..., **keywords)``: an object as given
    (any plan keyword passed beside it, even with its default value, is a ``TypeError``), or
    a string with the plan keywords that differ from their defaults (``KEYWORDS``); a keyword
    not passed is a :class:`Default`."""
    passed = {k: v for k, v in keywords.items() if not isinstance(v, Default)}
    given = {k: v for k, v in passed.items() if v is not KEYWORDS[k][1]
             and not (v == KEYWORDS[k][1] and type(v) is type(KEYWORDS[k][1]))}
    if isinstance(strategy, Strategy):
        if passed:
            given = passed
            raise TypeError(f"{', '.join(given)} given beside a strategy object: pass them to "
                            f"{type(strategy).__name__}(...) itself")
        return strategy
    if isinstance(strategy, type) and issubclass(strategy, Strategy):
        strategy = strategy.name
    if not isinstance(strategy, str):
        raise TypeError(f"strategy must be a name or a strategy object "
                        f"(hvd_overlap.keras.Layerwise, ...), got {strategy!r}")
    base = parse(strategy)
    settings = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)
                if getattr(base, f.name) != f.default}
    forward = given.pop("exchange_forward", AUTO)
    if "exchange" in given:
        layers = given.pop("exchange")
        if layers != NEVER:  # (Exchange refuses a mode other than auto, always)
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


def _parse_bytes(value: str, text: str) -> int:
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(value[-1:].upper(), 1)
    return _parse_int(value[:-1] if scale > 1 else value, text) * scale


def _parse_int(value: str, text: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"strategy {text!r}: {value!r} is not a whole number") from None


__all__ = ["KEYWORDS", "NOT_PASSED", "Default", "parse", "resolve"]
