"""Which table goes in which page, and how a page is rewritten or checked.

A generated table sits in its page between two markers::

    <!-- table:NAME -->
    ...what the generator writes, and a line naming its source files...
    <!-- /table:NAME -->

Everything outside the markers is the page's own text. Some pages are written whole by the
lab command that measures them (``exchange-results``, ``auto-results``, ``validate``,
``check-predictions``); they are regenerated whole, with that command's own code. The batch
study's page is written by ``examples/batch_growth_study.py``; it is only checked to hold the
tables its results give.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from benchmarks.tables import measured as m
from benchmarks.tables import predicted as p
from benchmarks.tables.sources import ROOT, footer


@dataclass(frozen=True)
class Table:
    """A table: its name (the markers'), the pages it appears in, how to draw it, and the
    result files it is drawn from (named under it)."""

    name: str
    pages: tuple[str, ...]
    render: Callable[[], str]
    sources: tuple[str, ...]

    def block(self, page: str) -> str:
        """What goes between the markers in ``page``."""
        return f"{self.render()}\n\n{footer(list(self.sources), page)}"


def _prediction(*names: str) -> tuple[str, ...]:
    return tuple(f"benchmarks/results/predictions/{n}.json" for n in names)


README, MEASURING, EXCHANGE = "README.md", "docs/measuring.md", "docs/exchange.md"
SCALING, SIMULATOR, GROWTH = "docs/scaling.md", "docs/simulator.md", "docs/batch_growth.md"

TABLES: tuple[Table, ...] = (
    Table("demo", (README, MEASURING), m.demo, (m.DEMO,)),
    Table("demo_output", (MEASURING,), m.demo_output, (m.DEMO_OUTPUT,)),
    Table("at_scale", (README,), p.readme_at_scale, _prediction("h200")),
    Table("bench", (MEASURING,), m.bench, m.BENCH_RUNS),
    Table("exchange", (EXCHANGE,), m.exchange, m.EXCHANGE_RUNS),
    Table("exchange_gather", (EXCHANGE,), m.exchange_gather, m.GATHER_RUNS),
    Table("exchange_at_scale", (EXCHANGE,), p.exchange_flops, _prediction("exchange_flops")),
    Table("exchange_h200", (EXCHANGE,), p.h200, _prediction("h200")),
    Table("exchange_calibrated", (EXCHANGE,), p.exchange_calibrated,
          _prediction("exchange_flops", "exchange_calibrated")),
    Table("gpu_profiles", (SCALING,), m.gpu_profiles, m.GPU_SOURCES),
    Table("calibration_2rank", (SCALING,), m.calibration_2rank, (m.CALIBRATION_2,)),
    Table("calibration_2to4", (SCALING,), m.calibration_2to4, (m.CALIBRATION_2TO4,)),
    Table("four_rank", (SCALING,), m.four_rank, m.FOUR_RANK_PAIRS),
    Table("horovod512", (SCALING,), p.horovod512_published, _prediction("horovod512")),
    Table("horovod512_plugin", (SCALING,), p.horovod512_plugin, _prediction("horovod512")),
    Table("typical", (SCALING,), p.typical, _prediction("typical")),
    Table("simulator_typical", (SIMULATOR,), p.simulator_typical, _prediction("typical")),
    Table("auto_grid", (SIMULATOR,), p.auto_grid, _prediction("auto_grid")),
    Table("growth_policies", (GROWTH,), m.growth_policies, (m.STUDY,)),
    Table("growth_sweep", (GROWTH,), m.growth_sweep, (m.STUDY,)),
    Table("tta_1024", (GROWTH,), partial(m.time_to_accuracy, m.TTA_1024), (m.TTA_1024,)),
    Table("tta_2048", (GROWTH,), partial(m.time_to_accuracy, m.TTA_2048, plans=False),
          (m.TTA_2048,)),
    Table("tta_steps", (GROWTH,), m.tta_steps, (m.TTA_2048,)),
    Table("tta_1024_predicted_steps", (GROWTH,), partial(m.result_table, m.TTA_1024_MD, 1),
          (m.TTA_1024_MD,)),
    Table("tta_1024_predicted", (GROWTH,), partial(m.result_table, m.TTA_1024_MD, 2),
          (m.TTA_1024_MD,)),
    Table("tta_2048_predicted_steps", (GROWTH,), partial(m.result_table, m.TTA_2048_MD, 1),
          (m.TTA_2048_MD,)),
    Table("tta_2048_predicted", (GROWTH,), partial(m.result_table, m.TTA_2048_MD, 2),
          (m.TTA_2048_MD,)),
)


@dataclass(frozen=True)
class WholePage:
    """A page the lab command that measures it writes whole; ``render`` is that command's
    code, run on the committed result files."""

    page: str
    render: Callable[[], str]
    sources: tuple[str, ...]


def _exchange_bench() -> str:
    from benchmarks import exchange_results
    from benchmarks.results import regenerate

    runs = list(m.EXCHANGE_BENCH_RUNS)
    page = "docs/exchange_bench.md"
    return exchange_results.markdown(_bench_runs(runs)) + regenerate(
        "scripts/exchange-bench", page, f"python -m benchmarks exchange-results {page}", runs)


def _auto_bench() -> str:
    from benchmarks import auto_results
    from benchmarks.results import link, regenerate

    page = "docs/auto_bench.md"
    runs = list(m.AUTO_RUNS)
    loaded = [{**r, "source": link(path, page)} for r, path in zip(_bench_runs(runs), runs,
                                                                   strict=True)]
    return auto_results.markdown(loaded) + regenerate(
        "scripts/auto-bench", page, f"python -m benchmarks auto-results {page}", runs)


def _scaling_validation() -> str:
    from benchmarks import validation
    from benchmarks.results import regenerate

    page = "docs/scaling_validation.md"
    table, _ = validation.validation_markdown(m.BENCH_RUNS, validation.OVERHEADS)
    options = f"--markdown {page} --plot docs/scaling_validation.png"
    return ("# The simulator's step times against measured ones\n\n" + table
            + regenerate("scripts/bench-results", page, "python -m benchmarks validate",
                         m.BENCH_RUNS, options))


def _four_rank_page() -> str:
    return m.four_rank() + "\n"


def _bench_runs(paths: list[str]) -> list[dict]:
    return [json.loads((ROOT / path).read_text()) for path in paths]


WHOLE_PAGES: tuple[WholePage, ...] = (
    WholePage("docs/exchange_bench.md", _exchange_bench, m.EXCHANGE_BENCH_RUNS),
    WholePage("docs/auto_bench.md", _auto_bench, m.AUTO_RUNS),
    WholePage("docs/scaling_validation.md", _scaling_validation,
              (*m.BENCH_RUNS, "benchmarks/profiles/overheads-gloo-2rank.json")),
    WholePage("docs/scaling_validation_4rank.md", _four_rank_page, m.FOUR_RANK_PAIRS),
)

STUDY_PAGE = "docs/batch_growth_study.md"

MARKER = re.compile(r"<!-- table:(?P<name>[\w-]+) -->\n(?:.*?\n)?<!-- /table:(?P=name) -->",
                    re.DOTALL)


def expected(page: str) -> str:
    """``page`` as the generators would write it now."""
    for whole in WHOLE_PAGES:
        if whole.page == page:
            return whole.render()
    text = (ROOT / page).read_text()
    tables = {t.name: t for t in TABLES if page in t.pages}
    found = {mt["name"] for mt in MARKER.finditer(text)}
    if unknown := found - set(tables):
        raise ValueError(f"{page}: no generator for table(s) {', '.join(sorted(unknown))}")
    if missing := set(tables) - found:
        raise ValueError(f"{page}: table(s) {', '.join(sorted(missing))} missing: add "
                       "<!-- table:NAME --> and <!-- /table:NAME --> where each goes")
    return MARKER.sub(lambda mt: f"<!-- table:{mt['name']} -->\n"
                                 f"{tables[mt['name']].block(page)}\n<!-- /table:{mt['name']} -->",
                      text)


def pages() -> list[str]:
    """Every page with a generated table, in a stable order."""
    return sorted({pg for t in TABLES for pg in t.pages} | {w.page for w in WHOLE_PAGES})


def stale() -> list[str]:
    """The pages whose tables differ from what the generators write now, and a study page
    missing one of its tables."""
    out = [pg for pg in pages() if (ROOT / pg).read_text() != expected(pg)]
    study = (ROOT / STUDY_PAGE).read_text()
    if any(t not in study for t in m.study_tables()):
        out.append(STUDY_PAGE)
    return out


def write() -> list[str]:
    """Rewrite every page whose tables are stale; returns those written."""
    written = []
    for pg in pages():
        new = expected(pg)
        if (ROOT / pg).read_text() != new:
            (ROOT / pg).write_text(new)
            written.append(pg)
    return written


def sources() -> list[str]:
    """Every result file a table or a generated page is drawn from."""
    found = [s for t in TABLES for s in t.sources]
    found += [s for w in WHOLE_PAGES for s in w.sources] + [m.STUDY]
    return list(dict.fromkeys(found))
