"""Horovod's own timeline, and the traced train step, show in which order the buckets travel and
what each of them waits for.

- layerwise: one by one in backprop order (output layer first), the first free to go while
  backprop is still running;
- deferred: at the start of the next step, one by one in forward order (input layer first), the
  first layer's forward waiting for its own bucket only;
- sharded: reduce-scatters free to go while backprop is still running, all-gathers at the start
  of the next step one by one in forward order, the first layer's forward waiting for its own
  all-gather only.

Every assertion is structural, so it holds on every step whatever the machine's load: in the
timeline, the order of the trips, each one enqueued only after the one before it ended (so they
cannot have been issued together), their count and bytes; in the traced step's graph, which ops
each collective and the first layer's forward wait for. Whether a step *happened* to send a
bucket while backprop or the forward was still computing is a matter of timing: it moves with
the load (from 8 of 8 steps down to 1 of 8 in a CI run), so it is printed, not asserted.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf

import hvd_overlap.keras as hvdo
from hvd_overlap.core.plan import Plan
from hvd_overlap.tools.timeline import (
    GATHER_OPS,
    Collective,
    merge_groups,
    origin_us,
    read_timeline,
)
from tests.graphs import ancestors

STEPS = 8



@pytest.fixture(autouse=True)
def _timeline_is_recorded() -> None:
    """These tests read Horovod's timeline: a 2-rank launch without it fails them (not at
    import, so a plain ``pytest`` still collects the file, and skips it as every 2-rank test)."""
    if os.environ.get("HOROVOD_TIMELINE") is None:
        pytest.fail("test_timeline.py records Horovod timelines: launch it with "
                    "HOROVOD_TIMELINE=DYNAMIC set (scripts/test does, in a launch of its own)")

#: a plugin collective's bucket in its (Horovod) name: ``<prefix>.b<k>``, ``.rs``, ``.ag``
_BUCKET_OP = re.compile(r"\.b(\d+)(?:\.rs|\.ag)?$")


def model() -> tf.keras.Sequential:
    L = tf.keras.layers
    return tf.keras.Sequential([
        L.Conv2D(32, 3, padding="same", activation="relu", input_shape=(32, 32, 3)),
        L.Conv2D(64, 3, padding="same", activation="relu"), L.MaxPool2D(),
        L.Conv2D(64, 3, padding="same", activation="relu"), L.MaxPool2D(),
        L.Flatten(), L.Dense(128, activation="relu"), L.Dense(10),
    ])


@dataclass
class Recording:
    """One strategy's recorded steps: its plan and optimizer, the traced step that ran them
    (``graph``; in it ``first_layer``, the first layer's output op, and ``grads``, each
    variable's gradient op) and, on rank 0, ``read`` (the timeline's trips per step, and rank
    0's host times of each step: first layer's forward done, backprop done, µs from the
    timeline's origin)."""

    plan: Plan
    opt: Any
    net: tf.keras.Model
    graph: Any
    first_layer: Any
    grads: list[Any]
    read: Callable[[], tuple[list[list[Collective]], list[np.ndarray]]] | None


def record(strategy: str) -> Recording:
    """Train STEPS steps under the timeline, after 3 that trace (twice for deferring
    strategies) and warm up."""
    tf.keras.utils.set_random_seed(0)
    net = model()
    opt = hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.01), strategy=strategy,
                                    bucket_bytes=64 * 1024, ordered=True)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.default_rng(hvd.rank())
    x = tf.constant(rng.normal(size=(32, 32, 32, 3)).astype("float32"))
    y = tf.constant(rng.integers(0, 10, 32))
    traced: dict[str, Any] = {}

    def step() -> tf.Tensor:
        with tf.GradientTape() as tape:
            h = net.layers[0](x, training=True)
            traced["first_layer"] = h.op  # (each trace: the last one is the one that runs)
            with tf.control_dependencies([h]):
                first_layer_done = tf.timestamp()
            for layer in net.layers[1:]:
                h = layer(h, training=True)
            loss = loss_fn(y, h)
        grads = tape.gradient(loss, net.trainable_variables)
        traced["grads"] = [g.op for g in grads]
        with tf.control_dependencies(grads):
            backprop_done = tf.timestamp()  # host clock, seconds, when the last gradient exists
        opt.apply_gradients(zip(grads, net.trainable_variables, strict=True))
        return tf.stack([first_layer_done, backprop_done])

    run = opt.make_train_step(step)
    for _ in range(3):  # trace (twice for deferring strategies) and warm up
        run()
    fn = run._fn
    path = hvd.broadcast_object(str(Path(tempfile.mkdtemp()) / "timeline.json"), 0)
    hvd.start_timeline(path)
    host = []
    for _ in range(STEPS):
        hvd.allreduce(tf.constant(0.0), name="timeline_barrier")
        host.append(run().numpy() * 1e6)
    hvd.stop_timeline()
    assert run._fn is fn, "the step was traced again while the timeline recorded"
    (concrete,) = fn._list_all_concrete_functions_for_serialization()
    assert traced["first_layer"].graph is concrete.graph  # the trace that ran the steps
    opt.flush()
    plan = opt.plan
    if hvd.rank() != 0:  # the coordinator writes the timeline
        return Recording(plan, opt, net, concrete.graph, traced["first_layer"], traced["grads"],
                         None)

    def read() -> tuple[list[list[Collective]], list[np.ndarray]]:
        zero = origin_us(path)
        trips = [c for c in merge_groups(read_timeline(path)) if c.bucket is not None]
        n = len(plan.buckets) * (2 if strategy == "sharded" else 1)  # sharded: rs + ag
        steps = [trips[i:i + n] for i in range(0, len(trips), n)]
        assert len(steps) == STEPS and all(len(s) == n for s in steps), [len(s) for s in steps]
        return steps, [h - zero for h in host]
    return Recording(plan, opt, net, concrete.graph, traced["first_layer"], traced["grads"],
                     read)


def decided(verdict: Callable[[], Any]) -> Any:
    """``verdict()`` -- the timeline's checks -- on rank 0, its outcome on every rank: a failed
    check fails every rank together instead of leaving the others waiting."""
    outcome = None
    if hvd.rank() == 0:
        try:
            outcome = ("ok", verdict())
        except Exception as e:  # noqa: BLE001 -- reported on every rank below
            outcome = ("failed", f"{type(e).__name__}: {e}")
    kind, value = hvd.broadcast_object(outcome, 0)
    if kind == "failed":
        pytest.fail(f"rank 0's check of the timeline: {value}")
    return value


# -- the traced step ---------------------------------------------------------------------------

def _bucket_of(name: str) -> int | None:
    m = _BUCKET_OP.search(name.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def _functions_in(graph: Any) -> dict[str, set[str]]:
    """For each function of ``graph``'s library, the names of the Horovod ops it runs, those of
    the functions it calls included (a ``tf.cond`` branch inside a branch)."""
    library = {f.signature.name: f for f in graph.as_graph_def().library.function}
    memo: dict[str, set[str]] = {}

    def ops(name: str) -> set[str]:
        if name not in memo:
            memo[name] = set()
            for node in library[name].node_def:
                if node.op.startswith("Horovod"):
                    memo[name].add(node.name)
                for attr in node.attr.values():
                    if attr.func.name in library:
                        memo[name] |= ops(attr.func.name)
        return memo[name]
    return {name: ops(name) for name in library}


def collectives(graph: Any) -> dict[int, Any]:
    """The step's top-level collective of each bucket (backward phase), by bucket index."""
    out = {}
    for op in graph.get_operations():
        if op.type.startswith("Horovod") and _bucket_of(op.name) is not None:
            out.setdefault(_bucket_of(op.name), op)
    return out


def forward_branches(graph: Any) -> dict[int, Any]:
    """The step's forward phase: the ``tf.cond`` (``If``) that brings each deferred bucket in
    at the step's start, by bucket index (the bucket its branch's collective names)."""
    funcs, out = _functions_in(graph), {}
    for op in graph.get_operations():
        if op.type in ("If", "StatelessIf"):
            buckets = {_bucket_of(n) for n in funcs[op.get_attr("then_branch").name]} - {None}
            if len(buckets) == 1:
                out[buckets.pop()] = op
    return out


def assert_one_after_another(ops: list[Any], what: str) -> None:
    """Each op waits for the one before it (a data or control path): they are issued one by
    one, in this order, never together."""
    for a, b in zip(ops, ops[1:], strict=False):
        assert a in ancestors(b), f"{what}: {b.name} does not wait for {a.name}"


def assert_forward_phase_chained(rec: Recording, fwd: list[int], what: str) -> None:
    """The traced step's pre-forward branches are exactly the buckets ``fwd``, one after another
    in that order, and the first layer's forward waits for the first and for no later one."""
    branches = forward_branches(rec.graph)
    assert sorted(branches) == sorted(fwd), sorted(branches)
    assert_one_after_another([branches[k] for k in fwd], what)
    waits = ancestors(rec.first_layer)
    assert branches[fwd[0]] in waits
    assert not {branches[k] for k in fwd[1:]} & waits, f"the first layer waits for later {what}"


# -- the timeline ------------------------------------------------------------------------------

def assert_on_the_wire_one_by_one(trips: list[Collective], what: str) -> None:
    """Each trip enqueued (its ``NEGOTIATE`` began on the coordinator) only after the previous
    one ended: the first's result existed before the next was issued."""
    for a, b in zip(trips, trips[1:], strict=False):
        assert b.enqueued >= a.end, \
            f"{what}: {b.tensor} enqueued at {b.enqueued} before {a.tensor} ended at {a.end}"


def layers_of(plan: Plan, buckets: list[int]) -> list[tuple[str, ...]]:
    by_index = {b.index: b for b in plan.buckets}
    return [by_index[k].layers for k in buckets]


def _input_layer_grads(rec: Recording) -> set[Any]:
    """The ops that make the input layer's gradients (backprop's last)."""
    first = [w.ref() for w in rec.net.layers[0].trainable_variables]
    return {op for op, v in zip(rec.grads, rec.net.trainable_variables, strict=True)
            if v.ref() in first}


def test_layerwise_buckets_go_out_in_plan_order_during_backprop():
    """One by one in backprop order (output layer first); the first bucket's allreduce waits
    for none of the input layer's gradients: it may go while backprop goes on."""
    rec = record("layerwise")
    plan, net = rec.plan, rec.net
    order = [b.index for b in plan.buckets]
    assert len(order) >= 4

    def verdict():  # what went on the wire, every step
        steps, host = rec.read()
        early = 0
        for s, (_, backprop_done) in zip(steps, host, strict=True):
            got = [c.bucket for c in s]
            assert got == order, got
            layers = layers_of(plan, got)  # backprop order: output layer first, input last
            assert net.layers[-1].name in layers[0] and net.layers[0].name in layers[-1], layers
            assert_on_the_wire_one_by_one(s, "layerwise buckets")
            early += s[0].start < backprop_done
        print(f"layerwise: first bucket started before backprop finished in {early}/{STEPS} "
              "(timing: printed, not asserted)")
        return early

    decided(verdict)
    # why it must be so, in the traced step
    sent = collectives(rec.graph)
    assert sorted(sent) == sorted(order), sorted(op.name for op in sent.values())
    assert_one_after_another([sent[k] for k in order], "layerwise buckets")
    input_grads = _input_layer_grads(rec)
    assert input_grads and not input_grads & ancestors(sent[order[0]]), \
        "the first bucket waits for the whole of backprop"
    assert input_grads <= ancestors(sent[order[-1]])


def test_deferred_buckets_go_out_in_forward_order_under_the_next_forward():
    """At the start of the next step, one by one in forward order (input layer first); the
    first layer's forward waits for its own bucket and for no other."""
    rec = record("deferred")
    plan, net = rec.plan, rec.net
    fwd = [b.index for b in plan.buckets]
    assert all(b.phase == "forward" for b in plan.buckets) and len(fwd) >= 4
    assert net.layers[0].name in plan.buckets[0].layers

    def verdict():  # what went on the wire, every step
        steps, host = rec.read()
        overlapped = 0
        for s, (first_layer_done, _) in zip(steps, host, strict=True):
            got = [c.bucket for c in s]
            assert got == fwd, got  # input layer's bucket first
            assert_on_the_wire_one_by_one(s, "deferred buckets")
            overlapped += first_layer_done < s[-1].end
        print(f"deferred: first layer's forward done while buckets still travelled in "
              f"{overlapped}/{STEPS} steps (timing: printed, not asserted)")
        return overlapped

    decided(verdict)
    # why it must be so, in the traced step
    assert_forward_phase_chained(rec, fwd, "deferred buckets")


def test_sharded_scatters_under_backprop_and_gathers_in_forward_order_under_the_forward():
    """Reduce-scatters: the output layer's waits for none of the input layer's gradients.
    All-gathers: at the start of the next step, one by one in forward order; the first layer's
    forward waits for its own and for no other. Each trip carries its bucket's bytes."""
    rec = record("sharded")
    plan, net = rec.plan, rec.net
    fwd = [b.index for b in plan.buckets]
    assert all(b.phase == "forward" for b in plan.buckets) and len(fwd) >= 4
    assert net.layers[0].name in plan.buckets[0].layers
    layout = {b.bucket: b for b in rec.opt._hvdo.state.layout.buckets}
    itemsize, size = 4, hvd.size()  # float32

    def verdict():  # what went on the wire, every step
        steps, host = rec.read()
        early = overlapped = 0
        for s, (first_layer_done, backprop_done) in zip(steps, host, strict=True):
            ag = [c for c in s if c.op in GATHER_OPS]  # gather_with: allgather/alltoall
            rs = [c for c in s if c.op == "REDUCESCATTER"]
            assert [c.bucket for c in ag] == fwd, [c.bucket for c in ag]  # input layer first
            assert_on_the_wire_one_by_one(ag, "all-gathers")
            assert sorted(c.bucket for c in rs) == sorted(fwd)
            for c in rs:  # this rank's slice of the bucket
                assert c.nbytes == layout[c.bucket].shard_size * itemsize, c
            for c in ag:  # every rank's slice
                assert c.nbytes == layout[c.bucket].shard_size * size * itemsize, c
            overlapped += first_layer_done < ag[-1].end
            early += min(c.start for c in rs) < backprop_done
        print(f"sharded: first reduce-scatter before backprop finished in {early}/{STEPS}; "
              f"first layer's forward done while all-gathers travelled in {overlapped}/{STEPS} "
              "(timing: printed, not asserted)")
        return early, overlapped

    decided(verdict)
    # why it must be so, in the traced step
    assert_forward_phase_chained(rec, fwd, "all-gathers")
    scatters = {k: op for k, op in collectives(rec.graph).items()
                if op.type == "HorovodReducescatter"}
    assert sorted(scatters) == sorted(fwd), sorted(op.name for op in scatters.values())
    output = next(b.index for b in plan.buckets if net.layers[-1].name in b.layers)
    assert not _input_layer_grads(rec) & ancestors(scatters[output]), \
        "the output layer's reduce-scatter waits for the whole of backprop"
