"""``hvd-overlap bench``: every strategy measured in one run on the same model, data and network.

- ``config``: the settings (``BenchConfig``) and their validation.
- ``worker``: the per-rank training and timing (runs under ``horovodrun``).
- ``launch``: starts ``horovodrun`` (optionally inside an emulated network), collects results.
- ``report``: turns raw step times into the table, JSON and plot.
- ``results``: the README/docs table over several runs (``scripts/bench-results``).
"""

from hvd_overlap.tools.bench.config import LOCAL, BenchConfig

__all__ = ["LOCAL", "BenchConfig"]
