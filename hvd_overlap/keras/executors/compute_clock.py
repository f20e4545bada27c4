"""The compute part of a train step, read from the step itself: ``auto``'s model of the step
starts from it instead of from a fit of the whole step's time.

Two in-graph timestamps per step: one at the step body's start (no inputs: it runs when the
function starts) and one once every gradient exists (control dependencies on all of them).
Neither delays anything: the gradients' collectives depend on the gradients only, and
TensorFlow orders a timestamp only after the stateful ops without resources traced before it
(random ops of the forward pass), never the collectives (Horovod's ops are stateless). Both go
into one local float64 variable that is tracked by nothing (no checkpoint holds it), read after
the step while ``auto`` checks -- when the step has ended already (``OverlapCallback`` waits
for it then).

Where the backward pass and the collectives share a core (a one-core rank), the gradients'
time holds what the collectives take of it too: that is compute time for the simulator as
well (a plan with fewer bytes frees it only if it also moves less).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from hvd_overlap.keras.executors.step_state import current_step


class ComputeClock:
    """Times, in the steps traced while it is on, the step's start to its last gradient."""

    def __init__(self) -> None:
        self._times: tf.Variable | None = None  # [start, gradients ready], seconds
        self._start: tf.Tensor | None = None    # the start's timestamp in the trace under way
        self.samples: list[float] = []          # the compute of each step counted (s)

    def start(self) -> None:
        """At the start of a train step's body (its pre-forward phase), when traced."""
        self._start = tf.timestamp() if current_step() is not None else None

    def gradients_ready(self, grads: Sequence[Any]) -> None:
        """Where a traced step has its local gradients (before any is sent): stamp the time
        they all exist. Nothing if this trace did not start the clock."""
        start, self._start = self._start, None
        if start is None:
            return
        deps = [g.values if isinstance(g, tf.IndexedSlices) else g
                for g in grads if g is not None]
        with tf.control_dependencies(deps):
            ready = tf.timestamp()
        self._variable().assign(tf.stack([start, ready]))

    def take(self) -> float | None:
        """The last step's compute (seconds), or None if that step did not stamp it; resets
        the clock for the next step. Eager, between steps."""
        if self._times is None:
            return None
        start, ready = (float(t) for t in self._times.numpy())
        if ready <= start:
            return None
        self._times.assign([0.0, 0.0])
        return ready - start

    def step_ended(self, counted: bool) -> None:
        """After a step: its compute joins ``samples`` if ``counted`` (and it was timed). A
        step not counted is not read (no host read on the other trials' steps): every step
        of the probe stamps the clock again, so a counted one reads its own."""
        took = self.take() if counted else None
        if took is not None:
            self.samples.append(took)

    def median(self) -> float | None:
        """The median compute of the steps counted, or None."""
        return statistics.median(self.samples) if self.samples else None

    def _variable(self) -> tf.Variable:
        if self._times is None:
            with tf.init_scope():  # made once, outside any function being traced
                self._times = tf.Variable([0.0, 0.0], dtype=tf.float64, trainable=False,
                                          name="hvd_overlap_compute_clock")
        return self._times
