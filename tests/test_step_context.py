"""The explicit step context: a train function built for a kind traces its body with that kind,
and what the plugin's hooks ask about the step being traced comes from the step itself (no
graph identity, nothing read from a callback's attribute)."""

from __future__ import annotations

import tensorflow as tf

from hvd_overlap.keras.executors.forward_phase import ForwardPhase
from hvd_overlap.keras.executors.step_state import (
    StepFunction,
    StepKind,
    current_step,
    function_kind,
    step_context,
)


def test_a_step_function_traces_its_body_with_the_kind_it_was_built_for():
    seen: list[StepKind] = []

    def body(x):
        with step_context(function_kind()) as step:
            seen.append(step.kind)  # Python: runs while TensorFlow traces
            return x + 1

    traced = tf.function(body)
    land, defer = StepFunction(traced, StepKind.LAND), StepFunction(tf.function(body),
                                                                   StepKind.DEFER)
    land(tf.constant(1.0))
    defer(tf.constant(1.0))
    land(tf.constant(2.0))  # no retrace: nothing more seen
    assert seen == [StepKind.LAND, StepKind.DEFER]
    assert function_kind() is StepKind.DEFER and current_step() is None
    assert land.python_function is body  # the function's own attributes stay reachable


def test_the_pre_forward_phase_is_installed_only_inside_a_step_body():
    assert not ForwardPhase.installed()
    with step_context(StepKind.DEFER):
        assert ForwardPhase.installed()
    assert not ForwardPhase.installed()


def test_a_step_numbers_each_layers_calls_and_keeps_what_they_sent_back():
    a, b = object(), object()
    with step_context(StepKind.DEFER) as step:
        assert [step.next_call(a), step.next_call(a), step.next_call(b)] == [0, 1, 0]
        assert step.calls(a) == 2 and step.calls(b) == 1
        step.send_back(a, "dx")
        assert step.sent_back(a) == ["dx"] and step.sent_back(b) == []
    with step_context(StepKind.DEFER) as again:  # the next trace starts afresh
        assert again.next_call(a) == 0
