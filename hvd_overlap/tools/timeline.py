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
    nbytes: int = 0  # this rank's output tensor (the timeline's dtype and shape), 0 if unknown

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


_ITEMSIZE = {"uint8": 1, "int8": 1, "float16": 2, "int32": 4, "float32": 4, "int64": 8,
             "float64": 8}


def _nbytes(args: dict) -> int:
    """Bytes of the output tensor a timeline end event describes (``dtype``, ``shape``:
    ``"[4, 3]"``)."""
    try:
        dims = json.loads(args["shape"])
    except (KeyError, ValueError):
        return 0
    n = 1
    for d in dims:
        n *= int(d)
    return n * _ITEMSIZE.get(args.get("dtype", ""), 4)


#: Bytes one rank sends for a collective whose output on that rank has ``n`` bytes (what Horovod
#: 0.28.1's timeline logs), on ``p`` ranks, by ring algorithms. Horovod logs no size for an
#: all-to-all: it is missing from what a timeline can tell.
SENT_PER_RANK = {
    "ALLREDUCE": lambda n, p: 2 * (p - 1) / p * n,
    "REDUCESCATTER": lambda n, p: (p - 1) * n,   # the output is this rank's 1/P
    "ALLGATHER": lambda n, p: (p - 1) / p * n,   # the output is every rank's part
    "BROADCAST": lambda n, p: n,
}


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
                out.append(Collective(names[pid], name, enqueued.pop(pid, begin), begin, ev["ts"],
                                      _nbytes(ev.get("args", {}))))
    return sorted(out, key=lambda c: (c.start, c.tensor))
