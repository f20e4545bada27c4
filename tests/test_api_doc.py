"""docs/api.md against the code: every exported name is on the page, every documented callable
is shown with every argument (and each default that is a value: ``flush_every=None``), every
member of the wrapped optimizer is named, every command of ``hvd-overlap`` has its section with
each of its options. The checker itself is tested to fail on a page missing one of them."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import horovod.tensorflow as hvd
import pytest

import hvd_overlap
import hvd_overlap.keras
from hvd_overlap.comm import methods
from hvd_overlap.growth import callback, data, policy
from hvd_overlap.keras.executors.step_state import TrainLoop
from hvd_overlap.keras.wrapper import DistributedMixin
from hvd_overlap.tools.cli import main

PAGE = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
#: what the page's defaults are evaluated with (``op=hvd.Average``)
NAMESPACE = {"hvd": hvd, "DEFAULT_BUCKET_BYTES": hvd_overlap.DEFAULT_BUCKET_BYTES,
             "TrainLoop": TrainLoop}
#: the bucket-method interface the page documents (the module's other names are internal)
METHODS = ("CommSettings", "GradientMethod", "SliceMethod", "Allreduce", "ReduceScatterGather",
           "StockHorovod")


def _policy_names() -> list[str]:
    """``hvd_overlap.growth.policy``'s ``__all__`` (its triggers are re-exported from
    ``growth.triggers``)."""
    return list(policy.__all__)


def exported() -> Iterator[tuple[str, str, Any]]:
    """(how the page spells it, qualified name, object) of every name a user imports."""
    for module, names in ((hvd_overlap, hvd_overlap.__all__),
                          (hvd_overlap.keras, hvd_overlap.keras.__all__),
                          (callback, callback.__all__), (data, data.__all__),
                          (policy, _policy_names())):
        for name in names:
            yield name, f"{module.__name__}.{name}", getattr(module, name)
    for name in METHODS:
        yield f"methods.{name}", f"{methods.__name__}.{name}", getattr(methods, name)


def optimizer_members() -> Iterator[tuple[str, Any]]:
    """(``opt.<name>``, member) of the wrapped optimizer's public methods and properties."""
    for name, member in vars(DistributedMixin).items():
        if not name.startswith("_"):
            yield f"opt.{name}", getattr(DistributedMixin, name) if not isinstance(
                member, property) else member


def _signatures(page: str, spelling: str) -> list[str]:
    """The argument text of every ``spelling(...)`` on the page (balanced parentheses)."""
    out = []
    for m in re.finditer(rf"(?<![\w]){re.escape(spelling)}\(", page):
        depth, i = 1, m.end()
        while depth and i < len(page):
            depth += {"(": 1, ")": -1}.get(page[i], 0)
            i += 1
        out.append(page[m.end():i - 1])
    return out


def _split(args: str) -> list[str]:
    """Top-level comma-separated items of an argument list."""
    items, depth, current, quote = [], 0, "", ""
    for ch in args:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(current.strip())
            current = ""
            continue
        current += ch
    return [i for i in [*items, current.strip()] if i and i != "*"]


def _signature_problems(page: str, spelling: str, obj: Any) -> list[str]:
    """Why no ``spelling(...)`` on the page shows ``obj``'s arguments and value defaults."""
    params = [p for p in inspect.signature(obj).parameters.values() if p.name != "self"]
    wanted = {("*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else "")
              + p.name: p for p in params}
    best: list[str] | None = None
    for text in _signatures(page, spelling):
        items = {i.split("=", 1)[0].strip(): i.split("=", 1)[1].strip() if "=" in i else None
                 for i in _split(text)}
        problems = [f"{spelling}: argument {name} missing" for name in wanted
                    if name not in items]
        for name, p in wanted.items():
            if name in items and p.default is not p.empty:
                try:
                    same = eval(items[name] or "<none>", dict(NAMESPACE)) == p.default
                except Exception:
                    same = False
                if not same:
                    problems.append(f"{spelling}: {name}={p.default!r} not shown as such "
                                    f"(page: {items[name]!r})")
        if best is None or len(problems) < len(best):
            best = problems
    return [f"{spelling}(...) is not on the page"] if best is None else best


def _documentable(obj: Any) -> bool:
    """Callables whose signature the page must show (not exceptions, protocols, constants)."""
    if inspect.isclass(obj):
        return not issubclass(obj, BaseException) and not getattr(obj, "_is_protocol", False)
    return callable(obj) and not isinstance(obj, dict)


def check(page: str) -> list[str]:
    """Everything the page lacks."""
    problems = []
    for spelling, qualified, obj in exported():
        if not re.search(rf"`[^`]*(?<![\w]){re.escape(spelling)}\b", page):
            problems.append(f"{qualified} is not on the page")
        elif _documentable(obj):
            problems += _signature_problems(page, spelling, obj)
    for spelling, member in optimizer_members():
        if isinstance(member, property):
            if not re.search(rf"`{re.escape(spelling)}\b", page):
                problems.append(f"{spelling} is not on the page")
        else:
            problems += _signature_problems(page, spelling, member)
    return problems + _cli_problems(page)


def _section(page: str, heading: str) -> str | None:
    """The text under the heading that contains ``heading``, to the next heading."""
    m = re.search(rf"^#+ .*{re.escape(heading)}.*$", page, re.M)
    if m is None:
        return None
    nxt = re.search(r"^#+ ", page[m.end():], re.M)
    return page[m.end():m.end() + nxt.start() if nxt else len(page)]


def _cli_problems(page: str) -> list[str]:
    problems = []
    for name, command in main.commands.items():
        section = _section(page, f"`hvd-overlap {name}`")
        if section is None:
            problems.append(f"hvd-overlap {name}: no section")
            continue
        for p in command.params:
            if isinstance(p, click.Argument):
                label = (p.metavar or p.name.upper()).strip("[].")
                found = re.search(rf"\b{re.escape(label)}\b", section)
            else:
                label = max(p.opts, key=len)
                found = re.search(rf"{re.escape(label)}(?![\w-])", section)
            if not found:
                problems.append(f"hvd-overlap {name}: {label} not in its section")
    return problems


def test_the_page_documents_every_export_argument_member_and_command():
    assert check(PAGE) == []


@pytest.mark.parametrize("cut, expected", [
    ("flush_every=None, ", "OverlapCallback: argument flush_every missing"),
    ("`tensorflow_distributions()`", "hvd_overlap.tensorflow_distributions is not on the page"),
    ("`opt.make_train_step(step_fn, model=None)`", "opt.make_train_step(...) is not on the page"),
    ("legacy_opts=False, ", "load_model: argument legacy_opts missing"),
    ("patience=3, ", "Plateau: argument patience missing"),
    ("`opt.pending`", "opt.pending is not on the page"),
    ("[--plot-steps 4]", "hvd-overlap timeline: --plot-steps not in its section"),
])
def test_the_checker_fails_on_a_page_missing_something(cut, expected):
    assert cut in PAGE
    assert expected in check(PAGE.replace(cut, ""))


def test_a_wrong_default_is_caught():
    problems = check(PAGE.replace("gather_state=True)`", "gather_state=False)`"))
    assert any("gather_state=True" in p for p in problems), problems
