"""The batch-growth policy (``hvd_overlap.growth.policy``): pure Python, single process."""

import json
import math

import pytest

from hvd_overlap.growth.policy import BatchGrowth, Milestones, Periodic, Plateau, split_batch


def run(policy: BatchGrowth, epochs: int, metrics=None, steps_per_epoch: int = 0) -> list[int]:
    """Global batch used in each epoch."""
    used = []
    for e in range(epochs):
        used.append(policy.global_batch)
        policy.step(steps_per_epoch)
        policy.end_epoch(e, None if metrics is None else metrics[e])
    return used


def test_milestones_grow_at_the_given_epochs():
    p = BatchGrowth(Milestones({2: 2, 4: 4}), initial_batch=16, base_lr=0.1)
    assert run(p, 6) == [16, 16, 32, 32, 128, 128]
    assert [(e.epoch, e.old_batch, e.new_batch) for e in p.events] == [(2, 16, 32), (4, 32, 128)]


def test_periodic_growth_every_k_epochs_with_start():
    assert run(BatchGrowth(Periodic(3), initial_batch=8, base_lr=1.0), 7) == [8, 8, 8, 16, 16,
                                                                            16, 32]
    p = BatchGrowth(Periodic(2, factor=3, start=1), initial_batch=2, base_lr=1.0)
    assert run(p, 6) == [2, 2, 2, 6, 6, 18]


def test_plateau_patience_min_delta_and_cooldown():
    p = BatchGrowth(Plateau(factor=2, patience=2, min_delta=0.1, cooldown=1),
                    initial_batch=4, base_lr=1.0)
    #           e0   e1    e2    e3    e4    e5    e6    e7    e8
    losses = [1.0, 0.95, 0.92, 0.5, 0.45, 0.44, 0.43, 0.42, 0.41]
    # e1, e2 gain < 0.1 -> grow after e2; e3 is the cooldown epoch (improves: best 0.5);
    # e4, e5 stall -> grow; e6 cooldown; e7, e8 stall -> grow
    assert run(p, 9, losses) == [4, 4, 4, 8, 8, 8, 16, 16, 16]
    assert [e.epoch for e in p.events] == [3, 6, 9]


def test_plateau_improvement_resets_wait_and_max_mode():
    p = BatchGrowth(Plateau(patience=3, min_delta=0.0, mode="max"), initial_batch=1, base_lr=1.0)
    accs = [0.5, 0.5, 0.5, 0.6, 0.6, 0.6, 0.6]
    # e1, e2 stall (wait 2), e3 improves (wait 0), e4-e6 stall -> grow after e6
    assert run(p, 7, accs) == [1] * 7
    assert p.global_batch == 2 and p.trigger.wait == 0
    assert [e.epoch for e in p.events] == [7]


def test_plateau_requires_a_finite_metric():
    p = BatchGrowth(Plateau(), initial_batch=4, base_lr=1.0)
    with pytest.raises(ValueError, match="finite"):
        p.end_epoch(0, float("nan"))


def test_split_batch_is_exact_and_minimises_accumulation():
    assert split_batch(64, 2) == (32, 1)
    assert split_batch(256, 2, 32) == (32, 4)
    assert split_batch(96, 2, 40) == (24, 2)      # 48/rank: largest divisor <= 40 is 24
    assert split_batch(2 * 7 * 5, 2, 6) == (5, 7)
    for g, r, c in [(96, 4, 5), (360, 3, 7), (1024, 8, 100)]:
        pr, acc = split_batch(g, r, c)
        assert pr * acc * r == g and pr <= c
    with pytest.raises(ValueError, match="multiple of 4"):
        split_batch(30, 4)


def test_per_rank_cap_turns_into_accumulation_and_global_cap_stops_growth():
    p = BatchGrowth(Periodic(1), initial_batch=16, base_lr=0.1, num_ranks=2,
                    max_per_rank_batch=16, max_global_batch=96)
    seen = []
    for e in range(5):
        seen.append((p.global_batch, p.per_rank_batch, p.accumulation_steps))
        p.end_epoch(e)
    assert seen == [(16, 8, 1), (32, 16, 1), (64, 16, 2), (96, 16, 3), (96, 16, 3)]
    assert all(g == pr * a * 2 for g, pr, a in seen)
    assert len(p.events) == 3  # no event once the cap is reached
    assert p.samples_per_rank_step == 48


@pytest.mark.parametrize("scaling,expected", [("linear", 0.8), ("sqrt", 0.1 * math.sqrt(8)),
                                              ("none", 0.1)])
def test_lr_coupling(scaling, expected):
    p = BatchGrowth(Milestones({1: 8}), initial_batch=32, base_lr=0.1, lr_scaling=scaling)
    assert p.lr == pytest.approx(0.1)
    event = p.end_epoch(0)
    assert event.new_lr == pytest.approx(expected) and p.lr == pytest.approx(expected)
    assert p.lr_for(64) == pytest.approx({"linear": 0.2, "sqrt": 0.1 * math.sqrt(2),
                                          "none": 0.1}[scaling])


def test_warmup_ramps_from_old_to_new_lr_after_each_growth():
    p = BatchGrowth(Milestones({1: 2, 2: 2}), initial_batch=8, base_lr=0.1, warmup_steps=4)
    assert p.lr == pytest.approx(0.1)
    p.end_epoch(0)
    ramp = []
    for _ in range(6):
        ramp.append(p.lr)
        p.step()
    assert ramp == pytest.approx([0.125, 0.15, 0.175, 0.2, 0.2, 0.2])
    # grow again in the middle of a ramp: the new ramp starts from the current lr
    p2 = BatchGrowth(Milestones({1: 2, 2: 2}), initial_batch=8, base_lr=0.1, warmup_steps=4)
    p2.end_epoch(0)
    p2.step(2)                          # next lr would be 0.175
    event = p2.end_epoch(1)
    assert event.old_lr == pytest.approx(0.175) and event.new_lr == pytest.approx(0.4)
    assert p2.lr == pytest.approx(0.175 + (0.4 - 0.175) / 4)


def test_start_lr_warms_up_a_large_initial_batch_then_holds():
    p = BatchGrowth(None, initial_batch=256, base_lr=0.32, warmup_steps=4, start_lr=0.04)
    lrs = []
    for _ in range(6):
        lrs.append(p.lr)
        p.step()
    assert lrs == pytest.approx([0.11, 0.18, 0.25, 0.32, 0.32, 0.32])
    assert p.end_epoch(0) is None and p.lr == pytest.approx(0.32)
    with pytest.raises(ValueError, match="warmup_steps > 0"):
        BatchGrowth(None, initial_batch=8, base_lr=0.1, start_lr=0.01)


def test_state_round_trip_resumes_exactly():
    def make():
        return BatchGrowth(Plateau(patience=2, min_delta=0.01, cooldown=1), initial_batch=8,
                           base_lr=0.1, num_ranks=2, warmup_steps=5, max_per_rank_batch=8,
                           lr_scaling="sqrt")

    losses = [1.0, 0.999, 0.998, 0.9, 0.899, 0.898, 0.897, 0.896, 0.8, 0.799]
    full, first = make(), make()
    lrs_full = []
    for e, loss in enumerate(losses):
        for _ in range(3):
            lrs_full.append(full.lr)
            full.step()
        full.end_epoch(e, loss)
    lrs = []
    for e, loss in enumerate(losses[:4]):
        for _ in range(3):
            lrs.append(first.lr)
            first.step()
        first.end_epoch(e, loss)
    state = json.loads(json.dumps(first.state_dict()))  # JSON-serialisable
    resumed = make()
    resumed.load_state_dict(state)
    assert resumed.end_epoch(3, 123.0) is None  # already seen: ignored
    for e, loss in enumerate(losses[4:], start=4):
        for _ in range(3):
            lrs.append(resumed.lr)
            resumed.step()
        resumed.end_epoch(e, loss)
    assert lrs == pytest.approx(lrs_full)
    assert resumed.state_dict() == full.state_dict()
    assert len(full.events) >= 2 and full.accumulation_steps > 1


def test_resume_on_other_rank_count_resplits_or_rejects():
    p = BatchGrowth(Milestones({1: 2}), initial_batch=12, base_lr=0.1, num_ranks=4)
    p.end_epoch(0)
    q = BatchGrowth(Milestones({1: 2}), initial_batch=12, base_lr=0.1, num_ranks=2)
    q.load_state_dict(p.state_dict())
    assert (q.global_batch, q.per_rank_batch) == (24, 12)
    r = BatchGrowth(Milestones({1: 2}), initial_batch=12, base_lr=0.1, num_ranks=1)
    with pytest.raises(ValueError, match="initial_batch"):
        BatchGrowth(None, initial_batch=16, base_lr=0.1).load_state_dict(p.state_dict())
    r.load_state_dict(p.state_dict())
    assert r.per_rank_batch == 24


@pytest.mark.parametrize("kwargs,match", [
    (dict(initial_batch=30, num_ranks=4), "initial_batch=30 must be a positive multiple of "
                                          "num_ranks=4.*use e.g. 32"),
    (dict(max_global_batch=100, num_ranks=8), "max_global_batch=100 is not a multiple.*use 96"),
    (dict(max_global_batch=8), "below initial_batch"),
    (dict(lr_scaling="cubic"), "lr_scaling"),
    (dict(warmup_steps=-1), "warmup_steps"),
    (dict(max_per_rank_batch=0), "max_per_rank_batch"),
    (dict(base_lr=0.0), "base_lr"),
])
def test_bad_config_errors(kwargs, match):
    args = dict(initial_batch=16, base_lr=0.1) | kwargs
    with pytest.raises(ValueError, match=match):
        BatchGrowth(Milestones({1: 2}), **args)


@pytest.mark.parametrize("make", [lambda: Milestones({3: 1.5}), lambda: Periodic(2, factor=1),
                                  lambda: Plateau(factor=0.5), lambda: Milestones({0: 2}),
                                  lambda: Milestones({}), lambda: Plateau(patience=0),
                                  lambda: Periodic(0)])
def test_bad_trigger_errors(make):
    with pytest.raises(ValueError):
        make()


def test_non_integer_factor_names_the_fix():
    with pytest.raises(ValueError, match="integer >= 2.*use e.g. 2"):
        Milestones({3: 1.5})
    assert Milestones({3: 2.0}).milestones == {3: 2}


def test_phase_epochs_counts_epochs_until_the_next_growth_or_the_end():
    p = BatchGrowth(Periodic(3), initial_batch=8, base_lr=1.0, max_global_batch=32)
    assert p.phase_epochs(0, 10) == 3          # grows after epoch 2
    run(p, 3)                                  # now 16, from epoch 3
    assert p.phase_epochs(3, 10) == 3
    assert p.phase_epochs(3, 5) == 2           # the fit ends first
    run_more = [p.end_epoch(e) for e in range(3, 6)]
    assert p.global_batch == 32 and run_more[-1] is not None
    assert p.phase_epochs(6, 10) == 4          # capped: no further growth
    m = BatchGrowth(Milestones({1: 2, 2: 2}), initial_batch=8, base_lr=1.0)
    assert m.phase_epochs(0, 3) == 1 and m.phase_epochs(1, 3) == 1
    assert BatchGrowth(None, initial_batch=8, base_lr=1.0).phase_epochs(2, 7) == 5
    assert BatchGrowth(Plateau(), initial_batch=8, base_lr=1.0).phase_epochs(0, 9) is None
