"""One steady-state step of a strategy as compute tasks and collective requests.

A plan's family picks the builder (``FAMILIES``): stock Horovod's (one fusable allreduce per
gradient, ``Plan.fused_by_horovod``), the allreduce plans (``layerwise``; ``deferred`` and
``hybrid``, whose ``forward``-phase buckets travel at the start of the step, in forward order,
each applied just before its layer's forward), the sharded plans (every bucket reduce-scattered
during backprop; the ``forward``-phase ones all-gathered at the step's start, the others
updated as soon as reduce-scattered -- an *eager* task that pauses backprop -- and all-gathered
right after), and the sharded plans with the dense factor exchange.

A layer's backward runs in two parts: its weight gradients (a GEMM with the forward's FLOPs),
whose collectives are issued then, and its input gradient, under which they travel
(TensorFlow computes a dense layer's kernel gradient before its input gradient: measured in
Horovod's timeline, docs/batch_growth.md); the first layer computes no input gradient.

``deferred`` buckets and the deferred all-gathers carry the previous step's gradients /
parameters, so the step is the same every time.

The dense factor exchange (``hvd_overlap.core.exchange``): a profile layer that carries its
kernel shape (``Layer.dense``) gets its kernel in a row-sliced bucket of its own; where
``label_exchange`` chooses the exchange, that kernel is not reduce-scattered: as the layer's
backward starts, its input (an alltoall) and its output errors (an all-gather) travel, and the
part of the layer's backward that computes the kernel gradient (taken as its forward time: the
same GEMM FLOPs) runs, eagerly, once both have arrived; its updated rows are all-gathered like
any sharded bucket -- or, with the forward on the rows (``EXCHANGE_ROWS``), never: the layer's
forward waits for an alltoall of its input (issued when the input exists) and the next layer
for an alltoall of the partial outputs; its backward waits for the all-gathered errors and the
layer below's backward for an alltoall of the input gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hvd_overlap.core.plan import ALLREDUCE, BACKWARD, EXCHANGES, FORWARD, Plan
from hvd_overlap.core.sim.cluster import Cluster
from hvd_overlap.core.sim.events import Request, Task
from hvd_overlap.core.sim.plans import StepBucket, buckets_of, plan_of, strategy_of
from hvd_overlap.core.sim.profile import Layer, Profile
from hvd_overlap.core.strategy import Strategy


@dataclass
class _Backward:
    """One layer's backward task while the builders add to it."""

    work: float
    waits: tuple[int, ...]
    issues: tuple[int, ...] = ()
    below: tuple[int, ...] = ()  # what the layer below's backward waits for
    grads: tuple[int, ...] = ()  # the gradients' collectives: issued once the weights' part ran
    split: bool = True  # the weights' part first (False: its GEMM already runs elsewhere)


@dataclass
class _Step:
    """The tasks and requests of one step, built in program order."""

    profile: Profile
    cluster: Cluster
    reqs: list[Request] = field(default_factory=list)
    tasks: list[Task] = field(default_factory=list)
    post: list[Task] = field(default_factory=list)   # updates after backprop
    eager: list[Task] = field(default_factory=list)

    def request(self, **kw: Any) -> int:
        self.reqs.append(Request(**kw))
        return len(self.reqs) - 1

    def start_chain(self, late: Sequence[StepBucket], kind: str) -> list[tuple[StepBucket, int]]:
        """The start of the step: ``late`` buckets in forward order, one after the other."""
        out, prev = [], None
        for b in late:
            prev = self.request(kind=kind, nbytes=b.nbytes, tensors=b.tensors,
                                label=f"{kind} bucket {b.index}", at_start=prev is None,
                                after=prev)
            out.append((b, prev))
        return out

    def forward(self, pre: dict[int, Task] | None = None,
                waits_before: dict[int, tuple[int, ...]] | None = None,
                on_rows: dict[int, StepBucket] | None = None) -> tuple[int, ...]:
        """Each layer's forward (``pre``: a task right before it; ``on_rows``: layers whose
        forward runs on the rows); returns what the output layer's backward waits for."""
        pre, waits_before, on_rows = pre or {}, waits_before or {}, on_rows or {}
        carry: tuple[int, ...] = ()  # the partial outputs of a layer on the rows: the next waits
        for i, la in enumerate(self.profile.layers):
            if i in pre:
                self.tasks.append(pre[i])
            waits, issues, carry = waits_before.get(i, ()) + carry, (), ()
            b = on_rows.get(i)
            if b is not None and b.exchange is not None:
                s = b.exchange  # the input to the rows' owners; the partial outputs back
                x = self.request(kind="alltoall", nbytes=s.calls * s.batch * s.n_in * b.itemsize,
                                 tensors=1, label=f"alltoall inputs bucket {b.index}",
                                 at_start=not self.tasks)
                if self.tasks:
                    self.tasks[-1].issues += (x,)
                issues = carry = (self.request(
                    kind="alltoall", nbytes=s.calls * self.cluster.ranks * s.batch * s.n_out
                    * b.itemsize, tensors=1, label=f"alltoall outputs bucket {b.index}"),)
                waits += (x,)
            self.tasks.append(Task(f"forward {la.name}", la.forward_s, waits, issues))
        return carry

    def backward(self, *hooks: Callable[[int, Layer, _Backward], None],
                 below: tuple[int, ...] = ()) -> None:
        """Each layer's backward, output layer first; ``hooks`` add its collectives."""
        for i in reversed(range(len(self.profile.layers))):
            la = self.profile.layers[i]
            back = _Backward(la.backward_s, below)
            for hook in hooks:
                hook(i, la, back)
            below = back.below
            # the weight gradients first (their GEMM has the forward's FLOPs), their collectives
            # issued before the input gradient's part; the first layer computes no input gradient
            weights = min(la.forward_s, back.work)
            if back.grads and back.split and i > 0 and 0 < weights < back.work:
                self.tasks.append(Task(f"backward {la.name} weights", weights, back.waits,
                                       back.grads))
                self.tasks.append(Task(f"backward {la.name} inputs", back.work - weights, (),
                                       back.issues))
            else:
                self.tasks.append(Task(f"backward {la.name}", back.work, back.waits,
                                       back.grads + back.issues))


def _by_first_layer(buckets: Iterable[StepBucket]) -> dict[int, list[StepBucket]]:
    """Buckets by their most input-side layer: where backprop completes their gradients."""
    out: dict[int, list[StepBucket]] = {}
    for b in buckets:
        out.setdefault(b.layers[0], []).append(b)
    return out


def _deferred(buckets: Sequence[StepBucket]) -> list[StepBucket]:
    """The buckets that travel at the start of the step (not those whose rows stay put)."""
    return [b for b in buckets if b.phase == FORWARD and not b.rows_forward]


def horovod_step(st: _Step, buckets: Sequence[StepBucket]) -> None:
    """Stock Horovod: one fusable allreduce per layer's gradients, updates after backprop."""
    per_byte = st.profile.update_s / max(st.profile.grad_bytes, 1)
    st.forward()

    def fused(i: int, la: Layer, back: _Backward) -> None:
        if la.grad_bytes:
            rid = st.request(kind="allreduce", nbytes=la.grad_bytes, tensors=max(la.tensors, 1),
                             label=f"allreduce {la.name}", fusable=True)
            back.grads += (rid,)
            st.post.append(Task(f"update {la.name}", la.grad_bytes * per_byte, (rid,)))

    st.backward(fused)


def allreduce_step(st: _Step, buckets: Sequence[StepBucket]) -> None:
    """Each bucket allreduced as its gradients exist (``layerwise``), or at the start of the
    next step and applied just before its first layer's forward (``deferred``, ``hybrid``)."""
    pre = {b.layers[0]: Task(f"update bucket {b.index}", b.update_s, (rid,))
           for b, rid in st.start_chain(_deferred(buckets), "allreduce")}
    st.forward(pre=pre)
    ready_at = _by_first_layer(b for b in buckets if b.phase == BACKWARD)

    def reduce(i: int, la: Layer, back: _Backward) -> None:
        for b in ready_at.get(i, ()):
            rid = st.request(kind="allreduce", nbytes=b.nbytes, tensors=b.tensors,
                             label=f"allreduce bucket {b.index}")
            back.grads += (rid,)
            st.post.append(Task(f"update bucket {b.index}", b.update_s, (rid,)))

    st.backward(reduce)


def sharded_step(st: _Step, buckets: Sequence[StepBucket]) -> None:
    """Every bucket reduce-scattered as its gradients exist; each rank updates its slice."""
    _sharded(st, buckets, exchange=False)


def exchange_step(st: _Step, buckets: Sequence[StepBucket]) -> None:
    """``sharded_step``, with the dense kernels ``label_exchange`` chose exchanged."""
    _sharded(st, buckets, exchange=True)


def _sharded(st: _Step, buckets: Sequence[StepBucket], exchange: bool) -> None:
    ranks = st.cluster.ranks
    late = _deferred(buckets)
    late_index = {b.index for b in late}
    waits_before: dict[int, tuple[int, ...]] = {}
    for b, rid in st.start_chain(late, "allgather"):  # parameters arrive already updated
        waits_before[b.layers[0]] = waits_before.get(b.layers[0], ()) + (rid,)
    on_rows = {b.layers[0]: b for b in buckets if b.rows_forward} if exchange else {}
    carry = st.forward(waits_before=waits_before, on_rows=on_rows)
    ready_at = _by_first_layer(b for b in buckets if b.exchange is None)
    exchanged = _by_first_layer(b for b in buckets if b.exchange is not None)

    def scatter(i: int, la: Layer, back: _Backward) -> None:
        for b in ready_at.get(i, ()):
            if b.allreduced:  # a whole bucket (shard="dense"): updated on every rank
                rid = st.request(kind="allreduce", nbytes=b.nbytes, tensors=b.tensors,
                                 label=f"allreduce bucket {b.index}")
                back.grads += (rid,)
                st.eager.append(Task(f"update bucket {b.index}", b.update_s, (rid,),
                                     eager=True))
                continue
            rid = st.request(kind="reduce_scatter", nbytes=b.nbytes, tensors=b.tensors,
                             label=f"reduce_scatter bucket {b.index}")
            back.grads += (rid,)
            if b.index in late_index:  # all-gathered at the next step's start
                st.post.append(Task(f"update bucket {b.index}", b.update_s / ranks, (rid,)))
            else:  # updated as soon as reduce-scattered, then all-gathered in this backprop
                ag = st.request(kind="allgather", nbytes=b.nbytes, tensors=b.tensors,
                                label=f"allgather bucket {b.index}")
                st.eager.append(Task(f"update bucket {b.index}", b.update_s / ranks,
                                     (rid,), (ag,), eager=True))

    def exchanges(i: int, la: Layer, back: _Backward) -> None:
        for b in exchanged.get(i, ()):
            _exchange_layer(st, b, i, la, back, b.index in late_index)

    st.backward(*((exchanges, scatter) if exchange else (scatter,)), below=carry)


def _exchange_layer(st: _Step, b: StepBucket, i: int, la: Layer, back: _Backward,
                    late: bool) -> None:
    """The collectives and tasks of one exchanged kernel as its layer's backward starts: its
    input (alltoall of each rank's B x n_in) and output errors (all-gather of P x B x n_out in
    all); with the forward on the rows, the errors only."""
    s, ranks = b.exchange, st.cluster.ranks
    assert s is not None
    x = () if b.rows_forward else (st.request(
        kind="alltoall", nbytes=s.calls * s.batch * s.n_in * b.itemsize, tensors=1,
        label=f"alltoall inputs bucket {b.index}"),)
    got = x + (st.request(kind="allgather", nbytes=s.calls * ranks * s.batch * s.n_out
                          * b.itemsize, tensors=1, label=f"allgather errors bucket {b.index}"),)
    st.tasks[-1].issues += got  # the previous task produced this layer's output errors
    rows_s = min(la.forward_s, back.work)  # the kernel-gradient GEMM: the forward's FLOPs
    back.work -= rows_s
    back.split = False  # what is left is the input gradient's part
    if b.rows_forward:  # then this rank's rows and dx columns
        back.waits += got
        st.eager.append(Task(f"gradient rows bucket {b.index}", rows_s, got, eager=True))
        st.post.append(Task(f"update bucket {b.index}", b.update_s / ranks, got))
        if i > 0:  # the input layer's input gradient is not computed
            back.below = (st.request(kind="alltoall", nbytes=s.calls * s.batch * s.n_in
                                     * b.itemsize, tensors=1,
                                     label=f"alltoall input gradient bucket {b.index}"),)
            back.issues += back.below
    elif late:  # its rows all-gathered at the next step's start
        st.eager.append(Task(f"gradient rows bucket {b.index}", rows_s, got, eager=True))
        st.post.append(Task(f"update bucket {b.index}", b.update_s / ranks, got))
    else:
        ag = st.request(kind="allgather", nbytes=b.nbytes, tensors=b.tensors,
                        label=f"allgather bucket {b.index}")
        st.eager.append(Task(f"gradient rows, update bucket {b.index}",
                             rows_s + b.update_s / ranks, got, (ag,), eager=True))


def plan_family(plan: Plan | None) -> str:
    """The key of ``FAMILIES`` that builds a step of ``plan``."""
    if plan is None:
        return "allreduce"  # nothing to send: compute only
    if plan.fused_by_horovod:
        return "horovod"
    collectives = {b.collective for b in plan.buckets}
    if collectives <= {ALLREDUCE}:
        return "allreduce"
    return "exchange" if collectives & set(EXCHANGES) else "sharded"


FAMILIES: dict[str, Callable[[_Step, Sequence[StepBucket]], None]] = {
    "horovod": horovod_step, "allreduce": allreduce_step, "sharded": sharded_step,
    "exchange": exchange_step}


def build_step(profile: Profile, strategy: str | Strategy, cluster: Cluster,
               defer: int | None = None) -> tuple[list[Task], list[Request]]:
    """The compute tasks and collectives of one steady-state step of ``strategy``'s plan (a
    name: built with the cluster's bucket size and ``defer``, ``sim.plans.strategy_of``)."""
    chosen = strategy_of(strategy, cluster.bucket_bytes, defer)
    plan = plan_of(profile, chosen, ranks=cluster.ranks)
    return step_of(profile, buckets_of(profile, plan=plan), cluster, plan_family(plan))


def step_of(profile: Profile, buckets: Sequence[StepBucket], cluster: Cluster,
            family: str) -> tuple[list[Task], list[Request]]:
    """The tasks and collectives of one step of ``buckets`` (``buckets_of``'s order: backprop's
    first, then the deferred ones in forward order) over the profile's layers."""
    st = _Step(profile, cluster)
    FAMILIES[family](st, buckets)
    return st.tasks + st.post + st.eager, st.reqs
