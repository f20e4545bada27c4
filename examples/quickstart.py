"""Quick start: stock Horovod's Keras script with the plugin's optimizer (generated data).

    horovodrun -np 2 -H localhost:2 --gloo python examples/quickstart.py
"""
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

import hvd_overlap.keras

hvd.init()
gpus = tf.config.list_physical_devices("GPU")
if gpus:  # one GPU per rank, as with Horovod
    tf.config.experimental.set_memory_growth(gpus[hvd.local_rank()], True)
    tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")

rng = np.random.default_rng(hvd.rank())  # each rank its own shard of the data
x = rng.normal(size=(2048, 64)).astype("float32")
y = (x[:, :8].sum(axis=1) > 0).astype("int64")

model = tf.keras.Sequential([tf.keras.layers.Dense(256, activation="relu", input_shape=(64,)),
                             tf.keras.layers.Dense(256, activation="relu"),
                             tf.keras.layers.Dense(2)])
opt = tf.keras.optimizers.SGD(0.01 * hvd.size(), momentum=0.9)
# opt = hvd.DistributedOptimizer(opt)                      # stock Horovod: the one line swapped
opt = hvd_overlap.keras.DistributedOptimizer(opt, strategy="auto")
model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
model.fit(x, y, batch_size=64, epochs=3, verbose=2 if hvd.rank() == 0 else 0,
          callbacks=[hvd_overlap.keras.OverlapCallback(),  # auto and cross-step strategies
                     hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
if hvd.rank() == 0:
    print(opt.plan.describe())
