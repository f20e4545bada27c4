"""From raw step times (``worker.run``) to the numbers, the table, the JSON and the plot.

Per strategy: ``step_time_s`` is the median over every timed step of every round of the step's
duration averaged over the ranks (``step_means``; results written before they were recorded:
the median over rounds of each round's mean step at its slowest rank). Why the median: on this
kind of shared 2-core machine a step now and then stalls for 100-800 ms in every strategy
alike, the compute-only one included, and a mean over 10 steps is decided by how many stalls it
caught. Why the ranks' mean of a step, not its slowest rank: ranks in lockstep see the same
total time, but one rank's step can end earlier and its next one last longer (it waits); the
slowest rank of each step would count that wait twice. ``mean_step_s`` keeps the median over
rounds of the mean step (slowest rank) beside it.
``samples_per_sec`` = global batch / step time; ``ratio_to_stock`` = the step time of real stock
Horovod (``stock``: ``hvd.DistributedOptimizer`` in processes that never imported the plugin) /
this one (> 1 is faster); ``efficiency`` = compute-only (``local``) step time / this one.
``bytes_per_step`` is the gradient bytes reduced per step: the sum of the model's trainable
variable sizes (0 for ``local``); a ring allreduce sends ``2 (P-1)/P`` times that per rank,
given as ``wire_bytes_per_rank``; ``sent_bytes_per_rank`` is what rank 0 really sent per step,
read from the timeline (each collective's logged input size times its algorithm's share, per
kind of collective and in ``all``; Horovod logs no size for an alltoall); ``link_bytes_per_rank``
is what rank 0's link really sent per timed step (the kernel's interface counters: everything,
alltoalls and TCP/IP headers included; on a shared shaped loopback its counter / ranks; None on
the plain loopback, which the host shares), the median over rounds. ``wire_s`` is the time the
gradient collectives really spent on the wire per step (from a Horovod timeline) and ``hidden``
= 1 - (step time - local step time) / ``wire_s``: the fraction of that communication time
hidden behind compute.

For ``sharded`` the two phases are split: ``reduce_scatter_hidden`` = 1 - (reduce-scatter wire
time after the step's last reduce-scatter was enqueued, i.e. after backprop) / its wire time;
``all_gather_hidden`` = 1 - (the rest of the exposed time) / the all-gathers' wire time (the
all-gathers are the only other communication, overlapping the next forward). Where the dense
factor exchange's collectives or whole buckets' allreduces run too, no kind can be charged
with the exposed time alone: ``wire_kinds_s`` gives each kind's wire time (the exchange's
apart) beside ``hidden``, the share in all.
``slot_mib`` is the optimizer slots one rank keeps (momentum, moments...); ``slice_mib`` the
parameter slices a sharded rank updates (0 for the others); ``optimizer_mib`` their sum.

On an emulated link, ``bound_s`` is the strategy's physical bound: max(compute-only step, the
bytes rank 0 sent per step / the link rate) -- its link's counter where there is one, else the
timeline's bytes; on a shared loopback all ranks' bytes pass one queue. ``regime`` (the JSON's
top-level key, and ``regime_line``) is stock's wire time / the compute-only step, beside the
regime ``--regime`` asked for and the rate chosen for it (``benchmarks.regime``).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks.config import LOCAL, STAND_IN, STOCK, base_name
from benchmarks.timelines import EXCHANGE
from hvd_overlap.tools.timeline import GATHER_OPS

Summary = dict[str, dict[str, Any]]


def model_compute_note(model_ms: float | None, raw: dict[str, Any], summary: Summary) -> str:
    """``auto``'s model's compute per step (timed in its probe's steps) beside this run's
    compute-only step, for the printed line of each round's choice."""
    from benchmarks import regime

    if model_ms is None:
        return ""
    steps = {s: m["step_time_s"] for s, m in summary.items()}
    alone = regime.compute_only_s(raw, steps)
    return f"; its model's compute {model_ms:.1f} ms" + (
        f" ({model_ms / (alone * 1e3):.2f}x the compute-only step, {alone * 1e3:.1f} ms)"
        if alone else "")


def summarize(raw: dict[str, Any]) -> Summary:
    """The per-strategy numbers, keyed by strategy, in the order measured."""
    from benchmarks import regime

    steps = {s: step_time(raw, s) for s in raw["step_times"]}
    ranks, grad = raw["ranks"], raw["grad_bytes"]
    rate, compute = regime.link_rate(raw), regime.compute_only_s(raw, steps)
    share = ranks if raw["config"].get("net_model") == "loopback" else 1
    out: Summary = {}
    for s, t in steps.items():
        sent = 0 if base_name(s) == LOCAL else grad
        measured = link_bytes(raw, s)
        if measured is None:
            measured = ((raw.get("sent_bytes_per_step") or {}).get(s) or {}).get("all")
        out[s] = {
            "samples_per_sec": raw["global_batch"] / t,
            "step_time_s": t,
            "ratio_to_stock": steps[STOCK] / t if STOCK in steps else None,
            "efficiency": steps[LOCAL] / t if LOCAL in steps else None,
            "bytes_per_step": sent,
            "wire_bytes_per_rank": round(sent * 2 * (ranks - 1) / ranks),
            "sent_bytes_per_rank": (raw.get("sent_bytes_per_step") or {}).get(s),
            "link_bytes_per_rank": link_bytes(raw, s),
            "mean_step_s": statistics.median(raw["step_times"][s]),
            "round_step_times_s": list(raw["step_times"][s]),
            "wire_s": raw.get("wire_time_per_step_s", {}).get(s),
            "hidden": hidden_fraction(t, steps.get(LOCAL), raw.get(
                "wire_time_per_step_s", {}).get(s)),
            **_memory(raw.get("optimizer_state_bytes", {}).get(s)),
            **phase_hidden(t, steps.get(LOCAL), (raw.get("wire_by_collective_s") or {}).get(s)),
            "bound_s": regime.bound(compute, 0.0 if base_name(s) == LOCAL else measured, rate,
                                    share),
        }
    return out


def regime_summary(raw: dict[str, Any], summary: Summary) -> dict[str, Any] | None:
    """The regime asked for (``--regime``; None without), the one achieved (stock's wire time
    / the compute-only step), the rate and the compute-only step used; None on the plain
    loopback."""
    from benchmarks import regime

    rate = regime.link_rate(raw)
    if rate is None:
        return None
    steps = {s: m["step_time_s"] for s, m in summary.items()}
    chosen = raw.get("regime") or {}
    return {"asked": chosen.get("asked"), "achieved": regime.achieved(raw, steps),
            "rate": raw["config"]["net"], "rate_bytes_per_s": rate,
            "compute_only_s": regime.compute_only_s(raw, steps),
            "probe_compute_s": chosen.get("probe_compute_s"),
            "link_efficiency": chosen.get("link_efficiency")}


def regime_line(raw: dict[str, Any], summary: Summary) -> str:
    """One line: the regime asked and achieved, the rate and every strategy's bound; empty on
    the plain loopback."""
    r = regime_summary(raw, summary)
    if r is None:
        return ""
    asked = f"asked {r['asked']:g}, " if r["asked"] is not None else ""
    compute = _num(r["compute_only_s"] and r["compute_only_s"] * 1e3, ".1f")
    missed = ""
    if r["asked"] and r["achieved"] and not 0.67 < r["achieved"] / r["asked"] < 1.5:
        missed = (f"WARNING: the regime achieved is {r['achieved'] / r['asked']:.1f}x the one "
                  "asked: the emulated link does not carry this rate (each rank's core also "
                  "moves its bytes) or stock's wire time is not its bytes at that rate; read "
                  "the results at the regime achieved\n")
    return missed + (f"regime: {asked}achieved {_num(r['achieved'], '.2f')} (stock's wire time / "
            f"compute-only step {compute} ms) at {r['rate']} "
            f"({r['rate_bytes_per_s'] * 8 / 1e6:.1f} Mbit/s); bound = max(compute-only step, "
            "bytes sent / rate): " + ", ".join(
                f"{s} {_num(m['bound_s'] and m['bound_s'] * 1e3, '.0f')} ms"
                for s, m in summary.items()))


def step_time(raw: dict[str, Any], strategy: str) -> float:
    """The strategy's step: the median over every round's timed steps of each step's duration
    averaged over the ranks; the median over rounds of the mean step if no steps were
    recorded."""
    rounds = (raw.get("step_means") or {}).get(strategy) or []
    pooled = [t for r in rounds for t in r]
    return statistics.median(pooled) if pooled else statistics.median(raw["step_times"][strategy])


def link_bytes(raw: dict[str, Any], strategy: str) -> float | None:
    """Rank 0's link bytes per timed step, median over rounds (see the module docstring)."""
    from benchmarks.netns import HOSTS, LOOPBACK, PLAIN

    c = raw.get("config", {})
    rounds = (raw.get("link_bytes_per_step") or {}).get(strategy) or []
    firsts = [r[0] for r in rounds if r and r[0] is not None]
    if c.get("net") == PLAIN or not firsts:
        return None
    share = {HOSTS: 1, LOOPBACK: raw["ranks"]}.get(c.get("net_model", HOSTS))
    return statistics.median(firsts) / share if share else None


def _memory(state: dict[str, int] | None) -> dict[str, Any]:
    if not state:
        return {}
    return {"optimizer_mib": (state["slots"] + state["slices"]) / 2**20,
            "slot_mib": state["slots"] / 2**20, "slice_mib": state["slices"] / 2**20}


def phase_hidden(step: float, local: float | None, wire: dict[str, float] | None
                 ) -> dict[str, Any]:
    """Sharded: hidden shares of the reduce-scatters (under backprop) and of the all-gathers
    (under the next forward); see the module docstring. Where other collectives share the step
    (the exchange's, on the critical path; whole buckets' allreduces, under backprop) the
    exposed time cannot be split by kind: only each kind's wire time (``wire_kinds_s``). Empty
    for strategies of one kind of collective."""
    gathers = [wire[op] for op in GATHER_OPS if op in wire] if wire else []
    if not wire or local is None:
        return {}
    kinds = {k: v for k, v in wire.items() if k.isupper() or k == EXCHANGE}
    if EXCHANGE in wire or "ALLREDUCE" in wire:
        return {"wire_kinds_s": kinds} if len(kinds) > 1 else {}
    if "REDUCESCATTER" not in wire or not gathers:
        return {}
    rs, ag = wire["REDUCESCATTER"], sum(gathers)
    rs_exposed = wire.get("REDUCESCATTER_after_backprop", 0.0)
    ag_exposed = max(step - local - rs_exposed, 0.0)
    return {"reduce_scatter_s": rs, "all_gather_s": ag,
            "reduce_scatter_hidden": _hidden(rs_exposed, rs) if rs else None,
            "all_gather_hidden": _hidden(ag_exposed, ag) if ag else None}


#: the kinds' names as printed
KIND_NAMES = {"ALLREDUCE": "allreduces", "REDUCESCATTER": "reduce-scatters",
              "ALLGATHER": "all-gathers", "ALLTOALL": "all-to-alls",
              EXCHANGE: "of which the exchange's"}


def kinds_line(strategy: str, m: dict[str, Any]) -> str:
    """Each kind's wire time per step and the hidden share in all, for a step whose exposed
    time no kind can be charged with alone."""
    kinds = m["wire_kinds_s"]
    parts = ", ".join(f"{KIND_NAMES.get(k, k)} {kinds[k] * 1e3:.1f}" for k in
                      [*(k for k in KIND_NAMES if k in kinds),
                       *sorted(k for k in kinds if k not in KIND_NAMES)])
    return (f"{strategy}: on the wire per step (ms): {parts}; "
            f"{_num(m.get('hidden'), '.0%')} of it hidden in all (per kind not separable: the "
            "exposed time is the step's, and the exchange's collectives and the allreduces "
            "run beside the others)")


def hidden_fraction(step: float, local: float | None, wire: float | None) -> float | None:
    """Share of the wire time not added to the step: 1 - exposed / wire, clamped to [0, 1]."""
    if local is None or not wire:
        return None
    return _hidden(step - local, wire)


def _hidden(exposed: float, wire: float) -> float:
    """1 - exposed / wire, clamped to [0, 1]."""
    return min(max(1.0 - exposed / wire, 0.0), 1.0)


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def net_label(c: dict[str, Any]) -> str:
    """``plain``, ``1gbit hosts`` (emulated hosts) or ``1gbit loopback`` (one shared loopback)."""
    return c["net"] if c["net"] == "plain" else f"{c['net']} {c.get('net_model', 'loopback')}"


def headline(raw: dict[str, Any]) -> str:
    """One line saying what was measured."""
    c = raw["config"]
    aged = f", after {c['history']} untimed" if c.get("history") else ""
    return (f"{c['model']}{' (tiny)' if c.get('tiny') else ''}: {raw['params'] / 1e6:.2f} M "
            f"params, {raw['grad_bytes'] / 2**20:.1f} MiB of gradients; {raw['ranks']} ranks x "
            f"{c['batch_size']}/rank, net {net_label(c)}, "
            f"{'pinned' if raw['pinned'] else 'unpinned'}"
            f"{', each strategy in its own launch' if c.get('one_per_launch') else ''};"
            f" {c['rounds']} interleaved rounds x {c['steps']} timed steps "
            f"({c['warmup']} warm-up excluded{aged}); "
            + ("median step over all rounds" if raw.get("step_means")
               else "median over rounds of the mean step")
            + (f"; host load {raw['load_avg_1min']:.1f} at the end" if "load_avg_1min" in raw
               else "")
            + (f"; {STAND_IN}" if raw.get("stock_stand_in") else
               "" if raw.get("clean_baseline", True) else
               "; WARNING: stock ran in the plugin's process (not a clean baseline)"))


def format_table(summary: Summary, stand_in: bool = False) -> str:
    """Fixed-width table, one row per strategy (``stand_in``: ``stock`` ran the plugin's
    stand-in, Keras 3)."""
    w = max(10, *(len(s) for s in summary))
    bounds = any(m.get("bound_s") is not None for m in summary.values())
    lines = [f"{'strategy':<{w}} {'samples/s':>10} {'step ms':>9} {'vs stock':>10} "
             f"{'efficiency':>10} {'MiB/step':>9} {'sent MiB':>9} {'link MiB':>9} "
             f"{'wire ms':>8} {'hidden':>7} {'slots MiB':>9}" + (" bound ms" if bounds else "")]
    for s, m in summary.items():
        wire = m.get("wire_s")
        sent = (m.get("sent_bytes_per_rank") or {}).get("all")
        link = m.get("link_bytes_per_rank")
        lines.append(f"{s:<{w}} {m['samples_per_sec']:>10.1f} {m['step_time_s'] * 1e3:>9.1f} "
                     f"{_num(m['ratio_to_stock'], '.3f'):>9}x "
                     f"{_num(m['efficiency'], '.2f'):>10} {m['bytes_per_step'] / 2**20:>9.1f} "
                     f"{_num(sent / 2**20 if sent else None, '.1f'):>9} "
                     f"{_num(link / 2**20 if link is not None else None, '.1f'):>9} "
                     f"{_num(wire * 1e3 if wire else None, '.1f'):>8} "
                     f"{_num(m.get('hidden'), '.0%'):>7} "
                     f"{_num(m.get('slot_mib'), '.1f'):>9}"
                     + (f" {_num(m['bound_s'] and m['bound_s'] * 1e3, '.0f'):>8}" if bounds
                        else ""))
    lines.append(("vs stock: the stand-in's step time (the plugin's `horovod`) / this"
                  if stand_in else
                  "vs stock: real stock Horovod's step time (hvd.DistributedOptimizer in a "
                  "process that never imported the plugin) / this")
                 + "; efficiency: local (no communication) "
                 "step time / this; MiB/step: gradient bytes reduced per step; sent MiB: what "
                 "rank 0 sent per step (Horovod timeline: each collective's size x its "
                 "algorithm's share; alltoalls are not logged); link MiB: what rank 0's link "
                 "sent per step (interface counters: everything); wire ms: time the collectives "
                 "spent on the wire per step "
                 "(Horovod timeline); hidden: 1 - (step - local step) / wire; slots MiB: "
                 "optimizer slots per rank (sharded: for its slices "
                 "only; it also keeps the parameter slices it updates, slice_mib in the JSON)"
                 + ("; bound ms: max(local step, link MiB (else sent MiB) / link rate)"
                    if bounds else ""))
    for s, m in summary.items():
        if m.get("wire_kinds_s"):
            lines.append(kinds_line(s, m))
        if m.get("reduce_scatter_hidden") is not None:
            lines.append(
                f"{s}: reduce-scatters {m['reduce_scatter_s'] * 1e3:.1f} ms/step on the wire, "
                f"{m['reduce_scatter_hidden']:.0%} hidden under backprop; all-gathers "
                f"{m['all_gather_s'] * 1e3:.1f} ms/step, "
                f"{_num(m['all_gather_hidden'], '.0%')} hidden under the next forward")
    return "\n".join(lines)


def whole_fit_summary(raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``--whole-fit``: per strategy, the median over rounds of its whole fit's seconds and of
    its first step's, stock's whole fit over it, and (``auto``) its median settling cost."""
    fits = {s: f for s, f in (raw.get("whole_fit") or {}).items() if f}
    out: dict[str, dict[str, Any]] = {}
    for s, runs in fits.items():
        out[s] = {"steps": runs[0]["steps"], "epochs": runs[0]["epochs"],
                  "seconds": statistics.median(r["seconds"] for r in runs),
                  "first_step_s": statistics.median(r["first_step_s"] for r in runs),
                  "epoch_s": [statistics.median(col) for col in
                              zip(*(r.get("epoch_s", []) for r in runs), strict=True)],
                  "rounds": len(runs)}
    if "stock" in out:
        for m in out.values():
            m["ratio_to_stock"] = out["stock"]["seconds"] / m["seconds"]
    picks = [p for p in raw.get("auto_choices", []) if p.get("extra_s") is not None]
    if "auto" in out and picks:
        out["auto"].update(settling_steps=statistics.median(p["steps"] for p in picks),
                           settling_s=statistics.median(p["seconds"] for p in picks),
                           settling_extra_s=statistics.median(p["extra_s"] for p in picks))
    return out


def whole_fit_lines(raw: dict[str, Any]) -> str:
    """The ``--whole-fit`` figures, one line per strategy, then auto's settling against the
    difference to stock ("" without ``--whole-fit``)."""
    fits = whole_fit_summary(raw)
    if not fits:
        return ""
    first = next(iter(fits.values()))
    lines = [f"whole fit of {first['steps']} steps ({first['epochs']} epochs, from a fresh "
             "process: tracing and auto's settling included; median over rounds):"]
    for s, m in fits.items():
        ratio = f", {m['ratio_to_stock']:.3f}x stock" if "ratio_to_stock" in m else ""
        epochs = ", ".join(f"{e:.1f}" for e in m["epoch_s"])
        lines.append(f"  {s:<14} {m['seconds']:8.1f} s{ratio} (first step "
                     f"{m['first_step_s']:.1f} s; epochs {epochs} s)")
    auto, stock = fits.get("auto"), fits.get("stock")
    if auto and stock and "settling_extra_s" in auto:
        lines.append(f"  auto's whole fit - stock's: {auto['seconds'] - stock['seconds']:+.1f} s;"
                     f" its settling ({auto['settling_steps']:.0f} steps, "
                     f"{auto['settling_s']:.1f} s) cost {auto['settling_extra_s']:.1f} s more "
                     "than as many steps of its choice")
    return "\n".join(lines)


def write_json(path: str | Path, raw: dict[str, Any], summary: Summary) -> None:
    """``{"strategies": {name: numbers}, "regime": ..., "whole_fit": ..., "raw": ...}``
    (``regime_summary``, ``whole_fit_summary``)."""
    Path(path).write_text(json.dumps({"strategies": summary,
                                      "regime": regime_summary(raw, summary),
                                      "whole_fit": whole_fit_summary(raw) or None, "raw": raw},
                                     indent=2))


def plot(path: str | Path, panels: dict[str, Summary]) -> None:
    """One bar panel per setting: samples/s per strategy, labelled with the ratio to stock."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (title, summary) in zip(axes[0], panels.items(), strict=True):
        names = list(summary)
        values = [summary[s]["samples_per_sec"] for s in names]
        colors = ["0.6" if s == LOCAL else f"C{i}" for i, s in enumerate(names)]
        bars = ax.bar(names, values, color=colors)
        for bar, s in zip(bars, names, strict=True):
            ratio = summary[s]["ratio_to_stock"]
            if ratio is not None:
                ax.annotate(f"{ratio:.2f}x", (bar.get_x() + bar.get_width() / 2,
                                               bar.get_height()), ha="center", va="bottom")
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("samples/s")
        ax.tick_params(axis="x", rotation=30)
        ax.margins(y=0.15)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
