"""Every results table in README.md and docs/ is what ``python -m benchmarks.tables`` draws from
the committed result files, and every such file says when, where and with what it was made."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.tables import measured, pages, sources

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("page", pages.pages())
def test_page_tables_are_generated(page):
    assert (ROOT / page).read_text() == pages.expected(page), (
        f"{page}: a generated table differs from what its result files give now; run "
        "`python -m benchmarks.tables` and commit the page (or the result file that changed)")


def test_the_study_page_holds_its_results_tables():
    text = (ROOT / pages.STUDY_PAGE).read_text()
    for table in measured.study_tables():
        assert table in text, (f"{pages.STUDY_PAGE} does not hold the table its results give: "
                               "`scripts/batch-study --from-json` (or the study) rewrites it")


@pytest.mark.parametrize("path", pages.sources())
def test_every_source_is_committed_with_its_provenance(path):
    assert (ROOT / path).is_file(), f"{path}: a table's source is missing"
    meta = sources.meta(path)
    assert set(meta) == set(sources.FIELDS)
    assert meta["date"] != sources.UNKNOWN and meta["commit"] != sources.UNKNOWN, (
        f"{path}: no date or commit recorded; `python -m benchmarks.tables --provenance` "
        "records them from git")


def test_a_stale_or_unknown_table_is_reported(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    monkeypatch.setattr(pages, "ROOT", tmp_path)
    monkeypatch.setattr(pages, "TABLES", (pages.Table(
        "t", ("page.md",), lambda: "| a |\n|---|\n| 1 |", (measured.DEMO,)),))
    page.write_text("x\n<!-- table:t -->\n| a |\n|---|\n| 2 |\n<!-- /table:t -->\ny\n")
    assert "| 1 |" in pages.expected("page.md") and "| 2 |" not in pages.expected("page.md")
    page.write_text("<!-- table:other -->\n<!-- /table:other -->\n<!-- table:t -->\n"
                    "<!-- /table:t -->\n")
    with pytest.raises(ValueError, match="no generator"):
        pages.expected("page.md")
    page.write_text("no markers\n")
    with pytest.raises(ValueError, match="missing"):
        pages.expected("page.md")


def test_readme_is_short_and_starts_with_what_users_need():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; at most 200"
    head = "\n".join(lines[:40])
    for needed in ("scripts/demo", "scripts/test", "pip install", "hvd-overlap doctor",
                   "hvd_overlap.keras.DistributedOptimizer", "What it does"):
        assert needed in head, f"README.md's first 40 lines do not mention {needed!r}"
