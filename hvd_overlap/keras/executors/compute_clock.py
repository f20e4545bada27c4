"""The compute part of a train step, read from the step itself: ``auto``'s model of the step
starts from it instead of from a fit of the whole step's time.

It is timed in the probe's quiet steps (``core.chooser.QUIET_STEPS``), whose train function
``auto`` traces in this shape: every gradient's collective waits until the last local gradient
exists, and the update until every collective has landed. Nothing then shares the core with
the backward pass or the update (on a one-core rank, Gloo's reductions and copies run on the
core of the backward pass; the update, run beside the collectives, would hide in their time),
and four timestamps give the compute alone: the step's start to its last local gradient, plus
the update's start to its end -- or, given the step's wall time, that time less the
collectives' span (the host's work around the graph counts too). The order changes when things
run, never what is computed: the quiet steps train as any other.

The stamps go into one local float64 variable that is tracked by nothing (no checkpoint holds
it), read after the step, when it has ended (``OverlapCallback`` waits for it while ``auto``
checks). Timestamps take no inputs; each is ordered by control dependencies on what it stamps.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from hvd_overlap.comm.schedule import tensors_of
from hvd_overlap.core import mutants
from hvd_overlap.keras.executors.immediate import ImmediateExecutor
from hvd_overlap.keras.executors.step_state import Gradients, current_step


class ComputeClock:
    """Times, in the quiet steps traced while it is on, the step's start to its last local
    gradient, and its update alone."""

    def __init__(self) -> None:
        self._times: tf.Variable | None = None  # [start, computed, reduced, applied], seconds
        self._start: tf.Tensor | None = None    # the start's timestamp in the trace under way
        self._reduced: tf.Tensor | None = None  # the update's start in the trace under way
        self.samples: list[float] = []          # the compute of each step counted (s)

    def start(self) -> None:
        """At the start of a train step's body (its pre-forward phase), when traced."""
        self._start = tf.timestamp() if current_step() is not None else None

    def hold_until_computed(self, grads: Sequence[Any]) -> list[Any]:
        """Where a traced step has its local gradients (before any is sent): stamp the time
        they all exist; the gradients returned are the same values, available only from then
        on (their collectives wait for the whole backward pass). Unchanged if this trace did
        not start the clock."""
        start, self._start = self._start, None
        if start is None:
            return list(grads)
        ready = _stamp_after(grads)
        self._variable()[0:2].assign(tf.stack([start, ready]))
        return list(grads) if mutants.off("quiet_hold") else _after(ready, grads)

    def hold_until_reduced(self, grads: Sequence[Any]) -> list[Any]:
        """The global gradients, available only once they all are (the update then runs
        alone); stamps that time, the update's start."""
        self._reduced = _stamp_after(grads)
        return _after(self._reduced, grads)

    def applied(self, variables: Sequence[tf.Variable]) -> None:
        """Stamp the update's end (once every variable was written) beside its start."""
        reduced, self._reduced = self._reduced, None
        if reduced is None:
            return
        with tf.control_dependencies([reduced] + [tf.convert_to_tensor(v) for v in variables]):
            done = tf.timestamp()
        self._variable()[2:4].assign(tf.stack([reduced, done]))

    def take(self, wall: float | None = None) -> float | None:
        """The last step's compute (seconds), or None if that step did not stamp it; resets
        the clock for the next step. Eager, between steps. With the step's ``wall`` time and
        its collectives stamped apart (the update timed), that wall time less the collectives'
        span: the host's work around the graph (the fit loop, the call) is compute too, which
        a step of a few milliseconds would otherwise miss."""
        if self._times is None:
            return None
        start, ready, reduced, done = (float(t) for t in self._times.numpy())
        if ready <= start:
            return None
        self._times.assign([0.0] * 4)
        in_graph = ready - start + max(done - reduced, 0.0)
        if wall is None or done <= reduced:
            return in_graph
        return max(wall - (reduced - ready), in_graph)

    def step_ended(self, counted: bool, wall: float | None = None) -> None:
        """After a step (of ``wall`` seconds): its compute joins ``samples`` if ``counted``
        (and it was timed). A step not counted is not read (no host read on other steps)."""
        took = self.take(wall) if counted else None
        if took is not None:
            self.samples.append(took)

    def estimate(self) -> float | None:
        """The median compute of the steps counted, or None. Neither the fastest nor the
        slowest: a step on a one-core rank varies by 15% either way (the mlp's quiet steps read
        38-56 ms beside a 42-46 ms compute-only step, and the fastest of three 0.76x it), and a
        step slowed by another process reads high (the median of three read 2.0x on a loaded
        machine: ``QUIET_STEPS`` times five)."""
        return statistics.median(self.samples) if self.samples else None

    def _variable(self) -> tf.Variable:
        if self._times is None:
            with tf.init_scope():  # made once, outside any function being traced
                self._times = tf.Variable([0.0] * 4, dtype=tf.float64, trainable=False,
                                          name="hvd_overlap_compute_clock")
        return self._times


def quiet_step(clock: ComputeClock, child: Any, grads: list[Any],
               variables: list[tf.Variable], args: tuple, kwargs: dict) -> Any:
    """``child``'s step (an executor's ``apply_gradients``) in the quiet shape: its
    collectives after the whole backward pass; where it reduces everything within the step
    (``ImmediateExecutor``), its update after every collective, timed alone."""
    grads = clock.hold_until_computed(grads)
    if type(child) is not ImmediateExecutor:  # it updates in parts: its backward alone
        return child.apply_gradients(grads, variables, args, kwargs)
    grads = clock.hold_until_reduced(child.reduce(grads, variables))
    out = child.apply_gradients(grads, variables, args, kwargs, gradients=Gradients.GLOBAL)
    clock.applied(variables)
    return out


def _stamp_after(grads: Sequence[Any]) -> tf.Tensor:
    """A timestamp taken once every gradient of ``grads`` exists. It waits on an identity of
    each (a data edge), not on the ops that made them: stock's fusion returns its gradients
    from a stateless function call, and a control edge on that call op alone is lost when
    TensorFlow inlines the call (the stamp then fired before the collectives ended)."""
    with tf.control_dependencies([tf.identity(t) for t in tensors_of(grads)]):
        return tf.timestamp()


def _after(stamp: tf.Tensor, grads: Sequence[Any]) -> list[Any]:
    """``grads``, each available only after ``stamp`` (the same values)."""
    out: list[Any] = []
    with tf.control_dependencies([stamp]):
        for g in grads:
            if isinstance(g, tf.IndexedSlices):
                g = tf.IndexedSlices(tf.identity(g.values), tf.identity(g.indices),
                                     g.dense_shape)
            elif g is not None:
                g = tf.identity(g)
            out.append(g)
    return out
