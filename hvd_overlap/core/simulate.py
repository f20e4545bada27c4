"""Event-level model of one synchronous data-parallel training step, for every strategy.

One compute resource runs the step's work in program order (the forward of each layer, the
backward of each layer in reverse, the optimizer updates); one communication channel is
Horovod's background thread: every cycle (``HOROVOD_CYCLE_TIME``) it negotiates the requests
that are ready on all ranks, then runs their collectives one at a time. Stock Horovod fuses
whatever is ready into buffers of up to ``HOROVOD_FUSION_THRESHOLD``; the plugin sends each
bucket of the plan (``hvd_overlap.core.plan``) as one collective of its own. Collectives cost
ring-algorithm time, growing with the number of ranks P:

- allreduce of n bytes: ``2 (P-1)/P n / bandwidth + 2 (P-1) latency``;
- reduce-scatter and all-gather: half of that each (together: one allreduce's bytes);
- alltoall of a buffer of n bytes per rank (the dense factor exchange's inputs): each rank
  keeps 1/P and sends the rest, ``(P-1)/P n / bandwidth + (P-1) latency``;
- every tensor adds ``tensor_s``; every cycle that carries work adds the negotiation,
  ``negotiation_s`` measured at P=2 and grown with P by an assumed law (``log2`` by default:
  tree / recursive-doubling coordination; ``linear``: a coordinator that talks to every rank).

On a host where communication runs on the cores that compute (CPU training, like this one), the
two slow each other down while they overlap: compute runs at ``1 - cpu_steal`` of its speed, and
a transfer takes ``comm_slowdown`` times as long. Both are 0 / 1 on a GPU cluster.

The steady-state step starts with an idle channel (every collective of the previous step's graph
has finished when ``train_function`` returns); ``deferred`` buckets and the deferred all-gathers
of ``sharded`` / ``sharded_hybrid`` carry the previous step's gradients / parameters, so the step
is the same every time.

The dense factor exchange (``sharded+exchange``, ``sharded_hybrid+exchange``: the runtime's
``sharded`` / ``sharded_hybrid`` with ``exchange="auto"``, ``hvd_overlap.core.exchange``): a
profile layer that carries its kernel shape (``Layer.dense``) gets its kernel in a row-sliced
bucket of its own; where ``label_exchange`` chooses the exchange, that kernel is not
reduce-scattered: as the layer's backward starts, its input (an alltoall) and its output errors
(an all-gather) travel, and the part of the layer's backward that computes the kernel gradient
(taken as its forward time: the same GEMM FLOPs) runs, eagerly, once both have arrived; its
updated rows are all-gathered like any sharded bucket -- or, with the forward on the rows
(``EXCHANGE_ROWS``, where ``label_exchange`` picks it), never: the layer's forward waits for an
alltoall of its input (issued when the input exists) and the next layer for an alltoall of the
partial outputs; its backward waits for the all-gathered errors and the layer below's backward
for an alltoall of the input gradient.

Updates run after backprop, in program order, except one case: ``sharded_hybrid`` (and
``sharded`` with ``defer`` below the number of buckets) updates each backprop-phase bucket's
slice as soon as its reduce-scatter is done, pausing backprop meanwhile (an *eager* task), and
issues that bucket's all-gather right after.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hvd_overlap.core.exchange import AUTO, GATHER, NEVER, ROWS, DenseShape, label_exchange
from hvd_overlap.core.plan import (
    ALLREDUCE,
    BACKWARD,
    DEFAULT_BUCKET_BYTES,
    EXCHANGE_ROWS,
    EXCHANGES,
    FORWARD,
    Plan,
    VarSpec,
    itemsize,
)
from hvd_overlap.core.strategies import STRATEGIES as _STRATEGIES
from hvd_overlap.core.strategies import PlanOptions, get_strategy
from hvd_overlap.core.trial import MARGIN

RUNTIME_STRATEGIES = tuple(_STRATEGIES)  # every runtime strategy, simulated from its own plan
EXCHANGE_SUFFIX = "+exchange"  # a sharded strategy with exchange="auto"
# ...and exchange_forward, as the bench spells it (no suffix: "auto")
FORWARD_SUFFIXES = {"": AUTO, "+gather": GATHER, "+rows": ROWS}
_COST_CHOICE = "+rows_if_cheaper"  # internal: exchange_forward="auto" before its online check
EXCHANGE_STRATEGIES = tuple(f"{s}{EXCHANGE_SUFFIX}" for s in RUNTIME_STRATEGIES
                            if _STRATEGIES[s].shards)
STRATEGIES = RUNTIME_STRATEGIES + tuple(f"{s}{f}" for s in EXCHANGE_STRATEGIES
                                        for f in FORWARD_SUFFIXES)
FUSION_BYTES = 128 * 1024 * 1024  # HOROVOD_FUSION_THRESHOLD default
CYCLE_S = 1e-3                    # HOROVOD_CYCLE_TIME default in Horovod 0.28.1 (1 ms)
PROFILE_FORMAT = "hvd-overlap-profile/1"
SHIPPED = Path(__file__).with_name("profiles")
_EPS = 1e-12


@dataclass(frozen=True)
class Layer:
    """One layer in forward order: seconds forward and backward, and its gradient."""

    name: str
    forward_s: float
    backward_s: float
    grad_bytes: int = 0
    dtype: str = "float32"
    tensors: int = 0
    flops: float | None = None  # forward FLOPs (FLOPs-derived profiles)
    #: a dense layer's kernel shape ``(n_in, n_out)`` (its ``grad_bytes`` hold that kernel and
    #: any bias): the factor exchange can carry the kernel
    dense: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.dense is not None:
            n_in, n_out = (int(d) for d in self.dense)
            object.__setattr__(self, "dense", (n_in, n_out))
            if min(n_in, n_out) < 1 or n_in * n_out * itemsize(self.dtype) > self.grad_bytes:
                raise ValueError(f"layer {self.name!r}: a dense kernel of {n_in}x{n_out} "
                                 f"{self.dtype} does not fit in its {self.grad_bytes} bytes")

    @property
    def kernel_bytes(self) -> int:
        """Bytes of the dense kernel (0: not a dense layer)."""
        return self.dense[0] * self.dense[1] * itemsize(self.dtype) if self.dense else 0

    def to_dict(self) -> dict[str, Any]:
        """The layer as profile JSON (``dense`` only if set: older readers keep working)."""
        d = asdict(self)
        if self.dense is None:
            del d["dense"]
        else:
            d["dense"] = list(self.dense)
        return d


@dataclass(frozen=True)
class Profile:
    """A model's per-layer compute and gradients, at one batch size per rank."""

    model: str
    batch_size: int
    layers: tuple[Layer, ...]
    update_s: float = 0.0  # optimizer update of every variable; split by gradient bytes
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def grad_bytes(self) -> int:
        return sum(la.grad_bytes for la in self.layers)

    @property
    def compute_s(self) -> float:
        """Seconds of one step without communication."""
        return sum(la.forward_s + la.backward_s for la in self.layers) + self.update_s

    def scaled(self, factor: float) -> Profile:
        """Every compute time multiplied by ``factor`` (a faster or slower device)."""
        return replace(self, update_s=self.update_s * factor, layers=tuple(
            replace(la, forward_s=la.forward_s * factor, backward_s=la.backward_s * factor)
            for la in self.layers))

    def to_dict(self) -> dict[str, Any]:
        return {"format": PROFILE_FORMAT, "model": self.model, "batch_size": self.batch_size,
                "update_s": self.update_s, "grad_bytes": self.grad_bytes,
                "compute_s": self.compute_s, "meta": self.meta,
                "layers": [la.to_dict() for la in self.layers]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Profile:
        if d.get("format") != PROFILE_FORMAT:
            raise ValueError(f"not a profile written by `hvd-overlap profile` "
                             f"(format {d.get('format')!r}, expected {PROFILE_FORMAT!r})")
        return cls(model=d["model"], batch_size=int(d["batch_size"]),
                   update_s=float(d.get("update_s", 0.0)), meta=d.get("meta", {}),
                   layers=tuple(Layer(**la) for la in d["layers"]))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")


def shipped_profiles() -> list[str]:
    """Names of the profiles that ship with the package (``hvd_overlap/core/profiles``)."""
    return sorted(p.stem for p in SHIPPED.glob("*.json") if not p.stem.startswith("overheads"))


def load_profile(name: str | Path) -> Profile:
    """A profile from a JSON file, or a shipped one by name (``resnet50``)."""
    path = Path(name)
    if not path.exists():
        path = SHIPPED / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"profile {str(name)!r}: no such file, and not a shipped "
                                f"profile ({', '.join(shipped_profiles())})")
    return Profile.from_dict(json.loads(path.read_text()))


@dataclass(frozen=True)
class Cluster:
    """The ranks, the link and Horovod's settings. ``bandwidth`` in bytes/s per rank,
    ``latency`` in seconds per ring hop."""

    ranks: int
    bandwidth: float
    latency: float = 0.0
    cycle_s: float = CYCLE_S
    negotiation_s: float = 0.0
    negotiation_growth: str = "log2"
    tensor_s: float = 0.0
    cpu_steal: float = 0.0
    comm_slowdown: float = 1.0
    fusion_bytes: int = FUSION_BYTES
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    #: measured per collective type (``hvd-overlap calibrate``; the alltoall's from its
    #: all-gather done as an alltoall); None: the link's ``bandwidth`` (ring model)
    reduce_scatter_bandwidth: float | None = None
    allgather_bandwidth: float | None = None
    alltoall_bandwidth: float | None = None

    def __post_init__(self) -> None:
        if self.ranks < 1 or self.bandwidth <= 0:
            raise ValueError("ranks must be >= 1 and bandwidth > 0")
        if not 0 <= self.cpu_steal < 1 or self.comm_slowdown < 1:
            raise ValueError("cpu_steal must be in [0, 1) and comm_slowdown >= 1")
        if self.negotiation_growth not in ("log2", "linear", "none"):
            raise ValueError("negotiation_growth: log2, linear or none")

    def negotiation(self) -> float:
        """Seconds of one cycle's coordination among ``ranks`` ranks."""
        p = self.ranks
        grow = {"log2": math.log2(p), "linear": p - 1.0, "none": 1.0}[self.negotiation_growth]
        return self.negotiation_s * grow if p > 1 else 0.0

    def allreduce(self, nbytes: float) -> float:
        """Ring allreduce seconds."""
        p = self.ranks
        return 2 * (p - 1) / p * nbytes / self.bandwidth + 2 * (p - 1) * self.latency

    def reduce_scatter(self, nbytes: float) -> float:
        """Ring reduce-scatter seconds (each rank ends with the sum of 1/P of the data)."""
        return self._half_ring(nbytes, self.reduce_scatter_bandwidth)

    def allgather(self, nbytes: float) -> float:
        """Ring all-gather seconds of ``nbytes`` in total (1/P from each rank)."""
        return self._half_ring(nbytes, self.allgather_bandwidth)

    def alltoall(self, nbytes: float) -> float:
        """Pairwise alltoall seconds of a buffer of ``nbytes`` on each rank (it keeps 1/P and
        sends 1/P to each other rank: P-1 steps)."""
        return self._half_ring(nbytes, self.alltoall_bandwidth)

    def _half_ring(self, nbytes: float, bandwidth: float | None) -> float:
        p = self.ranks
        return (p - 1) / p * nbytes / (bandwidth or self.bandwidth) + (p - 1) * self.latency

    def wire_bytes(self, kind: str, nbytes: float) -> float:
        """Bytes one rank sends for a collective of ``nbytes`` (all-gather: in all; alltoall:
        each rank's buffer)."""
        share = (self.ranks - 1) / self.ranks * nbytes
        return 2 * share if kind == "allreduce" else share


@dataclass
class Request:
    """A collective the channel must run. ``after``: issued only when that request is done."""

    kind: str
    nbytes: int
    tensors: int
    label: str
    fusable: bool = False
    at_start: bool = False
    after: int | None = None


@dataclass
class Task:
    """Compute work in program order; waits for requests, issues requests when done.
    ``eager``: not in program order -- runs as soon as its requests are done, pausing the
    program-order task meanwhile (one at a time, to completion)."""

    label: str
    work: float
    waits: tuple[int, ...] = ()
    issues: tuple[int, ...] = ()
    eager: bool = False


@dataclass(frozen=True)
class StepResult:
    """Seconds of one simulated step, and how it was spent."""

    strategy: str
    ranks: int
    step_s: float
    compute_s: float
    wire_s: float          # seconds the channel spent transferring (slowed while compute ran)
    collectives: int
    wire_bytes: float      # bytes one rank sends per step

    @property
    def efficiency(self) -> float:
        return self.compute_s / self.step_s

    @property
    def exposed_s(self) -> float:
        return self.step_s - self.compute_s

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "efficiency": self.efficiency, "exposed_s": self.exposed_s}


# --- the step of each strategy as tasks and requests -----------------------------------------

@dataclass(frozen=True)
class _Bucket:
    index: int           # the plan's
    layers: tuple[int, ...]  # forward positions of its layers
    nbytes: int
    tensors: int
    update_s: float
    phase: str = BACKWARD  # the plan's: when it travels (sharded: when it is all-gathered)
    exchange: DenseShape | None = None  # a dense kernel the factor exchange carries
    itemsize: int = 4
    rows_forward: bool = False  # the exchange's forward on the rows: its rows never gathered


def exchange_mode(strategy: str) -> tuple[str, str, str]:
    """The runtime strategy and ``exchange`` and ``exchange_forward`` keywords of a simulator
    strategy: ``sharded+exchange`` -> ``("sharded", "auto", "auto")``,
    ``sharded+exchange+rows`` -> ``("sharded", "auto", "rows")``, ``sharded`` ->
    ``("sharded", "never", "auto")``."""
    for suffix, forward in (*FORWARD_SUFFIXES.items(), (_COST_CHOICE, AUTO)):
        if suffix and strategy.endswith(suffix):
            base, _, _ = exchange_mode(strategy[:-len(suffix)])
            return base, AUTO, forward
    if strategy.endswith(EXCHANGE_SUFFIX):
        return strategy[:-len(EXCHANGE_SUFFIX)], AUTO, AUTO
    return strategy, NEVER, AUTO


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
    base, exchange, forward = exchange_mode(strategy)
    specs = _specs(profile, exchange != NEVER)
    if not specs:
        return None
    plan = get_strategy(base).build_plan(
        specs, PlanOptions(bucket_bytes, defer, exchange=exchange, exchange_forward=forward,
                           ranks=ranks))
    if exchange == NEVER:
        return plan
    return label_exchange(plan, _dense_shapes(profile, specs), exchange, ranks, forward)


def buckets_of(profile: Profile, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
               plan: Plan | None = None) -> list[_Bucket]:
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
        out.append(_Bucket(b.index, idx, nbytes, tensors, nbytes * per_byte, b.phase, shape,
                           itemsize(b.dtype), b.collective == EXCHANGE_ROWS))
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


def build_step(profile: Profile, strategy: str, cluster: Cluster,
               defer: int | None = None) -> tuple[list[Task], list[Request]]:
    """The compute tasks and collectives of one steady-state step of ``strategy``."""
    if strategy.removesuffix(_COST_CHOICE) not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")
    plan = plan_of(profile, strategy, cluster.bucket_bytes, defer, cluster.ranks)
    layers = profile.layers
    reqs: list[Request] = []
    per_byte = profile.update_s / max(profile.grad_bytes, 1)

    def request(**kw: Any) -> int:
        reqs.append(Request(**kw))
        return len(reqs) - 1

    def exchange(b: _Bucket, s: DenseShape) -> tuple[int, int]:
        """The layer's input (alltoall of each rank's B x n_in) and output errors (all-gather
        of P x B x n_out in all), once per call."""
        x = request(kind="alltoall", nbytes=s.calls * s.batch * s.n_in * b.itemsize, tensors=1,
                    label=f"alltoall inputs bucket {b.index}")
        dy = request(kind="allgather", nbytes=s.calls * cluster.ranks * s.batch * s.n_out
                     * b.itemsize, tensors=1, label=f"allgather errors bucket {b.index}")
        return x, dy

    buckets = buckets_of(profile, plan=plan)
    sharded = plan is not None and any(b.collective != ALLREDUCE for b in plan.buckets)
    fused_by_horovod = plan is not None and plan.fused_by_horovod
    # early: reduced (sharded: reduce-scattered, or exchanged) during this step's backprop;
    # late: travel at the start of the step, in forward order (sharded: the all-gather of
    # updated parameters; the early-only ones are all-gathered right after their update, in
    # backprop)
    late = [b for b in buckets if b.phase == FORWARD and not b.rows_forward]
    early = buckets if sharded else [b for b in buckets if b.phase == BACKWARD]
    on_rows = {b.layers[0]: b for b in buckets if b.rows_forward}
    late_index = {b.index for b in late}
    kind_late = "allgather" if sharded else "allreduce"
    kind_early = "reduce_scatter" if sharded else "allreduce"

    # start of the step: the late buckets in forward order (the plan's), one after the other
    waits_before: dict[int, tuple[int, ...]] = {}
    pre: dict[int, Task] = {}
    prev = None
    for b in late:
        rid = request(kind=kind_late, nbytes=b.nbytes, tensors=b.tensors,
                      label=f"{kind_late} bucket {b.index}", at_start=prev is None, after=prev)
        prev = rid
        first = b.layers[0]
        if sharded:                 # parameters arrive already updated
            waits_before[first] = waits_before.get(first, ()) + (rid,)
        else:                       # the update is applied right before the layer's forward
            pre[first] = Task(f"update bucket {b.index}", b.update_s, (rid,))

    tasks: list[Task] = []
    carry: tuple[int, ...] = ()  # the partial outputs of a layer on the rows: the next waits
    for i, la in enumerate(layers):
        if i in pre:
            tasks.append(pre[i])
        waits, issues, carry = waits_before.get(i, ()) + carry, (), ()
        b = on_rows.get(i)
        if b is not None and b.exchange is not None:
            s = b.exchange  # the input to the rows' owners; the partial outputs back
            x = request(kind="alltoall", nbytes=s.calls * s.batch * s.n_in * b.itemsize,
                        tensors=1, label=f"alltoall inputs bucket {b.index}",
                        at_start=not tasks)
            if tasks:
                tasks[-1].issues += (x,)
            issues = carry = (request(
                kind="alltoall", nbytes=s.calls * cluster.ranks * s.batch * s.n_out
                * b.itemsize, tensors=1, label=f"alltoall outputs bucket {b.index}"),)
            waits += (x,)
        tasks.append(Task(f"forward {la.name}", la.forward_s, waits, issues))
    # backward, output layer first; collectives issued as gradients appear (exchanges as their
    # layer's backward starts)
    ready_at: dict[int, list[_Bucket]] = {}
    exchanged: dict[int, list[_Bucket]] = {}
    for b in early:
        (ready_at if b.exchange is None else exchanged).setdefault(b.layers[0], []).append(b)
    post: list[Task] = []
    eager: list[Task] = []
    below: tuple[int, ...] = carry  # the input gradient a layer on the rows sends back
    for i in reversed(range(len(layers))):
        la = layers[i]
        issues: tuple[int, ...] = ()
        work = la.backward_s
        waits, below = below, ()
        for b, shape in ((b, b.exchange) for b in exchanged.get(i, []) if b.exchange):
            if b.rows_forward:  # errors all-gathered; then this rank's rows and dx columns
                dy = request(kind="allgather", nbytes=shape.calls * cluster.ranks * shape.batch
                             * shape.n_out * b.itemsize, tensors=1,
                             label=f"allgather errors bucket {b.index}")
                tasks[-1].issues += (dy,)
                rows_s = min(la.forward_s, work)
                work -= rows_s
                waits += (dy,)
                eager.append(Task(f"gradient rows bucket {b.index}", rows_s, (dy,), eager=True))
                post.append(Task(f"update bucket {b.index}", b.update_s / cluster.ranks, (dy,)))
                if i > 0:  # the input layer's input gradient is not computed
                    below = (request(kind="alltoall", nbytes=shape.calls * shape.batch
                                     * shape.n_in * b.itemsize, tensors=1,
                                     label=f"alltoall input gradient bucket {b.index}"),)
                    issues += below
                continue
            got = exchange(b, shape)
            tasks[-1].issues += got  # the previous task produced this layer's output errors
            rows_s = min(la.forward_s, work)  # the kernel-gradient GEMM: the forward's FLOPs
            work -= rows_s
            if b.index in late_index:   # its rows all-gathered at the next step's start
                eager.append(Task(f"gradient rows bucket {b.index}", rows_s, got, eager=True))
                post.append(Task(f"update bucket {b.index}", b.update_s / cluster.ranks, got))
            else:
                ag = request(kind="allgather", nbytes=b.nbytes, tensors=b.tensors,
                             label=f"allgather bucket {b.index}")
                eager.append(Task(f"gradient rows, update bucket {b.index}",
                                  rows_s + b.update_s / cluster.ranks, got, (ag,), eager=True))
        if fused_by_horovod and la.grad_bytes:
            rid = request(kind="allreduce", nbytes=la.grad_bytes, tensors=max(la.tensors, 1),
                          label=f"allreduce {la.name}", fusable=True)
            issues = (rid,)
            post.append(Task(f"update {la.name}", la.grad_bytes * per_byte, (rid,)))
        for b in () if fused_by_horovod else ready_at.get(i, ()):
            rid = request(kind=kind_early, nbytes=b.nbytes, tensors=b.tensors,
                          label=f"{kind_early} bucket {b.index}")
            issues += (rid,)
            if not sharded:
                post.append(Task(f"update bucket {b.index}", b.update_s, (rid,)))
            elif b.index in late_index:  # all-gathered at the next step's start
                post.append(Task(f"update bucket {b.index}", b.update_s / cluster.ranks, (rid,)))
            else:  # updated as soon as reduce-scattered, then all-gathered in this backprop
                ag = request(kind="allgather", nbytes=b.nbytes, tensors=b.tensors,
                             label=f"allgather bucket {b.index}")
                eager.append(Task(f"update bucket {b.index}", b.update_s / cluster.ranks,
                                  (rid,), (ag,), eager=True))
        tasks.append(Task(f"backward {la.name}", work, waits, issues))
    return tasks + post + eager, reqs


# --- the event loop ----------------------------------------------------------------------------

def _cost(cluster: Cluster, reqs: Sequence[Request]) -> float:
    """Seconds of one collective carrying ``reqs`` (fused if several)."""
    nbytes = sum(r.nbytes for r in reqs)
    ring = {"allreduce": cluster.allreduce, "reduce_scatter": cluster.reduce_scatter,
            "allgather": cluster.allgather, "alltoall": cluster.alltoall}[reqs[0].kind]
    return ring(nbytes) + cluster.tensor_s * sum(r.tensors for r in reqs)


def _responses(cluster: Cluster, ready: list[int], reqs: Sequence[Request]) -> list[list[int]]:
    """One cycle's collectives: fusable requests packed in ready order up to the threshold."""
    ops: list[list[int]] = []
    fused: list[int] = []
    for rid in ready:
        r = reqs[rid]
        if not r.fusable:
            ops.append([rid])
            continue
        if fused and sum(reqs[f].nbytes for f in fused) + r.nbytes > cluster.fusion_bytes:
            ops.append(fused)
            fused = []
        fused.append(rid)
    if fused:
        ops.append(fused)
    return ops


def run_step(tasks: Sequence[Task], reqs: Sequence[Request], cluster: Cluster) -> dict[str, Any]:
    """Simulate; returns the step's end, the seconds spent transferring, the collectives run
    and when each request (by label) was done."""
    inf = math.inf
    issued: dict[int, float] = {i: 0.0 for i, r in enumerate(reqs) if r.at_start}
    done: dict[int, float] = {}
    taken: set[int] = set()
    successors = {r.after: i for i, r in enumerate(reqs) if r.after is not None}
    program = [i for i, tk in enumerate(tasks) if not tk.eager]
    eager = [i for i, tk in enumerate(tasks) if tk.eager]
    left = {i: tk.work for i, tk in enumerate(tasks)}  # compute: work left of each task
    finished: set[int] = set()
    t, k = 0.0, 0                      # k: next program-order task (index into program)
    phase, phase_end, remaining_m = "idle", 0.0, 0.0  # channel
    last_cycle, anchor, cycle_ops, current = 0.0, 0.0, [], []
    wire, n_ops = 0.0, 0

    def next_cycle() -> float:
        """Start of the first cycle that sees a waiting request; idle cycles tick from
        ``anchor`` every ``cycle_s``."""
        waiting = [issued[i] for i in issued if i not in taken]
        if not waiting:
            return inf
        late = max(min(waiting) - anchor, 0.0)
        if cluster.cycle_s <= 0:
            return anchor + late
        return anchor + math.ceil(late / cluster.cycle_s - 1e-9) * cluster.cycle_s

    def pick() -> int | None:
        """The task computing now: an eager one already started or ready, else the next
        program-order one if its requests are done."""
        ready = [i for i in eager if i not in finished and
                 (left[i] < tasks[i].work or all(w in done for w in tasks[i].waits))]
        if ready:
            return min(ready, key=lambda i: (left[i] == tasks[i].work, i))  # started first
        if k < len(program) and all(w in done for w in tasks[program[k]].waits):
            return program[k]
        return None

    while True:
        running = pick()
        busy_c, busy_m = running is not None, phase == "transfer"
        rate_c = 1.0 - cluster.cpu_steal if busy_m else 1.0
        rate_m = 1.0 / cluster.comm_slowdown if busy_c else 1.0
        t_c = t + left[running] / rate_c if busy_c else inf
        if phase == "idle":
            t_m = next_cycle()
        elif phase == "negotiate":
            t_m = phase_end
        else:
            t_m = t + remaining_m / rate_m
        t_next = min(t_c, t_m)
        if t_next == inf:
            break
        dt = t_next - t
        if busy_c:
            left[running] -= dt * rate_c
        if busy_m:
            remaining_m -= dt * rate_m
            wire += dt
        t = t_next
        if busy_c and left[running] <= _EPS:
            for rid in tasks[running].issues:
                issued[rid] = t
            finished.add(running)
            if not tasks[running].eager:
                k += 1
        if t_m <= t + _EPS:
            if phase == "idle":
                last_cycle = t
                ready = sorted((i for i in issued if i not in taken and issued[i] <= t + _EPS),
                               key=lambda i: (issued[i], i))
                taken.update(ready)
                cycle_ops = _responses(cluster, ready, reqs)
                phase, phase_end = "negotiate", t + cluster.negotiation()
            elif phase == "transfer":
                for rid in current:
                    done[rid] = t
                    if rid in successors:
                        issued[successors[rid]] = t
                phase = "negotiate"
                phase_end = t
            if phase == "negotiate" and phase_end <= t + _EPS:
                if cycle_ops:
                    current = cycle_ops.pop(0)
                    remaining_m = _cost(cluster, [reqs[i] for i in current])
                    n_ops += 1
                    phase = "transfer"
                else:  # Horovod's loop starts the next cycle one cycle_s after this one
                    phase, anchor = "idle", max(last_cycle + cluster.cycle_s, t)
    if len(finished) < len(tasks) or len(done) < len(reqs):
        raise RuntimeError(f"simulation stalled: {len(finished)}/{len(tasks)} tasks, "
                           f"{len(done)}/{len(reqs)} collectives done")
    end = max([t] + list(done.values()))
    return {"end": end, "wire": wire, "collectives": n_ops,
            "done": {reqs[i].label: done[i] for i in sorted(done)}}


def simulate(profile: Profile, strategy: str, cluster: Cluster,
             defer: int | None = None) -> StepResult:
    """One steady-state step of ``strategy`` on ``cluster``; ``defer``: input-side buckets
    deferred to the next step (``hybrid``, ``sharded``, ``sharded_hybrid``), as
    ``DistributedOptimizer(defer=...)``: the step is built from the strategy's own plan."""
    compute = profile.compute_s  # the compute-only baseline: local training, full update
    if cluster.ranks == 1:
        return StepResult(strategy, 1, compute, compute, 0.0, 0, 0.0)
    if strategy.endswith(EXCHANGE_SUFFIX):  # exchange_forward="auto": its online check too
        chosen = simulate(profile, strategy + _COST_CHOICE, cluster, defer)
        gather = simulate(profile, strategy + "+gather", cluster, defer)
        best = gather if gather.step_s * (1 + MARGIN) < chosen.step_s else chosen
        return replace(best, strategy=strategy)
    tasks, reqs = build_step(profile, strategy, cluster, defer)
    out = run_step(tasks, reqs, cluster)
    sent = sum(cluster.wire_bytes(r.kind, r.nbytes) for r in reqs)
    return StepResult(strategy, cluster.ranks, out["end"], compute, out["wire"],
                      out["collectives"], sent)


def sweep(profile: Profile, cluster: Cluster, ranks: Sequence[int],
          strategies: Sequence[str] = STRATEGIES, defer: int | None = None) -> list[StepResult]:
    """Every strategy at every rank count (``defer``: see ``simulate``)."""
    return [simulate(profile, s, replace(cluster, ranks=p), defer)
            for p in ranks for s in strategies]
