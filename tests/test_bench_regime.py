"""``bench --regime``: the link rate chosen for a regime, the bounds and the achieved regime
reported, and the command line's checks (single process, no launch)."""

import pytest
from click.testing import CliRunner

from benchmarks import LOCAL, report
from benchmarks.cli import main
from benchmarks.config import STOCK, BenchConfig
from benchmarks.regime import bound, regime_rate, ring_bytes
from hvd_overlap.core.sim.cluster import parse_rate

VGG_BYTES = 25_602_344


def test_rate_puts_stock_s_ring_allreduce_at_the_regime():
    rate = regime_rate(2.0, 0.37, VGG_BYTES, 2, efficiency=1.0)
    assert rate.endswith("kbit")
    # 2 ranks: each sends the whole gradient once; at the rate that takes 2 x 370 ms
    assert VGG_BYTES / parse_rate(rate) == pytest.approx(0.74, rel=1e-4)
    assert parse_rate(rate) * 8 == pytest.approx(VGG_BYTES * 8 / 0.74, rel=1e-4)


def test_rate_scales_with_ranks_regime_sharing_and_efficiency():
    def bps(*args, **kw):
        return parse_rate(regime_rate(*args, **kw))

    base = bps(1.0, 0.5, VGG_BYTES, 2, efficiency=1.0)
    assert bps(0.5, 0.5, VGG_BYTES, 2, efficiency=1.0) == pytest.approx(2 * base, rel=1e-4)
    assert bps(1.0, 1.0, VGG_BYTES, 2, efficiency=1.0) == pytest.approx(base / 2, rel=1e-4)
    # 4 ranks send 2 * 3/4 of the gradient each instead of 2 * 1/2
    assert bps(1.0, 0.5, VGG_BYTES, 4, efficiency=1.0) == pytest.approx(1.5 * base, rel=1e-4)
    # one shared queue carries every rank's bytes
    assert bps(1.0, 0.5, VGG_BYTES, 2, shared=True, efficiency=1.0) == pytest.approx(
        2 * base, rel=1e-4)
    # a link that achieves 80% of its rate is set 1/0.8 faster
    assert bps(1.0, 0.5, VGG_BYTES, 2, efficiency=0.8) == pytest.approx(base / 0.8, rel=1e-4)
    assert ring_bytes(VGG_BYTES, 4) == pytest.approx(1.5 * VGG_BYTES)


@pytest.mark.parametrize("args", [(0, 0.3, VGG_BYTES, 2), (2, 0, VGG_BYTES, 2),
                                  (2, 0.3, 0, 2), (2, 0.3, VGG_BYTES, 1)])
def test_rate_refuses_what_has_no_regime(args):
    with pytest.raises(ValueError):
        regime_rate(*args)


def test_bound_is_compute_or_bytes_over_rate():
    assert bound(0.4, 10e6, 100e6) == pytest.approx(0.4)
    assert bound(0.05, 10e6, 100e6) == pytest.approx(0.1)
    assert bound(0.05, 10e6, 100e6, queue_share=2) == pytest.approx(0.2)
    assert bound(0.05, 10e6, None) is None
    assert bound(0.05, None, 100e6) is None  # bytes not measured: no bound


def test_summary_reports_bounds_and_the_achieved_regime():
    raw = {"config": {"model": "vgg", "batch_size": 32, "net": "100000kbit",
                      "net_model": "hosts", "rounds": 1, "steps": 4, "warmup": 2},
           "ranks": 2, "global_batch": 64, "params": 1, "grad_bytes": VGG_BYTES,
           "pinned": True,
           "step_times": {STOCK: [2.2], "sharded": [1.0], LOCAL: [0.4]},
           "link_bytes_per_step": {STOCK: [[26e6, 26e6]], "sharded": [[6e6, 6e6]],
                                   LOCAL: [[1e3, 1e3]]},
           "wire_time_per_step_s": {STOCK: 2.0, "sharded": 0.9},
           "regime": {"asked": 5.0, "probe_compute_s": 0.5, "link_efficiency": 1.0}}
    s = report.summarize(raw)
    rate = 100e6 / 8
    assert s[STOCK]["bound_s"] == pytest.approx(26e6 / rate)
    assert s["sharded"]["bound_s"] == pytest.approx(max(0.4, 6e6 / rate))
    assert s[LOCAL]["bound_s"] == pytest.approx(0.4)
    r = report.regime_summary(raw, s)
    assert r["asked"] == 5.0 and r["rate"] == "100000kbit"
    assert r["achieved"] == pytest.approx(2.0 / 0.4)  # this run's local, not the probe's
    assert "achieved 5.00" in report.regime_line(raw, s)
    assert "WARNING" not in report.regime_line(raw, s)
    # a regime the emulated link could not reach is said (here: asked 0.5, achieved 5)
    missed = {**raw, "regime": {**raw["regime"], "asked": 0.5}}
    assert "WARNING: the regime achieved is 10.0x" in report.regime_line(missed, s)
    without_local = {**raw, "step_times": {STOCK: [2.2]}}
    s2 = report.summarize(without_local)
    assert report.regime_summary(without_local, s2)["achieved"] == pytest.approx(2.0 / 0.5)
    plain = {**raw, "config": {**raw["config"], "net": "plain"}}
    assert report.regime_summary(plain, report.summarize(plain)) is None
    assert report.summarize(plain)[STOCK]["bound_s"] is None


def test_regime_and_net_are_exclusive():
    out = CliRunner().invoke(main, ["bench", "--regime", "2", "--net", "1gbit"])
    assert out.exit_code == 2 and "--net or --regime" in out.output
    out = CliRunner().invoke(main, ["bench", "--regime", "-1"])
    assert out.exit_code == 2 and "positive" in out.output
    with pytest.raises(ValueError, match="positive"):
        BenchConfig(regime=0.0).validate()
