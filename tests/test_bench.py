"""hvd-overlap bench: arithmetic and formatting on fake measurements, validation, the network
namespace, the launcher's timeout, and one tiny real 2-rank run."""

import json
import subprocess
import time

import pytest
from click.testing import CliRunner

from hvd_overlap import STRATEGIES
from hvd_overlap.bench import LOCAL, BenchConfig, launch, report
from hvd_overlap.bench.config import MODEL_NAMES
from hvd_overlap.cli import main
from hvd_overlap.models import MODELS
from hvd_overlap.netns import (
    NetnsError,
    check_requirements,
    namespaces,
    parse_net,
    shaped_namespace,
)

RAW = {"config": {"model": "vgg", "batch_size": 64, "net": "1gbit", "rounds": 3, "steps": 10,
                  "warmup": 2, "tiny": False},
       "ranks": 2, "global_batch": 128, "params": 6_400_586, "grad_bytes": 25_602_344,
       "pinned": True,
       "step_times": {"horovod": [0.8, 0.9, 0.7], "layerwise": [0.6, 0.5, 0.64],
                      LOCAL: [0.4, 0.41, 0.39]}}


def test_summary_arithmetic():
    s = report.summarize(RAW)
    assert list(s) == ["horovod", "layerwise", LOCAL]
    assert s["horovod"]["step_time_s"] == pytest.approx(0.8)  # median of rounds
    assert s["layerwise"]["samples_per_sec"] == pytest.approx(128 / 0.6)
    assert s["layerwise"]["ratio_to_horovod"] == pytest.approx(0.8 / 0.6)
    assert s["horovod"]["efficiency"] == pytest.approx(0.4 / 0.8)
    assert s[LOCAL]["efficiency"] == pytest.approx(1.0)
    assert s["horovod"]["bytes_per_step"] == 25_602_344 and s[LOCAL]["bytes_per_step"] == 0
    assert s["horovod"]["wire_bytes_per_rank"] == 25_602_344  # 2 (P-1)/P = 1 for P = 2


def test_summary_without_reference_or_local():
    s = report.summarize({**RAW, "step_times": {"layerwise": [0.5]}})
    assert s["layerwise"]["ratio_to_horovod"] is None and s["layerwise"]["efficiency"] is None
    assert "-" in report.format_table(s).splitlines()[1].split()


def test_table_json_and_plot(tmp_path):
    s = report.summarize(RAW)
    rows = report.format_table(s).splitlines()
    assert rows[0].split()[:2] == ["strategy", "samples/s"]
    # no timeline in RAW: wire time and hidden share are "-"
    assert rows[2].split() == ["layerwise", "213.3", "600.0", "1.333x", "0.67", "24.4", "-", "-",
                               "-"]
    with_wire = report.summarize({**RAW, "wire_time_per_step_s": {"layerwise": 0.4}})
    # local 400 ms, layerwise 600 ms: 200 ms of the 400 ms on the wire exposed -> half hidden
    assert with_wire["layerwise"]["hidden"] == pytest.approx(0.5)
    assert with_wire["layerwise"]["wire_s"] == 0.4
    assert "6.40 M params" in report.headline(RAW)
    report.write_json(tmp_path / "b.json", RAW, s)
    data = json.loads((tmp_path / "b.json").read_text())["strategies"]
    for key in ("samples_per_sec", "step_time_s", "ratio_to_horovod", "efficiency"):
        assert key in data["layerwise"]
    report.plot(tmp_path / "b.png", {"vgg 1gbit": s, "again": s})
    assert (tmp_path / "b.png").stat().st_size > 1000


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


def test_config_validation():
    assert set(MODEL_NAMES) == set(MODELS)
    assert BenchConfig().strategies == (*STRATEGIES, LOCAL)
    for bad in ({"model": "alexnet"}, {"steps": 0}, {"warmup": 0}, {"np": 0},
                {"strategies": ("horovod", "nope")}, {"strategies": ()},
                {"strategies": ("horovod", "horovod")}, {"net": "fast"}, {"timeout": 0}):
        with pytest.raises(ValueError):
            BenchConfig(**bad).validate()
    cfg = BenchConfig(strategies=("horovod",), net="1gbit")
    assert BenchConfig.from_json(cfg.to_json()) == cfg


def test_cli_refuses_bad_arguments():
    runner = CliRunner()
    for args in (["--steps", "0"], ["--strategies", "horovod,bogus"], ["--net", "1 gbit"],
                 ["--model", "alexnet"]):
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


def _require_netns() -> None:
    try:
        check_requirements()
    except NetnsError as e:  # CI machines are like this one: root with iproute2
        pytest.fail(f"cannot test the emulated network: {e}")


def test_namespace_created_shaped_and_removed():
    _require_netns()
    name = "hvdo-bench-test-ok"
    with shaped_namespace("1gbit", name=name) as ns:
        assert ns == name and name in namespaces()
        qdisc = subprocess.run(["ip", "netns", "exec", name, "tc", "qdisc", "show", "dev", "lo"],
                               capture_output=True, text=True).stdout
        assert "tbf" in qdisc and "rate 1Gbit" in qdisc
    assert name not in namespaces()


def test_namespace_removed_on_error():
    _require_netns()
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
    data = json.loads(out.read_text())["strategies"]
    assert list(data) == [*STRATEGIES, LOCAL]
    for name, m in data.items():
        assert m["samples_per_sec"] > 0 and m["step_time_s"] > 0, name
        assert m["ratio_to_horovod"] > 0 and m["efficiency"] > 0, name
    assert "vs horovod" in result.output
