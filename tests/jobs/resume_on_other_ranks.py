"""Train one epoch and save, or resume from a saved file for one more epoch, on however many
ranks ``horovodrun -np`` gives: run by tests/test_resume_on_other_ranks.py.

``resume_on_other_ranks.py train|resume stock|sharded CKPT OUT``. Every rank count sees the
same global batches (24 samples a step, split evenly over the ranks), so runs on 1, 2 or 3
ranks follow the same averaged gradients. ``sharded`` is the plugin's sharded update with the
dense factor exchange (uneven rows on 3 ranks). ``train`` saves CKPT on every rank (rank r:
CKPT.r); ``resume`` loads rank 0's file on every rank; rank 0 writes the weights to OUT (.npz).
"""

import sys

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

import hvd_overlap.keras as hvdo
from tests.multirank.helpers import LOSS, MODELS

GLOBAL_BATCH, STEPS = 24, 6
phase, kind, ckpt, out = sys.argv[1:5]
hvd.init()
size, rank = hvd.size(), hvd.rank()
assert GLOBAL_BATCH % size == 0
rng = np.random.default_rng(7 + (phase == "resume"))  # the second epoch sees other samples
y = rng.integers(0, 10, GLOBAL_BATCH * STEPS)
x = rng.normal(size=(GLOBAL_BATCH * STEPS, 12, 12, 1)).astype("float32") + y[:, None, None,
                                                                              None] / 5.0
per = GLOBAL_BATCH // size
mine = np.concatenate([np.arange(k * GLOBAL_BATCH + rank * per, k * GLOBAL_BATCH + (rank + 1) * per)
                       for k in range(STEPS)])
tf.keras.utils.set_random_seed(3)
model = MODELS["dense_mix"]()
opt = tf.keras.optimizers.Adam(0.003)
opt = hvd.DistributedOptimizer(opt) if kind == "stock" else hvdo.DistributedOptimizer(
    opt, strategy="sharded", exchange="always", bucket_bytes=2048)
model.compile(optimizer=opt, loss=LOSS)
callbacks = [hvdo.OverlapCallback(), hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
if phase == "resume":
    model.load_weights(f"{ckpt}.0")
    callbacks = callbacks[:1]  # every rank loaded the same file
model.fit(x[mine], y[mine], batch_size=per, epochs=1, shuffle=False, verbose=0,
          callbacks=callbacks)
if phase == "train":
    model.save_weights(f"{ckpt}.{rank}")
elif rank == 0:
    np.savez(out, *model.get_weights(), iterations=opt.iterations.numpy())
print(f"rank {rank} of {size}: {phase} {kind} done", flush=True)
