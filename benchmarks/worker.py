"""One rank of one benchmark launch: ``python -m benchmarks.worker JOB.json OUT.json``.

A launch measures a group of strategies: either ``stock`` and ``local`` -- real
``horovod.tensorflow.keras.DistributedOptimizer`` and the plain optimizer, in a process that never
imports the plugin's runtime (checked at the end: ``clean``) -- or the plugin's strategies. Each
strategy gets its own model (same seed, same synthetic batch on a rank) and SGD optimizer. The
order of the strategies rotates with the round (ABC, BCA, CAB), as the launcher rotates the
groups, so machine noise hits all alike. Each run is one ``model.fit`` of ``warmup + steps``
steps; the timing callback takes the end of the last warm-up step to the end of the last step
(Keras converts the logs of a callback that does not take tensors, so each step end is a sync
point). A run's step time is the slowest rank's. Timed launches run without ``HOROVOD_TIMELINE``:
set at all, it starts a writer thread that keeps rank 0's core busy (a third slower, the plugin's
many collectives the most). Timelines come from launches of their own (``Job.timeline_dir``, with
``HOROVOD_TIMELINE=DYNAMIC``): each strategy (``auto`` as the plan it chose) warms up, then runs
``1 + steps + 1`` steps under a timeline written to ``timeline_dir``; nothing is timed there.
Rank 0 writes the results to OUT.json.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from benchmarks.config import (
    AUTO,
    FIT_EPOCH_STEPS,
    LOCAL,
    STOCK,
    BenchConfig,
    base_name,
    is_clean_group,
    keras_generation,
    plugin_options,
)
from benchmarks.netns import link_bytes_sent

PROGRESS = "hvdo: "  # prefix of progress lines (the launcher forwards them)
#: The plugin's runtime: a clean (baseline) process loads none of it (the pure ``core``, the
#: models of ``hvd_overlap.tools`` and this lab carry no code that could touch stock's path).
RUNTIME = ("hvd_overlap.comm", "hvd_overlap.keras", "hvd_overlap.growth")


@dataclass(frozen=True)
class Job:
    """One launch: which strategies, which round (for the rotation); or, with a
    ``timeline_dir``, a launch that only records their timelines there, ``picks`` giving the
    ``DistributedOptimizer`` keywords a strategy stands for (``auto``: its choice)."""

    config: BenchConfig
    strategies: tuple[str, ...]
    round: int = 0
    timeline_dir: str = ""
    picks: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def record(self) -> bool:
        """A timeline launch (nothing timed)."""
        return bool(self.timeline_dir)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "config": json.loads(self.config.to_json())})

    @classmethod
    def from_json(cls, text: str) -> Job:
        d = json.loads(text)
        return cls(config=BenchConfig.from_json(json.dumps(d["config"])),
                   strategies=tuple(d["strategies"]), round=d["round"],
                   timeline_dir=d["timeline_dir"], picks=d.get("picks", {}))


def plugin_modules() -> list[str]:
    """The plugin's runtime modules loaded in this process."""
    return sorted(m for m in sys.modules
                  if any(m == p or m.startswith(p + ".") for p in RUNTIME))


def pin_rank() -> list[int]:
    """Pin every thread of this process to this rank's share of the cores (as ``scripts/pin-rank``:
    ``cores / local_size`` cores each, by ``HOROVOD_LOCAL_RANK``); with more ranks than cores,
    rank k shares core ``k mod cores`` (as ``hostrun`` pins emulated hosts)."""
    cores = sorted(os.sched_getaffinity(0))
    rank = int(os.environ.get("HOROVOD_LOCAL_RANK", "0"))
    size = int(os.environ.get("HOROVOD_LOCAL_SIZE", "1"))
    per = max(len(cores) // size, 1)
    mine = cores[rank * per:(rank + 1) * per] if size <= len(cores) else [
        cores[rank % len(cores)]]
    for tid in os.listdir("/proc/self/task"):  # threads started before (TF's import) as well
        try:
            os.sched_setaffinity(int(tid), mine)
        except OSError:
            pass  # a thread that has just exited
    return mine


class StepTimer(tf.keras.callbacks.Callback):
    """Seconds of each of the ``steps`` steps after the first ``warmup`` of a ``fit`` (the
    epoch's last step, after them, is not timed), the link bytes sent and the process's page
    faults meanwhile."""

    def __init__(self, warmup: int, steps: int):
        super().__init__()
        self.warmup, self.steps = warmup, steps
        self.ends: list[float] = []
        self.sent: list[int | None] = []
        self.faults: list[tuple[int, int]] = []  # (minor, major) page faults so far

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.ends.append(time.perf_counter())
        self.sent.append(link_bytes_sent())
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.faults.append((usage.ru_minflt, usage.ru_majflt))

    @property
    def faults_per_step(self) -> tuple[float, float]:
        """(minor, major) page faults of this process per timed step: memory the step had to
        map again (the allocator returned it, or the host reclaimed it)."""
        first, last = self._edges(self.faults)
        return ((last[0] - first[0]) / self.steps, (last[1] - first[1]) / self.steps)

    @property
    def link_bytes_per_step(self) -> float | None:
        """Bytes the namespace's link sent per timed step (None if not readable)."""
        first, last = self._edges(self.sent)
        return None if first is None or last is None else (last - first) / self.steps

    def _edges(self, counter: list) -> tuple[Any, Any]:
        """A per-batch counter at the end of the last warm-up step and of the last timed one."""
        return counter[self.warmup - 1], counter[self.warmup + self.steps - 1]

    @property
    def durations(self) -> list[float]:
        """Seconds of each timed step, in order."""
        timed = self.ends[self.warmup - 1:self.warmup + self.steps]
        return [b - a for a, b in zip(timed[:-1], timed[1:], strict=True)]


class Trainee:
    """A model compiled with one strategy's optimizer: ``stock`` is Horovod's own
    ``DistributedOptimizer``, ``local`` the plain optimizer, the others the plugin's."""

    def __init__(self, strategy: str, cfg: BenchConfig,
                 keywords: dict[str, Any] | None = None):
        """``keywords``: the plugin's ``DistributedOptimizer`` keywords to use instead of the
        strategy's spelling (``auto`` recorded as the plan it chose)."""
        from hvd_overlap.tools.models import build_model

        tf.keras.utils.set_random_seed(cfg.seed)
        self.link_bytes_per_step: float | None = None  # of the last run
        self.faults_per_step: tuple[float, float] = (0.0, 0.0)  # of the last run
        self.model = build_model(cfg.model, cfg.tiny)
        opt = tf.keras.optimizers.SGD(0.01, momentum=0.9)
        self.callbacks: list[tf.keras.callbacks.Callback] = []
        strategy = base_name(strategy)  # a replica (stock#2) runs its strategy
        if strategy == STOCK and keras_generation() == 3:  # (STAND_IN)
            import hvd_overlap.keras as hk

            opt = hk.DistributedOptimizer(opt, strategy="horovod")
        elif strategy == STOCK:
            import horovod.tensorflow.keras as hvd_keras

            opt = hvd_keras.DistributedOptimizer(opt)
        elif strategy != LOCAL:
            import hvd_overlap.keras as hk
            from hvd_overlap import STRATEGIES

            if keywords:
                name, extra = keywords["strategy"], {k: v for k, v in keywords.items()
                                                     if k != "strategy"}
            else:
                name, extra = plugin_options(strategy)
            opt = hk.DistributedOptimizer(opt, strategy=name, **extra)
            if AUTO in (name, *extra.values()) or STRATEGIES[name].defers:
                self.callbacks.append(hk.OverlapCallback())
        self.model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    def run(self, data: tf.data.Dataset, warmup: int, steps: int) -> list[float]:
        """Train ``warmup + steps + 1`` steps; the seconds of each of the ``steps`` timed ones.
        The epoch's last step is not timed, for any strategy: a deferring strategy
        lands its own update there (and traces that step's function once), and flushes after
        it -- once per epoch, amortised over real epochs, not the steady state."""
        timer = StepTimer(warmup, steps)
        self.model.fit(data, epochs=1, steps_per_epoch=warmup + steps + 1, verbose=0,
                       callbacks=[timer, *self.callbacks])
        self.link_bytes_per_step = timer.link_bytes_per_step
        self.faults_per_step = timer.faults_per_step
        return timer.durations


def age(trainee: Trainee, data: tf.data.Dataset, steps: int) -> int:
    """Train ``steps`` untimed steps (none if ``steps`` <= 0) in fits of at most 10 (``settle``
    trains in the same fits); the steps trained."""
    done = 0
    while done < steps:
        n = min(10, steps - done)
        trainee.model.fit(data, epochs=1, steps_per_epoch=n, verbose=0,
                          callbacks=trainee.callbacks)
        done += n
    return done


def settle(trainee: Trainee, data: tf.data.Dataset, ran: int = 0,
           limit: int = 200) -> dict[str, Any]:
    """``auto`` (or the exchange's ``exchange_forward="auto"``): train (untimed) until its
    online check has chosen, in fits of 10 steps (every rank stops at the same fit: the
    decisions are agreed), at least one fit unless ``ran`` steps were trained before (a
    ``--whole-fit``), nothing more if it chose in them. What it chose and what that cost
    (``auto``: the steps it ran before its choice was final and their time, as it reports
    them)."""
    ex = trainee.model.optimizer._hvdo
    steps, start = 0, time.perf_counter()
    while steps + ran == 0 or not ex.settled and steps < limit:
        steps += age(trainee, data, 10)
    out = {"settled": ex.settled, "trained": steps, "steps": steps,
           "seconds": time.perf_counter() - start}
    if not hasattr(ex, "current"):  # a sharded executor: its plan's notes say what it chose
        return {**out, "choice": "; ".join(n for n in ex.plan.notes if "exchange" in n)}
    return {**out, "steps": ex.settling_steps, "seconds": ex.settling_s,
            "extra_s": ex.settling_extra_s, "choice": ex.current.describe(),
            "keywords": ex.current.factory_keywords(), "log": ex.log,
            "measured_ms": _ms(ex.measured),
            "confirmed_ms": _ms(ex.confirmed),
            # the compute of the step auto's model started from (timed in its probe's steps,
            # or fitted to the probe's step where not timed): the bench prints it beside the
            # compute-only step
            "model_compute_ms": (1e3 * ex.chooser.fitted[0].compute_s
                                 if ex.chooser.fitted is not None else None)}


class FitClock(tf.keras.callbacks.Callback):
    """Seconds from the start of ``fit`` to the end of its first step (tracing included), and
    of every step and every epoch (where a whole fit's time went); when training began and
    ended."""

    def __init__(self) -> None:
        super().__init__()
        self.start = self.first_step_s = self.end = 0.0
        self.last = 0.0
        self.steps: list[float] = []
        self.epochs: list[float] = []

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.start = time.perf_counter()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.last = self._epoch_start = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        now = time.perf_counter()
        self.steps.append(now - self.last)
        self.last = now
        if not self.first_step_s:
            self.first_step_s = now - self.start

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.epochs.append(time.perf_counter() - self._epoch_start)

    def on_train_end(self, logs: dict | None = None) -> None:
        self.end = time.perf_counter()


def whole_fit(trainee: Trainee, data: tf.data.Dataset, steps: int, tag: str) -> dict[str, Any]:
    """One ``fit`` of ``steps`` steps (epochs of at most ``FIT_EPOCH_STEPS``) from the fresh
    model, timed end to end: what a user waits for. Its seconds and first step's (the slowest
    rank's: every rank waits for it), each epoch's and rank 0's every step's, and rank 0's
    seconds in ``fit`` before its training began and after it ended (the callbacks' end)."""
    import horovod.tensorflow as hvd

    epochs = -(-steps // FIT_EPOCH_STEPS)
    clock = FitClock()
    start = time.perf_counter()
    trainee.model.fit(data, epochs=epochs, steps_per_epoch=steps // epochs, verbose=0,
                      callbacks=[clock, *trainee.callbacks])
    end = time.perf_counter()
    mine = (end - start, clock.first_step_s, clock.epochs)
    every = hvd.allgather_object(mine, name=f"hvdo.bench.fit.{tag}")
    return {"steps": epochs * (steps // epochs), "epochs": epochs,
            "seconds": max(e[0] for e in every), "first_step_s": max(e[1] for e in every),
            "epoch_s": [max(col) for col in zip(*(e[2] for e in every), strict=True)],
            "step_s": clock.steps, "before_s": clock.start - start, "after_s": end - clock.end}


def _ms(times: dict[Any, float]) -> dict[str, float]:
    """Seconds by candidate -> milliseconds by the candidate's description."""
    return {c.describe(): t * 1e3 for c, t in times.items()}


def checks_online(trainee: Trainee) -> bool:
    """True while the trainee's plugin optimizer has an online check still to settle (the
    exchange's ``exchange_forward="auto"``, ``auto``'s trials)."""
    ex = getattr(trainee.model.optimizer, "_hvdo", None)
    return ex is not None and not getattr(ex, "settled", True)


def record(job: Job, data: tf.data.Dataset) -> dict[str, Any] | None:
    """A timeline launch: each strategy of the job but replicas (``stock#2``) and ``local``, built
    from ``job.picks`` where given (``auto`` as the plan it chose), settles its online checks,
    warms up ``warmup`` steps, then runs ``1 + steps + 1`` steps under a Horovod timeline written
    by rank 0 to ``timeline_dir/STRATEGY.json``. Nothing is timed: the timeline's writer thread
    keeps rank 0's core busy. The paths on rank 0 (none without ``HOROVOD_TIMELINE=DYNAMIC``)."""
    import horovod.tensorflow as hvd

    cfg = job.config
    timelines: dict[str, str] = {}
    for s in job.strategies:
        if base_name(s) != s or s == LOCAL or (s == AUTO and s not in job.picks):
            continue
        trainee = Trainee(s, cfg, job.picks.get(s))
        if checks_online(trainee):
            settle(trainee, data)
        age(trainee, data, cfg.warmup)
        path = str(Path(job.timeline_dir) / f"{s}.json")
        try:
            hvd.start_timeline(path)
        except ValueError:  # Horovod started without HOROVOD_TIMELINE
            break
        trainee.run(data, 1, cfg.steps)
        hvd.stop_timeline()
        timelines[s] = path
        if hvd.rank() == 0:
            progress(f"timeline {s:<14} recorded ({1 + cfg.steps + 1} steps)")
    return {"round": job.round, "strategies": list(job.strategies),
            "timelines": timelines} if hvd.rank() == 0 else None


def optimizer_state_bytes(opt: Any) -> dict[str, int]:
    """Bytes this rank's optimizer keeps besides the model: its slots (momentum, moments...)
    and, for ``sharded``, its parameter slices (the update targets)."""
    def nbytes(vs: Any) -> int:
        return sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in vs)

    variables = opt.variables() if callable(opt.variables) else opt.variables  # (Keras 3)
    slots = [v for v in variables if v is not opt.iterations and len(v.shape)]
    slices: list = []
    if hasattr(opt, "slice_variables"):  # the plugin's (non-empty for sharded)
        slices, slice_slots = opt.slice_variables()
        slots += slice_slots
    return {"slots": nbytes(slots), "slices": nbytes(slices)}


def progress(message: str) -> None:
    print(PROGRESS + message, file=sys.stderr, flush=True)


def _still_data() -> tf.data.Options:
    """tf.data without its autotuning and injected prefetch: on one repeated in-memory batch
    they only add threads, and their background work held Keras ``fit``'s return for up to a
    minute after training ended (reproduced without Horovod; see docs/bench.md)."""
    options = tf.data.Options()
    options.autotune.enabled = False
    options.experimental_optimization.inject_prefetch = False
    return options


def run(job: Job) -> dict[str, Any] | None:
    """Measure the job's strategies; the raw results on rank 0, None on the other ranks."""
    cfg = job.config
    pinned = pin_rank() if cfg.pin else None
    import horovod
    import horovod.tensorflow as hvd

    from hvd_overlap.tools.models import gradient_bytes, synthetic_batch

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    data = tf.data.Dataset.from_tensors(
        synthetic_batch(cfg.batch_size, seed=rank, model=cfg.model, tiny=cfg.tiny)).repeat()
    data = data.with_options(_still_data())
    if job.record:
        return record(job, data)
    names = list(job.strategies)
    r = job.round % len(names)
    times: dict[str, float] = {}
    samples: dict[str, list[float]] = {}
    means: dict[str, list[float]] = {}
    link: dict[str, list[float | None]] = {}  # per rank: bytes its link sent per timed step
    faults: dict[str, list[tuple[float, float]]] = {}  # per rank: page faults per timed step
    trainees = {s: Trainee(s, cfg) for s in names}
    chosen: dict[str, Any] = {}
    settled: dict[str, Any] = {}  # sharded strategies whose exchange checked online
    fits = {s: whole_fit(trainees[s], data, cfg.whole_fit, f"{job.round}.{s}")
            for s in names} if cfg.whole_fit else {}
    for s, fit in fits.items():
        if rank == 0:
            epochs = ", ".join(f"{e:.1f}" for e in fit["epoch_s"])
            progress(f"round {job.round + 1}/{cfg.rounds} {s:<14} whole fit of {fit['steps']} "
                     f"steps: {fit['seconds']:.1f} s (first step {fit['first_step_s']:.1f} s; "
                     f"epochs {epochs} s)")
    if AUTO in trainees:  # before any timing: the choice is made once, in its first steps
        chosen = settle(trainees[AUTO], data, ran=fits.get(AUTO, {}).get("steps", 0))
        if rank == 0:
            progress(f"round {job.round + 1}/{cfg.rounds} auto chose {chosen['choice']} in "
                     f"{chosen['steps']} steps ({chosen['seconds']:.1f} s)")
    for s in names:  # the exchange's online check, likewise (untimed)
        if s != AUTO and checks_online(trainees[s]):
            checked = settled[s] = settle(trainees[s], data,
                                          ran=fits.get(s, {}).get("steps", 0))
            if rank == 0:
                progress(f"round {job.round + 1}/{cfg.rounds} {s} settled in "
                         f"{checked['steps']} steps: {checked['choice']}")
    history: dict[str, int] = {}  # untimed steps before the timed ones (--history)
    for s in names:
        before = fits.get(s, {}).get("steps", 0) + \
            (chosen if s == AUTO else settled.get(s, {})).get("trained", 0)
        history[s] = before + age(trainees[s], data, cfg.history - before)
    for s in names[r:] + names[:r]:
        mine = trainees[s].run(data, cfg.warmup, cfg.steps)
        every = hvd.allgather_object(mine, name=f"hvdo.bench.{job.round}.{s}")
        per_step = list(zip(*every, strict=True))
        samples[s] = [max(step) for step in per_step]  # each step: its slowest rank
        means[s] = [sum(step) / len(step) for step in per_step]  # each step: the ranks' mean
        link[s] = hvd.allgather_object(trainees[s].link_bytes_per_step,
                                       name=f"hvdo.bench.link.{job.round}.{s}")
        faults[s] = hvd.allgather_object(trainees[s].faults_per_step,
                                         name=f"hvdo.bench.faults.{job.round}.{s}")
        times[s] = max(sum(d) / len(d) for d in every)
        if rank == 0:
            progress(f"round {job.round + 1}/{cfg.rounds} {s:<14} {times[s] * 1e3:8.1f} ms/step")
    memory = {s: optimizer_state_bytes(t.model.optimizer) for s, t in trainees.items()}
    loaded = plugin_modules()
    stand_in = keras_generation() == 3
    baseline = is_clean_group(names)
    clean = baseline and not loaded
    if baseline and loaded and not stand_in:
        raise RuntimeError(f"the baseline process loaded the plugin's modules {loaded}: the "
                           "stock baseline would not be clean")
    if rank != 0:
        return None
    model = next(iter(trainees.values())).model
    return {"strategies": names, "round": job.round, "ranks": size,
            "global_batch": cfg.batch_size * size, "params": model.count_params(),
            "grad_bytes": gradient_bytes(model), "step_times": times,
            "step_samples": samples, "step_means": means, "link_bytes_per_step": link,
            "page_faults_per_step": faults,
            "auto": chosen, "exchange_checks": settled, "history_steps": history,
            "whole_fit": fits,
            "optimizer_state_bytes": memory, "clean_process": clean, "plugin_modules": loaded,
            "stock_stand_in": stand_in,
            "pinned": pinned is not None, "load_avg_1min": os.getloadavg()[0],
            "horovod_env": {k: v for k, v in sorted(os.environ.items())
                            if k.startswith("HOROVOD_") and "RENDEZVOUS" not in k
                            and k not in ("HOROVOD_RANK", "HOROVOD_LOCAL_RANK",
                                          "HOROVOD_CROSS_RANK", "HOROVOD_HOSTNAME")},
            "versions": {"tensorflow": tf.__version__, "horovod": horovod.__version__,
                         "python": platform.python_version()},
            "threads": {k: os.environ.get(k) for k in
                        ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")}}


def main(argv: list[str]) -> None:
    job_path, out_path = argv
    raw = run(Job.from_json(Path(job_path).read_text()))
    if raw is not None:
        Path(out_path).write_text(json.dumps(raw, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
