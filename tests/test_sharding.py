"""The sharded strategy's partition: slices, padding, and re-slicing for another number of ranks
(pure Python and numpy, no ranks)."""

import numpy as np
import pytest

from hvd_overlap.core.plan import BACKWARD, FORWARD, REDUCE_SCATTER, VarSpec, build_layerwise_plan
from hvd_overlap.core.sharding import join_slices, own_slice, partition, segment_sizes


def specs():
    """Two layers, 3x5+5 = 20 and 5x3+3 = 18 elements, plus a variable without gradient."""
    return [VarSpec(0, "a/kernel:0", (3, 5), "float32", "a"),
            VarSpec(1, "a/bias:0", (5,), "float32", "a"),
            VarSpec(2, "b/kernel:0", (5, 3), "float32", "b"),
            VarSpec(3, "b/bias:0", (3,), "float32", "b"),
            VarSpec(4, "c/kernel:0", (2, 2), "float32", "c", has_grad=False)]


def arrays(seed=0):
    rng = np.random.default_rng(seed)
    return {s.index: rng.normal(size=s.shape).astype("float32") for s in specs()}


def test_partition_pads_each_bucket_to_equal_slices():
    plan = build_layerwise_plan(specs(), bucket_bytes=80)  # one layer per bucket
    layout = partition(plan, ranks=4)
    by_layer = {b.layers[0]: b for b in layout.buckets}
    assert set(by_layer) == {"a", "b"}  # c has no gradient: no bucket at all
    a, b = by_layer["a"], by_layer["b"]
    assert (a.total, a.shard_size, a.padding) == (20, 5, 0)
    assert (b.total, b.shard_size, b.padding) == (18, 5, 2)
    assert b.owned(3) == (15, 20)
    assert list(segment_sizes(b)) == [3, 15, 2]  # backprop order within the layer, then padding
    assert "per rank" in layout.describe() and "padding" in layout.describe()


@pytest.mark.parametrize("ranks", [1, 2, 3, 7, 40])
def test_slices_join_back_to_the_variables(ranks):
    layout = partition(build_layerwise_plan(specs(), bucket_bytes=1 << 20), ranks)
    whole = arrays()
    for b in layout.buckets:
        gathered = np.concatenate([own_slice(b, whole, r) for r in range(ranks)])
        assert gathered.size == b.shard_size * ranks
        assert not gathered[b.total:].any()  # padding is zero
        back = join_slices(b, gathered)
        assert set(back) == {s.index for s in b.segments}
        for i, arr in back.items():
            np.testing.assert_array_equal(arr, whole[i])


def test_state_saved_on_two_ranks_restores_on_three():
    """A checkpoint keeps whole arrays: the slices of 3 ranks cut from what 2 ranks gathered
    are exactly the 3-rank slices of the original arrays."""
    plan = build_layerwise_plan(specs(), bucket_bytes=1 << 20)
    whole = arrays(seed=3)
    two, three = partition(plan, 2), partition(plan, 3)
    for b2, b3 in zip(two.buckets, three.buckets, strict=True):
        saved = join_slices(b2, np.concatenate([own_slice(b2, whole, r) for r in range(2)]))
        for r in range(3):
            np.testing.assert_array_equal(own_slice(b3, saved, r), own_slice(b3, whole, r))


def test_bad_input():
    plan = build_layerwise_plan(specs())
    with pytest.raises(ValueError, match="ranks"):
        partition(plan, 0)
    b = partition(plan, 2).buckets[0]
    with pytest.raises(ValueError, match="gathered elements"):
        join_slices(b, np.zeros(3))


def test_sharded_plan_says_how_buckets_travel():
    from hvd_overlap.core.choice import get

    def plan_of(name, **kw):
        return get(name)(bucket_bytes=80, **kw).build_plan(specs()[:4])  # layers a, b

    plan = plan_of("sharded")
    assert {b.collective for b in plan.buckets} == {f"{REDUCE_SCATTER}+allgather"}
    # every all-gather waits for the next step, input side first
    assert [b.phase for b in plan.buckets] == [FORWARD, FORWARD]
    assert [b.layers for b in plan.buckets] == [("a",), ("b",)]
    text = plan.describe()
    assert "reducescatter+allgather" in text and "all-gathered" in text
    by_alltoall = plan_of("sharded", gather_with="alltoall")
    assert {b.collective for b in by_alltoall.buckets} == {f"{REDUCE_SCATTER}+alltoall"}
    assert "gathered with alltoall" in by_alltoall.describe()
    layout = partition(plan, 2)
    rows = layout.describe().splitlines()[2:]
    assert all("next step" in r for r in rows)
    # sharded_hybrid: at least one input-side bucket waits (a: 80 of 152 bytes, more than half,
    # yet one is the minimum); the output-side one is all-gathered in backprop
    hybrid = plan_of("sharded_hybrid")
    assert [(b.layers, b.phase) for b in hybrid.buckets] == [(("b",), BACKWARD), (("a",), FORWARD)]
    assert [b.phase for b in plan_of("sharded_hybrid", defer=0).buckets] == [BACKWARD] * 2
    assert [b.phase for b in plan_of("sharded_hybrid", defer=1).buckets] == [BACKWARD, FORWARD]
