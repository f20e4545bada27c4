"""What every strategy is: a frozen, hashable object holding only its own settings, which
builds its plan from the model's variables (``build_plan``), says which executor runs it
(``defers``, ``shards``, ``splits_update``) and how its collectives are set
(``comm_options``). ``auto``'s pool, the simulator, the CLI, the bench and the runtime all
take these objects; strings exist only at the edges (``spec`` writes the one spelling,
``hvd_overlap.core.spelling.parse`` reads it back).

A new strategy is one subclass and its :func:`register` (``hvd_overlap.core.choice`` holds
the shipped ones). Pure Python: no TensorFlow, no Horovod.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from hvd_overlap.core.exchange import ALWAYS, AUTO, FORWARD_MODES, NEVER, DenseShape
from hvd_overlap.core.plan import DEFAULT_BUCKET_BYTES, GATHER_METHODS, Plan, VarSpec, fmt_bytes


@dataclass(frozen=True)
class Exchange:
    """The dense factor exchange of the sharded update: a ``Dense`` kernel's gradient computed
    from exchanged inputs and output errors, each rank computing only its rows.

    ``layers``: ``"auto"`` (each layer where it moves fewer bytes, decided from the first
    step's batch) or ``"always"``. ``forward``: how an exchanged kernel's forward gets its
    weights: ``"gather"`` (all-gathered as any sharded bucket), ``"rows"`` (each rank's rows
    stay put; the forward multiplies them by exchanged inputs) or ``"auto"`` (per layer, the
    one that moves fewer bytes, then checked online against ``"gather"``)."""

    layers: str = AUTO
    forward: str = AUTO

    def __post_init__(self) -> None:
        if self.layers not in (AUTO, ALWAYS):
            raise ValueError(f"exchange={self.layers!r}: choose one of never, auto, always")
        if self.forward not in FORWARD_MODES:
            raise ValueError(f"exchange_forward={self.forward!r}: choose one of "
                             f"{', '.join(FORWARD_MODES)}")


class CommOptions(NamedTuple):
    """How a strategy's collectives are issued (``comm.methods.CommSettings`` takes them)."""

    ordered: bool = False                # each backprop bucket waits for the previous one
    gather_with: str = GATHER_METHODS[0]  # sharded: how the updated slices travel
    groups: object = None                # stock Horovod's manual grouping


@dataclass(frozen=True)
class Strategy:
    """What every strategy has: a registry name, the facts that pick its executor and checks,
    and its plan."""

    name: ClassVar[str]
    defers: ClassVar[bool] = False  # some buckets travel at the start of the next step
    shards: ClassVar[bool] = False  # each rank updates only its slice of every bucket
    #: the optimizer's update itself is applied bucket by bucket (not only the all-gathers),
    #: which an optimizer that updates every variable at once (Nadam) cannot follow exactly
    splits_update: ClassVar[bool] = False

    def build_plan(self, specs: Sequence[VarSpec], ranks: int = 1) -> Plan:
        """The communication plan for these variables on ``ranks`` ranks (no collectives)."""
        raise ValueError(f"strategy {self.name!r} chooses its plan while training")

    def settings(self) -> dict[str, Any]:
        """This object's settings by field name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @property
    def tuned(self) -> bool:
        """True if ``auto`` chooses part of the plan by timing candidates during the first
        steps (``Auto``, or ``bucket_bytes``/``defer`` set to ``"auto"``)."""
        own = self.settings()
        return AUTO in (own.get("bucket_bytes"), own.get("defer"))

    def exchange_modes(self) -> tuple[str, str]:
        """The dense factor exchange's ``(layers, forward)`` modes (``never``: none)."""
        return NEVER, AUTO

    def label(self, plan: Plan, shapes: Mapping[int, DenseShape], ranks: int) -> Plan:
        """``plan`` (built by ``build_plan``) once each exchangeable kernel's use in a step is
        known (``shapes``, by variable index; ``core.plan_builders.label_for_batch``): the same
        plan for a strategy without the exchange."""
        return plan

    @property
    def exchanges(self) -> bool:
        """True if the plan may carry dense kernels by the factor exchange."""
        return self.exchange_modes()[0] != NEVER

    def comm_options(self) -> CommOptions:
        """How this strategy's collectives are issued."""
        return CommOptions()

    def online_alternative(self) -> Strategy | None:
        """The plan an online check times against this one (None: no check): the exchange's
        ``forward="auto"`` (its per-layer cost choice) against ``"gather"``."""
        return None

    @property
    def kind(self) -> str:
        """This strategy without its sizes, split and exchange forward (``sharded+exchange``):
        ``auto``'s trials compare one of each kind."""
        bare = {k: v for k, v in self.settings().items()
                if k not in ("bucket_bytes", "defer", "groups")}
        if bare.get("exchange") is not None:
            bare["exchange"] = Exchange(bare["exchange"].layers)
        return "+".join([self.name, *spec_options(bare)])

    def child_name(self) -> str:
        """The part of collective names that tells ``auto``'s plans apart."""
        own = self.settings()
        return f"{self.name}.{own.get('bucket_bytes', 0)}.{own.get('defer')}"

    def describe(self) -> str:
        """This strategy in words, as logs and plan notes say it."""
        own = self.settings()
        if "bucket_bytes" not in own:
            return self.name
        size = own["bucket_bytes"]
        text = f"{self.name}, {'auto' if size == AUTO else fmt_bytes(size)} buckets"
        text += f", defer {own['defer']}" if own.get("defer") is not None else ""
        if own.get("exchange") is not None:
            text += f", exchange ({own['exchange'].forward})"
        text += ", ordered" if own.get("ordered") else ""
        text += f", gathered with {own['gather_with']}" if own.get("gather_with", GATHER_METHODS[
            0]) != GATHER_METHODS[0] else ""
        return text + (", only the dense kernels sharded" if own.get("shard", "all") != "all"
                       else "")

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

    def factory_keywords(self) -> dict[str, object]:
        """Every ``DistributedOptimizer`` keyword that builds this plan, ``strategy`` and the
        bucket size included (what ``auto``'s choices are reported as)."""
        own = self.settings()
        size = {"bucket_bytes": own["bucket_bytes"]} if "bucket_bytes" in own else {}
        return {"strategy": self.name, **size, **self.keywords()}

    def spec(self) -> str:
        """This strategy in the one string spelling (``core.spelling.parse`` reads it back)."""
        return "+".join([self.name, *spec_options(self.settings())])

    def __str__(self) -> str:
        return self.spec()


def spec_options(own: dict[str, Any]) -> list[str]:
    """The spelling's options of a strategy's settings, in the spelling's order."""
    out = []
    exchange: Exchange | None = own.get("exchange")
    if exchange is not None:
        out.append("exchange" if exchange.layers == AUTO else f"exchange={exchange.layers}")
        if exchange.forward != AUTO:
            out.append(exchange.forward)
    if own.get("shard", "all") != "all":
        out.append(f"shard={own['shard']}")
    if own.get("gather_with", GATHER_METHODS[0]) != GATHER_METHODS[0]:
        out.append(own["gather_with"])
    size = own.get("bucket_bytes", DEFAULT_BUCKET_BYTES)
    if size == AUTO:
        out.append(AUTO)
    elif size != DEFAULT_BUCKET_BYTES:
        out.append(f"bucket={fmt_spelled_bytes(size)}")
    if own.get("defer") is not None:
        out.append(f"defer={own['defer']}")
    if own.get("ordered"):
        out.append("ordered")
    if own.get("num_groups"):
        out.append(f"groups={own['num_groups']}")
    if own.get("groups") is not None:
        raise ValueError("explicit groups= (lists of variables) have no string spelling; "
                         "use the StockHorovod object")
    return out


def fmt_spelled_bytes(n: int) -> str:
    """``n`` bytes as the spelling writes them (``8M``, ``512K``, ``1000``)."""
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


#: Every strategy by its registry name (the shipped ones: ``hvd_overlap.core.choice``).
REGISTRY: dict[str, type[Strategy]] = {}


def register(cls: type[Strategy]) -> type[Strategy]:
    """Make ``cls`` known by its ``name`` to the spelling, the CLI and ``auto``'s explicit
    pools (a class decorator); a name taken by another class is a ValueError."""
    if REGISTRY.get(cls.name, cls) is not cls:
        raise ValueError(f"strategy name {cls.name!r} is taken by {REGISTRY[cls.name]!r}")
    REGISTRY[cls.name] = cls
    return cls


def unregister(cls: type[Strategy]) -> None:
    """Forget ``cls`` (a test's own strategy, when the test is done)."""
    if REGISTRY.get(cls.name) is cls:
        del REGISTRY[cls.name]


def get(name: str) -> type[Strategy]:
    """The strategy class called ``name``, or a ValueError listing the names."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown strategy {name!r}; choose one of: "
                         f"{', '.join(sorted(REGISTRY))}") from None
