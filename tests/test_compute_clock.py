"""``ComputeClock``: the compute of a quiet train step -- its start to its last local gradient,
plus its update alone -- read after the step; the collectives between (the wire) left out;
nothing where the step was not made by the plugin; the collectives wait for the backward pass."""

from __future__ import annotations

import time
from contextlib import nullcontext

import tensorflow as tf

from hvd_overlap.keras.executors.compute_clock import ComputeClock
from hvd_overlap.keras.executors.step_state import StepKind, step_context

SLEEP_S = 0.05


def _slow(x: tf.Tensor, factor: float = 1.0) -> tf.Tensor:
    """x * x, after ``factor`` * SLEEP_S of host time (the work being timed, or not)."""
    def sleep(v):
        time.sleep(SLEEP_S * factor)
        return v
    return tf.py_function(sleep, [x * x], tf.float32)


def _step(clock: ComputeClock, in_step: bool, var: tf.Variable | None = None):
    """A step: backward (one sleep), a 'collective' (three sleeps), an update (two sleeps)."""
    @tf.function
    def step(x):
        with step_context(StepKind.DEFER) if in_step else nullcontext():
            clock.start()
            grads = clock.hold_until_computed([_slow(x), None])
            if var is None:
                return tf.identity(grads[0]) + 1.0  # what a collective would do with it
            reduced = clock.hold_until_reduced([_slow(grads[0], 3.0)])  # the wire's time
            var.assign_add(_slow(reduced[0], 2.0))
            clock.applied([var])
            return var.read_value()
    return step


def test_the_step_until_its_last_gradient_is_timed_once():
    clock = ComputeClock()
    step = _step(clock, in_step=True)
    step(tf.constant(2.0))
    took = clock.take()
    assert took is not None and SLEEP_S <= took < SLEEP_S + 0.5
    assert clock.take() is None  # read once: the next step must stamp it again
    step(tf.constant(3.0))
    assert clock.take() >= SLEEP_S


def test_the_update_counts_and_the_wire_does_not():
    """Compute = backward (1 sleep) + update (2 sleeps); the 'collective' (3 sleeps) between
    the gradients and the update is not in it."""
    clock = ComputeClock()
    var = tf.Variable(0.0)
    step = _step(clock, in_step=True, var=var)
    assert float(step(tf.constant(2.0))) == 256.0  # the same values: ((2^2)^2)^2
    took = clock.take()
    assert 3 * SLEEP_S <= took < 4.5 * SLEEP_S, took


def test_the_wire_in_a_stateless_function_call_is_left_out():
    """Stock's fusion returns its gradients from a stateless function call (Horovod's); the
    update's start is stamped once that call's outputs exist. (A control edge on the call op
    alone is lost when TensorFlow inlines the call: the stamp fired at once, and the update's
    span held the whole 'wire'.)"""
    n = 600
    weights = tf.random.stateless_normal([n, n], seed=[1, 2]) / n

    @tf.function
    def wire(g):  # stateless and slow: stands for the collectives
        for _ in range(12):
            g = tf.matmul(g, weights)
        return g

    clock, var = ComputeClock(), tf.Variable(tf.zeros([n, n]))

    @tf.function
    def step(x):
        with step_context(StepKind.DEFER):
            clock.start()
            grads = clock.hold_until_computed([x * 2.0])
            reduced = clock.hold_until_reduced([wire(grads[0])])
            var.assign_add(reduced[0])
            clock.applied([var])

    x = tf.ones([n, n])
    step(x)
    clock.take()
    took, start = [], time.perf_counter()
    for _ in range(3):
        step(x)
        took.append(clock.take())
    step_s = (time.perf_counter() - start) / 3
    assert max(took) < 0.5 * step_s, (took, step_s)  # the step is mostly the 'wire'


def test_with_the_wall_time_the_host_work_counts_and_the_wire_does_not():
    """Given the step's wall time, the compute is that time less the collectives' span (the
    host's work around the graph counts), never less than the in-graph spans."""
    clock = ComputeClock()
    step = _step(clock, in_step=True, var=tf.Variable(0.0))
    step(tf.constant(2.0))
    start, ready, reduced, done = (float(t) for t in clock._variable().numpy())
    host = 0.5  # e.g. a slow fit loop around the graph
    wall = done - start + host
    took = clock.take(wall)
    assert abs(took - (wall - (reduced - ready))) < 1e-9
    assert took > ready - start + done - reduced + 0.4  # the host's work is in it
    step(tf.constant(2.0))
    assert clock.take(0.0) >= 3 * SLEEP_S  # (a wall shorter than the spans: the spans)


def test_a_step_the_plugin_did_not_make_is_not_timed():
    clock = ComputeClock()
    _step(clock, in_step=False)(tf.constant(2.0))
    assert clock.take() is None


def test_every_collective_waits_for_the_whole_backward_pass():
    """In a quiet step each gradient's collective takes its input only after the stamp of
    the last local gradient: nothing is sent while backprop runs."""
    import horovod.tensorflow as hvd

    hvd.init()
    clock = ComputeClock()

    @tf.function
    def step(x):
        with step_context(StepKind.DEFER):
            clock.start()
            grads = clock.hold_until_computed([_slow(x), x * 3.0])
            return [hvd.allreduce(g, name=f"clock_test_{i}") for i, g in enumerate(grads)]

    graph = step.get_concrete_function(tf.TensorSpec([], tf.float32)).graph
    ops = graph.get_operations()
    stamps = [op for op in ops if op.type == "Timestamp"]
    sends = [op for op in ops if op.type == "HorovodAllreduce"]
    assert len(stamps) == 2 and len(sends) == 2
    ready = stamps[1]  # (the start's first)
    for op in sends:
        fed_by = op.inputs[0].op
        assert ready in fed_by.control_inputs, (op.name, fed_by.control_inputs)
    assert [float(v) for v in step(tf.constant(2.0))] == [4.0, 6.0]


def test_the_median_of_the_steps_counted():
    """Neither a lucky fast step nor one slowed by another process moves the estimate."""
    clock = ComputeClock()
    assert clock.estimate() is None
    for s in (0.3, 0.05, 0.2, 0.9, 0.1):
        clock.samples.append(s)
    assert clock.estimate() == 0.2


def test_a_step_counts_only_where_asked():
    clock = ComputeClock()
    step = _step(clock, in_step=True)
    step(tf.constant(2.0))
    clock.step_ended(counted=False)  # (the first step of an epoch, a traced one)
    step(tf.constant(2.0))
    clock.step_ended(counted=True)
    assert len(clock.samples) == 1 and clock.samples[0] >= SLEEP_S
