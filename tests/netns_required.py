"""Tests that emulate a network: as root (CI, this project's machines) a missing requirement
fails the test; without root they are skipped, saying why."""

import os

import pytest

from benchmarks.netns import NetnsError, check_requirements


def require_netns() -> None:
    try:
        check_requirements()
    except NetnsError as e:
        if os.geteuid() == 0:
            pytest.fail(f"cannot test the emulated network as root: {e}")
        pytest.skip(f"emulated network not tested (needs root): {e}")
