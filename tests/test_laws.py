"""The laws by which the calibrated costs grow with the rank count, the simulator's use of them,
and predictions checked against bench runs: pure Python, synthetic calibrations."""

import pytest

from hvd_overlap.core.sim.cluster import Cluster, growth
from hvd_overlap.core.sim.laws import cluster_fields, fit_growth, fit_laws, fit_share


def _fit(p: int, overhead: float, tensor: float, share: float = 0.8, rate: float = 1.25e8,
         steal: float = 0.1) -> dict:
    return {"overhead_s": overhead, "tensor_s": tensor, "bandwidth": share * rate,
            "reduce_scatter_bandwidth": share / 2 * rate, "cpu_steal": steal,
            "comm_slowdown": 1.5, "cycle_period_s": 1e-3}


def test_each_growth_law_is_recovered_with_its_errors():
    for law in ("log2", "linear", "none"):
        got = fit_growth({p: 2e-4 * growth(law, p) for p in (2, 3, 4)})
        assert got["law"] == law and got["at_2_ranks"] == pytest.approx(2e-4)
        assert got["worst"] == pytest.approx(0.0, abs=1e-12)
        assert all(v > 0.05 for k, v in got["laws"].items() if k != law)
    noisy = fit_growth({2: 1e-3, 3: 2.2e-3, 4: 2.9e-3})  # about linear
    assert noisy["law"] == "linear" and 0.0 < noisy["worst"] < 0.15
    assert set(noisy["errors"]) == {2, 3, 4}
    with pytest.raises(ValueError):
        fit_growth({1: 1.0})


def test_a_share_of_the_rate_and_its_error_per_rank_count():
    got = fit_share({2: 100.0, 4: 80.0}, 125.0)
    assert got["share"] == pytest.approx(0.72)
    assert got["errors"][2] == pytest.approx(0.72 / 0.8 - 1)
    assert got["errors"][4] == pytest.approx(0.72 / 0.64 - 1)


def test_laws_give_the_cluster_at_any_rank_count_and_rate():
    fits = {p: _fit(p, 5e-4 * (p - 1), 1e-4, steal=0.1 * p) for p in (2, 3, 4)}
    laws = fit_laws(fits, 1.25e8)
    assert laws["overhead_s"]["law"] == "linear" and laws["tensor_s"]["law"] == "none"
    fields = cluster_fields(laws, 8, 2.5e7)
    c = Cluster(ranks=8, **fields)
    assert c.negotiation() == pytest.approx(5e-4 * 7)  # the fitted law, not the default log2
    assert c.per_tensor() == pytest.approx(1e-4)
    assert c.bandwidth == pytest.approx(0.8 * 2.5e7)  # the share, at this rate
    assert c.reduce_scatter_bandwidth == pytest.approx(0.4 * 2.5e7)
    assert c.allgather_bandwidth is None  # not calibrated: the ring model's link rate
    assert fields["cpu_steal"] == pytest.approx(0.4)  # the nearest rank count's (4)
    with pytest.raises(ValueError, match="2 ranks"):
        fit_laws({3: fits[3], 4: fits[4]}, 1.25e8)


def test_measured_cluster_uses_the_laws_and_the_nearest_calibrated_rate():
    from benchmarks.validation import measured_cluster

    laws = fit_laws({p: _fit(p, 5e-4 * (p - 1), 1e-4) for p in (2, 3, 4)}, 1.25e8)
    two = _fit(2, 9e-4, 3e-4)
    d = {"nets": {"1gbit hosts": {"fit": two, "laws": laws}, "500mbit hosts": {"fit": two}}}
    c = measured_cluster("1gbit", 4, d, "hosts")
    assert (c.negotiation_growth, c.negotiation()) == ("linear", pytest.approx(1.5e-3))
    near = measured_cluster("200mbit", 4, d, "hosts")  # never calibrated: 1gbit's laws, scaled
    assert near.bandwidth == pytest.approx(0.8 * 2.5e7)
    old = measured_cluster("500mbit", 4, d, "hosts")  # calibrated at 2 ranks only
    assert (old.negotiation_s, old.negotiation_growth) == (9e-4, "log2")
    with pytest.raises(ValueError, match="no calibration"):
        measured_cluster("200mbit", 4, d, "loopback")


def test_a_shaped_link_is_no_faster_than_the_unshaped_host():
    from benchmarks.validation import measured_cluster

    shaped = fit_laws({p: _fit(p, 5e-4, 1e-4) for p in (2, 4)}, 1.25e8)
    host = fit_laws({p: _fit(p, 3e-4, 1e-4, share=1.0, rate=3e8) for p in (2, 4)}, None)
    d = {"nets": {"1gbit hosts": {"laws": shaped}, "plain": {"laws": host}}}
    slow = measured_cluster("1gbit", 4, d, "hosts")
    assert slow.bandwidth == pytest.approx(1e8)  # 0.8 of 1 Gbit/s: below the host's 3e8
    fast = measured_cluster("10gbit", 4, d, "hosts")  # 0.8 of 10 Gbit/s: the host's
    assert fast.bandwidth == pytest.approx(3e8)
    assert fast.reduce_scatter_bandwidth == pytest.approx(1.5e8)
    assert fast.negotiation() == pytest.approx(slow.negotiation())  # the shaped net's costs
    from benchmarks.prediction import host_rate

    assert host_rate(4, "hosts", d) == pytest.approx(3e8)
    assert host_rate(4, "hosts", {"nets": {"1gbit hosts": {"laws": shaped}}}) is None


def test_ring_terms_of_the_allreduce_bandwidth_at_four_ranks():
    from hvd_overlap.tools.collective_costs import GROUP, SIZES, fit

    def run(base: float) -> dict:  # 4 ranks: 2 x 3/4 of n bytes at 1e9 bytes/s
        return {"sizes": {str(n): {"wall_s": base + 1.5 * n / 1e9} for n in SIZES},
                "grouped": {"1": 1e-3, str(GROUP): 1e-3}, "ranks": 4,
                "steal": {"cpu_steal": 0.0, "comm_slowdown": 1.0}}

    assert fit(run(5e-4), run(1e-3))["bandwidth"] == pytest.approx(1e9)


def _bench(model: str, net: str, steps: dict[str, float]) -> dict:
    return {"raw": {"config": {"model": model, "batch_size": 32, "np": 4, "net": net,
                               "net_model": "hosts"},
                    "step_times": {s: [t] for s, t in steps.items()}}}


def test_a_prediction_is_checked_beside_the_trivial_predictor():
    from benchmarks.prediction import check, markdown

    prediction = {"config": {"model": "vgg", "batch_size": 32, "np": 4, "net": "300mbit",
                             "net_model": "hosts"}, "compute_s": 0.4,
                  "predicted": {"stock": {"step_s": 1.1}, "sharded": {"step_s": 0.5},
                                "hybrid": {"step_s": 1.0}}}
    rows = check(prediction, _bench("vgg", "300mbit", {"stock": 1.0, "sharded": 0.6,
                                                       "local": 0.42}))
    assert [r.strategy for r in rows] == ["stock", "sharded"]  # hybrid was not measured
    stock = rows[0]
    assert stock.error == pytest.approx(0.1) and stock.trivial_error == pytest.approx(-0.6)
    assert stock.communication_heavy  # (1.0 - 0.42) / 1.0 of stock's step is communication
    table = markdown(rows)
    assert "| vgg | 300mbit | sharded | 600 | 500 | -16.7% | -33.3% | yes |" in table
    assert "1 of 2 rows within 15%" in table and "on 2 of 2 rows" in table
    with pytest.raises(ValueError, match="net"):
        check(prediction, _bench("vgg", "1gbit", {"stock": 1.0}))


def test_measured_costs_inside_the_calibrated_range_and_the_law_beyond():
    fits = {p: _fit(p, o, 1e-4) for p, o in ((2, 1e-3), (3, 1e-3), (4, 4e-3))}
    fits[2]["allgather_bandwidth"] = 0.4 * 1.25e8  # Gloo's all-gather: half rate at 2 ranks
    fits[3]["allgather_bandwidth"] = fits[4]["allgather_bandwidth"] = 0.7 * 1.25e8
    laws = fit_laws(fits, 1.25e8)
    law = laws["overhead_s"]["law"]
    at = {p: Cluster(ranks=p, **cluster_fields(laws, p, 1.25e8)) for p in (2, 3, 4, 16)}
    assert at[3].negotiation() == pytest.approx(1e-3)  # measured, not the law's value
    assert at[4].negotiation() == pytest.approx(4e-3)
    assert at[16].negotiation() == pytest.approx(4e-3 * growth(law, 16) / growth(law, 4))
    assert at[2].allgather_bandwidth == pytest.approx(0.4 * 1.25e8)
    assert at[16].allgather_bandwidth == pytest.approx(0.7 * 1.25e8)  # the largest count's
    assert laws["allgather_bandwidth"]["errors"][2] > 0.3  # one share would miss 2 ranks
    no_points = Cluster(ranks=4, bandwidth=1.0, negotiation_s=1e-3, negotiation_growth="linear")
    assert no_points.negotiation() == pytest.approx(3e-3)


def test_predict_command_writes_predictions_and_the_bench_that_checks_them(tmp_path,
                                                                           monkeypatch):
    """``predict`` measures only the compute-only step (here faked) and writes the simulator's
    step times with the bench command of the same configuration."""
    import json

    from click.testing import CliRunner

    from benchmarks import regime
    from benchmarks.cli import main

    def probe(cfg, _progress):
        assert cfg.strategies == ("local",) and cfg.np == 4
        return {"step_times": {"local": [0.3]}, "grad_bytes": 25_602_344, "ranks": 4}

    monkeypatch.setattr(regime, "measure_compute_only", probe)
    out = tmp_path / "p.json"
    res = CliRunner().invoke(main, ["predict", "--model", "vgg", "--np", "4", "--regime", "2",
                                    "--json", str(out)])
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    assert d["compute_s"] == 0.3 and d["config"]["np"] == 4
    # stock's ring bytes at the nominal rate, against the compute-only step
    assert d["stock_ideal_wire_over_compute"] == pytest.approx(2 * 0.95, rel=1e-3)
    assert set(d["predicted"]) >= {"stock", "sharded", "sharded+exchange", "layerwise",
                                   "hybrid"}
    assert all(p["step_s"] >= 0.3 for p in d["predicted"].values())
    assert d["best_allreduce"] in ("layerwise", "hybrid")
    assert f"--np 4 --batch-size 32 --net {d['config']['net']} --net-model hosts" \
        in d["bench_command"] and d["bench_command"].endswith("--one-per-launch")
    res = CliRunner().invoke(main, ["predict", "--model", "vgg", "--json", str(out)])
    assert res.exit_code == 2 and "--regime or --net" in res.output


def test_simulate_with_a_calibration_uses_its_costs_and_laws(tmp_path):
    """``hvd-overlap simulate --calibration``: the measured costs at the calibrated rank counts,
    their fitted growth beyond, the collectives' shares of the given link; without it the
    assumed 2-rank constants."""
    import json

    from click.testing import CliRunner

    from hvd_overlap.tools.cli import main
    from hvd_overlap.tools.simulate_report import calibrated_knobs, cluster_from_options

    fits = {p: _fit(p, 1e-3 * (p - 1), 1e-4) for p in (2, 3, 4)}
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"format": "hvd-overlap-overheads/1", "nets": {
        "1gbit hosts": {"fit": fits[2], "laws": fit_laws(fits, 1.25e8)},
        "old": {"fit": fits[2]}}}))
    key, knobs = calibrated_knobs(path, None, "10gbit")
    assert key == "1gbit hosts" and "cpu_steal" not in knobs
    c = cluster_from_options(64, "10gbit", "0us", knobs)
    assert c.negotiation() == pytest.approx(1e-3 * 63)  # 4 ranks' cost grown linearly
    assert c.bandwidth == pytest.approx(0.8 * 1.25e9)  # the share of the given link
    assert cluster_from_options(64, "10gbit", "0us", knobs,
                                negotiation_s=5e-4).negotiation() == pytest.approx(5e-4 * 63)
    with pytest.raises(ValueError, match="--calibration-net"):
        calibrated_knobs(path, "nope", "10gbit")
    args = ["simulate", "vgg16", "--np", "4,64", "--strategies", "horovod,sharded",
            "--bandwidth", "10gbit"]
    with_cal = CliRunner().invoke(main, [*args, "--calibration", str(path)])
    without = CliRunner().invoke(main, args)
    assert with_cal.exit_code == 0 and without.exit_code == 0, with_cal.output + without.output
    assert "measured at 2, 3, 4 ranks" in with_cal.output and "linear(P)" in with_cal.output
    assert "x log2(P)" in without.output
    assert with_cal.output.split("\n", 1)[1] != without.output.split("\n", 1)[1]


def test_a_prediction_prices_the_exchange_at_the_run_s_batch_not_the_profile_s():
    from benchmarks.prediction import predict
    from benchmarks.validation import OVERHEADS_BY_RANKS, bench_profile, lab_profile, load_overheads

    measured = lab_profile("vgg-b64-cpu")  # the vgg is profiled at 64 per rank only
    at_32 = bench_profile("vgg", 32)
    assert (measured.batch_size, at_32.batch_size) == (64, 32)
    assert at_32.grad_bytes == measured.grad_bytes and at_32.update_s == measured.update_s
    args = dict(compute_s=0.5, net="300mbit", ranks=4, net_model="hosts",
                strategies=("stock", "sharded", "sharded+exchange"),
                overheads=load_overheads(OVERHEADS_BY_RANKS))
    p32, p64 = predict("vgg", 32, **args)["predicted"], predict("vgg", 64, **args)["predicted"]
    # the exchange sends activations, which grow with the batch; the other plans send gradients
    exchanged = p64["sharded+exchange"]["sent_bytes"] - p32["sharded+exchange"]["sent_bytes"]
    assert exchanged > 0.1 * p32["sharded+exchange"]["sent_bytes"]
    assert p32["sharded"]["sent_bytes"] == p64["sharded"]["sent_bytes"]
