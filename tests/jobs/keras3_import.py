"""One rank of the Keras 3 refusal test: Horovod is initialised, then the plugin is imported in
a process whose ``tf.keras`` is Keras 3 (no ``TF_USE_LEGACY_KERAS``). The import must fail on
every rank before any collective; the line below the import is never reached."""

import horovod.tensorflow as hvd

hvd.init()
try:
    import hvd_overlap.keras  # noqa: F401
except ImportError as e:
    print(f"rank {hvd.rank()} refused: {type(e).__name__}: {e}", flush=True)
    raise SystemExit(3) from e
print(f"rank {hvd.rank()} imported hvd_overlap.keras under Keras 3", flush=True)
