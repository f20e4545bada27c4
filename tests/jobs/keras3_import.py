"""One rank of the Keras-generation test: Horovod is initialised, then the plugin is imported in
a process whose ``tf.keras`` is Keras 3 (``TF_USE_LEGACY_KERAS`` unset, tf-keras installed
beside). The plugin must pick its Keras 3 adapter, and refuse a tf-keras (Keras 2) optimizer on
every rank, naming the fix, before any collective."""

import horovod.tensorflow as hvd

hvd.init()
import tf_keras  # noqa: E402  -- installed on this stack, but not what tf.keras is

import hvd_overlap.keras  # noqa: E402
from hvd_overlap.adapters import keras_api  # noqa: E402

print(f"rank {hvd.rank()} runs the Keras {keras_api.GENERATION} adapter", flush=True)
try:
    hvd_overlap.keras.DistributedOptimizer(tf_keras.optimizers.Adam(0.1))
except TypeError as e:
    print(f"rank {hvd.rank()} refused: {e}", flush=True)
    raise SystemExit(3) from e
print(f"rank {hvd.rank()} wrapped a Keras 2 optimizer under Keras 3", flush=True)
