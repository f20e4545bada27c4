"""The simulator's time to a target epoch under batch growth (``hvd-overlap simulate
--growth``): the schedule, steps per epoch, auto's plan chosen again per phase, the four runs."""

import json

import pytest
from click.testing import CliRunner

from hvd_overlap.core import autoplan
from hvd_overlap.core.growth_time import (
    Overheads,
    Phase,
    interpolated,
    parse_schedule,
    phase_times,
    run_times,
    seconds_to_epoch,
)
from hvd_overlap.core.simulate import load_profile
from hvd_overlap.tools.cli import main
from hvd_overlap.tools.simulate_report import cluster_from_options

VGG = load_profile("vgg16-h200")  # batch 32 per rank; its dense layers make the exchange pay


def test_parse_schedule():
    assert parse_schedule("3x32, 3X64,12x128") == (Phase(3, 32), Phase(3, 64), Phase(12, 128))
    for bad in ("3-32", "3x", "0x32", "3x32,x64"):
        with pytest.raises(ValueError, match="EPOCHSxBATCH|at least 1"):
            parse_schedule(bad)


def test_each_phase_gets_its_own_batch_steps_and_plan():
    cluster = cluster_from_options(8, "10gbit", "50us")
    pts = phase_times(VGG, cluster, parse_schedule("1x64,1x4096"), 100_000)
    small, large = pts
    assert (small.per_rank_batch, small.steps_per_epoch) == (8, 1562)  # remainder dropped
    assert (large.per_rank_batch, large.steps_per_epoch) == (512, 24)
    for pt in pts:  # each phase is auto's choice for the profile at that batch
        at = autoplan.at_batch(VGG, pt.per_rank_batch / VGG.batch_size)
        assert pt.plan == autoplan.choose(at, cluster, family="every").best
        assert pt.plugin_s <= pt.stock_s
    assert large.stock_s > small.stock_s  # compute grows with the batch, bytes do not
    assert small.plan != large.plan  # the balance moved: the plan is chosen again
    assert phase_times(VGG, cluster, [Phase(1, 12)], 1000) is None  # 12 does not split over 8


def test_run_times_add_the_phases_up_to_the_target():
    cluster = cluster_from_options(8, "10gbit", "50us")
    phases = parse_schedule("2x64,2x256")
    t = run_times(VGG, cluster, phases, 10_000, target_epoch=3,
                  overheads=Overheads(epoch_s=2.0, trace_s=5.0))
    first, second = t.phases
    assert t.target_epoch == 3
    for plugin, grown, small in ((False, t.stock_growth, t.stock_small),
                                 (True, t.plugin_growth, t.plugin_small)):
        # a trace at the start, another at the first new batch (Keras then takes any batch)
        assert grown == pytest.approx(2 * first.epoch_s(plugin, 2.0) + second.epoch_s(plugin, 2.0)
                                      + 2 * 5.0)
        assert small == pytest.approx(3 * first.epoch_s(plugin, 2.0) + 5.0)
    assert t.plugin_growth < t.stock_growth < t.stock_small
    with pytest.raises(ValueError, match="epochs 1 to 4"):
        run_times(VGG, cluster, phases, 10_000, target_epoch=5)


def test_the_retrace_is_charged_once_at_the_first_new_batch():
    cluster = cluster_from_options(8, "10gbit", "50us")
    pts = phase_times(VGG, cluster, parse_schedule("1x64,1x64,1x128,1x256"), 10_000)
    steps = sum(pt.epoch_s(False) for pt in pts)
    got = seconds_to_epoch(pts, 4, False, Overheads(trace_s=1.0))
    assert got == pytest.approx(steps + 2.0)
    assert seconds_to_epoch(pts, 2, False, Overheads(trace_s=1.0)) == pytest.approx(
        pts[0].epoch_s(False) + pts[1].epoch_s(False) + 1.0)
    cheaper = Overheads(trace_s=1.0, retrace_s=0.25)  # a retrace reuses the first's conversion
    assert seconds_to_epoch(pts, 4, False, cheaper) == pytest.approx(steps + 1.25)


def test_compute_measured_at_several_batches_replaces_linear_scaling():
    measured = {16: 0.005, 64: 0.010, 256: 0.040}
    assert interpolated(16, measured) == pytest.approx(0.005)
    assert interpolated(32, measured) == pytest.approx(0.005 + 0.005 * 16 / 48)
    assert interpolated(8, measured) == pytest.approx(0.0025)  # proportional beyond the range
    assert interpolated(512, measured) == pytest.approx(0.080)
    with pytest.raises(ValueError, match="no measured compute"):
        interpolated(8, {})
    cluster = cluster_from_options(2, "100000gbit", "0us")  # the step is about the compute
    phases = parse_schedule("1x32,1x128,1x512")
    linear = phase_times(VGG, cluster, phases, 10_000)
    fitted = phase_times(VGG, cluster, phases, 10_000, compute_at=measured)
    for pt in fitted:
        assert pt.compute_s == pytest.approx(interpolated(pt.per_rank_batch, measured))
    assert fitted[-1].stock_s < linear[-1].stock_s / 4  # 40 ms measured, not 16x the first


def test_simulate_prints_and_writes_the_growth_prediction(tmp_path):
    out = tmp_path / "g.json"
    res = CliRunner().invoke(main, [
        "simulate", "vgg16-h200", "--np", "8,12", "--bandwidth", "10gbit", "--latency", "50us",
        "--strategies", "horovod", "--growth", "2x64,2x256", "--samples", "10000",
        "--epoch-overhead", "2s", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "growth 2x64,2x256 (global batches), 10000 samples per epoch" in res.output
    assert "(not at 12 ranks" in res.output
    (g,) = json.loads(out.read_text())["profiles"]["vgg16-h200"]["growth"]
    assert g["ranks"] == 8 and g["target_epoch"] == 4
    assert [p["per_rank_batch"] for p in g["phases"]] == [8, 32]
    assert g["auto_growth_s"] < g["stock_small_s"]
    res = CliRunner().invoke(main, [
        "simulate", "vgg16-h200", "--np", "8", "--bandwidth", "10gbit", "--strategies",
        "horovod", "--growth", "2x64,2x256", "--samples", "10000", "--trace-overhead", "3s,1s",
        "--batch-compute", "8=20ms,32=50ms", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "3 s tracing at the start and 1 s at the first new batch" in res.output
    assert "compute interpolated from --batch-compute" in res.output
    (h,) = json.loads(out.read_text())["profiles"]["vgg16-h200"]["growth"]
    assert [p["compute_s"] for p in h["phases"]] == pytest.approx([0.020, 0.050])
    steps = sum(2 * p["steps_per_epoch"] * p["stock_step_s"] for p in h["phases"])
    assert h["stock_growth_s"] == pytest.approx(steps + 3 + 1)  # traced at the start, retraced
    for args, message in ((["--growth", "2x64"], "--samples"),
                          (["--samples", "10"], "go with --growth"),
                          (["--batch-compute", "8=1ms"], "go with --growth"),
                          (["--growth", "2x64", "--samples", "10", "--batch-compute", "8:1ms"],
                           "BATCH=DURATION"),
                          (["--growth", "2-64", "--samples", "10"], "EPOCHSxBATCH")):
        res = CliRunner().invoke(main, ["simulate", "vgg16-h200", "--np", "8", *args])
        assert res.exit_code == 2 and message in res.output, res.output
