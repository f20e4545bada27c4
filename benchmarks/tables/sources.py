"""Where each figure comes from: the result files under ``benchmarks/results/`` and what is
known about each -- date, commit, software stack and machine.

Files written since the docs tables became generated carry that in their own ``meta``; for the
older ones ``benchmarks/results/provenance.json`` records it, read from ``git log`` (the
commit that last changed the file: the run it holds was made at or just before it) and from
the file itself (the bench's JSON records TensorFlow's, Horovod's and Python's versions).
Whatever is not known is written ``unknown``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
PROVENANCE = RESULTS / "provenance.json"
FIELDS = ("date", "commit", "stack", "machine")
UNKNOWN = "unknown"

#: the machine every CPU figure was measured on (docs/measuring.md#the-machine)
LAB = "the lab VM: 2 shared x86_64 cores, 2 ranks each pinned to one"
LAB_4 = "the lab VM: 2 shared x86_64 cores, 4 ranks (two per core)"
#: what an older file that records no versions ran on: the lab's one stack until TF 2.18 was added
DEFAULT_STACK = ("not recorded in the file; the lab's default stack: TensorFlow 2.15.1, "
                 "Horovod 0.28.1 (Gloo)")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=False).stdout.strip()


def now_meta() -> dict[str, str]:
    """Date and commit for a result file written now (the commit with ``+changes`` when the
    working tree differs from it)."""
    commit = _git("rev-parse", "--short", "HEAD") or UNKNOWN
    if _git("status", "--porcelain", "--untracked-files=no"):
        commit += "+changes"
    return {"date": dt.date.today().isoformat(), "commit": commit}


def relative(path: str | Path) -> str:
    """``path`` relative to the repository root, with forward slashes."""
    p = Path(path)
    return (p.resolve().relative_to(ROOT) if p.is_absolute() else p).as_posix()


def provenance() -> dict[str, dict[str, str]]:
    """The recorded provenance of the older result files, keyed by path."""
    return json.loads(PROVENANCE.read_text()) if PROVENANCE.exists() else {}


def meta(path: str | Path) -> dict[str, str]:
    """Date, commit, stack and machine of a result file: its own ``meta``, else its entry in
    the provenance file; ``unknown`` where neither says."""
    rel = relative(path)
    found: dict[str, Any] = {}
    if rel.endswith(".json"):
        data = json.loads((ROOT / rel).read_text())
        if isinstance(data, dict) and isinstance(data.get("meta"), dict):
            found = data["meta"]
    found = {**provenance().get(rel, {}), **found}
    return {k: str(found.get(k, UNKNOWN)) for k in FIELDS}


def guess(path: str | Path) -> dict[str, str]:
    """What git and the file say about an older result file (``--provenance`` records it)."""
    rel = relative(path)
    date, _, commit = _git("log", "-1", "--format=%cs %h", "--", rel).partition(" ")
    stack, machine = DEFAULT_STACK, LAB
    if rel.endswith(".json"):
        data = json.loads((ROOT / rel).read_text())
        raw = data.get("raw", {}) if isinstance(data, dict) else {}
        versions = raw.get("versions") or {}
        if versions:
            stack = (f"TensorFlow {versions.get('tensorflow', UNKNOWN)}, Horovod "
                     f"{versions.get('horovod', UNKNOWN)} (Gloo), Python "
                     f"{versions.get('python', UNKNOWN)}")
        if raw.get("ranks") == 4 or "four_ranks" in rel:
            machine = LAB_4
    if "gpu_profiles" in rel:
        stack, machine = "PyTorch 2.11, CUDA 13.0, cuDNN 9.19 (benchmarks/gpu_layers.py)", \
            "one NVIDIA H200"
    if "predictions" in rel and "four_ranks" in rel:
        stack, machine = "hvd-overlap's simulator", "none: predicted before measuring"
    return {"date": date or UNKNOWN, "commit": commit or UNKNOWN, "stack": stack,
            "machine": machine}


def record(paths: list[str]) -> None:
    """Add entries for ``paths`` to the provenance file (entries already there are kept)."""
    known = provenance()
    for p in paths:
        rel = relative(p)
        if (ROOT / rel).exists() and rel not in known and not _has_meta(rel):
            known[rel] = guess(rel)
    PROVENANCE.write_text(json.dumps(dict(sorted(known.items())), indent=1) + "\n")


def _has_meta(rel: str) -> bool:
    """Whether a result file carries its own ``meta`` (files written since the tables are
    generated)."""
    if not rel.endswith(".json"):
        return False
    data = json.loads((ROOT / rel).read_text())
    return isinstance(data, dict) and isinstance(data.get("meta"), dict)


def link(path: str | Path, page: str | Path) -> str:
    """``path`` as a link target from ``page`` (both relative to the repository root)."""
    return Path(os.path.relpath(ROOT / relative(path), (ROOT / relative(page)).parent)).as_posix()


def footer(paths: list[str], page: str) -> str:
    """The line under a table: its source files, and when, where and with what they were
    made (one clause per distinct date/commit/stack/machine)."""
    metas = [meta(p) for p in paths]
    folder = Path(os.path.commonpath([Path(p).parent.as_posix() for p in paths]))
    files = ", ".join(f"[{Path(p).name}]({link(p, page)})" for p in paths) if len(paths) <= 3 \
        else f"{len(paths)} files in [{folder.as_posix()}/]({link(folder, page)}/)"
    dates = sorted({m["date"] for m in metas})
    commits = list(dict.fromkeys(m["commit"] for m in metas))
    stacks = list(dict.fromkeys(m["stack"] for m in metas))
    machines = list(dict.fromkeys(m["machine"] for m in metas))
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    made = (f"commit {commits[0]}" if len(commits) == 1
            else f"commits {', '.join(commits[:4])}{', ...' if len(commits) > 4 else ''}")
    return (f"<sub>Generated by `python -m benchmarks.tables` from {files}: {when}, {made}; "
            f"{'; '.join(stacks)}; {'; '.join(machines)}.</sub>")
