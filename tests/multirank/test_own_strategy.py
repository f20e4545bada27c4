"""A strategy defined only in the tests (``tests/own_strategy.py``: ``Layerwise`` with its
buckets reversed) trains to stock Horovod's weights on 2 ranks, alone and as a plan ``auto``
switches to from an explicit pool."""

from __future__ import annotations

import pytest

import hvd_overlap.keras as hvdo
from hvd_overlap.core.choice import StockHorovod
from hvd_overlap.keras.executors import auto
from tests.multirank.helpers import (
    assert_weights_close,
    same_on_all_ranks,
    stock,
    stock_reference,
    train_fit,
)
from tests.own_strategy import ReversedLayerwise, registered

MINE = ReversedLayerwise(bucket_bytes=2048)


@pytest.fixture(autouse=True)
def own(monkeypatch):
    """One timed step per trial, every trial run whatever the timings, and no quiet steps
    (tested in test_auto.py): the whole check fits in the run's 24 steps."""
    monkeypatch.setattr(auto, "TRIAL_STEPS", 1)
    monkeypatch.setattr(auto, "CLEAR_GAIN", 1.0)  # every trial runs whatever the timings
    monkeypatch.setattr(auto, "QUIET_STEPS", 0)
    with registered():
        yield


def test_it_trains_to_stocks_weights():
    ref = train_fit("cnn_bn", "sgd_momentum", stock)
    made: list = []

    def wrap(opt):
        made.append(hvdo.DistributedOptimizer(opt, strategy=MINE))
        return made[-1]
    got = train_fit("cnn_bn", "sgd_momentum", wrap)
    assert_weights_close(got, ref)
    assert same_on_all_ranks(got)
    plan = made[0].plan
    assert plan.strategy == "reversed_layerwise" and len(plan.buckets) > 1
    first, last = plan.buckets[0].variables[0], plan.buckets[-1].variables[0]
    assert first.index < last.index  # input side first


def test_auto_switches_to_it_from_an_explicit_pool():
    made: list = []

    def wrap(opt):
        o = hvdo.DistributedOptimizer(opt, strategy="auto")
        o._hvdo.forced_trials = [MINE]
        made.append(o)
        return o
    got = train_fit("cnn_bn", "sgd_momentum", wrap)
    ex = made[0]._hvdo
    assert ex.settled and set(ex.measured) == {StockHorovod(), MINE}, ex.log
    assert ex.switches >= 1
    assert_weights_close(got, stock_reference("cnn_bn", "sgd_momentum"))
    assert same_on_all_ranks(got)
