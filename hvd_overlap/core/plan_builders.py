"""The plan-building steps the strategies share: stock Horovod's per-gradient plan, the
layer-ordered buckets, the split point, the sharded collectives and the dense factor exchange.

Pure Python (no TensorFlow, no Horovod). Each strategy class (``hvd_overlap.core.choice``)
builds its own plan from these; everything that follows -- which collectives run, in which
phase and order -- is read from the plan, by the runtime and by the simulator alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from hvd_overlap.core import mutants
from hvd_overlap.core.exchange import NEVER, DenseShape, label_exchange, split_exchangeable
from hvd_overlap.core.plan import (
    ALLREDUCE,
    BACKWARD,
    EXCHANGES,
    GATHER_METHODS,
    Bucket,
    Plan,
    VarSpec,
    build_layerwise_plan,
    check_dtypes,
    half_the_bytes,
    sharded_collective,
)

#: ``shard``: every bucket is sharded (``all``), or only the dense kernels the exchange may
#: carry (``dense``), every other bucket allreduced in backprop and updated whole on each rank
SHARD_ALL, SHARD_DENSE = "all", "dense"
SHARD_MODES = (SHARD_ALL, SHARD_DENSE)


def check_shard(shard: str, exchange: bool) -> None:
    """A ValueError naming the fix for a ``shard`` mode that is unknown, or ``dense`` without
    the exchange (``exchange``: whether it is on)."""
    if shard not in SHARD_MODES:
        raise ValueError(f"shard={shard!r}: choose {' or '.join(SHARD_MODES)}")
    if shard == SHARD_DENSE and not exchange:
        raise ValueError("shard='dense' shards the dense kernels the exchange carries: add "
                         "exchange='auto' (Exchange()) or 'always', or leave shard='all'")


def horovod_plan(specs: Sequence[VarSpec]) -> Plan:
    """Stock Horovod's path: one allreduce per gradient, output layer first."""
    check_dtypes(specs)
    ordered = sorted(specs, key=lambda v: -v.index)  # gradients appear output layer first
    return Plan(
        strategy="horovod", bucket_bytes=0, fused_by_horovod=True,
        buckets=tuple(Bucket(index=i, variables=(v,)) for i, v in enumerate(ordered)),
        notes=("one allreduce per gradient; Horovod fuses whatever is ready each cycle "
               "(HOROVOD_CYCLE_TIME, HOROVOD_FUSION_THRESHOLD), in the order it negotiates",),
    )


def default_half(specs: Sequence[VarSpec], bucket_bytes: int, defer: int | None) -> int:
    """``defer``, or (None) the input-side buckets holding at most half the bytes."""
    if defer is not None:
        return defer
    plan = build_layerwise_plan(specs, bucket_bytes)
    return half_the_bytes([b.nbytes for b in plan.buckets])


def sharded_plan(name: str, specs: Sequence[VarSpec], bucket_bytes: int, defer: int,
                 gather_with: str, exchange: str, forward: str, shard: str,
                 ranks: int) -> Plan:
    """A sharded plan: every bucket reduce-scattered, its slices gathered with
    ``gather_with`` (``defer`` input-side buckets in the next forward, -1: all); with the
    dense factor ``exchange`` (``never``, ``auto``, ``always``; ``forward``: the exchanged
    kernels' forward) and ``shard`` (``dense``: only the exchange's kernels sharded)."""
    if gather_with not in GATHER_METHODS:
        raise ValueError(f"gather_with={gather_with!r}: choose {' or '.join(GATHER_METHODS)}")
    plan = build_layerwise_plan(specs, bucket_bytes, name, defer=defer)
    plan = replace(plan, buckets=tuple(replace(b, collective=sharded_collective(gather_with))
                                       for b in plan.buckets),
                   notes=("sharded: every bucket is reduce-scattered during backprop and each "
                          "rank updates its 1/P slice; phase says when the updated slices are "
                          "all-gathered: 'backward' right after the update, in this step; "
                          "'forward' at the start of the next step, in forward order (input "
                          "side first)",
                          f"the slices are gathered with {gather_with}"
                          + (" (each rank's slice repeated P times: the all-gather's result "
                             "and bytes)" if gather_with == "alltoall" else "")))
    check_shard(shard, exchange != NEVER)
    if mutants.off("sharded_update"):  # whole buckets on every rank, not slices
        return shard_dense_only(plan if exchange == NEVER else split_exchangeable(plan))
    if exchange == NEVER:
        return plan
    plan = split_exchangeable(plan)
    plan = label_exchange(plan, {}, exchange, ranks, forward)
    return plan if shard == SHARD_ALL else shard_dense_only(plan)


def shard_dense_only(plan: Plan) -> Plan:
    """``shard="dense"``: every bucket but the row-sliced dense kernels allreduced as its
    gradients exist and updated whole on every rank (``layerwise``'s way, exact the same)."""
    return replace(plan, buckets=tuple(
        b if b.rows else replace(b, collective=ALLREDUCE, phase=BACKWARD, whole=True)
        for b in plan.buckets),
        notes=plan.notes + ("shard='dense': only the dense kernels the exchange may carry are "
                            "sharded; every other bucket is allreduced during backprop and "
                            "updated whole on every rank",))


def label_for_batch(plan: Plan, shapes: Mapping[int, DenseShape], ranks: int, exchange: str,
                    forward: str, shard: str) -> Plan:
    """The plan once each dense kernel's use in a step is known (``shapes``, by variable
    index): the exchange's choice made per kernel (``label_exchange``), and under
    ``shard="dense"`` a kernel it declines leaves the row-sliced layout, allreduced during
    backprop and updated whole with the other buckets (a small kernel, such as a classifier's,
    then costs no reduce-scatter and all-gather of its own)."""
    plan = label_exchange(plan, shapes, exchange, ranks, forward)
    if shard != SHARD_DENSE:
        return plan
    declined = {b.index for b in plan.buckets
                if b.rows and b.collective not in EXCHANGES and b.variables[0].index in shapes}
    if not declined:
        return plan
    names = ", ".join(b.variables[0].name for b in plan.buckets if b.index in declined)
    return replace(plan, buckets=tuple(
        replace(b, rows=False, collective=ALLREDUCE, phase=BACKWARD, whole=True)
        if b.index in declined else b for b in plan.buckets),
        notes=plan.notes + (f"shard='dense': the kernels the exchange declines are allreduced "
                            f"whole instead of reduce-scattered: {names}",))
