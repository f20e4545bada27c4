"""The mutant check's own rules: every mutant has tests that exist, the rotation covers every
mutant, and docs/testing.md shows the table the check prints."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hvd_overlap.core import mutants
from tests import mutant_check

ROOT = Path(__file__).resolve().parent.parent


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


@pytest.mark.parametrize("kill", mutant_check.KILLS, ids=lambda k: k.name)
def test_every_mutant_names_tests_that_exist(kill):
    assert kill.single or kill.ranks, f"{kill.name} has no test"
    for node in (*kill.single, *kill.ranks):
        file, _, name = node.partition("::")
        path = ROOT / file
        assert path.is_file(), node
        if name:
            assert name.split("[")[0] in _test_names(path), node
        if kill.ranks and node in kill.ranks:
            assert file.startswith("tests/multirank/"), node


def test_the_rotation_covers_every_mutant_once():
    names = [k.name for k in mutant_check.KILLS]
    parts = [mutant_check.rotation(names, day, 3) for day in range(3)]
    assert sorted(n for p in parts for n in p) == sorted(names)
    assert all(p for p in parts)


def test_the_docs_show_the_table_the_check_prints():
    page = (ROOT / "docs" / "testing.md").read_text()
    assert mutant_check.markdown_table() in page


def test_an_unknown_mutant_is_refused():
    with pytest.raises(KeyError, match="no mutant named"):
        mutants.off("no-such-mechanism")
