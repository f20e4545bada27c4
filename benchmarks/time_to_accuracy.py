"""``python -m benchmarks time-to-accuracy``: wall time until a target test accuracy, stock
Horovod against the plugin, each with the small batch and with batch growth.

The batch-growth study's task (digits, SGD with momentum, 24 epochs, small global batch 32,
growth x2 every 3 epochs to 512 with linear LR and a 50-step ramp) with a wider MLP (two
hidden layers, ``width`` wide), on 2 emulated hosts (``benchmarks.netns``). The link is set from the
measured compute-only step at the small batch (``regime.regime_rate``), so that stock's gradient
traffic takes ``regime`` times that step on the wire. Four configurations, each in a launch of
its own (``benchmarks.tta_worker``), interleaved seed by seed (the order rotates):
``stock-small``, ``stock-growth``, ``auto-small``, ``auto-growth`` (the plugin's
``strategy="auto"``, which chooses its plan again at each growth).

The target is the small-batch stock runs' mean final accuracy minus ``TARGET_DROP`` points; a
run's time to target is the wall time at the end of its first epoch whose test accuracy
reaches it (tracing, ``auto``'s settling and the per-epoch validation included).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.regime import regime_rate
from benchmarks.tta_task import CONFIGS, LOCAL, WIDTH, load, schedule

#: the target: the small-batch stock runs' mean final accuracy minus this many points
TARGET_DROP = 0.5
STOCK_SMALL = "stock-small"


def _launch(args: Sequence[str], rate: str | None, timeout: float,
            on_line: Callable[[str], None]) -> dict[str, Any]:
    """One ``tta_worker`` run on 2 emulated hosts (``rate``: None unshaped); rank 0's JSON."""
    from benchmarks.hostrun import run_on_hosts
    from benchmarks.netns import emulated_hosts

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        with emulated_hosts(2, rate) as hosts:
            code = run_on_hosts([sys.executable, "-m", "benchmarks.tta_worker", *args,
                                 "--out", str(out)], hosts, timeout=timeout, on_line=on_line)
        if code or not out.exists():
            raise RuntimeError(f"tta_worker {' '.join(args)} failed (exit code {code})")
        return json.loads(out.read_text())


def run(regime: float, seeds: Sequence[int], epochs: int, timeout: float,
        on_progress: Callable[[str], None], on_line: Callable[[str], None],
        width: int = WIDTH) -> dict[str, Any]:
    """Measure the compute-only step, set the link, run every configuration for every seed
    (``width``: the MLP's hidden layers)."""
    on_progress("compute-only step at the small batch (unshaped hosts, plain optimizer)")
    width_args = ["--width", str(width)]
    probe = _launch(["--config", LOCAL, "--epochs", str(epochs), *width_args], None, timeout,
                    on_line)
    rate = regime_rate(regime, probe["compute_step_s"], probe["grad_bytes"], 2)
    on_progress(f"compute-only {probe['compute_step_s'] * 1e3:.1f} ms, gradients "
                f"{probe['grad_bytes'] / 2**20:.1f} MiB: link {rate} for R = {regime}")
    runs: dict[str, list[dict]] = {c: [] for c in CONFIGS}
    for i, seed in enumerate(seeds):
        order = CONFIGS[i % len(CONFIGS):] + CONFIGS[:i % len(CONFIGS)]
        for config in order:
            on_progress(f"seed {seed}: {config}")
            got = _launch(["--config", config, "--seed", str(seed), "--epochs", str(epochs),
                           *width_args], rate, timeout, on_line)
            runs[config].append({"seed": seed, **got})
            last = got["epochs"][-1]
            on_progress(f"  {got['total_s']:.1f} s, accuracy {100 * last['val_accuracy']:.2f}"
                        f" %, {last['rounds']} rounds")
    return {"regime": regime, "rate": rate, "probe": probe, "seeds": list(seeds),
            "epochs": epochs, "runs": runs}


def width_of(result: dict[str, Any]) -> int:
    """The MLP's hidden width the runs trained (their worker's ``--width``; runs recorded
    before the option had the default)."""
    return result["runs"][STOCK_SMALL][0].get("config", {}).get("width", WIDTH)


def time_to(epochs: Sequence[dict], target: float) -> tuple[float, int] | None:
    """(wall s, rounds) at the end of the first epoch whose accuracy reaches ``target``."""
    for e in epochs:
        if e["val_accuracy"] >= target:
            return e["wall_s"], e["rounds"]
    return None


def _spread(values: Sequence[float]) -> tuple[float, float]:
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Per configuration: final accuracy, time and rounds to target (mean and sd over seeds;
    a run that never reached it counts as its total time and is counted in ``missed``), total
    time, and the ratio of stock-small's mean time to target over its own."""
    runs = result["runs"]
    target = statistics.mean(r["epochs"][-1]["val_accuracy"] for r in runs[STOCK_SMALL]) \
        - TARGET_DROP / 100
    rows: dict[str, dict[str, Any]] = {}
    for config, rs in runs.items():
        reached = [time_to(r["epochs"], target) for r in rs]
        times = [t[0] if t else r["total_s"] for t, r in zip(reached, rs, strict=True)]
        rows[config] = {
            "final_accuracy": _spread([100 * r["epochs"][-1]["val_accuracy"] for r in rs]),
            "time_to_target_s": _spread(times),
            "rounds_to_target": _spread([t[1] for t in reached if t] or [math.nan]),
            "missed": sum(t is None for t in reached),
            "total_s": _spread([r["total_s"] for r in rs]),
            "final_rounds": rs[0]["epochs"][-1]["rounds"],
            "plans": sorted({" / ".join(c["chosen"] for c in r.get("plan_choices", []))
                             for r in rs} - {""}),
        }
    base = rows[STOCK_SMALL]["time_to_target_s"][0]
    for row in rows.values():
        row["speedup"] = base / row["time_to_target_s"][0]
    return {"target": 100 * target, "rows": rows}


def markdown(result: dict[str, Any]) -> str:
    s = summarize(result)
    probe = result["probe"]
    lines = [
        f"Target: {s['target']:.2f} % (stock with the small batch, mean final accuracy, minus "
        f"{TARGET_DROP} points). MLP with two {width_of(result)}-wide hidden layers. "
        f"R = {result['regime']} at the small batch: compute-only "
        f"{probe['compute_step_s'] * 1e3:.1f} ms/step, {probe['grad_bytes'] / 2**20:.2f} MiB "
        f"of gradients, link {result['rate']}; seeds {', '.join(map(str, result['seeds']))}; "
        "mean ± sd.", "",
        "| run | time to target (s) | vs stock, small batch | final accuracy % | rounds to "
        "target | total (s) | `auto`'s plans |",
        "|---|---|---|---|---|---|---|"]
    for config, row in s["rows"].items():
        t, sd = row["time_to_target_s"]
        acc, acc_sd = row["final_accuracy"]
        rounds = row["rounds_to_target"][0]
        missed = f" ({row['missed']} missed)" if row["missed"] else ""
        lines.append(
            f"| {config} | {t:.1f} ± {sd:.1f}{missed} | {row['speedup']:.2f}x | {acc:.2f} ± "
            f"{acc_sd:.2f} | {rounds:.0f} | {row['total_s'][0]:.1f} | "
            f"{'; '.join(row['plans']) or '-'} |")
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    """Test accuracy against wall time, every run (one colour per configuration)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    target = summarize(result)["target"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for (config, rs), colour in zip(result["runs"].items(), ("C0", "C1", "C2", "C3"),
                                    strict=True):
        for k, r in enumerate(rs):
            ax.plot([e["wall_s"] for e in r["epochs"]],
                    [100 * e["val_accuracy"] for e in r["epochs"]], color=colour, alpha=0.8,
                    label=config if k == 0 else None)
    ax.axhline(target, color="grey", linestyle="--", linewidth=1, label="target")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_ylim(max(80.0, target - 10), 100)
    ax.set_title(f"digits, wide MLP, 2 emulated hosts at R = {result['regime']}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def mlp_profile(per_rank_batch: int, compute_s: float, width: int = WIDTH):
    """The experiment's MLP as a simulator profile: each dense layer's compute in proportion to
    its multiply-adds (backward twice the forward, once for the first layer), the whole scaled
    to the measured compute-only step."""
    from hvd_overlap.core.simulate import Layer, Profile

    shapes = [(64, width), (width, width), (width, 10)]
    layers = tuple(Layer(f"dense_{i}", n_in * n_out, n_in * n_out * (1 if i == 0 else 2),
                         4 * (n_in * n_out + n_out), tensors=2, dense=(n_in, n_out))
                   for i, (n_in, n_out) in enumerate(shapes))
    prof = Profile("tta-mlp", per_rank_batch, layers)
    return prof.scaled(compute_s / prof.compute_s)


def probe_inputs(probe: dict[str, Any]):
    """What the probe measured for the simulator: the compute-only step per per-rank batch and
    the overheads (each epoch's time outside its steps, the median over the batches; stock
    Horovod's first-epoch costs and its retrace at a new batch). Empty and zero for a probe of
    the small batch only (runs recorded before the probe measured more)."""
    from hvd_overlap.core.growth_time import Overheads

    batches = {int(b): v for b, v in probe.get("batches", {}).items()}
    if not batches:
        return {}, Overheads()
    traces = probe["stock_traces"]
    return ({b: v["compute_step_s"] for b, v in batches.items()},
            Overheads(statistics.median(v["epoch_overhead_s"] for v in batches.values()),
                      max(traces["first_s"], 0.0), max(traces["again_s"], 0.0)))


def prediction(result: dict[str, Any]) -> str:
    """The simulator's 2-rank prediction of the experiment beside what was measured: each
    configuration's median step per phase, and the time to its target epochs (each seed's),
    from the inputs taken before the runs in the probe's launch: the compute-only step at every
    batch of the schedule and each epoch's time outside its steps, stock Horovod's first-epoch
    costs and retrace (``tta_worker.stock_traces``), the link rate, the lab's 2-4-rank
    calibration on emulated hosts. Not predicted: ``auto``'s settling (its check's steps run
    at stock's speed; its link probe, about 0.4 s, is not counted)."""
    from benchmarks.validation import OVERHEADS_BY_RANKS, load_overheads, measured_cluster
    from hvd_overlap.core import growth_time

    runs, probe = result["runs"], result["probe"]
    config = runs[STOCK_SMALL][0]["config"]
    ranks = 2
    cluster = measured_cluster(result["rate"], ranks, load_overheads(OVERHEADS_BY_RANKS),
                               "hosts")
    profile = mlp_profile(config["small"] // ranks, probe["compute_step_s"], width_of(result))
    compute_at, overheads = probe_inputs(probe)
    phases = growth_time.parse_schedule(schedule(config))
    samples = len(load()[0])
    target = summarize(result)["target"] / 100
    measured_at = ",".join(f"{b}={v * 1e3:.1f}ms" for b, v in sorted(compute_at.items()))
    options = (f"`--growth {schedule(config)} --samples {samples}"
               + (f" --batch-compute {measured_at} --epoch-overhead "
                  f"{overheads.epoch_s * 1e3:.0f}ms --trace-overhead "
                  f"{overheads.trace_s * 1e3:.0f}ms,{overheads.again_s * 1e3:.0f}ms"
                  if compute_at else "") + "`")
    lines = [f"Predicted at {ranks} ranks (`hvd-overlap simulate` with {options}; "
             f"compute-only probe {probe['compute_step_s'] * 1e3:.2f} ms/step at the small "
             f"batch, link {result['rate']}, the lab's 2-4-rank calibration on emulated hosts), "
             "against the runs:", "",
             "| run | global batch | predicted compute ms | predicted step ms | "
             "measured step ms (median) | error |", "|---|---|---|---|---|---|"]
    times = {}
    for name, rs in runs.items():
        grown = "growth" in name
        sched = phases if grown else (growth_time.Phase(config["epochs"], config["small"]),)
        pts = growth_time.phase_times(profile, cluster, sched, samples, compute_at or None)
        times[name] = pts
        for pt in pts:
            measured = statistics.median(e["step_ms"] for r in rs for e in r["epochs"]
                                         if e["global_batch"] == pt.phase.batch)
            predicted = 1e3 * (pt.plugin_s if name.startswith("auto") else pt.stock_s)
            lines.append(f"| {name} | {pt.phase.batch} | {pt.compute_s * 1e3:.1f} | "
                         f"{predicted:.1f} | {measured:.1f} | {predicted / measured - 1:+.0%} |")
    lines += ["", "| run | target epochs (per seed) | predicted s | measured s | error | "
              "predicted s, steps only | measured s, steps only (median step x steps) |",
              "|---|---|---|---|---|---|---|"]
    for name, rs in runs.items():
        plugin = name.startswith("auto")
        epochs, pred, bare, meas, steps_only = [], [], [], [], []
        for r in rs:
            hit = next((i for i, e in enumerate(r["epochs"]) if e["val_accuracy"] >= target),
                       len(r["epochs"]) - 1)
            epochs.append(hit + 1)
            pred.append(growth_time.seconds_to_epoch(times[name], hit + 1, plugin, overheads))
            bare.append(growth_time.seconds_to_epoch(times[name], hit + 1, plugin))
            meas.append(r["epochs"][hit]["wall_s"])
            steps_only.append(sum(e["step_ms"] / 1e3 * (e["rounds"] - (r["epochs"][i - 1][
                "rounds"] if i else 0)) for i, e in enumerate(r["epochs"][:hit + 1])))
        p, m = statistics.mean(pred), statistics.mean(meas)
        lines.append(f"| {name} | {', '.join(map(str, epochs))} | {p:.1f} | {m:.1f} | "
                     f"{p / m - 1:+.0%} | {statistics.mean(bare):.1f} | "
                     f"{statistics.mean(steps_only):.1f} |")
    return "\n".join(lines) + "\n"
