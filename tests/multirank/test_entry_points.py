"""Keras training entry points with every strategy (issue 18): ``train_on_batch`` loops, with
``test_on_batch``, ``predict_on_batch`` and ``evaluate`` in between, against stock Horovod."""

from __future__ import annotations

import warnings

import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf

from tests.multirank.helpers import (
    BATCH,
    LOSS,
    MODELS,
    OPTIMIZERS,
    Result,
    assert_weights_close,
    ours,
    rank_data,
    stock,
)

STEPS = 6
STRATEGIES = ["horovod", "layerwise", "deferred", "hybrid", "sharded", "sharded_hybrid", "auto"]


def train_on_batch_loop(model_name: str, opt_name: str, wrap):
    """``STEPS`` calls of ``train_on_batch``; halfway, the weights are read three ways."""
    tf.keras.utils.set_random_seed(8)
    model = MODELS[model_name]()
    model.compile(wrap(OPTIMIZERS[opt_name]()), LOSS)
    x, y = rank_data(model_name, BATCH * STEPS)
    seen = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in range(STEPS):
            model.train_on_batch(x[k * BATCH:(k + 1) * BATCH], y[k * BATCH:(k + 1) * BATCH])
            if k == STEPS // 2:
                seen.append(np.asarray(model.test_on_batch(x[:BATCH], y[:BATCH])))
                seen.append(model.predict_on_batch(x[:BATCH]))
                seen.append(np.asarray(model.evaluate(x[:2 * BATCH], y[:2 * BATCH], verbose=0,
                                                      batch_size=BATCH)))
    assert int(model.optimizer.iterations.numpy()) == STEPS
    notes = [str(w.message) for w in caught if "pre-forward phase" in str(w.message)]
    return Result(model), seen, notes


_stock: dict = {}


def _reference(model_name: str, opt_name: str, **kw):
    key = (model_name, opt_name, tuple(sorted(kw.items())))
    if key not in _stock:
        _stock[key] = train_on_batch_loop(model_name, opt_name, lambda o: stock(o, **kw))
    return _stock[key]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("model_name,opt_name,kw", [
    ("cnn_bn", "sgd_momentum", {}),
    ("embedding", "adam", {"sparse_as_dense": True}),
    ("odd_sizes", "legacy_adam", {}),
])
def test_train_on_batch_equals_stock(strategy, model_name, opt_name, kw):
    """The weights after N ``train_on_batch`` calls, and what ``test_on_batch``,
    ``predict_on_batch`` and ``evaluate`` saw halfway, equal stock Horovod's. A deferring
    strategy falls back to landing each update within its step, and says so once (rank 0)."""
    want, want_seen, _ = _reference(model_name, opt_name, **kw)
    size = {} if strategy == "auto" else {"bucket_bytes": 2048}  # auto chooses its own
    got, seen, notes = train_on_batch_loop(model_name, opt_name, ours(strategy, **size, **kw))
    assert_weights_close(got, want)
    for a, b in zip(seen, want_seen, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    if strategy not in ("horovod", "layerwise") and hvd.rank() == 0:
        assert len(notes) == 1 and "OverlapCallback" in notes[0], notes
    else:
        assert notes == []
