"""The lab: this repository's experiments around the plugin, not part of the wheel. Run from
the repository root: ``python -m benchmarks --help`` (commands in ``benchmarks.cli``).

- ``config``: the settings of a benchmark (``BenchConfig``) and their validation;
- ``worker``: the per-rank training and timing (runs under ``horovodrun``);
- ``launch``: starts ``horovodrun`` (optionally inside an emulated network), collects results;
- ``report``: turns raw step times into the table, JSON and plot; ``timelines``: wire times
  and bytes from the Horovod timelines a launch records; ``regime``: ``bench --regime``'s link
  rate from the measured compute-only step, the achieved regime and each strategy's bound;
- ``results``, ``exchange_results``, ``auto_results``: the docs tables over several runs
  (``scripts/bench-results``, ``scripts/exchange-bench``, ``scripts/auto-bench``);
- ``netns``, ``hostrun``: emulated networks (network namespaces, shaped links) and Horovod
  Gloo jobs on emulated hosts;
- ``calibrate``, ``validation``: Horovod's measured per-collective costs on this machine, the
  bench models' measured profiles (``profiles/``) and the simulator checked against bench runs.
"""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks.config import LOCAL, BenchConfig

#: the repository root: where ``benchmarks`` is imported from (it is not installed)
ROOT = Path(__file__).resolve().parent.parent

__all__ = ["LOCAL", "ROOT", "BenchConfig", "importable"]


def importable(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the repository root first on ``PYTHONPATH``, so a process started from any
    directory (a rank in a network namespace, under ``horovodrun``) imports ``benchmarks``."""
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(ROOT) in paths:
        return env
    return {**env, "PYTHONPATH": os.pathsep.join([str(ROOT), *paths])}
