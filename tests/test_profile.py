"""The hybrid split chosen from a per-layer profile: the step simulation and the choice."""

import pytest
import tensorflow as tf

from hvd_overlap.core.plan import VarSpec, build_layerwise_plan
from hvd_overlap.tools.profile import (
    LayerTime,
    choose_defer,
    parse_bandwidth,
    profile_layers,
    simulate_step,
)


def test_parse_bandwidth():
    assert parse_bandwidth("1gbit") == 1e9 / 8
    assert parse_bandwidth("500mbit") == 500e6 / 8
    assert parse_bandwidth(1234.0) == 1234.0
    with pytest.raises(ValueError, match="1gbit"):
        parse_bandwidth("fast")


# Two layers, forward order a -> b; bucket 0 = b (output side), bucket 1 = a (input side).
TIMES = {"a": LayerTime("a", 1.0, 2.0), "b": LayerTime("b", 1.0, 2.0)}


def test_simulation_without_deferral_exposes_the_last_bucket():
    # forward 2 s; backward: b ready at 4, a ready at 6; comm 1 s each -> link ends at 7
    assert simulate_step([1, 1], [["b"], ["a"]], TIMES, ["a", "b"], 0, 1.0) == 7.0


# Three layers a -> b -> c: a computes long and holds few bytes, b holds many, c is the output.
T3 = {"a": LayerTime("a", 2.0, 2.0), "b": LayerTime("b", 0.2, 0.2), "c": LayerTime("c", 0.2, 0.2)}
COMM3 = [0.5, 3.0, 0.5]  # seconds on the link, backward order: c, b, a


def test_simulation_of_a_hybrid_split_by_hand():
    # k=0: forward 2.4; c ready 2.6 -> sent 3.1; b ready 2.8 -> 6.1; a ready 4.8 -> 6.6
    assert simulate_step(COMM3, [["c"], ["b"], ["a"]], T3, ["a", "b", "c"], 0, 1.0) == \
        pytest.approx(6.6)
    # k=2: a arrives 0.5, b 3.5 (while a computes); forward ends 3.9; backward ends 6.3;
    # c's bucket, ready at 4.1, is sent by 4.6
    assert simulate_step(COMM3, [["c"], ["b"], ["a"]], T3, ["a", "b", "c"], 2, 1.0) == \
        pytest.approx(6.3)


def spec(i, layer, floats):
    return VarSpec(index=i, name=f"{layer}/kernel:0", shape=(floats,), dtype="float32",
                   layer=layer)


def test_choose_defer_picks_the_shortest_simulated_step():
    specs = [spec(0, "a", 125), spec(1, "b", 750), spec(2, "c", 125)]  # 500, 3000, 500 bytes
    plan = build_layerwise_plan(specs, bucket_bytes=1)
    times = [T3["a"], T3["b"], T3["c"]]
    assert choose_defer(plan, times, 1000.0) == 2   # 1000 B/s: the comm seconds above
    assert choose_defer(plan, times, 1e15) == 0     # free link: nothing to gain, smallest k
    with pytest.raises(ValueError, match="not in the profile"):
        choose_defer(plan, times[:2], "1gbit")


def test_profile_layers_times_every_layer():
    model = tf.keras.Sequential([tf.keras.layers.Dense(8, input_shape=(4,)),
                                 tf.keras.layers.ReLU(), tf.keras.layers.Dense(2)])
    times = profile_layers(model, tf.ones((16, 4)), repeats=3)
    assert [t.layer for t in times][0] == model.layers[0].name
    assert len(times) == 3 and all(t.forward > 0 and t.backward >= 0 for t in times)
    bn = tf.keras.Sequential([tf.keras.layers.BatchNormalization(input_shape=(2,))])
    before = [v.numpy() for v in bn.non_trainable_variables]
    profile_layers(bn, tf.ones((16, 2)) * 5, repeats=2)
    for a, b in zip(before, bn.non_trainable_variables, strict=True):
        assert (a == b.numpy()).all()  # the profile leaves BatchNormalization's statistics
