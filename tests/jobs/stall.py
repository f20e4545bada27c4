"""A 2-rank ``fit`` whose rank 1 stays alive but stops joining the plugin's collectives.

Launched by tests/test_stall.py under horovodrun, in one of two ways:

- as a script, ``stall.py MODE STAMP_FILE``;
- as a pytest module through ``tests/multirank/run_rank`` (the multi-rank runner of
  scripts/test), with ``HVDO_STALL_MODE`` and ``HVDO_STALL_STAMP`` in the environment.

Rank 0 trains (``strategy="hybrid"``, buckets named ``stall_job.b<N>``) and waits in step
``STALL_AT``'s collectives; rank 1, at the start of that step, writes the time to the stamp file
and then, by MODE:

- ``mismatch``: waits in a collective of its own (``stall_job.rank1_only``) that rank 0 never
  issues, so each rank waits for a tensor the other never submits;
- ``sleep``: sleeps (bounded: 600 s), joining nothing.

Nothing in the job ends the stall: a rank that sees an error from Horovod prints
``rank R stopped by Horovod: ...`` and exits 1; one that finishes prints ``finished training``.
"""

from __future__ import annotations

import os
import sys
import time

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

import hvd_overlap.keras as hvdo

STALL_AT = 5  # steps before the stall: the plan is traced and Horovod's response cache warm
MODES = ("mismatch", "sleep")


class StallRankOne(tf.keras.callbacks.Callback):
    """Rank 1 stops joining the plugin's collectives before step ``STALL_AT``."""

    def __init__(self, mode: str, stamp: str):
        super().__init__()
        self.mode, self.stamp = mode, stamp

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if hvd.rank() != 1 or batch != STALL_AT:
            return
        with open(self.stamp, "w") as f:
            f.write(repr(time.time()))
        print(f"rank 1 stalls before step {STALL_AT} ({self.mode})", flush=True)
        if self.mode == "mismatch":
            hvd.allreduce(tf.constant(1.0), name="stall_job.rank1_only").numpy()
        else:
            time.sleep(600)


def fit_with_a_stall(mode: str, stamp: str) -> None:
    """Train 40 steps on 2 ranks; rank 1 stalls before step ``STALL_AT``."""
    if mode not in MODES:
        raise ValueError(f"unknown stall mode {mode!r}: one of {', '.join(MODES)}")
    hvd.init()
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu", input_shape=(32,)),
                                 tf.keras.layers.Dense(10)])
    model.compile(hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.01), strategy="hybrid",
                                            bucket_bytes=4096, name="stall_job"),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(hvd.rank())
    x, y = rng.normal(size=(16 * 40, 32)).astype("float32"), rng.integers(0, 10, 16 * 40)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0,
              callbacks=[hvdo.OverlapCallback(), hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         StallRankOne(mode, stamp)])
    print("rank", hvd.rank(), "finished training: the stall was not noticed", flush=True)


def test_rank_one_stalls_in_fit() -> None:
    """Not a test of its own: the job, as run_rank runs a multi-rank test (test_stall.py)."""
    fit_with_a_stall(os.environ["HVDO_STALL_MODE"], os.environ["HVDO_STALL_STAMP"])


if __name__ == "__main__":
    try:
        fit_with_a_stall(sys.argv[1], sys.argv[2])
    except tf.errors.OpError as e:  # Horovod's shutdown surfaces as an op error
        print(f"rank {hvd.rank()} stopped by Horovod: {type(e).__name__}: {str(e)[:300]}",
              flush=True)
        sys.exit(1)
