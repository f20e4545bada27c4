"""Quick start on Keras 3 (TensorFlow >= 2.16 without tf-keras): the plugin's optimizer and its
broadcast callback, where Horovod's own Keras layer does not work (generated data).

    horovodrun -np 2 -H localhost:2 --gloo python examples/keras3_quickstart.py
"""
import horovod.tensorflow as hvd
import keras
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

model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                          keras.layers.Dense(256, activation="relu"), keras.layers.Dense(2)])
opt = keras.optimizers.SGD(0.01 * hvd.size(), momentum=0.9)
opt = hvd_overlap.keras.DistributedOptimizer(opt, strategy="auto")
model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"], jit_compile=False)  # Horovod's ops have no XLA kernels
model.fit(x, y, batch_size=64, epochs=3, verbose=2 if hvd.rank() == 0 else 0,
          callbacks=[hvd_overlap.keras.OverlapCallback(),  # auto and cross-step strategies
                     hvd_overlap.keras.BroadcastGlobalVariablesCallback(0)])  # not hvd.callbacks'
if hvd.rank() == 0:
    print(opt.plan.describe())
