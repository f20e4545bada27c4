"""Multi-rank tests: run by scripts/test under ``horovodrun -np 2``; every rank runs them all."""

import os

import horovod.tensorflow.keras as hvd
import pytest

import hvd_overlap  # noqa: F401  (sets the Horovod environment before hvd.init)

os.environ.setdefault("HOROVOD_TIMELINE", "DYNAMIC")  # hvd.start_timeline in tests
hvd.init()


def pytest_collection_modifyitems(config, items):
    if os.environ.get("HOROVOD_RANK") is None or hvd.size() < 2:
        skip = pytest.mark.skip(reason="multi-rank test: run via scripts/test (horovodrun -np 2)")
        for item in items:
            item.add_marker(skip)
