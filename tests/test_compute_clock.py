"""``ComputeClock``: the compute of a traced train step, from its start to its last gradient,
read after the step; nothing where the step was not made by the plugin; no op of the step but
the clock's own waits for it."""

from __future__ import annotations

import time

import tensorflow as tf

from hvd_overlap.keras.executors.compute_clock import ComputeClock
from hvd_overlap.keras.executors.step_state import StepKind, step_context

SLEEP_S = 0.05


def _slow_square(x: tf.Tensor) -> tf.Tensor:
    """x**2, after SLEEP_S of host time (the 'backward pass' being timed)."""
    def sleep(v):
        time.sleep(SLEEP_S)
        return v
    return tf.py_function(sleep, [x * x], tf.float32)


def _step(clock: ComputeClock, in_step: bool):
    @tf.function
    def step(x):
        if in_step:
            with step_context(StepKind.DEFER):
                clock.start()
                grad = _slow_square(x)
                clock.gradients_ready([grad, None])
                return tf.identity(grad) + 1.0  # what a collective would do with it
        clock.start()
        grad = _slow_square(x)
        clock.gradients_ready([grad])
        return grad
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


def test_a_step_the_plugin_did_not_make_is_not_timed():
    clock = ComputeClock()
    _step(clock, in_step=False)(tf.constant(2.0))
    assert clock.take() is None


def test_no_collective_waits_for_the_clock():
    """A gradient's collective traced after the clock's stamp takes no control input from it
    (Horovod's ops are stateless: TensorFlow chains only stateful ops in program order)."""
    import horovod.tensorflow as hvd

    hvd.init()
    clock = ComputeClock()

    @tf.function
    def step(x):
        with step_context(StepKind.DEFER):
            clock.start()
            grads = [_slow_square(x), x * 3.0]
            clock.gradients_ready(grads)
            return [hvd.allreduce(g, name=f"clock_test_{i}") for i, g in enumerate(grads)]

    graph = step.get_concrete_function(tf.TensorSpec([], tf.float32)).graph
    ops = graph.get_operations()
    stamps = {op.name for op in ops if op.type == "Timestamp"}
    sends = [op for op in ops if op.type == "HorovodAllreduce"]
    assert len(stamps) == 2 and len(sends) == 2
    for op in sends:
        assert not {c.name for c in op.control_inputs}, (op.name, op.control_inputs)
    assert [float(v) for v in step(tf.constant(2.0))] == [4.0, 6.0]


def test_the_median_of_the_steps_counted():
    clock = ComputeClock()
    assert clock.median() is None
    for s in (0.3, 0.1, 0.2):
        clock.samples.append(s)
    assert clock.median() == 0.2


def test_a_step_counts_only_where_asked():
    clock = ComputeClock()
    step = _step(clock, in_step=True)
    step(tf.constant(2.0))
    clock.step_ended(counted=False)  # (the first step of an epoch, a traced one)
    step(tf.constant(2.0))
    clock.step_ended(counted=True)
    assert len(clock.samples) == 1 and clock.samples[0] >= SLEEP_S
