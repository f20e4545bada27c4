"""One rank of the benchmark: ``python -m hvd_overlap.bench.worker CONFIG.json OUT.json``.

Each strategy gets its own model (same seed, same synthetic batch on a rank) and SGD optimizer,
built once. Rounds interleave the strategies, the order rotating each round (ABC, BCA, CAB), so
machine noise hits all alike. Each run is one ``model.fit`` of ``warmup + steps`` steps; the
timing callback takes the end of the last warm-up step to the end of the last step (Keras
converts the logs of a callback that does not take tensors, so each step end is a sync point).
A run's step time is the slowest rank's; rank 0 writes them all to OUT.json.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from hvd_overlap.bench.config import LOCAL, BenchConfig

PROGRESS = "hvdo: "  # prefix of progress lines (the launcher forwards them)


def pin_rank() -> list[int] | None:
    """Pin every thread of this process to this rank's share of the cores (as ``scripts/pin-rank``:
    ``cores / local_size`` cores each, by ``HOROVOD_LOCAL_RANK``). None if there are too few."""
    cores = sorted(os.sched_getaffinity(0))
    rank = int(os.environ.get("HOROVOD_LOCAL_RANK", "0"))
    size = int(os.environ.get("HOROVOD_LOCAL_SIZE", "1"))
    if size > len(cores):
        return None
    per = len(cores) // size
    mine = cores[rank * per:(rank + 1) * per]
    for tid in os.listdir("/proc/self/task"):  # threads started before (TF's import) as well
        try:
            os.sched_setaffinity(int(tid), mine)
        except OSError:
            pass  # a thread that has just exited
    return mine


class StepTimer(tf.keras.callbacks.Callback):
    """Mean seconds per step after the first ``warmup`` steps of a ``fit``."""

    def __init__(self, warmup: int):
        super().__init__()
        self.warmup = warmup
        self.ends: list[float] = []

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.ends.append(time.perf_counter())

    @property
    def step_time(self) -> float:
        timed = self.ends[self.warmup - 1:]
        return (timed[-1] - timed[0]) / (len(timed) - 1)


class Trainee:
    """A model compiled with one strategy's optimizer (``local``: the plain optimizer)."""

    def __init__(self, strategy: str, cfg: BenchConfig):
        import hvd_overlap.keras as hk
        from hvd_overlap import STRATEGIES
        from hvd_overlap.models import build_model

        tf.keras.utils.set_random_seed(cfg.seed)
        self.model = build_model(cfg.model, cfg.tiny)
        opt = tf.keras.optimizers.SGD(0.01, momentum=0.9)
        self.callbacks: list[tf.keras.callbacks.Callback] = []
        if strategy != LOCAL:
            opt = hk.DistributedOptimizer(opt, strategy=strategy)
            overlap = getattr(hk, "OverlapCallback", None) or getattr(
                hk.callbacks, "OverlapCallback", None)
            if overlap is not None and getattr(STRATEGIES[strategy], "defers", False):
                self.callbacks.append(overlap())
        self.model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    def run(self, data: tf.data.Dataset, warmup: int, steps: int) -> float:
        """Train ``warmup + steps`` steps; the mean step time of the timed ones, in seconds."""
        timer = StepTimer(warmup)
        # the timer goes first: a deferring strategy's end-of-epoch flush (once per epoch,
        # amortised over real epochs) stays out of the steady-state step time
        self.model.fit(data, epochs=1, steps_per_epoch=warmup + steps, verbose=0,
                       callbacks=[timer, *self.callbacks])
        return timer.step_time


def wire_time_per_step(trainee: Trainee, data: tf.data.Dataset, steps: int,
                       tag: str) -> dict[str, float] | None:
    """Seconds per step that the gradient collectives spent on the wire, read from a Horovod
    timeline of one more run (1 + ``steps`` steps): the union of the collectives' communication
    spans (negotiation excluded), divided by the steps whose gradients they carried (a deferred
    strategy's flush carries the last step's). Also per kind of collective, and for
    reduce-scatters the part after the step's last one was enqueued (backprop over: exposed).
    Rank 0 only (Horovod writes the timeline there); None elsewhere or if Horovod was started
    without ``HOROVOD_TIMELINE=DYNAMIC``."""
    import tempfile

    import horovod.tensorflow as hvd

    from hvd_overlap.timeline import merge_groups, read_timeline
    from hvd_overlap.timeline_report import covered, exposed_after_last_enqueue

    path = hvd.broadcast_object(str(Path(tempfile.mkdtemp()) / "t.json"), 0,
                                name=f"hvdo.bench.tl.{tag}")
    try:
        hvd.start_timeline(path)
    except ValueError:
        return None
    trainee.run(data, 1, steps)
    hvd.stop_timeline()
    if hvd.rank() != 0:
        return None
    trips = [c for c in merge_groups(read_timeline(path))
             if not c.tensor.startswith("hvdo.bench")]
    per_step = 1e6 * (steps + 1)
    out = {"all": covered(trips) / per_step}
    for op in sorted({c.op for c in trips}):
        out[op] = covered([c for c in trips if c.op == op]) / per_step
    scatters = [c for c in trips if c.op == "REDUCESCATTER"]
    if scatters:
        out["REDUCESCATTER_after_backprop"] = exposed_after_last_enqueue(scatters) / per_step
    return out


def optimizer_state_bytes(opt: Any) -> dict[str, int]:
    """Bytes this rank's optimizer keeps besides the model: its slots (momentum, moments...)
    and, for ``sharded``, its parameter slices (the update targets)."""
    def nbytes(vs: Any) -> int:
        return sum(int(np.prod(v.shape)) * v.dtype.size for v in vs)

    shards = getattr(getattr(opt, "_hvdo", None), "shards", None)
    slots = [v for v in opt.variables() if v is not opt.iterations and v.shape.rank]
    slices: list = []
    if shards is not None:
        slots += [v for d in shards.slots.values() for v in d.values()]
        slices = list(shards.params.values())
    return {"slots": nbytes(slots), "slices": nbytes(slices)}


def progress(message: str) -> None:
    print(PROGRESS + message, file=sys.stderr, flush=True)


def run(cfg: BenchConfig) -> dict[str, Any] | None:
    """Measure every strategy; the raw results on rank 0, None on the other ranks."""
    pinned = pin_rank() if cfg.pin else None
    import horovod
    import horovod.tensorflow as hvd

    import hvd_overlap
    from hvd_overlap.models import gradient_bytes, synthetic_batch

    hvd_overlap.init()
    rank, size = hvd.rank(), hvd.size()
    data = tf.data.Dataset.from_tensors(synthetic_batch(cfg.batch_size, seed=rank)).repeat()
    trainees = {s: Trainee(s, cfg) for s in cfg.strategies}
    times: dict[str, list[float]] = {s: [] for s in cfg.strategies}
    names = list(cfg.strategies)
    for r in range(cfg.rounds):
        for s in names[r % len(names):] + names[:r % len(names)]:
            mine = trainees[s].run(data, cfg.warmup, cfg.steps)
            times[s].append(max(hvd.allgather_object(mine, name=f"hvdo.bench.{r}.{s}")))
            if rank == 0:
                progress(f"round {r + 1}/{cfg.rounds} {s:<10} {times[s][-1] * 1e3:8.1f} ms/step")
    wire = {s: wire_time_per_step(trainees[s], data, cfg.steps, f"{r}.{s}")
            for s in cfg.strategies if s != LOCAL}
    memory = {s: optimizer_state_bytes(t.model.optimizer) for s, t in trainees.items()}
    if rank != 0:
        return None
    model = next(iter(trainees.values())).model
    return {"config": json.loads(cfg.to_json()), "ranks": size,
            "global_batch": cfg.batch_size * size, "params": model.count_params(),
            "grad_bytes": gradient_bytes(model), "step_times": times,
            "wire_time_per_step_s": {s: w and w["all"] for s, w in wire.items()},
            "wire_by_collective_s": wire, "optimizer_state_bytes": memory,
            "pinned": pinned is not None, "load_avg_1min": os.getloadavg()[0],
            "versions": {"tensorflow": tf.__version__, "horovod": horovod.__version__,
                         "python": platform.python_version()},
            "threads": {k: os.environ.get(k) for k in
                        ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")}}


def main(argv: list[str]) -> None:
    config_path, out_path = argv
    raw = run(BenchConfig.from_json(Path(config_path).read_text()))
    if raw is not None:
        Path(out_path).write_text(json.dumps(raw, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
