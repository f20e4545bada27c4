"""The measured grid of ``strategy="auto"`` (``scripts/auto-bench``):

    python -m benchmarks auto-results OUT.md RUN.json [RUN.json ...]

Each RUN.json is a ``python -m benchmarks bench --json`` file with ``auto`` among its strategies.
Per run: auto's step time against real stock Horovod's and against the best fixed strategy of the
same run (stock included), with a 90% bootstrap interval of each ratio (rounds resampled, then steps
within them: how far this machine's noise lets the figure move), and what auto chose in each round.
A run that also measured ``stock#2`` (a second, independent stock entry) shows stock / stock#2: the
same code against itself, the ratio this machine cannot resolve. A run's ``source`` (its JSON
file as a link from the page; ``python -m benchmarks auto-results`` sets it) is its last cell:
when and how it was measured are in that file, not on the page.
"""

from __future__ import annotations

import random
import statistics
from typing import Any

from benchmarks import report
from benchmarks.config import AUTO, LOCAL, REPLICA, STOCK

#: the A/A control: a second stock entry
STOCK_AGAIN = f"{STOCK}{REPLICA}2"


def row(run: dict[str, Any]) -> dict[str, Any]:
    """One run's figures: step times (s), the best fixed strategy (replicas not counted: a
    second draw of one strategy would favour it), auto's ratios and picks, the A/A control."""
    s, raw = run["strategies"], run["raw"]
    fixed = {n: m["step_time_s"] for n, m in s.items()
             if n not in (AUTO, LOCAL) and REPLICA not in n}
    best = min(fixed, key=lambda n: fixed[n])
    auto = s[AUTO]["step_time_s"]
    aa = STOCK_AGAIN in s
    return {"config": raw["config"], "local": s.get(LOCAL, {}).get("step_time_s"),
            "stock": fixed[STOCK], "wire": s[STOCK].get("wire_s"), "best": best,
            "best_s": fixed[best], "auto": auto, "vs_stock": fixed[STOCK] / auto,
            "vs_best": fixed[best] / auto,
            "vs_stock_rounds": round_ratios(raw, STOCK, AUTO),
            "vs_stock_interval": ratio_interval(raw, STOCK, AUTO),
            "vs_best_interval": ratio_interval(raw, best, AUTO),
            "picks": [p["choice"] for p in raw.get("auto_choices", [])],
            "settle_steps": [p["steps"] for p in raw.get("auto_choices", [])],
            "control": fixed[STOCK] / s[STOCK_AGAIN]["step_time_s"] if aa else None,
            "control_interval": ratio_interval(raw, STOCK, STOCK_AGAIN) if aa else None,
            "source": run.get("source")}


def round_ratios(raw: dict[str, Any], reference: str, strategy: str) -> list[float]:
    """``reference``'s step / ``strategy``'s in each round (each the median of the round's
    steps, ranks averaged): how much the ratio moves from round to round. Empty without
    ``step_means``."""
    means = raw.get("step_means") or {}
    return [statistics.median(a) / statistics.median(b)
            for a, b in zip(means.get(reference, []), means.get(strategy, []), strict=False)
            if a and b]


def ratio_interval(raw: dict[str, Any], reference: str, strategy: str, level: float = 0.9,
                   draws: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """A ``level`` bootstrap interval of ``reference``'s step / ``strategy``'s (each the median
    of its pooled steps, as ``report.step_time``): each draw resamples each strategy's rounds
    with replacement, then the steps within every drawn round (a round's launches share a
    machine state, so rounds are the unit that varies most). None without ``step_means``."""
    means = raw.get("step_means") or {}
    a = [r for r in means.get(reference) or [] if r]
    b = [r for r in means.get(strategy) or [] if r]
    if not a or not b:
        return None
    rng = random.Random(seed)

    def draw(rounds: list[list[float]]) -> float:
        picked = [rng.choice(rounds) for _ in rounds]
        return statistics.median([rng.choice(r) for r in picked for _ in r])

    ratios = sorted(draw(a) / draw(b) for _ in range(draws))
    tail = (1 - level) / 2
    return ratios[int(tail * (draws - 1))], ratios[int((1 - tail) * (draws - 1))]


def markdown(runs: list[dict[str, Any]]) -> str:
    """The grid table and its worst cases."""
    rows = [row(r) for r in runs]

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x * 1e3:.0f}"

    lines = [
        '# `strategy="auto"`, measured', "",
        "| model | network | batch/rank | local ms | stock ms | stock wire ms | best fixed "
        "(ms) | auto ms | auto / stock | 90% interval | per round | auto / best fixed | "
        "90% interval | auto's pick per round | A/A: stock / stock#2 (90% interval) | "
        "raw data |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["config"]
        counts = {p: r["picks"].count(p) for p in dict.fromkeys(r["picks"])}
        picks = "; ".join(f"{p} ({n}/{len(r['picks'])})" for p, n in counts.items()) or "-"
        lines.append(
            f"| {c['model']} | {report.net_label(c)} | {c['batch_size']} | {ms(r['local'])} | "
            f"{ms(r['stock'])} | {ms(r['wire'])} | {r['best']} ({ms(r['best_s'])}) | "
            f"{ms(r['auto'])} | {r['vs_stock']:.2f}x | {_span(r['vs_stock_interval'])} | "
            f"{', '.join(f'{x:.2f}' for x in r['vs_stock_rounds']) or '-'} | "
            f"{r['vs_best']:.2f}x | {_span(r['vs_best_interval'])} | {picks} | "
            f"{_control(r)} | {_source(r['source'])} |")
    if rows:
        worst_stock = min(rows, key=lambda r: r["vs_stock"])
        worst_best = min(rows, key=lambda r: r["vs_best"])
        lines += ["", f"Lowest auto / stock: {worst_stock['vs_stock']:.2f}x "
                      f"({_where(worst_stock)}); lowest auto / best fixed: "
                      f"{worst_best['vs_best']:.2f}x ({_where(worst_best)}); runs with auto "
                      f">= 0.98x stock: {sum(r['vs_stock'] >= 0.98 for r in rows)} of "
                      f"{len(rows)}; within 3% of the best fixed: "
                      f"{sum(r['vs_best'] >= 0.97 for r in rows)} of {len(rows)}. Of the "
                      f"others, the 90% interval still reaches the bar in "
                      f"{_reaching(rows, 'vs_stock', 0.98)} (stock) and "
                      f"{_reaching(rows, 'vs_best', 0.97)} (best fixed): short of it by less "
                      "than this machine's noise resolves."]
        controls = [r for r in rows if r["control"] is not None]
        if controls:
            low = min(controls, key=lambda r: r["control"])
            high = max(controls, key=lambda r: r["control"])
            lines += ["", f"A/A control (stock / stock#2, the same code in two entries): "
                          f"{low['control']:.2f}x ({_where(low)}) to {high['control']:.2f}x "
                          f"({_where(high)}); below 0.98x in "
                          f"{sum(r['control'] < 0.98 for r in controls)} of {len(controls)} "
                          "runs: how often identical code misses a 0.98x bar on this machine."]
    return "\n".join(lines) + "\n"


def _source(source: str | None) -> str:
    return "-" if not source else f"[{source.rsplit('/', 1)[-1]}]({source})"


def _control(r: dict[str, Any]) -> str:
    if r["control"] is None:
        return "-"
    return f"{r['control']:.2f}x ({_span(r['control_interval'])})"


def _span(interval: tuple[float, float] | None) -> str:
    return "-" if interval is None else f"{interval[0]:.2f}-{interval[1]:.2f}"


def _reaching(rows: list[dict[str, Any]], key: str, bar: float) -> str:
    """'k of n': of the rows below ``bar``, how many have an interval whose top reaches it."""
    below = [r for r in rows if r[key] < bar]
    reach = [r for r in below if r[f"{key}_interval"] and r[f"{key}_interval"][1] >= bar]
    return f"{len(reach)} of {len(below)}"


def _where(r: dict[str, Any]) -> str:
    c = r["config"]
    return f"{c['model']}, {report.net_label(c)}, {c['batch_size']}/rank"
