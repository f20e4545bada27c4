"""The one strategy type: every strategy object builds its own plan, round-trips through its
spelling, and is what ``auto``'s pools, the simulator and the factory take; ``resolve`` tells
a keyword not passed from one passed with its default; one margin rule."""

from __future__ import annotations

import dataclasses

import pytest

from hvd_overlap.core import autoplan, spelling
from hvd_overlap.core.choice import (
    REGISTRY,
    Auto,
    Deferred,
    Exchange,
    Hybrid,
    Layerwise,
    Sharded,
    ShardedHybrid,
    StockHorovod,
)
from hvd_overlap.core.margin import as_share_of_incumbent, keep_unless_faster
from hvd_overlap.core.plan import VarSpec
from hvd_overlap.core.simulate import Layer, Profile

MIB = 1 << 20
#: one object of each class, with settings away from their defaults where it has any
EACH = [StockHorovod(num_groups=2), Layerwise(bucket_bytes=8 * MIB, ordered=True),
        Deferred(bucket_bytes="auto"), Hybrid(defer=2), Hybrid(defer="auto"),
        Sharded(gather_with="alltoall", exchange=Exchange(forward="rows"), shard="dense"),
        Sharded(exchange=Exchange("always", "gather")), ShardedHybrid(bucket_bytes=512, defer=0),
        Auto()]


def _dense_profile() -> Profile:
    return Profile("p", 32, tuple(Layer(f"l{i}", 0.001, 0.002, 4 * MIB, tensors=2,
                                        dense=(1024, 1024)) for i in range(3)))


@pytest.mark.parametrize("strategy", EACH, ids=str)
def test_every_class_round_trips_through_its_spelling(strategy):
    assert spelling.parse(strategy.spec()) == strategy
    assert hash(strategy) == hash(spelling.parse(strategy.spec()))


def test_every_candidate_auto_generates_round_trips():
    pool = autoplan.candidates(_dense_profile(), strategies=autoplan.FAMILIES["every"],
                               exchange=True)
    assert len(pool) > 20 and {c.name for c in pool} == set(autoplan.FAMILIES["every"])
    for c in pool:
        assert spelling.parse(c.spec()) == c, c.spec()
        assert not c.tuned


def test_every_registered_class_is_one_of_each():
    assert {c.name for c in map(type, EACH)} == set(REGISTRY)


def test_each_strategy_builds_its_own_plan():
    specs = [VarSpec(i, f"l{i}/kernel:0", (256, 256), "float32", f"l{i}") for i in range(4)]
    assert Hybrid(bucket_bytes=256 * 1024, defer=1).build_plan(specs).strategy == "hybrid"
    assert StockHorovod().build_plan(specs).fused_by_horovod
    with pytest.raises(ValueError, match="chooses its plan"):
        Auto().build_plan(specs)


def test_comm_options_and_the_online_check_are_the_objects_own():
    assert StockHorovod(num_groups=3).comm_options().groups == 3
    assert Layerwise(ordered=True).comm_options().ordered
    assert Sharded(gather_with="alltoall").comm_options().gather_with == "alltoall"
    auto_forward = Sharded(exchange=Exchange())
    assert auto_forward.online_alternative() == Sharded(exchange=Exchange(forward="gather"))
    assert Sharded(exchange=Exchange(forward="rows")).online_alternative() is None
    assert Hybrid().online_alternative() is None


@pytest.mark.parametrize("value", [8 << 20, 4 << 20])
def test_a_plan_keyword_beside_an_object_is_refused_even_at_its_default(value):
    with pytest.raises(TypeError, match="beside a strategy object"):
        spelling.resolve(Layerwise(), bucket_bytes=value)
    with pytest.raises(TypeError, match="beside a strategy object"):
        spelling.resolve(Sharded(), gather_with="allgather")


def test_keywords_not_passed_leave_the_object_and_strings_as_they_were():
    assert spelling.resolve(Layerwise(), **spelling.NOT_PASSED) == Layerwise()
    # with a name, a keyword at its default is no setting (the CLI passes its defaults)
    assert spelling.resolve("horovod", bucket_bytes=4 << 20) == StockHorovod()
    assert spelling.resolve("hybrid", bucket_bytes=8 << 20) == Hybrid(bucket_bytes=8 << 20)
    assert spelling.NOT_PASSED["bucket_bytes"] == 4 << 20  # shown as the value
    assert repr(spelling.NOT_PASSED["groups"]) == "None"


def test_one_margin_rule():
    assert keep_unless_faster(0.995, 1.0, 0.01)       # inside the margin: kept
    assert not keep_unless_faster(0.99, 1.0, 0.01)    # at the margin: the challenger
    assert not keep_unless_faster(0.5, float("inf"), 0.01)
    m = as_share_of_incumbent(0.05)
    assert keep_unless_faster(0.96, 1.0, m) and not keep_unless_faster(0.95, 1.0, m)


def test_strategies_stay_frozen_and_hashable():
    s = Hybrid(bucket_bytes=MIB, defer=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.defer = 3  # type: ignore[misc]
    assert {s: 1}[Hybrid(bucket_bytes=MIB, defer=2)] == 1
