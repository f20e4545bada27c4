"""The package's layers import only downward, and no module grows past what a reader can hold.

    core  <-  adapters  <-  comm  <-  growth  <-  keras  <-  tools

``core`` is pure Python (plan, strategies, simulator, chooser); ``adapters`` holds every Keras
internal (one adapter per Keras generation); ``comm`` moves tensors with Horovod; ``growth`` is
the batch-growth feature; ``keras`` is the runtime a user imports; ``tools`` (CLI, bench helpers)
may use anything. ``stack`` (the install check) sits below all of them; the package's own
``__init__`` (version, plan, stack check) imports ``core`` and ``stack`` only. Every import counts,
also one inside a function: a lazy import upward is still a cycle waiting to happen.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import hvd_overlap

ROOT = Path(hvd_overlap.__file__).parent
#: each layer and the layers it may import (itself included)
ALLOWED: dict[str, set[str]] = {
    "stack": {"stack"},
    "core": {"core"},
    "adapters": {"adapters", "core", "stack", "__init__"},
    "comm": {"comm", "adapters", "core", "stack", "__init__"},
    "growth": {"growth", "comm", "adapters", "core", "stack", "__init__"},
    "keras": {"keras", "growth", "comm", "adapters", "core", "stack", "__init__"},
    "tools": {"tools", "keras", "growth", "comm", "adapters", "core", "stack", "__init__"},
    "__init__": {"core", "stack"},
}
#: no module of the package is longer than this
MAX_LINES = 300


def _layer(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root)
    return rel.parts[0].removesuffix(".py") if len(rel.parts) > 1 or rel.stem != "__init__" \
        else "__init__"


def _imported_layers(path: Path) -> list[tuple[int, str]]:
    """(line, layer) of every ``hvd_overlap`` import in the module, at any depth."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "hvd_overlap":
            names = [f"hvd_overlap.{a.name}" if (ROOT / a.name).is_dir()
                     or (ROOT / f"{a.name}.py").is_file() else "hvd_overlap.__init__"
                     for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "hvd_overlap" and len(parts) > 1:
                out.append((node.lineno, parts[1]))
    return out


MODULES = sorted(ROOT.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_go_down_the_layers_only(path):
    layer = _layer(path)
    assert layer in ALLOWED, f"{path}: layer {layer!r} is not in ALLOWED (add it, with its rule)"
    upward = [(line, got) for line, got in _imported_layers(path) if got not in ALLOWED[layer]]
    assert not upward, f"{path.relative_to(ROOT)} ({layer}) imports upward: {upward}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_is_longer_than_a_reader_can_hold(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)}: {lines} lines (split it)"


@pytest.mark.parametrize("path", sorted((ROOT / "core").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_core_imports_no_tensorflow_horovod_or_keras(path):
    """``core`` is pure Python, at any depth of its modules (the simulator and ``auto``'s
    chooser run without TensorFlow; ``test_optimizer_local`` imports them in a clean process)."""
    heavy = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        heavy |= {n for n in names if n.split(".")[0] in ("tensorflow", "horovod", "keras")}
    assert not heavy, f"{path.relative_to(ROOT)} imports {sorted(heavy)}"


def test_the_check_sees_an_upward_import(tmp_path):
    """The rule can fail: a ``comm`` module importing ``hvd_overlap.keras`` lazily is caught."""
    bad = tmp_path / "comm" / "probe.py"
    bad.parent.mkdir()
    bad.write_text("import tensorflow\n\ndef f():\n    from hvd_overlap.keras import optimizer\n")
    assert _imported_layers(bad) == [(4, "keras")]
    assert "keras" not in ALLOWED[_layer(bad, tmp_path)]
