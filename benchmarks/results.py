"""The docs table over several bench runs (``scripts/bench-results``):

    python -m benchmarks bench-results OUT.md OUT.png RUN.json [RUN.json ...]

Each RUN.json is a ``python -m benchmarks bench --json`` file; its ``command`` key (added by the
script) is quoted in OUT.md so every number can be regenerated. The runs the docs pages are made
from live in ``benchmarks/results/<experiment>/``; every page ends with ``regenerate``'s section:
the script that measures it again, its raw data folder and the command that redraws it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.config import LOCAL, STOCK


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def label(raw: dict[str, Any]) -> str:
    """A run's title in the plot: model, network, batch per rank."""
    c = raw["config"]
    return f"{c['model']}, {report.net_label(c)}, {c['batch_size']}/rank"


def link(target: str | Path, page: str | Path) -> str:
    """``target`` as a markdown link target from the page written to ``page``."""
    return Path(os.path.relpath(target, Path(page).parent)).as_posix()


def regenerate(script: str, page: str | Path, command: str, run_paths: Sequence[str | Path],
               options: str = "") -> str:
    """A page's last section: ``script`` measures it again; the raw data (the folder holding
    ``run_paths``, linked from ``page``); ``command`` RUN.json... ``options`` redraws the page
    from that data without measuring (the runs in their order on the page)."""
    folder = os.path.commonpath([os.path.dirname(os.path.abspath(p)) for p in run_paths])
    here = os.path.relpath(folder)
    shown = Path(folder if here.startswith("..") else here).as_posix().rstrip("/") + "/"
    args = [command, *(Path(p).as_posix() for p in run_paths), *([options] if options else [])]
    return "\n".join([
        "", "## Regenerate", "",
        f"Measured with `{script}` (it rewrites this page; its header lists the settings). "
        "Raw data, one `python -m benchmarks bench --json` file per run: "
        f"[{shown}]({link(folder, page)}/). This page from it, without measuring (from the "
        "repository root):", "",
        "```", " \\\n  ".join(args), "```", ""])


def ratio_table(runs: list[dict[str, Any]]) -> str:
    """One row per run: its compute-only and stock step times, stock's wire time, and every
    strategy's ratio to stock (> 1 is faster), best in bold."""
    names = list(dict.fromkeys(s for run in runs for s in run["strategies"]
                               if s not in (STOCK, LOCAL)))
    lines = ["| model | network | batch/rank | local ms | stock ms | stock wire ms | "
             + " | ".join(names) + " |", "|---|---|---|---|---|---|" + "---|" * len(names)]
    for run in runs:
        c, s = run["raw"]["config"], run["strategies"]
        ratios = {n: s[n]["ratio_to_stock"] for n in names if n in s}
        best = max(ratios.values(), default=None)
        cells = [("-" if n not in ratios else f"**{ratios[n]:.2f}x**" if ratios[n] == best
                  and best > 1 else f"{ratios[n]:.2f}x") for n in names]
        stock = s.get(STOCK, {})
        lines.append(
            f"| {c['model']} | {report.net_label(c)} | {c['batch_size']} | "
            f"{_num(s.get(LOCAL, {}).get('step_time_s', 0) * 1e3 or None, '.0f')} | "
            f"{_num(stock.get('step_time_s', 0) * 1e3 or None, '.0f')} | "
            f"{_num((stock.get('wire_s') or 0) * 1e3 or None, '.0f')} | "
            + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


#: The page's prose on the bench models and ``--regime`` (kept with the tables it explains).
GUIDE = """## The bench models

`--model` picks one of the bench models (`hvd_overlap/tools/models.py`); each brings its own
synthetic data, the same batch on a rank for every strategy:

| model | parameters | inputs | what it stresses |
|---|---|---|---|
| `vgg` | 6.4 M (4.2 M in one dense layer) | random 32x32x3 images | communication |
| `resnet20` | 0.27 M | random 32x32x3 images | compute |
| `resnet56` | 0.86 M in 173 tensors (114 batch norm) | random 32x32x3 images | many small tensors |
| `mlp` | 10.5 M (3072-2048-2048-10) | random 32x32x3 images | communication, little compute |
| `cnn` | 1.1 M (the demo's digits CNN) | random 32x32x3 images | neither |
| `text` | 1.3 M (1.28 M in the embedding) | random token ids | sparse gradients |

`text` is a text classifier: an embedding of a 20000-token vocabulary, 64 wide, averaged over
the 64 tokens of an example, a dense layer of 256 and the 10-class output. Its embedding's
gradient is a `tf.IndexedSlices` holding only the rows of the tokens a batch contains: stock
Horovod all-gathers those rows (it does not allreduce them), and the plugin's strategies have to
handle a gradient that is not a dense tensor. `--tiny` divides every width by 16, the
vocabulary too.

## Regimes: `--regime R`

A link rate is not an experiment that can be repeated on this machine: its compute speed has
changed by up to 2x between days, and what decides whether overlap or fewer bytes can help is
the regime R = stock's wire time per step / the compute-only step. R well below 1 is
compute-bound (stock already hides most of its wire under backprop, and no plan can beat
`local`); around 1-2 overlap matters; above 2 only fewer bytes help much.

`python -m benchmarks bench --regime R` (instead of `--net`; root, as every emulated network)
first measures the compute-only step (`local`, no communication, one launch on the plain
loopback with the same model, batch, ranks, warm-up and steps), then chooses the link rate at
which stock Horovod's gradient bytes per step take R times that step on the wire, and runs the
requested strategies on the emulated network at that rate, as `--net RATE` does. Stock's bytes
are a ring allreduce of every gradient: each rank sends 2 (P-1)/P times the gradient bytes (on
`--net-model loopback` every rank's bytes pass the one queue). The emulated link carries about
95% of its nominal rate (measured on vgg 32/rank at R = 2: stock's bytes / rate against its
timeline wire time were 0.950 and 0.955 of it, so the uncorrected rate gave R = 2.10 and 2.11);
the rate is raised by that factor (`benchmarks.regime.LINK_EFFICIENCY`). For `text` the rate
assumes a dense allreduce of the embedding too; stock's all-gather of its rows moves other
bytes, so the achieved regime says where it really is.

The bench prints the chosen rate, and after the table the regime achieved: stock's measured
wire time per step (from its Horovod timeline) / the compute-only step (this run's `local` if it
ran one, else the probe's), and every strategy's physical bound: max(compute-only step, the
bytes its rank sent per step / the link rate; the link's counters where there are some, else the
timeline's bytes); with a rate, the table has a `bound ms` column. `--json` writes both under
`regime` (`asked`, `achieved`, `rate`, `rate_bytes_per_s`, `compute_only_s`,
`probe_compute_s`, `link_efficiency`) and each strategy's `bound_s`. Any `--net RATE` run reports
its achieved regime and bounds the same way.

```
python -m benchmarks bench --model vgg --batch-size 32 --regime 2 \\
  --strategies stock,stock#2,auto,local
```
"""


def markdown(runs: list[dict[str, Any]]) -> str:
    """A model x network x strategy table, then how each run was made."""
    lines = ["# Benchmark: every strategy on the same model, data and network", "",
             "Regenerate with `scripts/bench-results` (2 ranks, each pinned to its own core). "
             "`stock` is real `hvd.DistributedOptimizer` in processes that never imported the "
             "plugin (launched like the others, each round; the plugin's strategies run in "
             "processes of their own); `local` is the same training without communication, "
             "the compute-only bound. Network `RATE hosts`: each rank in its own network "
             "namespace on a switch, each link shaped to RATE in both directions (`tbf`), like "
             "hosts on a switch with RATE ports; `RATE loopback`: both ranks on one loopback "
             "shaped to RATE (a shared half-duplex bus); `plain`: this machine's loopback.", "",
             "| model | network | batch/rank | strategy | samples/s | step ms | vs stock | "
             "efficiency "
             "| wire ms | hidden | slots MiB/rank |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    body_at = len(lines)
    for run in runs:
        c = run["raw"]["config"]
        for s, m in run["strategies"].items():
            ratio, eff = m["ratio_to_stock"], m["efficiency"]
            wire, hidden = m.get("wire_s"), m.get("hidden")
            lines.append(
                f"| {c['model']} | {report.net_label(c)} | {c['batch_size']} | {s} | "
                f"{m['samples_per_sec']:.1f} | "
                f"{m['step_time_s'] * 1e3:.0f} | {'-' if ratio is None else f'{ratio:.2f}x'} | "
                f"{'-' if eff is None else f'{eff:.2f}'} | "
                f"{'-' if not wire else f'{wire * 1e3:.0f}'} | "
                f"{'-' if hidden is None else f'{hidden:.0%}'} | "
                f"{_num(m.get('slot_mib'), '.1f')} |")
    lines += ["", "vs stock: real stock Horovod's step time / this one (> 1 is faster); "
              "efficiency: "
              "compute-only (`local`, no communication) step time / this one; wire ms: time the "
              "gradient collectives spent on the wire per step (Horovod timeline, one extra run "
              "per strategy); hidden: 1 - (step - local step) / wire, the share of that time "
              "hidden behind compute; slots MiB/rank: the optimizer slots one rank keeps (SGD "
              "momentum; sharded: for its 1/P slices only, plus as much again for the parameter "
              "slices it updates).", ""]
    phases = [f"- {c['model']}, {report.net_label(c)}, {c['batch_size']}/rank: reduce-scatters "
              f"{m['reduce_scatter_s'] * 1e3:.0f} ms/step on the wire, "
              f"{m['reduce_scatter_hidden']:.0%} hidden under backprop; "
              f"all-gathers {m['all_gather_s'] * 1e3:.0f} ms/step, "
              f"{_num(m['all_gather_hidden'], '.0%')} hidden under the next forward"
              for run in runs for c in [run["raw"]["config"]]
              for m in [run["strategies"].get("sharded", {})]
              if m.get("reduce_scatter_hidden") is not None]
    if phases:
        lines += ["`sharded`, phase by phase (reduce-scatter hidden: 1 - its wire time after the "
                  "step's last reduce-scatter was enqueued / its wire time; all-gather hidden: "
                  "1 - the rest of the exposed time / its wire time):", "", *phases, ""]
    lines[body_at - 2:body_at - 2] = [
        "Ratios to stock Horovod (its step time / the strategy's; > 1 is faster):", "",
        ratio_table(runs), "All figures:", ""]
    lines += ["Runs:", ""]
    for run in runs:
        lines += [f"- {report.headline(run['raw'])}", f"  `{run.get('command', '?')}`"]
    return "\n".join(lines) + "\n\n" + GUIDE
