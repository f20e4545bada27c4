"""The dense factor exchange's docs table over several bench runs (``scripts/exchange-bench``):

    python -m benchmarks exchange-results OUT.md RUN.json [RUN.json ...]

Per run: the ratios to stock and to plain ``sharded``, the bytes rank 0 sent per step (from the
Horovod timeline), each round's step times (the spread is this machine's noise), and the command.
"""

from __future__ import annotations

from typing import Any

from benchmarks import report
from benchmarks.config import LOCAL, STOCK
from benchmarks.results import ratio_table

SHARDED = "sharded"


def _sent(m: dict[str, Any]) -> str:
    sent = (m.get("sent_bytes_per_rank") or {}).get("all")
    return "-" if not sent else f"{sent / 2**20:.1f}"


def _link(m: dict[str, Any]) -> str:
    link = m.get("link_bytes_per_rank")
    return "-" if link is None else f"{link / 2**20:.1f}"


def markdown(runs: list[dict[str, Any]]) -> str:
    """Ratios to stock, then per run and strategy: vs sharded, MiB sent, rounds."""
    lines = ["# The dense factor exchange, measured", "",
             "Regenerate with `scripts/exchange-bench` (2 ranks, each pinned to its own core; "
             "`stock` is real `hvd.DistributedOptimizer` in processes that never imported the "
             "plugin; `local` the compute-only bound; `+exchange`: `exchange=\"auto\"`, "
             "`+gather`: `exchange_forward=\"gather\"`, `+rows`: `exchange_forward=\"rows\"`, "
             "`+alltoall`: `gather_with=\"alltoall\"`). Runs made before `exchange_forward` "
             "existed (every JSON without a `sharded+exchange+gather` entry) measured the "
             "gather under the name `sharded+exchange`; since then `+exchange` alone lets "
             "`exchange_forward=\"auto\"` choose, and on mlp it chooses the rows.", "",
             "Ratios to stock Horovod (its step time / the strategy's; > 1 is faster):", "",
             ratio_table(runs),
             "Per strategy: step time (median of the rounds), ratio to plain `sharded` in the "
             "same run, MiB rank 0 sent per step (Horovod timeline: each collective's logged "
             "size x its algorithm's share; an alltoall's size is not logged, so it is missing), "
             "MiB rank 0's link sent per step (the interface counters: everything, alltoalls "
             "and TCP/IP headers included; older runs did not record it) and every "
             "round's step time:", "",
             "| model | network | batch/rank | strategy | step ms | vs stock | vs sharded | "
             "sent MiB | link MiB | rounds (ms) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        c, s = run["raw"]["config"], run["strategies"]
        base = s.get(SHARDED, {}).get("step_time_s")
        for name, m in s.items():
            t = m["step_time_s"]
            vs_sharded = "-" if not base or name in (STOCK, LOCAL) else f"{base / t:.2f}x"
            ratio = m["ratio_to_stock"]
            rounds = ", ".join(f"{x * 1e3:.0f}" for x in m["round_step_times_s"])
            lines.append(f"| {c['model']} | {report.net_label(c)} | {c['batch_size']} | {name} | "
                         f"{t * 1e3:.0f} | {'-' if ratio is None else f'{ratio:.2f}x'} | "
                         f"{vs_sharded} | {'-' if name == LOCAL else _sent(m)} | "
                         f"{'-' if name == LOCAL else _link(m)} | {rounds} |")
    lines += ["", "Runs:", ""]
    for run in runs:
        lines += [f"- {report.headline(run['raw'])}", f"  `{run.get('command', '?')}`"]
    return "\n".join(lines) + "\n"
