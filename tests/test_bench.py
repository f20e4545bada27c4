"""``python -m benchmarks bench``: arithmetic and formatting on fake measurements, validation, the
launch plan, the emulated networks (one shaped loopback; hosts on a switch), the launchers'
timeouts, tiny real 2-rank runs on this machine and on two emulated hosts, and the docs tables'
commands."""

import json
import subprocess
import time

import pytest
from click.testing import CliRunner

from benchmarks import LOCAL, BenchConfig, launch, report
from benchmarks.cli import main
from benchmarks.config import AUTO, MODEL_NAMES, STOCK
from benchmarks.netns import (
    NetnsError,
    namespaces,
    parse_net,
    shaped_namespace,
)
from hvd_overlap import STRATEGIES
from hvd_overlap.core.chooser import QUIET_STEPS
from hvd_overlap.tools.models import MODELS
from tests.netns_required import require_netns

RAW = {"config": {"model": "vgg", "batch_size": 64, "net": "1gbit", "rounds": 3, "steps": 10,
                  "warmup": 2, "tiny": False},
       "ranks": 2, "global_batch": 128, "params": 6_400_586, "grad_bytes": 25_602_344,
       "pinned": True,
       "step_times": {STOCK: [0.8, 0.9, 0.7], "layerwise": [0.6, 0.5, 0.64],
                      LOCAL: [0.4, 0.41, 0.39]}}


def test_summary_arithmetic():
    s = report.summarize(RAW)
    assert list(s) == [STOCK, "layerwise", LOCAL]
    assert s[STOCK]["step_time_s"] == pytest.approx(0.8)  # median of rounds
    assert s["layerwise"]["samples_per_sec"] == pytest.approx(128 / 0.6)
    assert s["layerwise"]["ratio_to_stock"] == pytest.approx(0.8 / 0.6)
    assert s[STOCK]["efficiency"] == pytest.approx(0.4 / 0.8)
    assert s[LOCAL]["efficiency"] == pytest.approx(1.0)
    assert s[STOCK]["bytes_per_step"] == 25_602_344 and s[LOCAL]["bytes_per_step"] == 0
    assert s[STOCK]["wire_bytes_per_rank"] == 25_602_344  # 2 (P-1)/P = 1 for P = 2


def test_summary_step_is_the_median_of_every_round_s_steps():
    # one round whose mean is spoilt by a stall: the pooled median is the typical step
    raw = {**RAW, "step_means": {STOCK: [[0.5, 0.5, 2.9], [0.6, 0.5, 0.5], [0.7, 0.5, 0.6]],
                                 "layerwise": [[0.4], [0.4], [0.5]], LOCAL: []},
           "step_times": {STOCK: [1.3, 0.53, 0.6], "layerwise": [0.4, 0.4, 0.5],
                          LOCAL: [0.3, 0.3, 0.3]}}
    s = report.summarize(raw)
    assert s[STOCK]["step_time_s"] == pytest.approx(0.5)
    assert s[STOCK]["mean_step_s"] == pytest.approx(0.6)  # the median of the round means
    assert s["layerwise"]["ratio_to_stock"] == pytest.approx(0.5 / 0.4)
    assert s[LOCAL]["step_time_s"] == pytest.approx(0.3)  # no samples: the round means
    assert "median step over all rounds" in report.headline({**raw, "params": 1})


def test_summary_without_reference_or_local():
    s = report.summarize({**RAW, "step_times": {"layerwise": [0.5]}})
    assert s["layerwise"]["ratio_to_stock"] is None and s["layerwise"]["efficiency"] is None
    assert "-" in report.format_table(s).splitlines()[1].split()


def test_table_json_and_plot(tmp_path):
    s = report.summarize(RAW)
    rows = report.format_table(s).splitlines()
    assert rows[0].split()[:2] == ["strategy", "samples/s"]
    # no timeline in RAW: bytes sent, wire time, hidden share and the bound are "-"
    assert rows[2].split() == ["layerwise", "213.3", "600.0", "1.333x", "0.67", "24.4", "-", "-",
                               "-", "-", "-", "-"]
    sent = report.summarize({**RAW, "sent_bytes_per_step": {"layerwise": {"all": 3 * 2**20}}})
    assert sent["layerwise"]["sent_bytes_per_rank"] == {"all": 3 * 2**20}
    assert report.format_table(sent).splitlines()[2].split()[6] == "3.0"
    with_wire = report.summarize({**RAW, "wire_time_per_step_s": {"layerwise": 0.4}})
    # local 400 ms, layerwise 600 ms: 200 ms of the 400 ms on the wire exposed -> half hidden
    assert with_wire["layerwise"]["hidden"] == pytest.approx(0.5)
    assert with_wire["layerwise"]["wire_s"] == 0.4
    assert "6.40 M params" in report.headline(RAW)
    assert "1gbit loopback" in report.headline(RAW)  # 0.1 JSON files had no net_model
    assert "1gbit hosts" in report.headline(
        {**RAW, "config": {**RAW["config"], "net_model": "hosts"}})
    assert "not a clean baseline" in report.headline({**RAW, "clean_baseline": False})
    report.write_json(tmp_path / "b.json", RAW, s)
    data = json.loads((tmp_path / "b.json").read_text())["strategies"]
    for key in ("samples_per_sec", "step_time_s", "ratio_to_stock", "efficiency"):
        assert key in data["layerwise"]
    report.plot(tmp_path / "b.png", {"vgg 1gbit": s, "again": s})
    assert (tmp_path / "b.png").stat().st_size > 1000


def test_link_bytes_from_the_interface_counters():
    """Rank 0's link bytes per step, median over rounds; a shared loopback counts every rank's
    traffic once (so / ranks); the host's own loopback is not the benchmark's alone (None)."""
    link = {"layerwise": [[4 * 2**20, 5 * 2**20], [6 * 2**20, 1.0], [2 * 2**20, None]]}
    hosts = {**RAW, "config": {**RAW["config"], "net_model": "hosts"},
             "link_bytes_per_step": link}
    assert report.summarize(hosts)["layerwise"]["link_bytes_per_rank"] == 4 * 2**20
    assert report.format_table(report.summarize(hosts)).splitlines()[2].split()[7] == "4.0"
    shared = {**hosts, "config": {**hosts["config"], "net_model": "loopback"}}
    assert report.summarize(shared)["layerwise"]["link_bytes_per_rank"] == 2 * 2**20
    plain = {**hosts, "config": {**hosts["config"], "net": "plain"}}
    assert report.summarize(plain)["layerwise"]["link_bytes_per_rank"] is None
    assert report.summarize(RAW)["layerwise"]["link_bytes_per_rank"] is None  # older JSON


def test_sharded_phases_and_optimizer_memory():
    """Local 400 ms, sharded 500 ms: 100 ms exposed; 30 ms of the reduce-scatters' 200 ms ran
    after backprop, so the all-gathers' 140 ms exposed the other 70 ms."""
    raw = {**RAW, "step_times": {"sharded": [0.5], LOCAL: [0.4]},
           "wire_by_collective_s": {"sharded": {"all": 0.33, "REDUCESCATTER": 0.2,
                                                "ALLGATHER": 0.14,
                                                "REDUCESCATTER_after_backprop": 0.03}},
           "optimizer_state_bytes": {"sharded": {"slots": 2**20, "slices": 2**20},
                                     LOCAL: {"slots": 2**21, "slices": 0}}}
    s = report.summarize(raw)
    assert s["sharded"]["reduce_scatter_hidden"] == pytest.approx(1 - 0.03 / 0.2)
    assert s["sharded"]["all_gather_hidden"] == pytest.approx(1 - 0.07 / 0.14)
    assert s["sharded"]["optimizer_mib"] == pytest.approx(2.0)
    assert s["sharded"]["slot_mib"] == pytest.approx(1.0)
    assert s["sharded"]["slice_mib"] == pytest.approx(1.0)
    assert "reduce_scatter_hidden" not in s[LOCAL] and s[LOCAL]["optimizer_mib"] == 2.0
    text = report.format_table(s)
    assert "85% hidden under backprop" in text and "50% hidden under the next forward" in text


def test_a_step_with_the_exchange_reports_wire_per_kind_not_phases():
    """The exchange's collectives on the critical path and whole buckets' allreduces beside
    the reduce-scatters: the exposed time is not charged to the all-gathers (no phase split);
    each kind's wire time and the hidden share in all are printed instead."""
    wire = {"all": 0.2, "ALLREDUCE": 0.05, "REDUCESCATTER": 0.01, "ALLGATHER": 0.04,
            "ALLTOALL": 0.1, "exchange": 0.12, "REDUCESCATTER_after_backprop": 0.0}
    raw = {**RAW, "step_times": {"sharded+exchange": [0.5], LOCAL: [0.4]},
           "wire_time_per_step_s": {"sharded+exchange": 0.2},
           "wire_by_collective_s": {"sharded+exchange": wire}}
    m = report.summarize(raw)["sharded+exchange"]
    assert "reduce_scatter_hidden" not in m and "all_gather_hidden" not in m
    assert m["wire_kinds_s"] == {k: v for k, v in wire.items() if k not in (
        "all", "REDUCESCATTER_after_backprop")}
    line = report.kinds_line("sharded+exchange", m)
    assert ("allreduces 50.0, reduce-scatters 10.0, all-gathers 40.0, all-to-alls 100.0, "
            "of which the exchange's 120.0; 50% of it hidden in all") in line
    assert line in report.format_table(report.summarize(raw))


def test_config_validation():
    assert set(MODEL_NAMES) == set(MODELS)
    assert BenchConfig().strategies == (STOCK, *STRATEGIES, LOCAL)
    for bad in ({"model": "alexnet"}, {"steps": 0}, {"warmup": 0}, {"np": 0},
                {"strategies": ("horovod", "nope")}, {"strategies": ()},
                {"strategies": ("horovod", "horovod")}, {"net": "fast"}, {"timeout": 0},
                {"net_model": "wifi"}, {"history": -1}, {"whole_fit": -1},
                {"whole_fit": 300}):  # (a whole fit needs one_per_launch)
        with pytest.raises(ValueError):
            BenchConfig(**bad).validate()
    # replicas: NAME#K (K >= 2) of a fixed strategy that is measured too
    BenchConfig(strategies=(STOCK, "stock#2", "layerwise", "layerwise#3")).validate()
    for bad_replica, says in ((("stock#2",), "list stock too"), ((STOCK, "stock#1"), "K >= 2"),
                              ((STOCK, "stock#x"), "K >= 2"),
                              ((AUTO, "auto#2"), "for fixed strategies"),
                              (("sharded+auto", "sharded+auto#2"), "for fixed strategies")):
        with pytest.raises(ValueError, match=says):
            BenchConfig(strategies=bad_replica).validate()
    BenchConfig(whole_fit=300, one_per_launch=True).validate()
    cfg = BenchConfig(strategies=("horovod",), net="1gbit", net_model="loopback", history=40)
    assert BenchConfig.from_json(cfg.to_json()) == cfg


def test_launch_plan_runs_the_clean_baseline_in_launches_of_its_own():
    cfg = BenchConfig(strategies=(STOCK, "layerwise", "hybrid", LOCAL), rounds=3)
    plan = launch.launch_plan(cfg)
    clean, plugin = (STOCK, LOCAL), ("layerwise", "hybrid")
    assert plan == [(0, clean), (0, plugin), (1, plugin), (1, clean), (2, clean), (2, plugin)]
    assert launch.launch_plan(BenchConfig(strategies=("layerwise",), rounds=2)) == [
        (0, ("layerwise",)), (1, ("layerwise",))]
    alone = launch.launch_plan(BenchConfig(strategies=(STOCK, "layerwise", LOCAL), rounds=2,
                                           one_per_launch=True))
    assert alone == [(0, (STOCK,)), (0, ("layerwise",)), (0, (LOCAL,)),
                     (1, ("layerwise",)), (1, (LOCAL,)), (1, (STOCK,))]


def test_a_replica_runs_where_its_strategy_runs():
    from benchmarks.config import base_name, is_clean_group, plugin_options

    assert base_name("stock#2") == STOCK and base_name("sharded+exchange#2") == "sharded+exchange"
    assert is_clean_group(["stock#2", LOCAL]) and not is_clean_group(["stock#2", "layerwise#2"])
    assert plugin_options("sharded+alltoall#2") == ("sharded", {"gather_with": "alltoall"})
    cfg = BenchConfig(strategies=(STOCK, "stock#2", "layerwise", "layerwise#2", LOCAL), rounds=1)
    assert launch.launch_plan(cfg) == [(0, (STOCK, "stock#2", LOCAL)),
                                       (0, ("layerwise", "layerwise#2"))]
    raw = {**RAW, "step_times": {**RAW["step_times"], "local#2": [0.4]}}
    assert report.summarize(raw)["local#2"]["bytes_per_step"] == 0


def test_a_clean_process_refuses_to_have_loaded_the_plugin():
    """The baseline's check reads sys.modules: it must see the plugin's runtime when loaded."""
    import hvd_overlap.keras  # noqa: F401
    from benchmarks.worker import plugin_modules

    assert "hvd_overlap.keras.optimizer" in plugin_modules()
    assert "hvd_overlap.tools.models" not in plugin_modules()


def test_cli_refuses_bad_arguments():
    runner = CliRunner()
    for args in (["--steps", "0"], ["--strategies", "horovod,bogus"], ["--net", "1 gbit"],
                 ["--model", "alexnet"], ["--net-model", "wifi"]):
        result = runner.invoke(main, ["bench", *args])
        assert result.exit_code == 2, (args, result.output)


def test_net_names():
    assert parse_net("plain") is None and parse_net("1gbit") == "1gbit"
    assert parse_net("500MBIT") == "500mbit" and parse_net("2.5gbit") == "2.5gbit"
    with pytest.raises(ValueError):
        parse_net("1gb")


def test_under_horovodrun_refuses_emulated_net(monkeypatch):
    monkeypatch.setenv("HOROVOD_RANK", "0")
    with pytest.raises(ValueError, match="already under horovodrun"):
        launch.run_bench(BenchConfig(net="1gbit"), print)


def test_launch_timeout_kills_the_group(tmp_path):
    t0 = time.monotonic()
    code = launch.run_logged(["sleep", "30"], tmp_path / "log", 0.5, print)
    assert code < 0 and time.monotonic() - t0 < 10


def test_namespace_created_shaped_and_removed():
    require_netns()
    name = "hvdo-bench-test-ok"
    with shaped_namespace("1gbit", name=name) as ns:
        assert ns == name and name in namespaces()
        qdisc = subprocess.run(["ip", "netns", "exec", name, "tc", "qdisc", "show", "dev", "lo"],
                               capture_output=True, text=True).stdout
        assert "tbf" in qdisc and "rate 1Gbit" in qdisc
    assert name not in namespaces()


def test_namespace_removed_on_error():
    require_netns()
    name = "hvdo-bench-test-err"
    with pytest.raises(KeyboardInterrupt), shaped_namespace("10gbit", name=name):
        assert name in namespaces()
        raise KeyboardInterrupt
    assert name not in namespaces()
    with pytest.raises(NetnsError), shaped_namespace("0gbit", name=name):
        pass  # tc refuses a zero rate: the namespace must still go
    assert name not in namespaces()


def test_end_to_end_tiny_mlp(tmp_path):
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, [
        "bench", "--model", "mlp", "--tiny", "--np", "2", "--batch-size", "8", "--steps", "3",
        "--warmup", "1", "--rounds", "1", "--timeout", "240", "--json", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    data, raw = doc["strategies"], doc["raw"]
    assert list(data) == [STOCK, *STRATEGIES, LOCAL]
    for name, m in data.items():
        assert m["samples_per_sec"] > 0 and m["step_time_s"] > 0, name
        assert m["ratio_to_stock"] > 0 and m["efficiency"] > 0, name
    assert "vs stock" in result.output
    # stock ran in a launch of its own that never loaded the plugin, with the same Horovod
    # settings as the plugin's launch
    clean = [x for x in raw["launches"] if STOCK in x["strategies"]]
    plugin = [x for x in raw["launches"] if "layerwise" in x["strategies"]]
    assert len(clean) == 1 and clean[0]["strategies"] == [STOCK, LOCAL]
    assert clean[0]["clean_process"] and clean[0]["plugin_modules"] == []
    assert raw["clean_baseline"] and not plugin[0]["clean_process"]
    assert clean[0]["horovod_env"] == plugin[0]["horovod_env"]
    assert "HOROVOD_DISABLE_GROUP_FUSION" not in clean[0]["horovod_env"]
    # timed without HOROVOD_TIMELINE (its writer thread keeps rank 0's core busy); the wire
    # times come from the timeline launches after the timed ones
    assert "HOROVOD_TIMELINE" not in clean[0]["horovod_env"]
    assert "HOROVOD_TIMELINE" not in plugin[0]["horovod_env"]
    wire = raw["wire_time_per_step_s"]
    assert set(wire) == {STOCK, *STRATEGIES} and all(w > 0 for w in wire.values()), wire
    # each rank's page faults per timed step, per round (minor, major)
    ((rank0, rank1),) = raw["page_faults_per_step"][STOCK]
    assert all(x >= 0 for x in (*rank0, *rank1)) and len(rank0) == 2


def test_end_to_end_auto_chooses_before_timing(tmp_path):
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, [
        "bench", "--model", "mlp", "--tiny", "--np", "2", "--batch-size", "8", "--steps", "3",
        "--warmup", "1", "--rounds", "1", "--timeout", "300", "--strategies",
        "stock,stock#2,auto", "--one-per-launch", "--history", "15", "--whole-fit", "40",
        "--json", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["strategies"]["auto"]["ratio_to_stock"] > 0
    launches = doc["raw"]["launches"]
    assert [x["strategies"] for x in launches] == [[STOCK], ["stock#2"], [AUTO]]
    # the A/A control: a second stock, in a clean process of its own, timed as stock
    assert launches[1]["clean_process"] and launches[1]["plugin_modules"] == []
    assert doc["strategies"]["stock#2"]["ratio_to_stock"] > 0
    assert doc["raw"]["clean_baseline"] and "each strategy in its own launch" in result.output
    (pick,) = doc["raw"]["auto_choices"]
    # a trial for each of the two fastest strategies predicted 10% faster than stock's fusion:
    # two, one or none (which depends on this machine's load while the link is probed)
    trials = len(pick["measured_ms"]) - 1
    assert pick["settled"] and trials in (0, 1, 2), pick
    assert pick["choice"] in pick["measured_ms"]
    if trials:  # the quiet steps, then stock's fusion, the trials, stock's again (10 steps
        # each), a confirmation; or stock's fusion and one trial, 25% faster or more
        assert pick["steps"] >= QUIET_STEPS + 20 + 10 * trials \
            or pick["steps"] == QUIET_STEPS + 20, pick
    else:
        assert pick["choice"] == "horovod (stock fusion)", pick
        assert pick["steps"] == QUIET_STEPS + 10, pick
    # a choice other than stock fusion was measured again beside it (and kept only if faster)
    again = pick["confirmed_ms"]
    fastest = min(pick["measured_ms"], key=pick["measured_ms"].get)
    assert not again or set(again) == {"horovod (stock fusion)", fastest}
    assert "auto, round 1: chose " + pick["choice"] in result.output
    # timelines: stock and auto (as the plan it chose) recorded; the replica not
    assert set(doc["raw"]["wire_time_per_step_s"]) == {STOCK, AUTO}
    assert f"timeline {AUTO}" in result.output
    # --whole-fit: every strategy first trained one fit of 40 steps from its fresh process,
    # timed end to end (its first, tracing step too); auto chose in it or after it
    fits = doc["whole_fit"]
    assert set(fits) == {STOCK, "stock#2", AUTO}
    for fit in fits.values():
        assert fit["steps"] == 40 and fit["epochs"] == 1 and fit["rounds"] == 1
        assert fit["seconds"] > fit["first_step_s"] > 0
        assert len(fit["epoch_s"]) == 1 and fit["seconds"] >= fit["epoch_s"][0] > 0
        assert fit["ratio_to_stock"] == pytest.approx(fits[STOCK]["seconds"] / fit["seconds"])
    assert fits[AUTO]["settling_steps"] == pick["steps"] >= 10
    assert fits[AUTO]["settling_extra_s"] == pytest.approx(pick["extra_s"])
    assert "whole fit of 40 steps" in result.output
    assert "auto's whole fit - stock's" in result.output
    # --history: untimed steps before the timed ones, the whole fit's and auto's choice counted
    assert doc["raw"]["history_steps"] == {STOCK: [40], "stock#2": [40],
                                           AUTO: [40 + pick["trained"]]}
    assert "after 15 untimed" in result.output


def test_end_to_end_on_two_emulated_hosts(tmp_path):
    require_netns()
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, [
        "bench", "--model", "mlp", "--tiny", "--np", "2", "--batch-size", "8", "--steps", "2",
        "--warmup", "2", "--rounds", "1", "--timeout", "240", "--net", "1gbit",
        "--strategies", "stock,sharded", "--json", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["raw"]["config"]["net_model"] == "hosts" and "1gbit hosts" in result.output
    assert doc["strategies"]["sharded"]["ratio_to_stock"] > 0
    assert doc["raw"]["wire_by_collective_s"]["sharded"]["REDUCESCATTER"] > 0


def test_ratio_table_one_row_per_run_best_in_bold():
    from benchmarks.results import markdown, ratio_table

    run = {"raw": RAW, "strategies": report.summarize(
        {**RAW, "step_times": {**RAW["step_times"], "hybrid": [0.9, 0.9, 0.9]}})}
    table = ratio_table([run]).splitlines()
    assert table[0].split("|")[7:9] == [" layerwise ", " hybrid "]
    assert table[2] == "| vgg | 1gbit loopback | 64 | 400 | 800 | - | **1.33x** | 0.89x |"
    assert "Ratios to stock Horovod" in markdown([run])


def test_auto_results_rows_ratios_and_rounds():
    from benchmarks import auto_results

    raw = {**RAW, "step_times": {STOCK: [0.8] * 2, "layerwise": [0.5] * 2, AUTO: [0.6] * 2,
                                 LOCAL: [0.4] * 2},
           "step_means": {STOCK: [[0.8, 0.8], [1.0, 1.0]], "layerwise": [[0.5], [0.5]],
                          AUTO: [[0.4, 0.4], [0.5, 0.5]], LOCAL: [[0.3], [0.3]]},
           "auto_choices": [{"round": 0, "choice": "layerwise, 1.0MiB buckets", "steps": 40},
                            {"round": 1, "choice": "layerwise, 1.0MiB buckets", "steps": 40}]}
    row = auto_results.row({"strategies": report.summarize(raw), "raw": raw})
    assert row["best"] == "layerwise" and row["vs_best"] == pytest.approx(0.5 / 0.45)
    assert row["vs_stock"] == pytest.approx(0.9 / 0.45)  # pooled medians: 0.9 and 0.45
    assert row["vs_stock_rounds"] == pytest.approx([2.0, 2.0])
    text = auto_results.markdown([{"strategies": report.summarize(raw), "raw": raw,
                                   "measured": "2026-12-01 14:00 UTC",
                                   "source": "../results/auto/run.json"}])
    lo, hi = row["vs_stock_interval"]
    assert 1.6 <= lo < 2.0 < hi <= 2.5  # the rounds differ: the interval spans their mix
    best_lo, best_hi = row["vs_best_interval"]  # layerwise steady at 0.5; auto 0.4 to 0.5
    assert 1.0 <= best_lo < 0.5 / 0.45 < best_hi <= 1.25
    assert (f"| 2.00x | {lo:.2f}-{hi:.2f} | 2.00, 2.00 | 1.11x | ") in text
    # the last cell links the run's JSON; when it was measured stays in that file
    assert "| layerwise, 1.0MiB buckets (2/2) | - | [run.json](../results/auto/run.json) |" \
        in text and "2026-12-01" not in text
    assert "runs with auto >= 0.98x stock: 1 of 1; within 3% of the best fixed: 1 of 1" in text
    assert row["control"] is None
    # the A/A control: a second stock entry, faster by luck, is not a "best fixed" strategy
    again = {**raw, "step_times": {**raw["step_times"], "stock#2": [0.3] * 2},
             "step_means": {**raw["step_means"], "stock#2": [[0.3, 0.3], [0.3, 0.3]]}}
    row = auto_results.row({"strategies": report.summarize(again), "raw": again})
    assert row["best"] == "layerwise" and row["control"] == pytest.approx(0.9 / 0.3)
    lo, hi = row["control_interval"]
    assert lo < 0.9 / 0.3 < hi
    text = auto_results.markdown([{"strategies": report.summarize(again), "raw": again}])
    assert f"| {0.9 / 0.3:.2f}x ({lo:.2f}-{hi:.2f}) |" in text
    assert "A/A control (stock / stock#2, the same code in two entries): 3.00x" in text
    assert "below 0.98x in 0 of 1 runs" in text


def test_auto_results_interval_is_the_ratio_when_steps_agree_and_none_without_steps():
    from benchmarks import auto_results

    steady = {"step_means": {STOCK: [[0.8] * 5] * 3, AUTO: [[0.4] * 5] * 3}}
    assert auto_results.ratio_interval(steady, STOCK, AUTO) == (2.0, 2.0)
    noisy = {"step_means": {STOCK: [[0.8, 0.9, 1.0]] * 3, AUTO: [[0.5, 0.5, 0.5]] * 3}}
    lo, hi = auto_results.ratio_interval(noisy, STOCK, AUTO)
    assert 1.6 <= lo < 1.8 < hi <= 2.0  # the point estimate 0.9 / 0.5 inside a real spread
    assert auto_results.ratio_interval({"step_times": {}}, STOCK, AUTO) is None


def test_docs_tables_are_commands_of_the_lab(tmp_path):
    """``python -m benchmarks bench-results / exchange-results / auto-results`` write the docs
    tables from bench JSON files."""
    from benchmarks import auto_results, results

    raw = {**RAW, "step_times": {**RAW["step_times"], AUTO: [0.6] * 3}}
    run = {"raw": raw, "strategies": report.summarize(raw), "command": "made by hand"}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    md, png = tmp_path / "bench.md", tmp_path / "bench.png"
    res = CliRunner().invoke(main, ["bench-results", str(md), str(png), str(path)])
    assert res.exit_code == 0, res.output
    # each page ends with how to regenerate it: the script, the raw data, the exact command
    again = results.regenerate("scripts/bench-results", md, f"python -m benchmarks "
                               f"bench-results {md} {png}", [path])
    assert md.read_text() == results.markdown([run]) + again
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "](./)" in again and f"bench-results {md} {png} \\\n  {path}\n```" in again
    res = CliRunner().invoke(main, ["exchange-results", str(md), str(path)])
    assert res.exit_code == 0, res.output
    assert md.read_text().startswith("# The dense factor exchange, measured")
    assert "Measured with `scripts/exchange-bench`" in md.read_text()
    res = CliRunner().invoke(main, ["auto-results", str(md), str(path)])
    assert res.exit_code == 0, res.output
    assert md.read_text() == auto_results.markdown([{**run, "source": "run.json"}]) + \
        results.regenerate("scripts/auto-bench", md, f"python -m benchmarks auto-results {md}",
                           [path])
    assert "| [run.json](run.json) |" in md.read_text()
    assert CliRunner().invoke(main, ["auto-results", str(md)]).exit_code != 0  # no RUN.json


def test_the_simulators_default_costs_are_the_calibrations():
    """``hvd-overlap simulate`` ships the negotiation and per-tensor cost as constants; they are
    the calibration's ``cluster_defaults`` (``benchmarks/profiles/overheads-gloo-2rank.json``)."""
    from benchmarks.validation import load_overheads
    from hvd_overlap.tools.simulate_report import NEGOTIATION_S, TENSOR_S

    defaults = load_overheads()["cluster_defaults"]
    assert (NEGOTIATION_S, TENSOR_S) == (defaults["overhead_s"], defaults["tensor_s"])


def test_the_package_never_imports_the_lab():
    """``benchmarks`` is not in the wheel: no module of ``hvd_overlap`` may import it."""
    import ast
    from pathlib import Path

    import hvd_overlap

    for f in sorted(Path(hvd_overlap.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not [n for n in names if n.split(".")[0] == "benchmarks"], f
