"""``hvd-overlap calibrate``: a cluster's collective costs measured in the user's own job, filed
per network and rank count, with the laws fitted once two counts are in; what `simulate
--calibration` reads."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hvd_overlap.tools.cli import main
from hvd_overlap.tools.collective_costs import OVERHEADS_FORMAT, record

HVD_OVERLAP = Path(sys.executable).with_name("hvd-overlap")
HOROVODRUN = Path(sys.executable).with_name("horovodrun")


def _measured(p: int, overhead: float, tensor: float = 1e-4, rate: float = 1e9) -> dict:
    """What measure_cycles returns on rank 0, reduced to its fit."""
    return {"fit": {"overhead_s": overhead, "tensor_s": tensor, "bandwidth": 0.8 * rate,
                    "allgather_bandwidth": 0.5 * rate, "cpu_steal": 0.1,
                    "comm_slowdown": 1.2, "cycle_period_s": 1e-3},
            "short_cycle": {"ranks": p}, "default_cycle": {"ranks": p}}


def test_record_files_each_rank_count_and_fits_the_laws_once_two_are_in():
    doc = record({}, "ib", 4, _measured(4, 3e-3), 1.25e9, "horovodrun -np 4 ...")
    entry = doc["nets"]["ib"]
    assert doc["format"] == OVERHEADS_FORMAT and "laws" not in entry  # no 2-rank anchor yet
    doc = record(doc, "ib", 2, _measured(2, 1e-3), 1.25e9, "horovodrun -np 2 ...")
    entry = doc["nets"]["ib"]
    assert entry["fit"]["overhead_s"] == 1e-3 and set(entry["ranks"]) == {"4"}
    laws = entry["laws"]
    assert laws["ranks"] == [2, 4] and laws["overhead_s"]["law"] == "linear"  # 1, 3 ms at 2, 4
    assert laws["bandwidth"]["share"] == pytest.approx(0.8 * 1e9 / 1.25e9)
    assert doc["command"] == "horovodrun -np 4 ...; horovodrun -np 2 ..."
    # a rank count measured again replaces its first measurement; other networks are kept
    doc = record(doc, "ib", 4, _measured(4, 2e-3), 1.25e9)
    doc = record(doc, "eth", 2, _measured(2, 5e-4), None)
    assert doc["nets"]["ib"]["laws"]["overhead_s"]["measured"] == {2: 1e-3, 4: 2e-3}
    assert set(doc["nets"]) == {"ib", "eth"} and "laws" not in doc["nets"]["eth"]
    with pytest.raises(ValueError, match="not a calibration file"):
        record({"format": "hvd-overlap-profile/1"}, "ib", 2, _measured(2, 1e-3), None)


def test_simulate_reads_a_recorded_file(tmp_path):
    doc = record({}, "eth", 2, _measured(2, 1e-3, rate=1e8), None)
    doc = record(doc, "eth", 3, _measured(3, 2e-3, rate=1e8), None)
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(doc))
    res = CliRunner().invoke(main, ["simulate", "vgg16", "--np", "2,8", "--strategies",
                                    "horovod", "--calibration", str(path)])
    assert res.exit_code == 0, res.output
    assert "collective rates as measured" in res.output  # no --link: its own rates
    assert "measured at 2, 3 ranks" in res.output


def _calibrate(ranks: int, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_NUM_INTRAOP_THREADS": "1",
           "TF_NUM_INTEROP_THREADS": "2", "HOROVOD_STALL_CHECK_TIME_SECONDS": "20",
           "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "40"}
    return subprocess.run(
        ["timeout", "--kill-after=10", str(timeout), str(HOROVODRUN), "-np", str(ranks), "-H",
         f"localhost:{ranks}", "--gloo", str(HVD_OVERLAP), "calibrate", *args],
        capture_output=True, text=True, env=env)


def test_calibrate_on_two_ranks_writes_a_file_simulate_reads(tmp_path):
    path = tmp_path / "cal.json"
    proc = _calibrate(2, "--json", str(path), "--name", "lo", "--link", "10gbit",
                      "--repeats", "1")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    doc = json.loads(path.read_text())
    fit = doc["nets"]["lo"]["fit"]
    assert doc["format"] == OVERHEADS_FORMAT
    assert "horovodrun -np 2 hvd-overlap calibrate" in doc["command"]
    # both cycles were measured in the one job: the short one, then the job's own
    assert doc["nets"]["lo"]["short_cycle"]["cycle_time_ms"] == "0.1"
    assert doc["nets"]["lo"]["default_cycle"]["cycle_time_ms"] is None
    for key in ("overhead_s", "cycle_period_s", "bandwidth", "reduce_scatter_bandwidth",
                "allgather_bandwidth", "alltoall_gather_bandwidth"):
        assert 0 < fit[key] < float("inf"), key
    assert "run it at another rank count too" in proc.stdout


def test_calibrate_refuses_a_file_that_is_not_a_calibration_on_every_rank(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"format": "hvd-overlap-profile/1"}))
    proc = _calibrate(2, "--json", str(path), "--repeats", "1", timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode not in (0, 124), out[-3000:]
    assert out.count("not a calibration file") >= 2, out[-3000:]  # both ranks say it
    assert json.loads(path.read_text()) == {"format": "hvd-overlap-profile/1"}  # untouched


def test_calibrate_needs_two_ranks(tmp_path):
    res = subprocess.run([str(HVD_OVERLAP), "calibrate", "--json", str(tmp_path / "c.json")],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert res.returncode == 2 and "horovodrun -np N" in res.stderr, res.stderr[-2000:]
    res = CliRunner().invoke(main, ["calibrate", "--json", "c.json", "--link", "fast"])
    assert res.exit_code == 2 and "--link 'fast'" in res.output
