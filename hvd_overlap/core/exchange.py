"""The dense factor exchange, as numbers: which rows of a kernel a rank owns, the elements each
way of computing a dense layer's gradient puts on the wire, and when the exchange pays.

Pure Python (no TensorFlow, no Horovod): the plan builder, the runtime and the simulator read
the same functions.

For ``y = x W`` with ``W`` of ``n_in x n_out`` on ``ranks`` ranks, local batch ``batch``:

- ``sharded`` (reduce-scatter then all-gather of the kernel): each rank sends
  ``2 (P-1)/P n_in n_out`` elements per step;
- the exchange: an all-to-all of the layer's input (each rank keeps its ``1/P`` of the input
  features for the whole global batch: ``(P-1)/P batch n_in`` sent), an all-gather of the
  output errors (``(P-1) batch n_out`` sent) -- once per call of the layer --, then one
  local GEMM gives the exact global gradient of the rank's own rows, and the updated rows are
  all-gathered as ``sharded`` does (``(P-1)/P n_in n_out``);
- the exchange with the forward on the rows (``exchange_forward="rows"``): the updated rows stay
  on their rank and are never gathered while training. The forward sends the input's columns
  to their rows' owners (the all-to-all above, its result kept for backprop), each rank
  multiplies them by its rows, and the partial outputs go back to their batch's rank to be
  summed (``(P-1) batch n_out``); backprop all-gathers the output errors as above and sends
  each rank the input gradient of its own columns back (``(P-1)/P batch n_in``). Per call:
  ``2 (P-1)/P batch n_in + 2 (P-1) batch n_out`` elements, nothing per weight -- but four
  collectives on the step's critical path, each charged ``LATENCY_ELEMENTS`` per peer (``P-1``)
  when choosing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from hvd_overlap.core.plan import (
    EXCHANGE,
    EXCHANGE_ROWS,
    Bucket,
    Plan,
    VarSpec,
    fmt_bytes,
    itemsize,
    sharded_collective,
)

NEVER, AUTO, ALWAYS = "never", "auto", "always"
EXCHANGE_MODES = (NEVER, AUTO, ALWAYS)
# exchange_forward: how an exchanged kernel's forward gets its weights
GATHER, ROWS = "gather", "rows"
FORWARD_MODES = (AUTO, GATHER, ROWS)
#: collectives per call on the critical path with the forward on the rows
ROWS_COLLECTIVES = 4
#: what one such collective is charged per peer when choosing, in elements (its start-up: ~2 ms
#: at 1 Gbit/s, measured per collective here; small against a kernel's rows at few ranks)
LATENCY_ELEMENTS = 1 << 16


def row_sizes(rows: int, ranks: int) -> list[int]:
    """Rows each rank owns: equal shares, the first ``rows % ranks`` ranks one more (Horovod's
    reduce-scatter splits the first dimension the same way)."""
    base, extra = divmod(rows, ranks)
    return [base + (r < extra) for r in range(ranks)]


def row_range(rows: int, ranks: int, rank: int) -> tuple[int, int]:
    """``[start, stop)`` of the rows rank ``rank`` owns."""
    sizes = row_sizes(rows, ranks)
    start = sum(sizes[:rank])
    return start, start + sizes[rank]


@dataclass(frozen=True)
class DenseShape:
    """A dense layer's kernel and how it is used in one step: ``calls`` times (a shared layer
    is called more than once) on a local batch of ``batch`` rows each."""

    n_in: int
    n_out: int
    batch: int
    calls: int = 1

    def sharded_elements(self, ranks: int) -> float:
        """Elements one rank sends per step: reduce-scatter plus all-gather of the kernel."""
        return 2 * (ranks - 1) / ranks * self.n_in * self.n_out

    def activation_elements(self, ranks: int) -> float:
        """Elements one rank sends per step for the exchange of inputs and output errors."""
        per_call = (ranks - 1) / ranks * self.batch * self.n_in + (ranks - 1) * self.batch \
            * self.n_out
        return self.calls * per_call

    def exchange_elements(self, ranks: int) -> float:
        """Elements one rank sends per step with the exchange (activations plus the
        all-gather of the updated rows)."""
        return self.activation_elements(ranks) + (ranks - 1) / ranks * self.n_in * self.n_out

    def rows_elements(self, ranks: int) -> float:
        """Elements one rank sends per step with the forward on the rows: the activations
        both ways in the forward and in backprop, no weights."""
        per_call = 2 * (ranks - 1) / ranks * self.batch * self.n_in + 2 * (ranks - 1) \
            * self.batch * self.n_out
        return self.calls * per_call

    def exchange_pays(self, ranks: int) -> bool:
        """True if the exchange moves fewer elements than reduce-scatter plus all-gather."""
        return self.exchange_elements(ranks) < self.sharded_elements(ranks)

    def cost(self, collective: str | None, ranks: int) -> float:
        """What ``choose_exchange`` compares: elements sent per rank per step (None: the
        kernel reduce-scattered), plus the start-up charge of the rows forward's
        critical-path collectives (each: ``LATENCY_ELEMENTS`` per peer)."""
        if collective is None:
            return self.sharded_elements(ranks)
        if collective == EXCHANGE:
            return self.exchange_elements(ranks)
        return self.rows_elements(ranks) + ROWS_COLLECTIVES * self.calls * (ranks - 1) \
            * LATENCY_ELEMENTS


def choose_exchange(mode: str, n_in: int, shape: DenseShape | None, ranks: int,
                    forward: str = AUTO) -> str | None:
    """How one eligible kernel of ``n_in`` rows travels: None (reduce-scatter), ``EXCHANGE``
    or ``EXCHANGE_ROWS``. ``mode``: ``never``; ``always`` (if every rank owns a row); ``auto``:
    the cheapest (``DenseShape.cost``) for ``shape`` (None: the batch is not known yet, so
    reduce-scatter for now). ``forward`` (``exchange_forward``) limits the exchange to one
    way: ``gather`` or ``rows``; ``auto`` allows both."""
    if mode not in EXCHANGE_MODES:
        raise ValueError(f"exchange={mode!r}: choose one of {', '.join(EXCHANGE_MODES)}")
    if forward not in FORWARD_MODES:
        raise ValueError(f"exchange_forward={forward!r}: choose one of "
                         f"{', '.join(FORWARD_MODES)}")
    if mode == NEVER or ranks < 2 or n_in < ranks:
        return None
    ways = [w for w, f in ((EXCHANGE, GATHER), (EXCHANGE_ROWS, ROWS)) if forward in (AUTO, f)]
    if shape is None:  # before the first step: the layout's choice, revised once it is known
        return ways[0] if mode == ALWAYS else None
    if mode == AUTO:
        ways.insert(0, None)
    return min(ways, key=lambda w: shape.cost(w, ranks))  # ties: the first, the simplest


def split_exchangeable(plan: Plan) -> Plan:
    """The plan with every exchangeable kernel (on the loss path) in a bucket of its own, sliced
    by rows, where its bucket was (same phase); what is left of a bucket joins the previous
    bucket of its phase when the byte budget allows (a dense layer's bias does not travel
    alone). Buckets renumbered in issue order. The layout does not depend on the exchange
    decision, which may come later (``label_exchange``)."""
    out: list[Bucket] = []
    for b in plan.buckets:
        kernels = [v for v in b.variables if _eligible(v)]
        rest = tuple(v for v in b.variables if not _eligible(v))
        if rest:
            prev = next((k for k in range(len(out) - 1, -1, -1) if not out[k].rows), None)
            joined = None if prev is None else out[prev]
            if joined is not None and joined.phase == b.phase and joined.dtype == rest[0].dtype \
                    and joined.nbytes + sum(v.nbytes for v in rest) <= plan.bucket_bytes \
                    and kernels:
                out[prev] = replace(joined, variables=joined.variables + rest)
            else:
                out.append(replace(b, variables=rest))
        out += [replace(b, variables=(v,), rows=True) for v in kernels]
    return replace(plan, buckets=tuple(replace(b, index=i) for i, b in enumerate(out)))


def label_exchange(plan: Plan, shapes: Mapping[int, DenseShape], mode: str, ranks: int,
                   forward: str = AUTO) -> Plan:
    """The plan with each row-sliced kernel's choice made (``choose_exchange``, by variable
    index in ``shapes``) and one note per kernel: its choice and the elements each way sends
    per rank per step."""
    buckets, notes = [], [n for n in plan.notes if not n.startswith("exchange")]
    for b in plan.buckets:
        if not b.rows:
            buckets.append(b)
            continue
        v = b.variables[0]
        shape = shapes.get(v.index)
        use = choose_exchange(mode, v.shape[0], shape, ranks, forward)
        if use:
            b = replace(b, collective=use)
        elif b.collective in (EXCHANGE, EXCHANGE_ROWS):
            b = replace(b, collective=sharded_collective("allgather"))
        buckets.append(b)
        if shape is None:
            how = use or "reduce-scatter until the batch is known (first step)"
            notes.append(f"exchange: {v.name} {list(v.shape)}: {how}")
            continue
        size = itemsize(v.dtype)
        notes.append(
            f"exchange: {v.name} {list(v.shape)} at {shape.batch}/rank x {shape.calls} call(s) "
            f"on {ranks} ranks: {use or 'reduce-scatter'} "
            f"(exchange+allgather {fmt_bytes(shape.exchange_elements(ranks) * size)}, "
            f"exchange+rows {fmt_bytes(shape.rows_elements(ranks) * size)}, reduce-scatter "
            f"{fmt_bytes(shape.sharded_elements(ranks) * size)} sent per rank per step)")
    return replace(plan, buckets=tuple(buckets), notes=tuple(notes))


def _eligible(v: VarSpec) -> bool:
    return v.exchangeable and v.has_grad and not v.sparse and len(v.shape) == 2
