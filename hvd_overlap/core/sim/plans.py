"""The simulator's strategy names, and each strategy's plan over a profile's layers.

The simulator takes the strategy objects themselves (``hvd_overlap.core.choice``: each builds
its own plan); its names (``STRATEGIES``) are their spellings (``hvd_overlap.core.spelling``):
the runtime strategies, and the sharded ones with the dense factor exchange
(``sharded+exchange``) and optionally its forward (``+gather``, ``+rows``) and
``shard="dense"`` (``sharded+exchange+rows+shard=dense``). The profile's layers
become the plan's variables (one per layer with a gradient; a dense layer's kernel apart from
its bias where the exchange may carry it), and the plan's buckets become ``StepBucket``
records over the profile's layer positions, which the step builders
(``hvd_overlap.core.sim.steps``) read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from hvd_overlap.core.choice import STRATEGIES as _CLASSES
from hvd_overlap.core.choice import Deferred, Exchange, Hybrid, Sharded, ShardedHybrid
from hvd_overlap.core.exchange import AUTO, GATHER, NEVER, ROWS, DenseShape
from hvd_overlap.core.plan import (
    BACKWARD,
    DEFAULT_BUCKET_BYTES,
    EXCHANGE_ROWS,
    EXCHANGES,
    Plan,
    VarSpec,
    itemsize,
)
from hvd_overlap.core.plan_builders import SHARD_DENSE
from hvd_overlap.core.sim.profile import Profile
from hvd_overlap.core.spelling import parse
from hvd_overlap.core.strategy import Strategy

RUNTIME_STRATEGIES = tuple(_CLASSES)  # every runtime strategy, simulated from its own plan
#: the sharded strategies with the dense factor exchange (``exchange="auto"``)
EXCHANGE_STRATEGIES = tuple(c(exchange=Exchange()).spec() for c in _CLASSES.values()
                            if c.shards)
_FORWARDS = (AUTO, GATHER, ROWS)  # the exchange's forward, in the names' order
STRATEGIES = RUNTIME_STRATEGIES + tuple(
    c(exchange=Exchange(forward=f)).spec() for c in _CLASSES.values() if c.shards
    for f in _FORWARDS) + tuple(Sharded(exchange=Exchange(forward=f), shard=SHARD_DENSE).spec()
                                for f in _FORWARDS)


def strategy_of(strategy: str | Strategy, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                defer: int | None = None) -> Strategy:
    """The strategy object to simulate: an object as given (its own bucket size and split);
    a name (the edge: the CLI, the bench) parsed and built with ``bucket_bytes`` and
    ``defer`` (-1: every bucket), where the strategy splits: ``hybrid`` and
    ``sharded_hybrid`` at ``defer`` (-1: ``deferred``'s and ``sharded``'s plan), ``sharded``
    at ``defer`` >= 0 (``sharded_hybrid``'s plan)."""
    if isinstance(strategy, Strategy):
        return strategy
    try:
        chosen = parse(strategy)
    except (TypeError, ValueError):
        raise ValueError(f"strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}"
                         ) from None
    own = chosen.settings()
    if "bucket_bytes" not in own:
        return chosen
    own["bucket_bytes"] = bucket_bytes
    if defer == -1 and isinstance(chosen, ShardedHybrid):
        return Sharded(**{k: v for k, v in own.items() if k != "defer"})
    if defer == -1 and isinstance(chosen, Hybrid):
        return Deferred(bucket_bytes, own["ordered"])
    if defer is not None and defer >= 0 and type(chosen) is Sharded:
        return ShardedHybrid(**own, defer=defer)
    if "defer" in own:
        own["defer"] = defer
    return replace(chosen, **own)


@dataclass(frozen=True)
class StepBucket:
    """A plan's bucket over the profile's layers, as the step builders read it."""

    index: int           # the plan's
    layers: tuple[int, ...]  # forward positions of its layers
    nbytes: int
    tensors: int
    update_s: float
    phase: str = BACKWARD  # the plan's: when it travels (sharded: when it is all-gathered)
    exchange: DenseShape | None = None  # a dense kernel the factor exchange carries
    itemsize: int = 4
    rows_forward: bool = False  # the exchange's forward on the rows: its rows never gathered
    allreduced: bool = False  # a sharded plan's whole bucket (``shard="dense"``): allreduced


def exchange_mode(strategy: str | Strategy) -> tuple[str, str, str]:
    """The runtime strategy and ``exchange`` and ``exchange_forward`` keywords of a simulator
    strategy: ``sharded+exchange`` -> ``("sharded", "auto", "auto")``,
    ``sharded+exchange+rows`` -> ``("sharded", "auto", "rows")``, ``sharded`` ->
    ``("sharded", "never", "auto")``."""
    chosen = strategy_of(strategy)
    return (chosen.name, *chosen.exchange_modes())


def _specs(profile: Profile, exchange: bool = False) -> list[VarSpec]:
    """One variable per layer with a gradient, as the plan sees the profile; ``exchange``: a
    dense layer's kernel (``Layer.dense``) as an exchangeable variable of its own, the rest of
    its bytes (the bias) as another."""
    specs: list[VarSpec] = []
    for la in profile.layers:
        rest = la.grad_bytes
        if exchange and la.dense:
            specs.append(VarSpec(len(specs), f"{la.name}/kernel", la.dense, la.dtype, la.name,
                                 exchangeable=True))
            rest -= la.kernel_bytes
        if rest > 0:
            specs.append(VarSpec(len(specs), f"{la.name}/grad", (rest // itemsize(la.dtype),),
                                 la.dtype, la.name))
    return specs


def _dense_shapes(profile: Profile, specs: Sequence[VarSpec]) -> dict[int, DenseShape]:
    """How each exchangeable kernel is used in one step, by variable index."""
    dense = {la.name: la.dense for la in profile.layers if la.dense}
    return {v.index: DenseShape(*dense[v.layer], batch=profile.batch_size)
            for v in specs if v.exchangeable}


def plan_of(profile: Profile, strategy: str | Strategy,
            bucket_bytes: int = DEFAULT_BUCKET_BYTES, defer: int | None = None,
            ranks: int = 1) -> Plan | None:
    """The plan the runtime would build for the profile's layers on ``ranks`` ranks (None:
    nothing to send); a name is built with ``bucket_bytes`` and ``defer`` (``strategy_of``);
    an exchange strategy's with each dense kernel's choice made for the profile's batch
    (``Strategy.label``)."""
    chosen = strategy_of(strategy, bucket_bytes, defer)
    layers = chosen.exchange_modes()[0]
    specs = _specs(profile, layers != NEVER)
    if not specs:
        return None
    plan = chosen.build_plan(specs, ranks)
    return chosen.label(plan, _dense_shapes(profile, specs), ranks)


def buckets_of(profile: Profile, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
               plan: Plan | None = None) -> list[StepBucket]:
    """The plan's buckets (default: ``layerwise``'s) over the profile's layers, in the plan's
    issue order (backprop's buckets first, then the deferred ones in forward order)."""
    plan = plan or plan_of(profile, "layerwise", bucket_bytes)
    if plan is None:
        return []
    pos = {la.name: i for i, la in enumerate(profile.layers)}
    split = {v.layer for v in plan.variables if v.exchangeable}  # kernel apart from its bias
    shapes = _dense_shapes(profile, plan.variables)
    per_byte = profile.update_s / max(profile.grad_bytes, 1)
    out = []

    def size(v: VarSpec) -> tuple[int, int]:
        """The profile's bytes and tensors of one variable (a kernel: one tensor)."""
        la = profile.layers[pos[v.layer]]
        if v.exchangeable:
            return la.kernel_bytes, 1
        apart = v.layer in split
        return la.grad_bytes - apart * la.kernel_bytes, max(la.tensors - apart, 1)

    for b in plan.buckets:
        idx = tuple(sorted({pos[v.layer] for v in b.variables}))
        nbytes, tensors = (sum(col) for col in zip(*map(size, b.variables), strict=True))
        shape = shapes[b.variables[0].index] if b.collective in EXCHANGES else None
        out.append(StepBucket(b.index, idx, nbytes, tensors, nbytes * per_byte, b.phase, shape,
                              itemsize(b.dtype), b.collective == EXCHANGE_ROWS,
                              b.whole))
    return out


@dataclass(frozen=True)
class ExchangeChoice:
    """One dense kernel on ``ranks`` ranks: the bytes one rank sends per step with
    reduce-scatter plus all-gather, with the exchange (of which the activations) and with the
    exchange's forward on the rows, and how ``exchange="auto"`` sends it (``way``: the plan's
    label)."""

    ranks: int
    layer: str
    shape: DenseShape
    sharded_bytes: float
    exchange_bytes: float
    activation_bytes: float
    rows_bytes: float
    way: str

    @property
    def exchanged(self) -> bool:
        return self.way in EXCHANGES

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "exchanged": self.exchanged}


def exchange_choices(profile: Profile, ranks: int,
                     strategy: str | Strategy = EXCHANGE_STRATEGIES[0],
                     bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[ExchangeChoice]:
    """Each dense kernel of the profile (forward order) as ``strategy``'s plan on ``ranks``
    ranks treats it (``label_exchange``'s choice, ``DenseShape``'s bytes)."""
    plan = plan_of(profile, strategy, bucket_bytes, ranks=ranks)
    if plan is None:
        return []
    shapes = _dense_shapes(profile, plan.variables)
    out = []
    for b in plan.buckets:
        v = b.variables[0]
        if not b.rows or v.index not in shapes:
            continue
        s, size = shapes[v.index], itemsize(v.dtype)
        out.append((v.index, ExchangeChoice(
            ranks, v.layer, s, s.sharded_elements(ranks) * size,
            s.exchange_elements(ranks) * size, s.activation_elements(ranks) * size,
            s.rows_elements(ranks) * size, b.collective)))
    return [c for _, c in sorted(out, key=lambda ic: ic[0])]


