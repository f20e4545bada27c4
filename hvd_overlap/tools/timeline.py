"""Read a Horovod timeline (``HOROVOD_TIMELINE``) into collectives with their times.

Horovod writes Chrome-trace JSON: one "process" per tensor name, and on it ``B``/``E`` events:
``NEGOTIATE_<OP>`` from the moment this rank enqueued the tensor until all ranks agreed, then
``<OP>`` (e.g. ``ALLREDUCE``) while it was really being communicated. Times are microseconds.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

_BUCKET = re.compile(r"^(?P<prefix>.+)\.b(?P<bucket>\d+)(?:_\d+of\d+|\.v\d+.*|\.rs|\.ag)?$")


#: Timeline op names of the sharded strategies' gathers (``gather_with`` allgather / alltoall).
GATHER_OPS = ("ALLGATHER", "ALLTOALL")


@dataclass(frozen=True)
class Collective:
    """One tensor's trip through Horovod: enqueued, then communicated from start to end (µs)."""

    tensor: str
    op: str
    enqueued: float
    start: float
    end: float

    @property
    def bucket(self) -> int | None:
        """The plan bucket index encoded in the plugin's names (``<prefix>.b<k>...``)."""
        m = _BUCKET.match(self.tensor)
        return int(m.group("bucket")) if m else None


def load_events(path: str | Path) -> list[dict]:
    """The trace events; tolerates a file whose writer has not closed the JSON array yet."""
    text = Path(path).read_text().strip()
    if not text.endswith("]"):
        text = text.rstrip(",\n ") + "]"
    text = re.sub(r",\s*\]$", "]", text)
    return json.loads(text)


def origin_us(path: str | Path) -> float:
    """Wall-clock time (µs since the epoch) of the timeline's zero, for matching host clocks."""
    for ev in load_events(path):
        start = ev.get("args", {}).get("start_time_since_epoch_in_micros")
        if start is not None:
            return float(start)
    raise ValueError(f"{path}: no start_time_since_epoch_in_micros in the timeline")


_PART = re.compile(r"_\d+of\d+$")


def merge_groups(collectives: list[Collective]) -> list[Collective]:
    """One entry per grouped collective: Horovod logs each of a group's k tensors as
    ``<name>_<i>of<k>``; their n-th occurrences are merged (earliest start, latest end)."""
    seen: dict[str, int] = defaultdict(int)
    merged: dict[tuple[str, int], Collective] = {}
    for c in collectives:
        occurrence = seen[c.tensor]
        seen[c.tensor] += 1
        key = (_PART.sub("", c.tensor), occurrence)
        m = merged.get(key)
        merged[key] = c if m is None else Collective(
            key[0], c.op, min(m.enqueued, c.enqueued), min(m.start, c.start), max(m.end, c.end))
    return sorted(merged.values(), key=lambda c: (c.start, c.tensor))


def read_timeline(path: str | Path) -> list[Collective]:
    """Every completed collective in the file, ordered by the time communication started."""
    names: dict[int, str] = {}
    stacks: dict[int, list[tuple[str, float]]] = defaultdict(list)
    enqueued: dict[int, float] = {}
    out: list[Collective] = []
    for ev in load_events(path):
        pid, ph = ev.get("pid"), ev.get("ph")
        if ph == "M" and ev.get("name") == "process_name" and "name" in ev.get("args", {}):
            names[pid] = ev["args"]["name"]
        elif ph == "B":
            stacks[pid].append((ev.get("name", ""), ev["ts"]))
        elif ph == "E" and stacks[pid]:
            name, begin = stacks[pid].pop()
            if stacks[pid]:
                continue  # a nested activity (memcpy, the transport's own span)
            if name.startswith("NEGOTIATE_"):
                enqueued[pid] = begin
            elif pid in names:
                out.append(Collective(names[pid], name, enqueued.pop(pid, begin), begin, ev["ts"]))
    return sorted(out, key=lambda c: (c.start, c.tensor))
