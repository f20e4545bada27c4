"""A 2-rank training job whose rank 1 dies (SIGKILL) in the middle of its first epoch.

Run under horovodrun by tests/test_dead_rank.py: ``dead_rank.py STRATEGY STAMP_FILE``
(``sharded+exchange``: the sharded update with the dense factor exchange). Rank 1
writes the time it dies to STAMP_FILE; rank 0 goes on training, as a surviving rank would.
"""

import os
import signal
import sys
import time

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

import hvd_overlap.keras as hvdo

strategy, stamp = sys.argv[1], sys.argv[2]
options = {"exchange": "always"} if strategy == "sharded+exchange" else {}
strategy = strategy.removesuffix("+exchange")
hvd.init()
tf.keras.utils.set_random_seed(0)
model = tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu", input_shape=(32,)),
                             tf.keras.layers.Dense(10)])
model.compile(hvdo.DistributedOptimizer(tf.keras.optimizers.SGD(0.01), strategy=strategy,
                                        **options),
              tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
rng = np.random.default_rng(hvd.rank())
x, y = rng.normal(size=(16 * 400, 32)).astype("float32"), rng.integers(0, 10, 16 * 400)


class DieMidEpoch(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if hvd.rank() == 1 and batch == 20:
            with open(stamp, "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)


model.fit(x, y, batch_size=16, epochs=3, verbose=0,
          callbacks=[hvdo.OverlapCallback(), hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                     DieMidEpoch()])
print("rank", hvd.rank(), "finished training: the dead rank was not noticed", flush=True)
