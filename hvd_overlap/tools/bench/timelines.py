"""Wire time per step from the Horovod timeline a benchmark launch recorded (pure Python)."""

from __future__ import annotations

from pathlib import Path

from hvd_overlap.tools.timeline import merge_groups, read_timeline
from hvd_overlap.tools.timeline_report import covered, exposed_after_last_enqueue


def wire_time_per_step(path: str | Path, steps: int) -> dict[str, float] | None:
    """Seconds per step that the gradient collectives spent on the wire in a timeline of
    ``1 + steps + 1`` steps (``Trainee.run(data, 1, steps)``): the union of their
    communication spans (negotiation excluded), divided by the steps whose gradients they
    carried (a deferring strategy's last step carries its own deferred part). Also per kind of
    collective, and for reduce-scatters the part after the step's last one was enqueued
    (backprop over: exposed). None if the file is missing."""
    if not Path(path).exists():
        return None
    trips = [c for c in merge_groups(read_timeline(path))
             if not c.tensor.startswith("hvdo.bench")]
    per_step = 1e6 * (steps + 2)
    out = {"all": covered(trips) / per_step}
    for op in sorted({c.op for c in trips}):
        out[op] = covered([c for c in trips if c.op == op]) / per_step
    scatters = [c for c in trips if c.op == "REDUCESCATTER"]
    if scatters:
        out["REDUCESCATTER_after_backprop"] = exposed_after_last_enqueue(scatters) / per_step
    return out
