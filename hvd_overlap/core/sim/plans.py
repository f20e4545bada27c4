"""The simulator's strategy names, and each strategy's plan over a profile's layers.

A simulator strategy is a runtime strategy (``hvd_overlap.core.strategies``), or a sharded one
with the dense factor exchange (``sharded+exchange``: ``exchange="auto"``,
``hvd_overlap.core.exchange``) and optionally its ``exchange_forward`` (``+gather``,
``+rows``) and ``shard="dense"`` (``sharded+exchange+rows+shard=dense``). The profile's layers
become the plan's variables (one per layer with a gradient; a dense layer's kernel apart from
its bias where the exchange may carry it), and the plan's buckets become ``StepBucket``
records over the profile's layer positions, which the step builders
(``hvd_overlap.core.sim.steps``) read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from hvd_overlap.core.exchange import AUTO, GATHER, NEVER, ROWS, DenseShape, label_exchange
from hvd_overlap.core.plan import (
    BACKWARD,
    DEFAULT_BUCKET_BYTES,
    EXCHANGE_ROWS,
    EXCHANGES,
    Plan,
    VarSpec,
    itemsize,
)
from hvd_overlap.core.sim.profile import Profile
from hvd_overlap.core.spelling import parse
from hvd_overlap.core.strategies import STRATEGIES as _STRATEGIES
from hvd_overlap.core.strategies import get_strategy

RUNTIME_STRATEGIES = tuple(_STRATEGIES)  # every runtime strategy, simulated from its own plan
EXCHANGE_SUFFIX = "+exchange"  # a sharded strategy with exchange="auto"
# ...and exchange_forward, as the bench spells it (no suffix: "auto")
FORWARD_SUFFIXES = {"": AUTO, "+gather": GATHER, "+rows": ROWS}
_COST_CHOICE = "+rows_if_cheaper"  # internal: exchange_forward="auto" before its online check
EXCHANGE_STRATEGIES = tuple(f"{s}{EXCHANGE_SUFFIX}" for s in RUNTIME_STRATEGIES
                            if _STRATEGIES[s].shards)
DENSE_SUFFIX = "+shard=dense"  # only the exchange's dense kernels sharded (``shard="dense"``)
STRATEGIES = RUNTIME_STRATEGIES + tuple(f"{s}{f}" for s in EXCHANGE_STRATEGIES
                                        for f in FORWARD_SUFFIXES) \
    + tuple(f"{EXCHANGE_STRATEGIES[0]}{f}{DENSE_SUFFIX}" for f in FORWARD_SUFFIXES)


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


def exchange_mode(strategy: str) -> tuple[str, str, str]:
    """The runtime strategy and ``exchange`` and ``exchange_forward`` keywords of a simulator
    strategy, read by the one strategy parser (``hvd_overlap.core.spelling.parse``):
    ``sharded+exchange`` -> ``("sharded", "auto", "auto")``, ``sharded+exchange+rows`` ->
    ``("sharded", "auto", "rows")``, ``sharded`` -> ``("sharded", "never", "auto")``."""
    if strategy.endswith(_COST_CHOICE):
        return exchange_mode(strategy[:-len(_COST_CHOICE)])
    chosen = parse(strategy)
    options = chosen.plan_options()
    return chosen.name, options.exchange, options.exchange_forward


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


def plan_of(profile: Profile, strategy: str, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
            defer: int | None = None, ranks: int = 1) -> Plan | None:
    """The plan the runtime would build for the profile's layers on ``ranks`` ranks (None:
    nothing to send); an exchange strategy's with each dense kernel's choice made for the
    profile's batch (``label_exchange``)."""
    chosen = parse(strategy.removesuffix(_COST_CHOICE))
    options = replace(chosen.plan_options(ranks), bucket_bytes=bucket_bytes, defer=defer)
    specs = _specs(profile, options.exchange != NEVER)
    if not specs:
        return None
    plan = get_strategy(chosen.name).build_plan(specs, options)
    if options.exchange == NEVER:
        return plan
    return label_exchange(plan, _dense_shapes(profile, specs), options.exchange, ranks,
                          options.exchange_forward)


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


def exchange_choices(profile: Profile, ranks: int, strategy: str = EXCHANGE_STRATEGIES[0],
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


