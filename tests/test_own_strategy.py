"""A new strategy is one class and its registration (``tests/own_strategy.py``): it runs
through the spelling, the simulator, the CLI's plan and simulate commands and ``auto``'s
choice from an explicit pool, with no module of the package changed."""

from __future__ import annotations

import pytest
import tensorflow as tf
from click.testing import CliRunner

from hvd_overlap.core import autoplan, spelling
from hvd_overlap.core.choice import REGISTRY, STRATEGIES, Layerwise
from hvd_overlap.core.simulate import Cluster, Layer, Profile, simulate
from hvd_overlap.tools.cli import main
from tests.own_strategy import ReversedLayerwise, registered

MIB = 1 << 20
SIX = Profile("six", 32, tuple(Layer(f"l{i}", 0.002, 0.004, 2 * MIB, tensors=2)
                               for i in range(6)))


@pytest.fixture(autouse=True)
def own():
    with registered():
        yield


def test_it_is_spelled_and_kept_out_of_autos_pools():
    s = ReversedLayerwise(bucket_bytes=2 * MIB)
    assert spelling.parse(s.spec()) == s and s.spec() == "reversed_layerwise+bucket=2M"
    assert spelling.resolve("reversed_layerwise", bucket_bytes=MIB) == \
        ReversedLayerwise(bucket_bytes=MIB)
    assert "reversed_layerwise" in REGISTRY and "reversed_layerwise" not in STRATEGIES
    every = autoplan.candidates(SIX, strategies=autoplan.FAMILIES["every"], exchange=True)
    assert not any(isinstance(c, ReversedLayerwise) for c in every)


def test_the_simulator_predicts_its_step():
    cluster = Cluster(ranks=4, bandwidth=1e8)
    mine = simulate(SIX, ReversedLayerwise(bucket_bytes=2 * MIB), cluster)
    layerwise = simulate(SIX, Layerwise(bucket_bytes=2 * MIB), cluster)
    assert mine.wire_bytes == pytest.approx(layerwise.wire_bytes)
    assert mine.step_s >= layerwise.step_s  # the input side's gradients come last
    assert simulate(SIX, "reversed_layerwise", cluster).step_s > SIX.compute_s


def test_auto_chooses_from_an_explicit_pool_holding_it():
    pool = [ReversedLayerwise(bucket_bytes=2 * MIB), Layerwise(bucket_bytes=2 * MIB)]
    choice = autoplan.choose(SIX, Cluster(ranks=4, bandwidth=1e8), pool)
    assert {c for c, _ in choice.ranking} >= set(pool)
    ranked = [c for c, _ in choice.ranking]
    assert autoplan.trial_order(choice.ranking, ranked[-1], trials=2)  # a kind of its own


def test_the_cli_simulates_it_and_prints_its_plan(tmp_path):
    out = CliRunner().invoke(main, ["simulate", "resnet50", "--np", "2,8", "--strategies",
                                    "layerwise,reversed_layerwise"])
    assert out.exit_code == 0, out.output
    assert "reversed_layerwise" in out.output
    model = tf.keras.Sequential([tf.keras.layers.Dense(64, input_shape=(32,)),
                                 tf.keras.layers.Dense(64), tf.keras.layers.Dense(10)])
    path = str(tmp_path / "m.keras")
    model.save(path)
    plan = CliRunner().invoke(main, ["plan", path, "--strategy", "reversed_layerwise",
                                     "--bucket-bytes", "1024"])
    assert plan.exit_code == 0, plan.output
    assert "reversed_layerwise" in plan.output and "reversed order" in plan.output
