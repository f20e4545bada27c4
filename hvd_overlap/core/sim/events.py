"""The event loop: one compute resource and Horovod's background thread, over one step.

The compute resource runs the step's tasks in program order (the forward of each layer, the
backward of each layer in reverse, the optimizer updates), plus *eager* tasks that run as soon
as their collectives are done. The channel is Horovod's background thread: every cycle
(``HOROVOD_CYCLE_TIME``) it negotiates the requests that are ready on all ranks, then runs
their collectives one at a time, fusing the fusable ones up to ``HOROVOD_FUSION_THRESHOLD``.
The step starts with an idle channel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hvd_overlap.core.sim.cluster import Cluster

_EPS = 1e-12


@dataclass
class Request:
    """A collective the channel must run. ``after``: issued only when that request is done."""

    kind: str
    nbytes: int
    tensors: int
    label: str
    fusable: bool = False
    at_start: bool = False
    after: int | None = None


@dataclass
class Task:
    """Compute work in program order; waits for requests, issues requests when done.
    ``eager``: not in program order -- runs as soon as its requests are done, pausing the
    program-order task meanwhile (one at a time, to completion)."""

    label: str
    work: float
    waits: tuple[int, ...] = ()
    issues: tuple[int, ...] = ()
    eager: bool = False


def _cost(cluster: Cluster, reqs: Sequence[Request]) -> float:
    """Seconds of one collective carrying ``reqs`` (fused if several)."""
    return (cluster.collective(reqs[0].kind, sum(r.nbytes for r in reqs))
            + cluster.per_tensor() * sum(r.tensors for r in reqs))


def _responses(cluster: Cluster, ready: list[int], reqs: Sequence[Request]) -> list[list[int]]:
    """One cycle's collectives: fusable requests packed in ready order up to the threshold."""
    ops: list[list[int]] = []
    fused: list[int] = []
    for rid in ready:
        r = reqs[rid]
        if not r.fusable:
            ops.append([rid])
            continue
        if fused and sum(reqs[f].nbytes for f in fused) + r.nbytes > cluster.fusion_bytes:
            ops.append(fused)
            fused = []
        fused.append(rid)
    if fused:
        ops.append(fused)
    return ops


def run_step(tasks: Sequence[Task], reqs: Sequence[Request], cluster: Cluster) -> dict[str, Any]:
    """Simulate; returns the step's end, the seconds spent transferring, the collectives run
    and when each request (by label) was done."""
    inf = math.inf
    issued: dict[int, float] = {i: 0.0 for i, r in enumerate(reqs) if r.at_start}
    done: dict[int, float] = {}
    taken: set[int] = set()
    successors = {r.after: i for i, r in enumerate(reqs) if r.after is not None}
    program = [i for i, tk in enumerate(tasks) if not tk.eager]
    eager = [i for i, tk in enumerate(tasks) if tk.eager]
    left = {i: tk.work for i, tk in enumerate(tasks)}  # compute: work left of each task
    finished: set[int] = set()
    t, k = 0.0, 0                      # k: next program-order task (index into program)
    phase, phase_end, remaining_m = "idle", 0.0, 0.0  # channel
    last_cycle, anchor, cycle_ops, current = 0.0, 0.0, [], []
    wire, n_ops = 0.0, 0

    def next_cycle() -> float:
        """Start of the first cycle that sees a waiting request; idle cycles tick from
        ``anchor`` every ``cycle_s``."""
        waiting = [issued[i] for i in issued if i not in taken]
        if not waiting:
            return inf
        late = max(min(waiting) - anchor, 0.0)
        if cluster.cycle_s <= 0:
            return anchor + late
        return anchor + math.ceil(late / cluster.cycle_s - 1e-9) * cluster.cycle_s

    def pick() -> int | None:
        """The task computing now: an eager one already started or ready, else the next
        program-order one if its requests are done."""
        ready = [i for i in eager if i not in finished and
                 (left[i] < tasks[i].work or all(w in done for w in tasks[i].waits))]
        if ready:
            return min(ready, key=lambda i: (left[i] == tasks[i].work, i))  # started first
        if k < len(program) and all(w in done for w in tasks[program[k]].waits):
            return program[k]
        return None

    while True:
        running = pick()
        busy_c, busy_m = running is not None, phase == "transfer"
        rate_c = 1.0 - cluster.cpu_steal if busy_m else 1.0
        rate_m = 1.0 / cluster.comm_slowdown if busy_c else 1.0
        t_c = t + left[running] / rate_c if busy_c else inf
        if phase == "idle":
            t_m = next_cycle()
        elif phase == "negotiate":
            t_m = phase_end
        else:
            t_m = t + remaining_m / rate_m
        t_next = min(t_c, t_m)
        if t_next == inf:
            break
        dt = t_next - t
        if busy_c:
            left[running] -= dt * rate_c
        if busy_m:
            remaining_m -= dt * rate_m
            wire += dt
        t = t_next
        if busy_c and left[running] <= _EPS:
            for rid in tasks[running].issues:
                issued[rid] = t
            finished.add(running)
            if not tasks[running].eager:
                k += 1
        if t_m <= t + _EPS:
            if phase == "idle":
                last_cycle = t
                ready = sorted((i for i in issued if i not in taken and issued[i] <= t + _EPS),
                               key=lambda i: (issued[i], i))
                taken.update(ready)
                cycle_ops = _responses(cluster, ready, reqs)
                phase, phase_end = "negotiate", t + cluster.negotiation()
            elif phase == "transfer":
                for rid in current:
                    done[rid] = t
                    if rid in successors:
                        issued[successors[rid]] = t
                phase = "negotiate"
                phase_end = t
            if phase == "negotiate" and phase_end <= t + _EPS:
                if cycle_ops:
                    current = cycle_ops.pop(0)
                    remaining_m = _cost(cluster, [reqs[i] for i in current])
                    n_ops += 1
                    phase = "transfer"
                else:  # Horovod's loop starts the next cycle one cycle_s after this one
                    phase, anchor = "idle", max(last_cycle + cluster.cycle_s, t)
    if len(finished) < len(tasks) or len(done) < len(reqs):
        raise RuntimeError(f"simulation stalled: {len(finished)}/{len(tasks)} tasks, "
                           f"{len(done)}/{len(reqs)} collectives done")
    end = max([t] + list(done.values()))
    return {"end": end, "wire": wire, "collectives": n_ops,
            "done": {reqs[i].label: done[i] for i in sorted(done)}}
