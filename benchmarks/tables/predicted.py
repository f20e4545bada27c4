"""The simulator's predictions the docs show, kept as result files.

Each prediction is a list of ``hvd-overlap simulate`` runs whose JSON outputs are stored
together in ``benchmarks/results/predictions/NAME.json`` with the date, the commit and the
command that made them (``python -m benchmarks.tables --predict NAME`` runs them again). The
tables are drawn from those files, never by running the simulator: a change to the simulator
shows in the docs only when its predictions are made again and committed.
"""

from __future__ import annotations

import contextlib
import io
import json
import shlex
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.tables.sources import RESULTS, now_meta

PREDICTIONS = RESULTS / "predictions"

FLOPS = ("vgg16", "resnet50")
H200 = ("vgg16-h200", "vgg16-h200-amp", "resnet50-h200", "resnet50-h200-amp")
CLUSTERS = {"10gbit": "50us", "25gbit": "10us", "100gbit": "5us", "400gbit": "2us"}
WHOLE = "horovod,layerwise,deferred,hybrid,sharded,sharded_hybrid"
EXCHANGE = ("horovod,sharded,sharded+exchange,sharded_hybrid,sharded_hybrid+exchange,"
            "sharded+exchange+shard=dense")
CALIBRATION = ["--calibration", "benchmarks/profiles/overheads-gloo-2to4ranks.json",
               "--calibration-net", "1gbit hosts"]

#: name -> the ``hvd-overlap simulate`` argument lists whose outputs it keeps
RUNS: dict[str, list[list[str]]] = {
    "exchange_flops": [
        [*FLOPS, "--np", "8,32,128,512", "--bandwidth", "10gbit", "--latency", "50us",
         "--strategies", EXCHANGE],
        [*FLOPS, "--np", "8,32,128,512", "--bandwidth", "25gbit", "--latency", "10us",
         "--strategies", EXCHANGE]],
    "exchange_calibrated": [
        [*FLOPS, "--np", "8,32,128,512", "--bandwidth", "10gbit", "--latency", "50us",
         "--strategies", EXCHANGE, *CALIBRATION],
        [*FLOPS, "--np", "8,32,128,512", "--bandwidth", "25gbit", "--latency", "10us",
         "--strategies", EXCHANGE, *CALIBRATION]],
    "h200": [[*H200, "--np", "8,128", "--bandwidth", bw, "--latency", lat, "--strategies",
              "horovod,sharded,sharded+exchange,sharded_hybrid+exchange,auto"]
             for bw, lat in CLUSTERS.items()],
    "horovod512": [
        ["resnet101", "vgg16", "--np", "512", "--bandwidth", "25gbit", "--latency", "10us",
         "--strategies", WHOLE],
        ["resnet101", "vgg16", "--np", "512", "--bandwidth", "25gbit", "--latency", "10us",
         "--strategies", WHOLE, "--bucket-mb", "32"],
        ["vgg16", "--np", "512", "--bandwidth", "25gbit", "--latency", "10us",
         "--strategies", WHOLE, "--device-tflops", "8"],
        ["resnet101", "vgg16", "--np", "512", "--bandwidth", "25gbit", "--latency", "25us",
         "--strategies", "horovod"],
        ["resnet101", "vgg16", "--np", "512", "--bandwidth", "25gbit", "--latency", "10us",
         "--strategies", "horovod", "--cycle-ms", "5", "--fusion-mb", "64"],
        ["resnet101", "vgg16", "--np", "512", "--bandwidth", "25gbit", "--latency", "10us",
         "--strategies", "horovod", "--negotiation-growth", "linear"]],
    "typical": [["resnet50", "vgg16", "--np", "64,512", "--bandwidth", bw, "--latency", lat,
                 "--strategies", f"{WHOLE},auto"]
                for bw, lat in (("10gbit", "50us"), ("25gbit", "10us"), ("100gbit", "2us"))],
}

#: ``auto-grid``'s grid (``python -m benchmarks auto-grid``): families of ``autoplan.choose``
GRID = {"profiles": ("vgg16", "resnet50", "resnet101"), "ranks": "2-512",
        "bandwidths": ("1gbit", "10gbit", "25gbit", "100gbit"),
        "latencies": ("2us", "10us", "50us"), "families": ("every", "whole", "sharded")}


def _simulate(args: Sequence[str]) -> dict[str, Any]:
    """One ``hvd-overlap simulate ARGS --json`` run, in this process; its JSON."""
    from hvd_overlap.tools.simulate_command import simulate

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        with contextlib.redirect_stdout(io.StringIO()):
            simulate.main([*args, "--json", str(out)], standalone_mode=False)
        return json.loads(out.read_text())


def _grid() -> list[dict[str, Any]]:
    """``auto-grid``'s points, every family: what auto picks and its predicted speed-up."""
    from benchmarks.validation import lab_profile
    from hvd_overlap.core import autoplan
    from hvd_overlap.tools.simulate_report import cluster_from_options, parse_ranks

    profiles = {n: lab_profile(n) for n in GRID["profiles"]}
    points = []
    for family in GRID["families"]:
        for pt in autoplan.grid(profiles, parse_ranks(GRID["ranks"]), GRID["bandwidths"],
                                GRID["latencies"], cluster_from_options, family):
            points.append({"family": family, "model": pt.model, "ranks": pt.ranks,
                           "bandwidth": pt.bandwidth, "latency": pt.latency,
                           "pick": pt.choice.best.strategy,
                           "speedup_vs_stock": pt.choice.speedup})
    return points


def predict(name: str) -> Path:
    """Make prediction ``name`` again and write its file; returns the path."""
    meta = {**now_meta(), "stack": "hvd-overlap's simulator (pure Python, no TensorFlow)",
            "machine": "none: predicted, not measured"}
    if name == "auto_grid":
        data: dict[str, Any] = {"meta": {**meta, "command": "python -m benchmarks auto-grid "
                                          "--family every|whole|sharded"},
                                "grid": {k: list(v) if isinstance(v, tuple) else v
                                         for k, v in GRID.items()},
                                "points": _grid()}
    else:
        data = {"meta": meta, "runs": [
            {"command": "hvd-overlap simulate " + shlex.join(args), "result": _simulate(args)}
            for args in RUNS[name]]}
    path = PREDICTIONS / f"{name}.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


NAMES = (*RUNS, "auto_grid")


# --- reading the files ----------------------------------------------------------------------

def load(name: str) -> dict[str, Any]:
    return json.loads((PREDICTIONS / f"{name}.json").read_text())


def results(name: str) -> list[dict[str, Any]]:
    """Every (profile, ranks, strategy) result of prediction ``name``, flattened, each with
    its run's ``command``, cluster and profile fields, and the ``auto`` pick where there is
    one."""
    rows = []
    for run in load(name)["runs"]:
        res, cluster = run["result"], run["result"]["cluster"]
        for path, prof in res["profiles"].items():
            picks = {a["ranks"]: a for a in prof["auto"]}
            for r in prof["results"]:
                rows.append({**r, "profile": path, "model": prof["model"],
                             "batch": prof["batch_size"], "profile_compute_s": prof["compute_s"],
                             "bandwidth": cluster["bandwidth"], "latency": cluster["latency"],
                             "bucket_bytes": cluster["bucket_bytes"],
                             "command": run["command"],
                             "pick": picks.get(r["ranks"]) if r["strategy"] == "auto" else None})
    return rows


def find(rows: list[dict[str, Any]], **want: Any) -> dict[str, Any]:
    """The one row whose fields equal ``want``."""
    hits = [r for r in rows if all(r.get(k) == v for k, v in want.items())]
    if len(hits) != 1:
        raise KeyError(f"{len(hits)} predicted rows match {want}")
    return hits[0]


MODEL_NAMES = {"vgg16": "VGG-16", "resnet50": "ResNet-50", "resnet101": "ResNet-101"}
LINKS = {1.25e9: "10 GbE", 3.125e9: "25 GbE", 1.25e10: "100 Gb/s", 5e10: "400 Gb/s"}


def cluster_label(row: dict[str, Any]) -> str:
    """``10 GbE, 50 us``: the link per rank and the latency per hop."""
    link = LINKS.get(row["bandwidth"], f"{row['bandwidth'] * 8 / 1e9:g} Gbit/s")
    return f"{link}, {row['latency'] * 1e6:.0f} us"


def model_label(row: dict[str, Any], precision: bool = False) -> str:
    """``VGG-16 (b32)``, with ``fp32``/``AMP`` for measured GPU profiles."""
    name = row["model"].removesuffix("-amp").removesuffix("-h200")
    base = f"{MODEL_NAMES.get(name, name)} (b{row['batch']})"
    if not precision:
        return base
    return f"{base} {'AMP' if row['profile'].endswith('-amp') else 'fp32'}"


def pick_label(pick: dict[str, Any] | None) -> str:
    """auto's pick as ``sharded, 16 MiB, exchange (rows), dense only``."""
    if not pick or pick["strategy"] == "horovod":
        return "stock's fusion"
    parts = [pick["strategy"]]
    if pick.get("bucket_bytes"):
        parts.append(f"{pick['bucket_bytes'] / 2**20:g} MiB")
    if pick.get("defer") is not None:
        parts.append(f"defer {pick['defer']}")
    if pick.get("exchange"):
        parts.append(f"exchange ({pick.get('exchange_forward') or 'auto'})")
    if pick.get("shard") == "dense":
        parts.append("dense only")
    return ", ".join(parts)


def speedup(rows: list[dict[str, Any]], row: dict[str, Any]) -> float:
    """Predicted stock step / this row's, stock from the same run, profile and ranks."""
    stock = find(rows, command=row["command"], profile=row["profile"], ranks=row["ranks"],
                 strategy="horovod")
    return stock["step_s"] / row["step_s"]


def regime(rows: list[dict[str, Any]], row: dict[str, Any]) -> float:
    """R: predicted stock wire time per step / the profile's compute-only step."""
    stock = find(rows, command=row["command"], profile=row["profile"], ranks=row["ranks"],
                 strategy="horovod")
    return stock["wire_s"] / row["profile_compute_s"]


def grid_summary(points: list[dict[str, Any]], family: str) -> list[dict[str, Any]]:
    """Per model, for one family: min / median / max speed-up, how often stock is kept, the
    picks by count (as ``autoplan.grid_markdown``)."""
    out = []
    for model in dict.fromkeys(p["model"] for p in points):
        mine = [p for p in points if p["model"] == model and p["family"] == family]
        speed = [p["speedup_vs_stock"] for p in mine]
        picks: dict[str, int] = {}
        for p in mine:
            picks[p["pick"]] = picks.get(p["pick"], 0) + 1
        out.append({"model": model, "n": len(mine), "min": min(speed),
                    "median": statistics.median(speed), "max": max(speed),
                    "stock": picks.get("horovod", 0),
                    "picks": sorted(picks.items(), key=lambda kv: -kv[1])})
    return out


# --- the tables -------------------------------------------------------------------------------

def _x(value: float, bold: bool = False) -> str:
    return f"**{value:.2f}x**" if bold else f"{value:.2f}x"


def _efficiency(value: float, bold: bool = False) -> str:
    return f"**{value:.2f}**" if bold else f"{value:.2f}"


EXCHANGE_ROWS = (("10gbit", "vgg16", 8), ("10gbit", "vgg16", 32), ("10gbit", "vgg16", 128),
                 ("10gbit", "vgg16", 512), ("25gbit", "vgg16", 128), ("10gbit", "resnet50", 8))
EXCHANGE_COLUMNS = ("sharded", "sharded+exchange", "sharded_hybrid", "sharded_hybrid+exchange",
                    "sharded+exchange+shard=dense")


def _at(rows: list[dict[str, Any]], bw: str, profile: str, ranks: int, strategy: str
        ) -> dict[str, Any]:
    """The row of the run made with ``--bandwidth bw``."""
    return find([r for r in rows if f"--bandwidth {bw} " in r["command"]], profile=profile,
                ranks=ranks, strategy=strategy)


def exchange_flops() -> str:
    """Speed-up over stock of the sharded plans with and without the exchange (FLOPs profiles
    at 6 TFLOP/s, the default cluster costs), and the bytes one rank sends per step."""
    rows = results("exchange_flops")
    lines = ["| cluster | model | ranks | " + " | ".join(EXCHANGE_COLUMNS)
             + " | sent MiB/rank: sharded, +exchange |", "|---|---|---|" + "---|" * 6]
    for bw, profile, ranks in EXCHANGE_ROWS:
        cells = [_at(rows, bw, profile, ranks, s) for s in EXCHANGE_COLUMNS]
        ups = [speedup(rows, c) for c in cells]
        best = max(ups)
        sharded, exchanged = cells[0], cells[1]
        lines.append(f"| {cluster_label(cells[0])} | {model_label(cells[0])} | {ranks} | "
                     + " | ".join(_x(u, u == best and u > 1.05) for u in ups)
                     + f" | {sharded['wire_bytes'] / 2**20:.0f}, "
                       f"{exchanged['wire_bytes'] / 2**20:.0f} |")
    return "\n".join(lines)


def exchange_calibrated() -> str:
    """The same, the default cluster costs against the 2-4-rank calibration's (assumed /
    calibrated), and stock's step."""
    flops, cal = results("exchange_flops"), results("exchange_calibrated")
    names = ("sharded", "sharded+exchange", "sharded_hybrid+exchange",
             "sharded+exchange+shard=dense")
    lines = ["| cluster | model | ranks | " + " | ".join(names) + " | stock ms |",
             "|---|---|---|" + "---|" * 5]
    for bw, profile, ranks in EXCHANGE_ROWS:
        cells = [f"{speedup(flops, _at(flops, bw, profile, ranks, s)):.2f}x / "
                 f"{speedup(cal, _at(cal, bw, profile, ranks, s)):.2f}x" for s in names]
        a, c = (_at(r, bw, profile, ranks, "horovod") for r in (flops, cal))
        lines.append(f"| {cluster_label(a)} | {model_label(a)} | {ranks} | " + " | ".join(cells)
                     + f" | {a['step_s'] * 1e3:.0f} / {c['step_s'] * 1e3:.0f} |")
    return "\n".join(lines)


def h200(profiles: tuple[str, ...] = ("vgg16-h200", "resnet50-h200"),
         clusters: tuple[str, ...] = tuple(CLUSTERS), columns: bool = True,
         ranks_at: tuple[int, ...] = (8, 128)) -> str:
    """On compute measured on an H200: R, stock's step, the sharded plans and what auto would
    pick, as speed-ups over stock."""
    rows = results("h200")
    names = ("sharded", "sharded+exchange", "sharded_hybrid+exchange") if columns else ()
    lines = ["| cluster | model | ranks | R | stock ms | " + "".join(f"{n} | " for n in names)
             + "`auto` (its pick) |", "|---|---|---|---|---|" + "---|" * (len(names) + 1)]
    for bw in clusters:
        for profile in profiles:
            for ranks in ranks_at:
                stock = _at(rows, bw, profile, ranks, "horovod")
                auto = _at(rows, bw, profile, ranks, "auto")
                lines.append(
                    f"| {cluster_label(stock)} | {model_label(stock, precision=True)} | {ranks} "
                    f"| {regime(rows, stock):.1f} | {stock['step_s'] * 1e3:.0f} | "
                    + "".join(f"{_x(speedup(rows, _at(rows, bw, profile, ranks, n)))} | "
                              for n in names)
                    + f"{_x(speedup(rows, auto))} ({pick_label(auto['pick'])}) |")
    return "\n".join(lines)


def readme_at_scale() -> str:
    """The README's predicted table: VGG-16 and ResNet-50 on H200 compute, 128 ranks on
    25 GbE and on 100 Gb/s."""
    return h200(clusters=("25gbit", "100gbit"), columns=False, ranks_at=(128,))


PUBLISHED = {"resnet101": 0.90, "vgg16": 0.68}


def horovod512_published() -> str:
    """Stock Horovod's predicted efficiency at 512 GPUs against Horovod's published figure,
    and how the prediction moves with the assumptions."""
    rows = results("horovod512")
    cmds = [run["command"] for run in load("horovod512")["runs"]]

    def eff(profile: str, run: int) -> str:
        hits = [r for r in rows if r["command"] == cmds[run] and r["profile"] == profile
                and r["strategy"] == "horovod"]
        return f"{hits[0]['efficiency']:.2f}" if hits else "-"

    lines = ["| stock Horovod at 512 GPUs, 25 Gbit/s | published | predicted | 25 us per hop | "
             "2018's defaults (5 ms cycle, 64 MiB fusion) | coordination linear in P | "
             "8 TFLOP/s |", "|---|---|---|---|---|---|---|"]
    for profile, label in (("resnet101", "ResNet-101, 64/GPU"), ("vgg16", "VGG-16, 32/GPU")):
        lines.append(f"| {label} | {PUBLISHED[profile]:.2f} | **{eff(profile, 0)}** | "
                     f"{eff(profile, 3)} | {eff(profile, 4)} | {eff(profile, 5)} | "
                     f"{eff(profile, 2)} |")
    return "\n".join(lines)


def horovod512_plugin() -> str:
    """Every whole-state and sharded strategy's predicted efficiency at 512 GPUs, 25 Gbit/s,
    best in bold."""
    rows = results("horovod512")
    cmds = [run["command"] for run in load("horovod512")["runs"]]
    names = WHOLE.split(",")
    lines = ["| 512 GPUs, 25 Gbit/s, 10 us | " + " | ".join(names) + " |",
             "|---|" + "---|" * len(names)]
    for profile, run, label in (("resnet101", 0, "ResNet-101, 4 MiB buckets (default)"),
                                ("resnet101", 1, "ResNet-101, 32 MiB buckets"),
                                ("vgg16", 0, "VGG-16, 4 MiB buckets (default)"),
                                ("vgg16", 1, "VGG-16, 32 MiB buckets"),
                                ("vgg16", 2, "VGG-16 at 8 TFLOP/s, 4 MiB buckets")):
        effs = [find(rows, command=cmds[run], profile=profile, strategy=n)["efficiency"]
                for n in names]
        best = max(effs)
        lines.append(f"| {label} | " + " | ".join(_efficiency(e, e == best) for e in effs)
                     + " |")
    return "\n".join(lines)


def typical(names: tuple[str, ...] = tuple(WHOLE.split(",")), with_ms: bool = True,
            auto: bool = False) -> str:
    """Predicted efficiency (and step ms) of the strategies on typical clusters, FLOPs
    profiles at 6 TFLOP/s, the plugin's default 4 MiB buckets; best in bold."""
    rows = results("typical")
    head = "| cluster | ranks | model | " + " | ".join(names) + (" | `auto` (its pick)" if auto
                                                                 else "") + " |"
    lines = [head, "|---|---|---|" + "---|" * (len(names) + auto)]
    for run in load("typical")["runs"]:
        for profile in ("resnet50", "vgg16"):
            for ranks in (64, 512):
                cells = [find(rows, command=run["command"], profile=profile, ranks=ranks,
                              strategy=n) for n in names]
                best = max(c["efficiency"] for c in cells)
                text = [_efficiency(c["efficiency"], c["efficiency"] == best)
                        + (f" ({c['step_s'] * 1e3:.0f})" if with_ms else "") for c in cells]
                if auto:
                    a = find(rows, command=run["command"], profile=profile, ranks=ranks,
                             strategy="auto")
                    text.append(f"{a['efficiency']:.2f} ({pick_label(a['pick'])})")
                lines.append(f"| {cluster_label(cells[0])} | {ranks} | "
                             f"{model_label(cells[0])} | " + " | ".join(text) + " |")
    return "\n".join(lines)


def simulator_typical() -> str:
    return typical(("horovod", "layerwise", "hybrid", "sharded"), with_ms=False, auto=True)


FAMILIES = {"every": "every plan (`strategy=\"auto\"`)",
            "whole": "whole-state plans only (an optimizer that cannot be sharded)",
            "sharded": "sharded plans only (`sharded`, `bucket_bytes=\"auto\"`)"}


def auto_grid() -> str:
    """auto's predicted speed-up over stock across the grid, per model and family."""
    d = load("auto_grid")
    lines = ["| model | chooses among | clusters | auto / stock: min | median | max | keeps "
             "stock | picks |", "|---|---|---|---|---|---|---|---|"]
    for family, label in FAMILIES.items():
        for s in grid_summary(d["points"], family):
            name = MODEL_NAMES.get(s["model"], s["model"])
            lines.append(f"| {name} | {label} | {s['n']} | {s['min']:.3f}x | "
                         f"{s['median']:.3f}x | {s['max']:.2f}x | {s['stock']} of {s['n']} | "
                         + ", ".join(f"{k} {v}" for k, v in s["picks"]) + " |")
    return "\n".join(lines)
