"""``python -m benchmarks time-to-accuracy``'s arithmetic on made-up runs: the target, each run's
time to it, the spread over seeds and the table (the launches themselves need root and minutes:
docs/time_to_accuracy.md says how they were run)."""

import pytest

from benchmarks import time_to_accuracy as tta


def _run(accs, wall=10.0, rounds=42, total=None, plans=()):
    epochs = [{"epoch": i, "wall_s": wall * (i + 1), "val_accuracy": a,
               "rounds": rounds * (i + 1), "global_batch": 32, "step_ms": 5.0}
              for i, a in enumerate(accs)]
    return {"epochs": epochs, "total_s": total or wall * len(accs),
            "plan_choices": [{"chosen": p} for p in plans]}


RESULT = {
    "regime": 2.0, "rate": "1000kbit", "seeds": [1, 2], "epochs": 3,
    "probe": {"compute_step_s": 0.005, "grad_bytes": 4 * 2**20},
    "runs": {
        "stock-small": [_run([0.90, 0.96, 0.970]), _run([0.91, 0.95, 0.980])],
        "stock-growth": [_run([0.90, 0.975, 0.976], wall=6.0), _run([0.9, 0.9, 0.9], wall=6.0)],
        "auto-small": [_run([0.97, 0.97, 0.97], wall=8.0, plans=["sharded"])] * 2,
        "auto-growth": [_run([0.80, 0.971, 0.98], wall=4.0, plans=["sharded", "horovod"])] * 2,
    }}


def test_time_to_target_is_the_first_epoch_reaching_it():
    epochs = RESULT["runs"]["stock-small"][0]["epochs"]
    assert tta.time_to(epochs, 0.96) == (20.0, 84)
    assert tta.time_to(epochs, 0.99) is None


def test_summary_target_spread_misses_and_speedups():
    s = tta.summarize(RESULT)
    assert s["target"] == pytest.approx(97.5 - 0.5)          # stock-small's mean final, -0.5
    rows = s["rows"]
    # stock-small: 0.970 reaches 0.970 at epoch 3 (30 s); 0.980 at epoch 3 too
    assert rows["stock-small"]["time_to_target_s"] == (30.0, 0.0)
    assert rows["stock-small"]["speedup"] == pytest.approx(1.0)
    # stock-growth: one run at 12 s, one never (counted as its 18 s total, and missed)
    assert rows["stock-growth"]["time_to_target_s"][0] == pytest.approx(15.0)
    assert rows["stock-growth"]["missed"] == 1
    assert rows["auto-small"]["time_to_target_s"] == (8.0, 0.0)
    assert rows["auto-growth"]["speedup"] == pytest.approx(30.0 / 8.0)
    assert rows["auto-growth"]["plans"] == ["sharded / horovod"]
    assert rows["auto-growth"]["final_accuracy"][0] == pytest.approx(98.0)


def test_markdown_has_one_row_per_configuration():
    text = tta.markdown(RESULT)
    assert "Target: 97.00 %" in text and "link 1000kbit" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "x |" in line]
    assert [r.split(" | ")[0] for r in rows] == ["| stock-small", "| stock-growth",
                                                 "| auto-small", "| auto-growth"]
    assert "(1 missed)" in text and "3.75x" in text


def test_schedule_in_the_simulators_syntax():
    config = {"small": 32, "factor": 16, "every": 3, "epochs": 24}
    assert tta.schedule(config) == "3x32,3x64,3x128,3x256,12x512"
    assert tta.schedule({**config, "epochs": 7}) == "3x32,3x64,1x128"


def test_prediction_beside_the_runs():
    from benchmarks.validation import OVERHEADS_BY_RANKS, load_overheads, measured_cluster
    from hvd_overlap.core.growth_time import Phase, phase_times

    config = {"small": 32, "factor": 2, "every": 1, "epochs": 3}
    grown = [dict(e, global_batch=b) for e, b in zip(_run([0.9, 0.975, 0.98])["epochs"],
                                                       (32, 64, 64), strict=True)]
    runs = {name: [{**r, "config": config} for r in rs] for name, rs in RESULT["runs"].items()}
    for name in ("stock-growth", "auto-growth"):
        runs[name] = [{**runs[name][0], "epochs": grown}]
    text = tta.prediction({**RESULT, "runs": runs})
    assert "`--growth 1x32,2x64 --samples 1347`" in text
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| stock")]
    batches = [(r[0], r[1]) for r in rows if len(r) == 6]
    assert batches == [("| stock-small", "32"), ("| stock-growth", "32"),
                       ("| stock-growth", "64")]
    cluster = measured_cluster("1000kbit", 2, load_overheads(OVERHEADS_BY_RANKS), "hosts")
    (pt,) = phase_times(tta.mlp_profile(16, 0.005), cluster, [Phase(3, 32)], 1347)
    assert f"| stock-small | 32 | 5.0 | {pt.stock_s * 1e3:.1f} | 5.0 |" in text
    # time to target: stock-small reaches 97 % in its 3rd epoch (both seeds): 3 epochs of steps
    bare = 3 * pt.epoch_s(False)
    assert f"| stock-small | 3, 3 | {bare:.1f} | 30.0 |" in text
    # a probe that measured every batch, the epochs' time outside the steps and stock's traces:
    # they reach the prediction
    probe = {**RESULT["probe"], "stock_traces": {"first_s": 2.0, "again_s": 0.5},
             "batches": {"16": {"compute_step_s": 0.005, "epoch_overhead_s": 0.1},
                         "32": {"compute_step_s": 0.006, "epoch_overhead_s": 0.3}}}
    text = tta.prediction({**RESULT, "runs": runs, "probe": probe})
    assert "--batch-compute 16=5.0ms,32=6.0ms --epoch-overhead 200ms --trace-overhead " \
        "2000ms,500ms`" in text
    assert f"| stock-small | 3, 3 | {bare + 3 * 0.2 + 2.0:.1f} | 30.0 |" in text
    assert "| stock-growth | 32 | 5.0 |" in text and "| stock-growth | 64 | 6.0 |" in text


def test_prediction_models_the_width_the_runs_trained():
    from benchmarks.validation import OVERHEADS_BY_RANKS, load_overheads, measured_cluster
    from hvd_overlap.core.growth_time import Phase, phase_times

    wide = tta.mlp_profile(16, 0.005, width=2048)
    assert wide.grad_bytes == 4 * (64 * 2048 + 2048 + 2048 * 2048 + 2048 + 2048 * 10 + 10)
    config = {"small": 32, "factor": 1, "every": 1, "epochs": 3, "width": 2048}  # no growth
    runs = {name: [{**r, "config": config} for r in rs] for name, rs in RESULT["runs"].items()}
    text = tta.prediction({**RESULT, "runs": runs})
    cluster = measured_cluster("1000kbit", 2, load_overheads(OVERHEADS_BY_RANKS), "hosts")
    (pt,) = phase_times(wide, cluster, [Phase(3, 32)], 1347)
    (narrow,) = phase_times(tta.mlp_profile(16, 0.005), cluster, [Phase(3, 32)], 1347)
    assert f"{pt.stock_s * 1e3:.1f}" != f"{narrow.stock_s * 1e3:.1f}"
    assert f"| stock-small | 32 | 5.0 | {pt.stock_s * 1e3:.1f} | 5.0 |" in text
    assert "two 2048-wide hidden layers" in tta.markdown({**RESULT, "runs": runs})
    assert "two 1024-wide hidden layers" in tta.markdown(RESULT)  # runs without --width
