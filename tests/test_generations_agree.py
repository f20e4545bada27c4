"""The plugin's Keras 2 path and its Keras 3 path train to the same weights: from the same
starting weights and data, on 2 ranks, every strategy both generations run, with SGD (momentum)
and Adam on a dense model, and SGD on an embedding model (``cases`` says why not Adam there).
Where both tf-keras and Keras 3 are installed (the TF 2.18 venv), one ``horovodrun`` launch of
``tests/jobs/generations_agree.py`` per generation; skipped elsewhere, saying why.
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest

from tests.jobs import generations_agree as job
from tests.launch import ROOT, horovodrun

TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}

pytestmark = pytest.mark.skipif(
    find_spec("tf_keras") is None or find_spec("keras") is None
    or not __import__("keras").__version__.startswith("3."),
    reason="needs tf-keras and Keras 3 in one venv (scripts/test runs it in .venv-tf2.18)")


def _train(out: Path, legacy: bool) -> None:
    """Every case on 2 ranks with tf-keras (``legacy``) or Keras 3 as ``tf.keras``."""
    out.mkdir()
    horovodrun(2, ROOT / "tests" / "jobs" / "generations_agree.py", str(out), limit_s=240,
               env={"TF_USE_LEGACY_KERAS": "1"} if legacy else None,
               unset=() if legacy else ("TF_USE_LEGACY_KERAS",))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[int, Path]:
    base = tmp_path_factory.mktemp("generations")
    _train(base / "keras2", legacy=True)
    _train(base / "keras3", legacy=False)
    return {2: base / "keras2", 3: base / "keras3"}


def _load(folder: Path, case: str, rank: int) -> dict[str, np.ndarray]:
    with np.load(folder / f"{case}.rank{rank}.npz") as f:
        return {k: f[k] for k in f.files}


@pytest.mark.parametrize("case", [job.case_name(*c) for c in job.cases()])
def test_keras_2_and_keras_3_paths_reach_the_same_weights(trained, case):
    got = {g: _load(trained[g], case, 0) for g in (2, 3)}
    assert [int(got[g]["generation"]) for g in (2, 3)] == [2, 3], "a launch ran the wrong Keras"
    assert int(got[2]["iterations"]) == int(got[3]["iterations"]) == job.STEPS * job.EPOCHS
    weights = sorted(k for k in got[2] if k.startswith("arr_"))
    assert weights == sorted(k for k in got[3] if k.startswith("arr_")) and weights
    for k in weights:
        np.testing.assert_allclose(got[3][k], got[2][k], err_msg=f"{case} {k}", **TOLERANCE)
    for g in (2, 3):  # and the ranks agree within each generation
        other = _load(trained[g], case, 1)
        for k in weights:
            np.testing.assert_array_equal(other[k], got[g][k], err_msg=f"{case} rank 1 {k}")


def test_training_moved_the_weights(trained):
    """Control: the compared weights are not the starting ones (a job that trained nothing
    would pass the comparison)."""
    import tensorflow as tf

    start = job.build(tf.keras, "mlp").get_weights()
    got = _load(trained[3], job.case_name("mlp", "layerwise", "adam"), 0)
    assert max(float(np.max(np.abs(got[f"arr_{i}"] - w))) for i, w in enumerate(start)) > 1e-2
