"""Wire time per step from the Horovod timeline a benchmark launch recorded (pure Python)."""

from __future__ import annotations

from pathlib import Path

from hvd_overlap.tools.timeline import SENT_PER_RANK, merge_groups, read_timeline
from hvd_overlap.tools.timeline_report import covered, exposed_after_last_enqueue

#: the key of the dense factor exchange's collectives (all-to-alls and all-gathers of
#: activations, named ``<optimizer>.xch<layer>...``) in ``wire_time_per_step``
EXCHANGE = "exchange"
EXCHANGE_NAME = ".xch"


def wire_time_per_step(path: str | Path, steps: int) -> dict[str, float] | None:
    """Seconds per step that the gradient collectives spent on the wire in a timeline of
    ``1 + steps + 1`` steps (``Trainee.run(data, 1, steps)``): the union of their
    communication spans (negotiation excluded), divided by the steps whose gradients they
    carried (a deferring strategy's last step carries its own deferred part). Also per kind of
    collective, the dense factor exchange's apart (``EXCHANGE``: they are counted in their kind
    too), and for reduce-scatters the part after the step's last one was enqueued (backprop
    over: exposed). None if the file is missing."""
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
    exchanged = [c for c in trips if EXCHANGE_NAME in c.tensor]
    if exchanged:
        out[EXCHANGE] = covered(exchanged) / per_step
    return out


def wire_bytes_per_step(path: str | Path, steps: int, ranks: int) -> dict[str, float] | None:
    """Bytes this rank sent per step in the same timeline, from each collective's output size
    (Horovod logs its dtype and shape) and the algorithm's share (``SENT_PER_RANK``): in all
    and per kind of collective (an all-to-all's size is not logged: not counted). None if the
    file is missing."""
    if not Path(path).exists():
        return None
    trips = [c for c in read_timeline(path) if not c.tensor.startswith("hvdo.bench")]
    out: dict[str, float] = {"all": 0.0}
    for c in trips:
        sent = SENT_PER_RANK.get(c.op, lambda n, p: 0.0)(c.nbytes, ranks) / (steps + 2)
        out[c.op] = out.get(c.op, 0.0) + sent
        out["all"] += sent
    return out
