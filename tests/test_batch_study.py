"""The batch-growth study's short variant (``scripts/batch-study --quick``) runs on 2 ranks with
the plugin and writes its table, raw results and plot; the rounds it reports are the optimizer
steps the batch schedule implies (issue 16)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

STUDY = Path(__file__).parent.parent / "examples" / "batch_growth_study.py"


def test_quick_study_runs_on_two_ranks_and_reports_rounds(tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_NUM_INTRAOP_THREADS": "1",
           "TF_NUM_INTEROP_THREADS": "2", "HOROVOD_STALL_CHECK_TIME_SECONDS": "20",
           "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "50"}
    horovodrun = Path(sys.executable).with_name("horovodrun")
    proc = subprocess.run(
        ["timeout", "--kill-after=10", "300", str(horovodrun), "-np", "2", "-H", "localhost:2",
         "--gloo", sys.executable, "-W", "ignore::DeprecationWarning", str(STUDY), "--quick",
         "--out", str(tmp_path)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    result = json.loads((tmp_path / "batch_growth.json").read_text())
    runs = {r["config"]: r for r in result["runs"]}
    assert result["args"]["strategy"] == "hybrid"
    assert sorted(runs) == ["growth", "large", "small"]
    # 1347 // 2 = 673 samples per rank; steps per epoch = 673 // per-rank batch
    assert runs["small"]["batch"] == [32] * 4 and runs["small"]["rounds_by_epoch"] == \
        [42, 84, 126, 168]
    assert runs["growth"]["batch"] == [32, 64, 128, 256]
    assert runs["growth"]["rounds_by_epoch"] == [42, 63, 73, 78]
    assert runs["large"]["rounds"] == 8
    # the large batch warms up from the small lr for 5 epochs (10 steps): still ramping at 4
    assert 0.04 < runs["large"]["lr"][-1] < 0.64
    assert runs["small"]["acc"][-1] > 0.8       # it learns: 4 epochs of small batches
    text = (tmp_path / "batch_growth_study.md").read_text()
    assert "| growth | 32 → 64 → 128 → 256 |" in text
    assert (tmp_path / "batch_growth.png").stat().st_size > 10_000
