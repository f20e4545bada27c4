"""Put on ``PYTHONPATH`` by ``scripts/test`` for the TF 2.18 + tf-keras stack on Python 3.12 only.

tf-keras 2.17/2.18 (the last that TensorFlow 2.18, and so Horovod 0.28.1, can run) seeds its
layers with ``random.randint(1, 1e9)`` once ``tf.keras.utils.set_random_seed`` was called, and
Python 3.12 refuses a float bound there (fixed in tf-keras 2.19). The tests seed every run with
``set_random_seed``; this lets ``randint`` take the integral float, as Python 3.11 did. Users
on 3.12 seed with ``random.seed``, ``np.random.seed`` and ``tf.random.set_seed`` instead
(docs/troubleshooting.md)."""

import random

_randint = random.Random.randint


def _randint_of_integral_floats(self: random.Random, a: float, b: float) -> int:
    return _randint(self, int(a), int(b))


random.Random.randint = _randint_of_integral_floats  # type: ignore[method-assign]
random.randint = random._inst.randint  # type: ignore[attr-defined]
