"""Multi-rank tests: run by scripts/test under ``horovodrun -np 2``; every rank runs them all."""

import os

import horovod.tensorflow.keras as hvd
import pytest

import hvd_overlap  # noqa: F401  (sets the Horovod environment before hvd.init)

# No HOROVOD_TIMELINE here: set at all, it starts a writer thread on rank 0 that keeps a core
# busy for the whole process (the tests ran 1.4x slower with it). scripts/test sets it only for
# the launch of test_timeline.py, which records timelines.
hvd.init()


@pytest.fixture
def exchanged(monkeypatch):
    """How many times a patched layer was activated (the exchange carried its kernel)."""
    from hvd_overlap.keras.exchange import ExchangedDense

    count = {"n": 0}
    original = ExchangedDense.activate

    def activate(self, rows, keep=False):
        count["n"] += 1
        return original(self, rows, keep)
    monkeypatch.setattr(ExchangedDense, "activate", activate)
    return count


def pytest_collection_modifyitems(config, items):
    if os.environ.get("HOROVOD_RANK") is None or hvd.size() < 2:
        skip = pytest.mark.skip(reason="multi-rank test: run via scripts/test (horovodrun -np 2)")
        for item in items:
            item.add_marker(skip)
