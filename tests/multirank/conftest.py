"""Multi-rank tests: run by scripts/test under ``horovodrun -np 2``; every rank runs them all."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import horovod.tensorflow.keras as hvd
import pytest

import hvd_overlap  # noqa: F401  (sets the Horovod environment before hvd.init)

# No HOROVOD_TIMELINE here: set at all, it starts a writer thread on rank 0 that keeps a core
# busy for the whole process (the tests ran 1.4x slower with it). scripts/test sets it only for
# the launch of test_timeline.py, which records timelines.
hvd.init()


@pytest.fixture
def exchanged(monkeypatch) -> dict[str, int]:
    """How many times a patched layer was activated and became active (the exchange carries
    its kernel from the next trace on); an ``activate`` that left the layer inactive does not
    count."""
    from hvd_overlap.keras.exchange import ExchangedDense

    count = {"n": 0}
    original = ExchangedDense.activate

    def activate(self: Any, rows: tuple[int, int], keep: bool = False) -> None:
        out = original(self, rows, keep)
        count["n"] += int(self.active)
        return out
    monkeypatch.setattr(ExchangedDense, "activate", activate)
    return count


class TrainSteps:
    """The train function every step ran, per optimizer, in order: ``fit``'s (the one
    ``OverlapCallback`` installed for the step) and custom loops' (``make_train_step``)."""

    def __init__(self) -> None:
        self._ran: list[tuple[Any, Any]] = []

    def record(self, opt: Any, fn: Any) -> None:
        self._ran.append((opt, fn))

    def of(self, opt: Any) -> list[Any]:
        """The functions ``opt``'s steps ran, one per step (a function repeats), in order."""
        return [fn for o, fn in self._ran if o is opt]

    def optimizers(self) -> list[Any]:
        """The optimizers whose steps were recorded, in the order of their first step."""
        out: list[Any] = []
        for o, _ in self._ran:
            if not any(o is seen for seen in out):
                out.append(o)
        return out


@pytest.fixture
def train_steps(monkeypatch) -> TrainSteps:
    """Records which train function each step of the plugin's optimizers ran (stock Horovod's
    steps are not recorded: ``OverlapCallback`` leaves its ``fit`` alone)."""
    from hvd_overlap.keras.callbacks import OverlapCallback
    from hvd_overlap.keras.train_step import OverlapTrainStep

    steps = TrainSteps()
    begin = OverlapCallback.on_train_batch_begin

    def on_train_batch_begin(self: Any, batch: int, logs: dict | None = None) -> None:
        begin(self, batch, logs)
        opt = self._optimizer()
        if opt is not None and self._patched:
            steps.record(opt, self.model.train_function)  # what fit calls for this step
    monkeypatch.setattr(OverlapCallback, "on_train_batch_begin", on_train_batch_begin)
    trace = OverlapTrainStep._trace

    def _trace(self: Any) -> Callable[..., Any]:
        fn = trace(self)

        def run(*args: Any, **kwargs: Any) -> Any:
            steps.record(self.opt, fn)
            return fn(*args, **kwargs)
        return run
    monkeypatch.setattr(OverlapTrainStep, "_trace", _trace)
    return steps


def pytest_collection_modifyitems(config, items):
    if os.environ.get("HOROVOD_RANK") is None or hvd.size() < 2:
        skip = pytest.mark.skip(reason="multi-rank test: run via scripts/test (horovodrun -np 2)")
        for item in items:
            item.add_marker(skip)
