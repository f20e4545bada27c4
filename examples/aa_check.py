"""A/A check of the benchmark's noise: the same plans, alone in a launch and side by side.

Run one launch per argument, on 2 emulated hosts at 1 Gbit/s (root), from the repository
root (the ranks import ``benchmarks``), e.g.::

    for k in stock horovod stock,horovod,layerwise,hybrid; do
      python -m benchmarks hostrun --np 2 --net 1gbit -- python examples/aa_check.py $k
    done

Each trainee (``stock``: real ``hvd.DistributedOptimizer``; any other name: the plugin's
strategy) is a VGG of ``hvd_overlap.tools.models`` at 32 samples per rank, trained 3 times for
10 steps, in turns; rank 0 prints the median step, timed over the train function alone
(``inner``) and from one batch end to the next (``outer``).
"""

import sys
import time

import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvd_keras
import numpy as np
import tensorflow as tf

from benchmarks.worker import pin_rank
from hvd_overlap.tools.models import build_model, synthetic_batch


class StepTimes(tf.keras.callbacks.Callback):
    """Per batch: the train function's seconds, and the time of its end."""

    def __init__(self) -> None:
        super().__init__()
        self.inner: list[float] = []
        self.ends: list[float] = []
        self._start = 0.0

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        self.inner.append(now - self._start)
        self.ends.append(now)


def trainee(kind: str):
    tf.keras.utils.set_random_seed(0)
    model = build_model("vgg")
    opt = tf.keras.optimizers.SGD(0.01, momentum=0.9)
    callbacks = []
    if kind == "stock":
        opt = hvd_keras.DistributedOptimizer(opt)
    else:
        import hvd_overlap.keras as hk

        opt = hk.DistributedOptimizer(opt, strategy=kind)
        callbacks.append(hk.OverlapCallback())
    model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, callbacks


def main(kinds: list[str]) -> None:
    hvd.init()
    pin_rank()  # a CPU core per rank; on GPUs, one GPU per rank as with Horovod:
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        tf.config.experimental.set_memory_growth(gpus[hvd.local_rank()], True)
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    data = tf.data.Dataset.from_tensors(synthetic_batch(32, seed=hvd.rank())).repeat()
    trainees = {k: trainee(k) for k in kinds}
    for rep in range(3):
        for kind, (model, callbacks) in trainees.items():
            timer = StepTimes()
            model.fit(data, epochs=1, steps_per_epoch=10, verbose=0,
                      callbacks=[timer, *callbacks])
            inner = np.median(timer.inner[3:]) * 1e3
            outer = np.median(np.diff(timer.ends[3:])) * 1e3
            if hvd.rank() == 0:
                print(f"{','.join(kinds)} repeat {rep} {kind}: inner {inner:.0f} ms, "
                      f"outer {outer:.0f} ms", flush=True)


if __name__ == "__main__":
    main(sys.argv[1].split(","))
