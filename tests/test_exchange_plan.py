"""The dense factor exchange as numbers and plan data (pure Python, no ranks): row split,
elements on the wire, the per-layer choice, the row-sliced layout, wire bytes from a timeline,
the bench's spelling."""

import numpy as np
import pytest

from benchmarks.config import BenchConfig, plugin_options
from benchmarks.timelines import wire_bytes_per_step, wire_time_per_step
from hvd_overlap.core.choice import Exchange, Sharded, ShardedHybrid
from hvd_overlap.core.exchange import (
    ALWAYS,
    AUTO,
    GATHER,
    LATENCY_ELEMENTS,
    NEVER,
    ROWS,
    DenseShape,
    choose_exchange,
    label_exchange,
    row_range,
    row_sizes,
    split_exchangeable,
)
from hvd_overlap.core.plan import ALLREDUCE, BACKWARD, EXCHANGE, EXCHANGE_ROWS, FORWARD, VarSpec
from hvd_overlap.core.sharding import join_slices, own_slice, partition


def test_rows_split_as_horovods_reduce_scatter():
    # Horovod's reducescatter of 5 rows on 2 ranks gives rank 0 three rows (checked by hand)
    assert row_sizes(5, 2) == [3, 2]
    assert row_sizes(33, 4) == [9, 8, 8, 8]
    assert [row_range(33, 4, r) for r in range(4)] == [(0, 9), (9, 17), (17, 25), (25, 33)]


def test_elements_on_the_wire_worked_by_hand():
    s = DenseShape(n_in=4096, n_out=1024, batch=32)
    # reduce-scatter + all-gather: 2 * 1/2 * 4096 * 1024 on 2 ranks
    assert s.sharded_elements(2) == 4096 * 1024
    # all-to-all of x: 1/2 * 32 * 4096; all-gather of dY: 1 * 32 * 1024; rows: 1/2 * 4096 * 1024
    assert s.exchange_elements(2) == 16 * 4096 + 32 * 1024 + 2048 * 1024
    assert DenseShape(4096, 1024, 32, calls=2).activation_elements(2) == \
        2 * (16 * 4096 + 32 * 1024)
    assert s.exchange_pays(2)
    # a narrow classifier: the activations outweigh the kernel
    assert not DenseShape(1024, 10, 32).exchange_pays(2)
    # the activation term grows with P: 4096x4096 at 32/rank pays at 32 ranks, not at 128
    assert DenseShape(4096, 4096, 32).exchange_pays(32)
    assert not DenseShape(4096, 4096, 32).exchange_pays(128)


def test_choice_by_mode():
    pays, loses = DenseShape(4096, 1024, 32), DenseShape(1024, 10, 32)
    assert choose_exchange(AUTO, 4096, pays, 2) and not choose_exchange(AUTO, 1024, loses, 2)
    assert choose_exchange(ALWAYS, 1024, loses, 2) and choose_exchange(ALWAYS, 1024, None, 2)
    assert not choose_exchange(AUTO, 4096, None, 2)  # batch unknown: not yet
    assert not choose_exchange(NEVER, 4096, pays, 2)
    assert not choose_exchange(ALWAYS, 3, DenseShape(3, 10, 32), 4)  # a rank would own no row
    assert not choose_exchange(ALWAYS, 4096, pays, 1)
    with pytest.raises(ValueError, match="exchange="):
        choose_exchange("sometimes", 4096, pays, 2)
    with pytest.raises(ValueError, match="exchange_forward="):
        choose_exchange(AUTO, 4096, pays, 2, "scatter")


def test_rows_forward_elements_and_choice():
    # the bench mlp's first layer, 3072 x 2048 at 64/rank on 2 ranks
    s = DenseShape(3072, 2048, 64)
    # x to the rows' owners and dx back: 2 * 1/2 * 64 * 3072; partial y back and dY: 2 * 64 * 2048
    assert s.rows_elements(2) == 64 * 3072 + 2 * 64 * 2048
    assert s.cost(EXCHANGE_ROWS, 2) == s.rows_elements(2) + 4 * LATENCY_ELEMENTS
    assert choose_exchange(AUTO, 3072, s, 2) == EXCHANGE_ROWS
    assert choose_exchange(AUTO, 3072, s, 2, GATHER) == EXCHANGE
    assert choose_exchange(ALWAYS, 3072, s, 2, ROWS) == EXCHANGE_ROWS
    assert choose_exchange(ALWAYS, 3072, None, 2) == EXCHANGE  # layout before the batch is known
    # rows beat the gather exactly where the exchange beats reduce-scatter (both: batch *
    # (n_in + P n_out) < n_in n_out), by the rows' all-gather; the activations grow with P
    assert choose_exchange(AUTO, 3072, s, 8) == EXCHANGE_ROWS
    assert choose_exchange(AUTO, 3072, s, 64) is None
    # the critical-path collectives' charge grows with the peers: at 32 ranks the gather wins
    assert s.cost(EXCHANGE_ROWS, 32) == s.rows_elements(32) + 4 * 31 * LATENCY_ELEMENTS
    assert choose_exchange(AUTO, 3072, s, 32) == EXCHANGE
    # so only the four critical-path collectives' charge makes the gather win: small layers
    small = DenseShape(144, 33, 16)
    assert small.rows_elements(2) < small.exchange_elements(2)
    assert choose_exchange(AUTO, 144, small, 2) == EXCHANGE


def specs():
    return [VarSpec(0, "c/kernel:0", (3, 3, 3, 8), "float32", "c"),
            VarSpec(1, "c/bias:0", (8,), "float32", "c"),
            VarSpec(2, "d/kernel:0", (785, 512), "float32", "d", exchangeable=True),
            VarSpec(3, "d/bias:0", (512,), "float32", "d"),
            VarSpec(4, "o/kernel:0", (512, 10), "float32", "o", exchangeable=True),
            VarSpec(5, "o/bias:0", (10,), "float32", "o")]


def test_kernels_get_row_buckets_and_biases_do_not_travel_alone():
    plan = Sharded(bucket_bytes=1 << 20, exchange=Exchange(AUTO)).build_plan(specs(), 2)
    rows = [b for b in plan.buckets if b.rows]
    assert [b.variables[0].name for b in rows] == ["d/kernel:0", "o/kernel:0"]
    others = [b for b in plan.buckets if not b.rows]
    assert len(others) == 1 and {v.name for v in others[0].variables} == {
        "c/kernel:0", "c/bias:0", "d/bias:0", "o/bias:0"}
    assert [b.index for b in plan.buckets] == list(range(len(plan.buckets)))
    assert all(b.phase == FORWARD for b in plan.buckets)
    # never: the plan of sharded, unchanged
    plain = Sharded(bucket_bytes=1 << 20).build_plan(specs())
    assert not any(b.rows for b in plain.buckets)
    assert split_exchangeable(plain) != plain  # exchangeable kernels do get split when asked


def test_exchange_plan_keeps_backprop_order():
    """``sharded_hybrid`` with the exchange: the buckets gathered during backprop come in
    backprop order (output layer first, each kernel's row bucket after its layer's bias), the
    one the next step gathers after them; the indices count backprop order."""
    plan = ShardedHybrid(bucket_bytes=64, exchange=Exchange(ALWAYS)).build_plan(specs(), 2)
    backward, forward = plan.phase_buckets(BACKWARD), plan.phase_buckets(FORWARD)
    assert [(b.layers, b.rows) for b in backward] == [
        (("o",), False), (("o",), True), (("d",), False), (("d",), True)]
    assert [b.layers for b in forward] == [("c",)]
    assert plan.buckets == backward + forward
    assert [b.index for b in plan.buckets] == list(range(5))


def test_shard_dense_keeps_only_the_kernels_sliced():
    """``shard="dense"``: every bucket but the dense kernels' row buckets allreduced during
    backprop and not cut (``whole``: every rank owns all of it); without the exchange it is
    refused, naming the fix."""
    plan = Sharded(bucket_bytes=1 << 20, exchange=Exchange(AUTO), shard="dense").build_plan(
        specs(), 2)
    rows = [b for b in plan.buckets if b.rows]
    whole = [b for b in plan.buckets if not b.rows]
    assert [b.variables[0].name for b in rows] == ["d/kernel:0", "o/kernel:0"]
    assert all(b.phase == FORWARD and not b.whole for b in rows)
    assert whole and all(b.whole and b.collective == ALLREDUCE and b.phase == BACKWARD
                         for b in whole)
    layout = partition(plan, 2)
    for b in layout.buckets:
        assert (b.shard_size, b.padding, b.owned(1)) == ((b.total, 0, (0, b.total)) if b.whole
                                                         else (b.shard_size, 0, b.owned(1)))
        if b.whole:
            arrays = {s.index: np.full(s.shape, s.index, "float32") for s in b.segments}
            assert np.array_equal(own_slice(b, arrays, 1), own_slice(b, arrays, 0))
    assert "none" in layout.describe()  # a whole bucket is never gathered
    everything = Sharded(bucket_bytes=1 << 20, exchange=Exchange(AUTO)).build_plan(specs(), 2)
    assert not any(b.whole for b in everything.buckets)
    assert everything.signature() != plan.signature()
    with pytest.raises(ValueError, match="add exchange="):
        Sharded(bucket_bytes=1 << 20, shard="dense").build_plan(specs())


def test_shard_dense_kernels_the_exchange_declines_become_whole():
    """Once the batch is known (``Strategy.label``), ``shard="dense"`` allreduces the kernels
    the exchange declines whole during backprop (their partition no longer cut); before it,
    and under ``shard="all"``, they stay row-sliced and reduce-scattered."""
    shapes = {2: DenseShape(785, 512, 32), 4: DenseShape(512, 10, 32)}
    dense = Sharded(bucket_bytes=1 << 20, exchange=Exchange(AUTO), shard="dense")
    labelled = dense.label(dense.build_plan(specs(), 2), shapes, 2)
    by_name = {b.variables[0].name: b for b in labelled.buckets if len(b.variables) == 1}
    assert by_name["d/kernel:0"].collective == EXCHANGE and by_name["d/kernel:0"].rows
    o = by_name["o/kernel:0"]
    assert (o.collective, o.phase, o.whole, o.rows) == (ALLREDUCE, BACKWARD, True, False)
    assert labelled.notes[-1].endswith("allreduced whole instead of reduce-scattered: "
                                       "o/kernel:0")
    layout = {b.bucket: b for b in partition(labelled, 2).buckets}
    assert layout[o.index].whole and layout[o.index].owned(1) == (0, 512 * 10)
    assert not layout[by_name["d/kernel:0"].index].whole
    unknown = dense.label(dense.build_plan(specs(), 2), {}, 2)  # before the first step
    assert [b.variables[0].name for b in unknown.buckets if b.rows] == ["d/kernel:0",
                                                                        "o/kernel:0"]
    every = Sharded(bucket_bytes=1 << 20, exchange=Exchange(AUTO))
    kept = every.label(every.build_plan(specs(), 2), shapes, 2)
    assert [b.variables[0].name for b in kept.buckets if b.rows] == ["d/kernel:0",
                                                                     "o/kernel:0"]
    assert not any(b.whole for b in kept.buckets)


def test_label_exchange_per_layer_with_bytes():
    plan = Sharded(bucket_bytes=1 << 20, exchange=Exchange(AUTO)).build_plan(specs(), 2)
    assert not any(b.collective == EXCHANGE for b in plan.buckets)  # batch not known yet
    labelled = label_exchange(plan, {2: DenseShape(785, 512, 32), 4: DenseShape(512, 10, 32)},
                              AUTO, 2)
    chosen = [b.variables[0].name for b in labelled.buckets if b.collective == EXCHANGE]
    assert chosen == ["d/kernel:0"]
    notes = [n for n in labelled.notes if n.startswith("exchange")]
    assert len(notes) == 2 and "d/kernel:0 [785, 512] at 32/rank" in notes[0]
    assert ": exchange+allgather (" in notes[0] and ": reduce-scatter (" in notes[1]
    assert labelled.signature() != plan.signature()


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_row_slices_join_back(ranks):
    plan = Sharded(bucket_bytes=1 << 20, exchange=Exchange(ALWAYS)).build_plan(specs(), ranks)
    layout = partition(plan, ranks)
    rng = np.random.default_rng(0)
    arrays = {s.index: rng.normal(size=s.shape).astype("float32") for s in specs()}
    for b in layout.buckets:
        if not b.rows:
            continue
        n_in, n_out = b.segments[0].shape
        pieces = [own_slice(b, arrays, r) for r in range(ranks)]
        assert [p.size for p in pieces] == [n * n_out for n in row_sizes(n_in, ranks)]
        assert b.padding == 0
        whole = join_slices(b, np.concatenate(pieces))
        np.testing.assert_array_equal(whole[b.segments[0].index], arrays[b.segments[0].index])


def _timeline(tmp_path, collectives) -> str:
    """A Horovod timeline of ``(tensor, op, output shape)``, each 5 us on the wire, 10 us
    apart."""
    events = ['{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "x"}}']
    for pid, (name, op, shape) in enumerate(collectives, start=1):
        events += [f'{{"name": "process_name", "ph": "M", "pid": {pid}, "args": {{"name": '
                   f'"{name}"}}}}',
                   f'{{"ph": "B", "name": "{op}", "ts": {pid * 10}, "pid": {pid}}}',
                   f'{{"ph": "E", "ts": {pid * 10 + 5}, "pid": {pid}, "args": {{"dtype": '
                   f'"float32", "shape": "{shape}"}}}}']
    path = tmp_path / "t.json"
    path.write_text("[\n" + ",\n".join(events) + "\n]")
    return str(path)


def test_wire_bytes_from_a_timeline(tmp_path):
    """Horovod logs each collective's output shape: an allreduce of 1000 floats sends 2 * 1/2 *
    4000 B on 2 ranks, a reduce-scatter whose output is 500 floats sends 2000 B, an all-gather
    whose output is 1000 floats sends 2000 B; over 1 + 1 + 1 steps."""
    path = _timeline(tmp_path, [("a", "ALLREDUCE", "[1000]"), ("r", "REDUCESCATTER", "[500]"),
                                ("g", "ALLGATHER", "[10, 100]")])
    got = wire_bytes_per_step(path, steps=1, ranks=2)
    assert got == {"all": 8000 / 3, "ALLREDUCE": 4000 / 3, "REDUCESCATTER": 2000 / 3,
                   "ALLGATHER": 2000 / 3}


def test_the_bench_spells_strategies_as_the_plugin_does():
    assert plugin_options("sharded+exchange") == ("sharded", {"exchange": "auto"})
    assert plugin_options("sharded_hybrid+exchange+alltoall") == (
        "sharded_hybrid", {"exchange": "auto", "gather_with": "alltoall"})
    assert plugin_options("layerwise") == ("layerwise", {})
    assert plugin_options("sharded+auto") == ("sharded", {"bucket_bytes": "auto"})
    assert plugin_options("hybrid+defer=2+bucket=8K#2") == (
        "hybrid", {"defer": 2, "bucket_bytes": 8192})
    with pytest.raises(ValueError, match="layerwise.*no setting 'exchange'.*sharded"):
        BenchConfig(strategies=("layerwise+exchange",)).validate()
    with pytest.raises(ValueError, match="unknown option 'turbo'"):
        BenchConfig(strategies=("sharded+turbo",)).validate()
    BenchConfig(strategies=("stock", "sharded+exchange", "local")).validate()


def test_the_exchanges_wire_time_apart(tmp_path):
    """The exchange's collectives (named ``.xch``) count in their kind and apart, so that the
    bench can tell a step with them from one of reduce-scatters and all-gathers alone."""
    path = _timeline(tmp_path, [("o.xch1.0.x", "ALLTOALL", "[8]"), ("o.b2.ag", "ALLGATHER", "[8]"),
                                ("o.xch1.0.dy", "ALLGATHER", "[8]")])
    got = wire_time_per_step(path, steps=1)
    assert got["exchange"] == pytest.approx(2 * 5e-6 / 3)
    assert got["ALLGATHER"] == pytest.approx(2 * 5e-6 / 3)
    assert got["ALLTOALL"] == pytest.approx(5e-6 / 3)
    assert "exchange" not in wire_time_per_step(
        _timeline(tmp_path, [("o.b2.ag", "ALLGATHER", "[8]")]), steps=1)
