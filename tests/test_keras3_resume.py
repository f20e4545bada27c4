"""On Keras 3, a checkpoint (``model.save`` of a model compiled with the plugin's optimizer)
saved on 2 ranks resumes exactly on 1 and on 3 ranks with ``hvdo.load_model``, for
``layerwise``, ``hybrid`` (Adam) and ``deferred`` (SGD with momentum and a decaying rate).

Each run is a ``horovodrun`` launch of ``tests/jobs/keras3_resume.py``. The reference is plain
Keras 3 in this process, without Horovod: the same model trained on the global batches (every
rank's batch of a step, in rank order) must give the weights the 2 ranks saved, and the saved
file loaded with ``keras.models.load_model`` (a plain optimizer, with its state) and trained on
the N-rank global batches must give the weights and iteration count the N ranks reached.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hvd_overlap.adapters import keras_api
from tests.jobs import keras3_resume as job
from tests.launch import horovodrun

pytestmark = pytest.mark.skipif(
    keras_api.GENERATION != 3,
    reason="runs on the keras3 stack (.venv-keras3: TF 2.18 + Keras 3); tf.keras is Keras 2 here")

ROOT = Path(__file__).parents[1]
JOB = ROOT / "tests" / "jobs" / "keras3_resume.py"
STRATEGIES = ("layerwise", "hybrid", "deferred", "sharded")
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


def _launch(ranks: int, *args: str) -> None:
    horovodrun(ranks, JOB, *args)


def _fit_plain(model, phase: str, ranks: int) -> None:
    """One epoch of plain Keras on the global batches ``ranks`` ranks see in ``phase``."""
    x, y = job.dataset()
    rows = job.epoch_rows(phase, ranks)
    model.fit(x[rows], y[rows], batch_size=ranks * job.PER_RANK, epochs=1, shuffle=False,
              verbose=0)


def _assert_same(got: np.lib.npyio.NpzFile, want: list[np.ndarray], iterations: int) -> None:
    """The job's saved weights and iterations against the reference's."""
    assert int(got["iterations"]) == iterations
    names = [k for k in got.files if k != "iterations"]
    assert len(names) == len(want)
    for i, w in enumerate(want):
        np.testing.assert_allclose(got[f"arr_{i}"], w, err_msg=f"weight {i}", **TOLERANCE)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """Every strategy's checkpoint after one epoch on 2 ranks: ``<base>/<strategy>/``."""
    base = tmp_path_factory.mktemp("keras3_resume")
    for strategy in STRATEGIES:
        (base / strategy).mkdir()
        _launch(job.TRAIN_RANKS, "train", strategy, str(base / strategy))
    return base


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_two_rank_epoch_matches_plain_keras(saved, strategy):
    """The 2 ranks' first epoch equals plain Keras on the global batches of 16 rows."""
    import keras

    model = job.make_model()
    model.compile(optimizer=job.make_optimizer(strategy), loss=job.loss())
    _fit_plain(model, "train", job.TRAIN_RANKS)
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == job.STEPS
    _assert_same(np.load(saved / strategy / "after_train.npz"), model.get_weights(), job.STEPS)


@pytest.mark.parametrize("ranks", [1, 3])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_checkpoint_resumes_on_another_number_of_ranks(saved, strategy, ranks):
    """Resumed on ``ranks`` ranks, the second epoch equals plain Keras resuming the same file
    (its optimizer state included) on the global batches of ``ranks`` x 8 rows."""
    import keras

    _launch(ranks, "resume", strategy, str(saved / strategy), str(ranks))
    model = keras.models.load_model(saved / strategy / "model.keras")
    plain = type(job.make_optimizer(strategy))
    assert type(model.optimizer) is plain, type(model.optimizer)
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == job.STEPS
    _fit_plain(model, "resume", ranks)
    _assert_same(np.load(saved / strategy / f"resumed{ranks}.npz"), model.get_weights(),
                 2 * job.STEPS)
