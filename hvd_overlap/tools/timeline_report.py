"""Per-step analysis of a Horovod timeline: communication time, how much of it was hidden
behind backprop, and the order the collectives ran in; and a Gantt chart of it.

Horovod's timeline holds communication spans only (no compute), so the definitions are:

- **step**: by default the k-th occurrence of every collective name seen most often (a training
  step issues each named collective once). Left out of every step: names seen fewer times, and
  Horovod's default names of unnamed eager ops (``HorovodAllgather``, ``HorovodBroadcast``...:
  one-off helpers such as ``broadcast_variables`` or ``allgather_object``). Or, with
  ``per_step=N``, consecutive groups of N collectives in enqueue order.
- **wall**: from the step's first enqueue to the end of its last collective.
- **backprop window**: from the first enqueue to the *last* enqueue of the step -- while the
  last gradient had not been produced yet, i.e. backprop was still running.
- **comm**: the union of the spans in which the step's collectives were on the wire.
- **hidden**: the part of comm inside the backprop window; **exposed** = comm - hidden.

Communication overlapping the *next* step's forward (deferred strategies) cannot be seen
without compute spans: it counts as exposed here.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from hvd_overlap.tools.timeline import Collective

_UNNAMED = re.compile(r"^Horovod[A-Za-z]+$")  # Horovod's name for an unnamed eager collective

DEFINITION = ("hidden = communication overlapping the step's backprop window (first enqueue to "
              "last enqueue, i.e. before the last gradient existed); exposed = the rest")


@dataclass(frozen=True)
class StepReport:
    """One step's collectives (in start order) and its times in µs."""

    index: int
    collectives: tuple[Collective, ...]
    first_enqueue: float
    last_enqueue: float
    end: float
    comm: float
    hidden: float

    @property
    def wall(self) -> float:
        return self.end - self.first_enqueue

    @property
    def exposed(self) -> float:
        return self.comm - self.hidden

    @property
    def hidden_fraction(self) -> float:
        return self.hidden / self.comm if self.comm else 0.0

    def order(self) -> list[str]:
        """Labels in the order communication started (``b<k>`` for plan buckets)."""
        return [label(c) for c in self.collectives]


def label(c: Collective) -> str:
    """``b<k>`` for a plan bucket, else the tensor name."""
    return f"b{c.bucket}" if c.bucket is not None else c.tensor


def union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merged, sorted, non-overlapping intervals covering ``spans``."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def covered(collectives: list[Collective]) -> float:
    """µs during which at least one of ``collectives`` was on the wire."""
    return sum(b - a for a, b in union([(c.start, c.end) for c in collectives]))


def exposed_after_last_enqueue(collectives: list[Collective]) -> float:
    """µs, summed over steps, that a step's collectives spent on the wire after the step's last
    one was enqueued: for gradient collectives, communication left when backprop was over."""
    total = 0.0
    for step in split_steps(collectives):
        last = max(c.enqueued for c in step)
        total += sum(b - a for a, b in union([(max(c.start, last), c.end) for c in step]))
    return total


def overlap(spans: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Total length of ``spans`` (disjoint) inside [lo, hi]."""
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in spans)


def split_steps(collectives: list[Collective], per_step: int | None = None
                ) -> list[list[Collective]]:
    """Group collectives into steps (see the module docstring)."""
    ordered = sorted(collectives, key=lambda c: (c.enqueued, c.start, c.tensor))
    if per_step is not None:
        if per_step < 1:
            raise ValueError("per_step must be at least 1")
        return [ordered[i:i + per_step] for i in range(0, len(ordered), per_step)]
    counts = Counter(c.tensor for c in ordered if not _UNNAMED.match(c.tensor))
    most = max(counts.values(), default=0)
    seen: dict[str, int] = defaultdict(int)
    steps: dict[int, list[Collective]] = defaultdict(list)
    for c in ordered:
        if counts.get(c.tensor) == most:
            steps[seen[c.tensor]].append(c)
            seen[c.tensor] += 1
    return [steps[k] for k in sorted(steps)]


def analyze(collectives: list[Collective], per_step: int | None = None) -> list[StepReport]:
    """One report per step, from (preferably ``merge_groups``-ed) collectives."""
    reports = []
    for i, step in enumerate(split_steps(collectives, per_step)):
        first = min(c.enqueued for c in step)
        last = max(c.enqueued for c in step)
        spans = union([(c.start, c.end) for c in step])
        reports.append(StepReport(
            index=i, collectives=tuple(sorted(step, key=lambda c: (c.start, c.tensor))),
            first_enqueue=first, last_enqueue=last, end=max(c.end for c in step),
            comm=sum(b - a for a, b in spans), hidden=overlap(spans, first, last)))
    return reports


def format_steps(reports: list[StepReport], limit: int = 20) -> str:
    """A table: per step wall, comm, hidden, exposed (ms), hidden %, and the order."""
    lines = [f"{'step':>4} {'wall_ms':>8} {'comm_ms':>8} {'hidden_ms':>9} {'exposed_ms':>10} "
             f"{'hidden%':>7}  order (start)"]
    for r in reports[:limit]:
        lines.append(f"{r.index:>4} {r.wall / 1e3:>8.2f} {r.comm / 1e3:>8.2f} "
                     f"{r.hidden / 1e3:>9.2f} {r.exposed / 1e3:>10.2f} "
                     f"{100 * r.hidden_fraction:>6.1f}%  {' '.join(r.order())}")
    if len(reports) > limit:
        lines.append(f"... {len(reports) - limit} more steps")
    lines.append(DEFINITION)
    return "\n".join(lines)


def plot_gantt(path: str | Path, reports: list[StepReport], max_steps: int = 4) -> None:
    """Gantt chart of the first ``max_steps`` steps: one row per collective, waiting (enqueue to
    start) light, on the wire dark; each step's backprop window shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = reports[:max_steps]
    if not shown:
        raise ValueError("no steps to plot")
    t0 = shown[0].first_enqueue
    rows: dict[str, int] = {}
    for r in shown:
        for c in sorted(r.collectives, key=lambda c: c.enqueued):
            rows.setdefault(label(c), len(rows))
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.3 * len(rows)))
    for r in shown:
        ax.axvspan((r.first_enqueue - t0) / 1e3, (r.last_enqueue - t0) / 1e3, color="C2",
                   alpha=0.12, lw=0)
        for c in r.collectives:
            y = rows[label(c)]
            ax.barh(y, (c.start - c.enqueued) / 1e3, left=(c.enqueued - t0) / 1e3,
                    color="C0", alpha=0.3, height=0.6)
            ax.barh(y, (c.end - c.start) / 1e3, left=(c.start - t0) / 1e3, color="C0",
                    height=0.6)
    ax.set_yticks(range(len(rows)), [n[-40:] for n in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the first enqueue")
    ax.set_title("light: waiting (enqueued, not yet on the wire); dark: on the wire; "
                 "green: backprop window", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
