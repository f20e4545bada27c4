"""The time-to-accuracy experiment's task, without TensorFlow: its configurations, the MLP's
default width, the digits split and the growth schedule. Shared by the launcher
(``benchmarks.time_to_accuracy``), the rank's worker (``benchmarks.tta_worker``) and the CLI."""

from __future__ import annotations

from typing import Any

CONFIGS = ("stock-small", "stock-growth", "auto-small", "auto-growth")
LOCAL = "local-small"
WIDTH = 1024  # the hidden layers: a 1024x1024 kernel, the dense factor exchange's to carry


def load(seed: int = 0):
    """The batch-growth study's split: 1347 training images, 450 held out (the same as
    ``examples/batch_growth_study.py``'s, not imported from it: that module loads the plugin's
    runtime, which a stock run must not)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    return train_test_split(x, y.astype("int64"), test_size=0.25, stratify=y, random_state=seed)


def schedule(config: dict[str, Any]) -> str:
    """The growth runs' schedule in ``--growth`` syntax (global batches): x2 every ``every``
    epochs from ``small`` up to ``small * factor``, that batch for the remaining epochs."""
    phases, batch, left = [], config["small"], config["epochs"]
    while left > 0:
        n = left if batch >= config["small"] * config["factor"] else min(config["every"], left)
        phases.append(f"{n}x{batch}")
        left -= n
        batch *= 2
    return ",".join(phases)
