"""The communication plan is pure data: built, printed and checked without any rank."""

import pytest

from hvd_overlap.core.plan import VarSpec, build_layerwise_plan, layer_of


def spec(i, layer, name, shape, dtype="float32"):
    return VarSpec(index=i, name=f"{layer}/{name}:0", shape=shape, dtype=dtype, layer=layer)


def cnn_specs():
    return [
        spec(0, "conv1", "kernel", (3, 3, 1, 8)), spec(1, "conv1", "bias", (8,)),
        spec(2, "bn1", "gamma", (8,)), spec(3, "bn1", "beta", (8,)),
        spec(4, "conv2", "kernel", (3, 3, 8, 16)), spec(5, "conv2", "bias", (16,)),
        spec(6, "dense", "kernel", (1024, 64)), spec(7, "dense", "bias", (64,)),
        spec(8, "out", "kernel", (64, 10)), spec(9, "out", "bias", (10,)),
    ]


def test_layer_of():
    assert layer_of("conv2d_1/kernel:0") == "conv2d_1"
    assert layer_of("model/block/dense/bias:0") == "model/block/dense"
    assert layer_of("loose:0") == "loose"


def test_buckets_are_in_backprop_order_and_cover_every_variable_once():
    plan = build_layerwise_plan(cnn_specs(), bucket_bytes=4096)
    order = [v.index for b in plan.buckets for v in b.variables]
    assert sorted(order) == list(range(10))
    assert plan.buckets[0].layers[0] == "out"          # output layer goes first
    assert plan.buckets[-1].layers[-1] == "conv1"      # input layer goes last
    firsts = [min(v.index for v in b.variables) for b in plan.buckets]
    assert firsts == sorted(firsts, reverse=True)


def test_small_layers_merge_and_a_large_layer_stands_alone():
    plan = build_layerwise_plan(cnn_specs(), bucket_bytes=8192)
    layers = [b.layers for b in plan.buckets]
    # out (2.6 KB) fits; dense (262 KB) exceeds the budget alone: its own bucket, not split.
    assert layers[0] == ("out",)
    assert layers[1] == ("dense",)
    # conv2 (4.7 KB) + bn1 + conv1 (0.4 KB) fit in 8 KiB together.
    assert layers[2] == ("conv2", "bn1", "conv1")
    for b in plan.buckets:
        assert b.nbytes <= 8192 or len(b.layers) == 1


def test_a_layer_is_never_split():
    plan = build_layerwise_plan(cnn_specs(), bucket_bytes=1)
    for b in plan.buckets:
        assert len(b.layers) == 1
    assert len(plan.buckets) == 5


def test_one_dtype_per_bucket():
    specs = [spec(0, "a", "k", (4,)), spec(1, "b", "k", (4,), "float16"), spec(2, "c", "k", (4,))]
    plan = build_layerwise_plan(specs, bucket_bytes=1 << 20)
    assert [b.dtype for b in plan.buckets] == ["float32", "float16", "float32"]


def test_bfloat16_is_refused_with_the_fix():
    with pytest.raises(TypeError, match="bfloat16.*mixed_float16"):
        build_layerwise_plan([spec(0, "a", "k", (4,), "bfloat16")])


def test_bad_budget():
    with pytest.raises(ValueError, match="bucket_bytes"):
        build_layerwise_plan(cnn_specs(), bucket_bytes=0)


def test_describe_lists_every_bucket_in_order():
    plan = build_layerwise_plan(cnn_specs(), bucket_bytes=8192)
    text = plan.describe()
    assert text.splitlines()[0].startswith("plan: strategy=layerwise")
    rows = [ln.split() for ln in text.splitlines()[2:] if ln.strip() and ln.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == list(range(len(plan.buckets)))
    assert "dense/kernel:0" in text and "backward" in text


def test_signature_changes_with_the_model():
    a = build_layerwise_plan(cnn_specs(), 8192)
    b = build_layerwise_plan(cnn_specs()[:-1], 8192)
    assert a.signature() == build_layerwise_plan(cnn_specs(), 8192).signature()
    assert a.signature() != b.signature()
