"""The communication plan: which bucket each trainable variable is in, how it travels, and when.

Pure Python (no TensorFlow, no Horovod), so it can be built, printed and tested without ranks.
A plan is built once per model from the variables in forward order (``model.trainable_variables``
order) and is the only thing the executor needs to know to issue the collectives.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from hvd_overlap.core import mutants

# Horovod 0.28.1 collectives support these dtypes (no bfloat16).
SUPPORTED_DTYPES = frozenset(
    {"uint8", "int8", "int32", "int64", "float16", "float32", "float64"}
)
_ITEMSIZE = {
    "uint8": 1, "int8": 1, "int32": 4, "int64": 8,
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
}

# Default bucket budget. See README "Choosing bucket_bytes": 4 MiB merges the small conv/BN
# layers of a CNN into a few collectives while a large dense layer keeps a bucket of its own.
DEFAULT_BUCKET_BYTES = 4 * 1024 * 1024

# Phases: when a bucket's collective is issued.
BACKWARD = "backward"  # inside the train step, as soon as the bucket's gradients exist
FORWARD = "forward"    # deferred: at the start of the next step, before the layer's forward
ALLREDUCE = "allreduce"
REDUCE_SCATTER = "reducescatter"  # then all-gather of the updated slices (sharded)
# How the updated slices are gathered: Horovod's all-gather, or an alltoall of the slice repeated
# P times (every rank receives every slice: the same result and bytes; faster on Gloo).
GATHER_METHODS = ("allgather", "alltoall")
# A dense kernel whose gradient rows are computed from exchanged factors (hvd_overlap.core.exchange)
# and whose updated rows are then all-gathered.
EXCHANGE = "exchange+allgather"
# The same gradient, but the updated rows stay on their rank: the layer's forward (and its input
# gradient) is computed from each rank's rows, with the activations exchanged instead; the whole
# kernel is gathered only when the weights are read (a flush).
EXCHANGE_ROWS = "exchange+rows"
EXCHANGES = (EXCHANGE, EXCHANGE_ROWS)


def sharded_collective(gather_with: str) -> str:
    """The plan's label of a sharded bucket's pair of collectives: ``reducescatter+alltoall``."""
    return f"{REDUCE_SCATTER}+{gather_with}"


@dataclass(frozen=True)
class VarSpec:
    """A trainable variable as the plan sees it: forward position, name, shape, dtype, layer."""

    index: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    layer: str
    sparse: bool = False     # its gradient is an IndexedSlices (Embedding) sent as such
    has_grad: bool = True    # False: not on the loss path, never sent nor updated
    exchangeable: bool = False  # the 2-D kernel of a dense layer the factor exchange can carry

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= int(d)
        return n

    @property
    def nbytes(self) -> int:
        return self.size * itemsize(self.dtype)


@dataclass(frozen=True)
class Bucket:
    """Variables that travel together in one named collective."""

    index: int
    variables: tuple[VarSpec, ...]
    collective: str = ALLREDUCE
    phase: str = BACKWARD
    rows: bool = False  # sharded: one 2-D kernel, sliced by rows (the exchange's layout)
    whole: bool = False  # sharded: not sliced; allreduced and updated on every rank

    @property
    def nbytes(self) -> int:
        return sum(v.nbytes for v in self.variables)

    @property
    def dtype(self) -> str:
        return self.variables[0].dtype

    @property
    def layers(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for v in self.variables:
            seen.setdefault(v.layer, None)
        return tuple(seen)


@dataclass(frozen=True)
class Plan:
    """Ordered buckets (in issue order) plus the settings that produced them."""

    strategy: str
    bucket_bytes: int
    buckets: tuple[Bucket, ...]
    notes: tuple[str, ...] = field(default=())
    #: True for stock Horovod's path: the buckets are single gradients that Horovod fuses by
    #: readiness each cycle, in the order it negotiates (not issued one by one in plan order)
    fused_by_horovod: bool = False

    def phase_buckets(self, phase: str) -> tuple[Bucket, ...]:
        """The buckets of one phase, in the order they are issued."""
        return tuple(b for b in self.buckets if b.phase == phase)

    def bucket_of(self) -> dict[int, int]:
        """Map a variable's forward index to the index of its bucket."""
        return {v.index: b.index for b in self.buckets for v in b.variables}

    @property
    def variables(self) -> tuple[VarSpec, ...]:
        return tuple(sorted((v for b in self.buckets for v in b.variables), key=lambda v: v.index))

    def signature(self) -> str:
        """A short hash of everything that must agree across ranks."""
        payload = [self.strategy, self.bucket_bytes] + [
            [b.index, b.collective, b.phase, b.rows, b.whole] + [
                [v.index, v.name, list(v.shape), v.dtype, v.sparse, v.has_grad, v.exchangeable]
                for v in b.variables]
            for b in self.buckets
        ]
        return hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:16]

    def describe(self) -> str:
        """A human-readable table: one row per bucket, in the order the collectives are issued."""
        total = sum(b.nbytes for b in self.buckets)
        nvars = sum(len(b.variables) for b in self.buckets)
        lines = [
            f"plan: strategy={self.strategy} bucket_bytes={_fmt_bytes(self.bucket_bytes)} "
            f"buckets={len(self.buckets)} variables={nvars} total={_fmt_bytes(total)}",
            f"{'order':>5}  {'bucket':>6}  {'phase':<9} {'collective':<10} {'dtype':<8} "
            f"{'bytes':>9}  {'vars':>4}  layers",
        ]
        for order, b in enumerate(self.buckets):
            layers = ", ".join(b.layers)
            lines.append(
                f"{order:>5}  {b.index:>6}  {b.phase:<9} {b.collective:<10} {b.dtype:<8} "
                f"{_fmt_bytes(b.nbytes):>9}  {len(b.variables):>4}  {layers}"
            )
            for v in b.variables:
                lines.append(f"{'':>36}- {v.name} {list(v.shape)}")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


def itemsize(dtype: str) -> int:
    """Bytes per element of a dtype name (4 if unknown)."""
    return _ITEMSIZE.get(dtype, 4)


def fmt_bytes(n: float) -> str:
    """``4194304`` -> ``'4.0MiB'``."""
    return _fmt_bytes(n)


def layer_of(var_name: str) -> str:
    """The owning layer of a Keras variable name: ``'m/conv2d_1/kernel:0'`` -> ``'m/conv2d_1'``."""
    base = var_name.split(":", 1)[0]
    return base.rsplit("/", 1)[0] if "/" in base else base


def check_dtypes(variables: Iterable[VarSpec]) -> None:
    """Refuse dtypes Horovod cannot reduce, naming the fix."""
    for v in variables:
        if v.dtype not in SUPPORTED_DTYPES:
            raise TypeError(
                f"variable {v.name!r} has dtype {v.dtype}, which Horovod's collectives do not "
                f"support (supported: {', '.join(sorted(SUPPORTED_DTYPES))}). Keep trainable "
                "variables in float32 (for mixed precision use the 'mixed_float16' policy, "
                "not 'mixed_bfloat16')."
            )


def build_layerwise_plan(
    variables: Sequence[VarSpec], bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    strategy: str = "layerwise", defer: int = 0,
) -> Plan:
    """Buckets in backprop order (output layer first), cut at layer boundaries by ``bucket_bytes``.

    Adjacent layers merge until adding the next layer would exceed the budget; a layer larger
    than the budget gets a bucket of its own (a layer is never split). A bucket holds one dtype.
    ``defer`` input-side buckets (-1: all) move to the FORWARD phase: issued at the start of the
    next step in forward order (input layer first), after the BACKWARD buckets of this step.
    A bucket holding a sparse gradient stays in the BACKWARD phase (its size varies per step).
    """
    if not isinstance(defer, int) or defer < -1:
        raise ValueError(f"defer must be an int >= 0 (or -1 for all buckets), got {defer!r}")
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be a positive number of bytes, got {bucket_bytes}")
    check_dtypes(variables)
    # Group variables by layer, keeping forward order of first appearance.
    layers: dict[str, list[VarSpec]] = {}
    for v in sorted(variables, key=lambda v: v.index):
        layers.setdefault(v.layer, []).append(v)

    buckets: list[list[VarSpec]] = []
    current: list[VarSpec] = []
    for layer_vars in reversed(list(layers.values())):
        # Backprop produces a layer's gradients in reverse creation order too.
        for dtype_group in _split_by_dtype(list(reversed(layer_vars))):
            cur_bytes = sum(v.nbytes for v in current)
            add = sum(v.nbytes for v in dtype_group)
            if current and (
                current[0].dtype != dtype_group[0].dtype or cur_bytes + add > bucket_bytes
            ):
                buckets.append(current)
                current = []
            current = current + dtype_group
    if current:
        buckets.append(current)
    n_defer = len(buckets) if defer == -1 else min(defer, len(buckets))
    made = [
        Bucket(index=i, variables=tuple(b),
               phase=FORWARD if i >= len(buckets) - n_defer
               and not any(v.sparse for v in b) else BACKWARD)
        for i, b in enumerate(buckets)
    ]
    backward = [b for b in made if b.phase == BACKWARD]
    if mutants.off("bucket_order"):
        backward.reverse()
    forward = [b for b in reversed(made) if b.phase == FORWARD]
    return Plan(strategy=strategy, bucket_bytes=bucket_bytes, buckets=tuple(backward + forward))


def input_side_share(nbytes: Sequence[int], share: float) -> int:
    """How many input-side buckets hold at most ``share`` of the gradient bytes (produced last
    by backprop, needed first by the next forward): at least one if there are several, never
    all of them. ``nbytes``: bytes per bucket in backward order."""
    total = sum(nbytes)
    deferred, acc = 0, 0
    for b in reversed(nbytes):  # input side first
        if acc + b > share * total:
            break
        acc += b
        deferred += 1
    return min(max(deferred, 1), len(nbytes) - 1) if len(nbytes) > 1 else 0


def half_the_bytes(nbytes: Sequence[int]) -> int:
    """Hybrid's default split: the input-side buckets holding at most half the gradient bytes
    (``input_side_share``)."""
    return input_side_share(nbytes, 0.5)


def _split_by_dtype(vs: list[VarSpec]) -> list[list[VarSpec]]:
    groups: list[list[VarSpec]] = []
    for v in vs:
        if groups and groups[-1][0].dtype == v.dtype:
            groups[-1].append(v)
        else:
            groups.append([v])
    return groups


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n}B"
