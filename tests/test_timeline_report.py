"""Per-step timeline analysis (comm, hidden behind backprop, order) on a handcrafted trace."""

import pytest
from click.testing import CliRunner

from hvd_overlap.tools.cli import main
from hvd_overlap.tools.timeline import Collective, merge_groups, read_timeline
from hvd_overlap.tools.timeline_report import (
    analyze,
    covered,
    exposed_after_last_enqueue,
    format_steps,
    overlap,
    split_steps,
    union,
)


def span(pid: int, op: str, enq: int, start: int, end: int) -> str:
    return (f'{{"ph": "B", "name": "NEGOTIATE_{op}", "ts": {enq}, "pid": {pid}}},\n'
            f'{{"ph": "E", "ts": {start}, "pid": {pid}}},\n'
            f'{{"ph": "B", "name": "{op}", "ts": {start}, "pid": {pid}}},\n'
            f'{{"ph": "E", "ts": {end}, "pid": {pid}}},\n')


# Two steps; bucket 1 (the last layers) is enqueued first, as in backprop.
# step 0: b1 enq 100 wire 110-150; b0 (grouped, 2 parts) enq 140 wire 150-200
#         window [100, 140]: comm 90, hidden 30
# step 1: b1 enq 300 wire 300-320; b0 enq 330 wire 335-360 -> window [300, 330]: comm 45, hidden 20
TRACE = (
    '[\n{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "p.b1"}},\n'
    '{"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "p.b0_1of2"}},\n'
    '{"name": "process_name", "ph": "M", "pid": 3, "args": {"name": "p.b0_2of2"}},\n'
    + span(1, "ALLREDUCE", 100, 110, 150) + span(2, "ALLREDUCE", 140, 150, 200)
    + span(3, "ALLREDUCE", 141, 151, 199) + span(1, "ALLREDUCE", 300, 300, 320)
    + span(2, "ALLREDUCE", 330, 335, 360) + span(3, "ALLREDUCE", 331, 336, 359)
    # in no step: a name seen once, and Horovod's name for unnamed eager ops (seen twice)
    + '{"name": "process_name", "ph": "M", "pid": 4, "args": {"name": "barrier"}},\n'
    + span(4, "ALLGATHER", 500, 500, 510)
    + '{"name": "process_name", "ph": "M", "pid": 5, "args": {"name": "HorovodAllgather"}},\n'
    + span(5, "ALLGATHER", 10, 10, 12) + span(5, "ALLGATHER", 600, 600, 602))


@pytest.fixture
def trace(tmp_path):
    p = tmp_path / "timeline.json"
    p.write_text(TRACE)
    return p


def test_union_and_overlap():
    assert union([(5, 8), (0, 2), (1, 3), (8, 9), (4, 4)]) == [(0, 3), (5, 9)]
    assert overlap([(0, 3), (5, 9)], 2, 6) == 2


def test_steps_comm_hidden_order(trace):
    steps = analyze(merge_groups(read_timeline(trace)))
    assert [(r.wall, r.comm, r.hidden, r.exposed) for r in steps] == [
        (100, 90, 30, 60), (60, 45, 20, 25)]
    assert [r.order() for r in steps] == [["b1", "b0"], ["b1", "b0"]]
    assert steps[0].hidden_fraction == pytest.approx(1 / 3)


def test_per_step_groups_in_enqueue_order(trace):
    trips = merge_groups(read_timeline(trace))
    assert [len(s) for s in split_steps(trips, per_step=2)] == [2, 2, 2, 1]
    assert [r.comm for r in analyze(trips, per_step=1)] == [2, 40, 50, 20, 25, 10, 2]
    with pytest.raises(ValueError):
        split_steps(trips, per_step=0)


def test_format_states_definition(trace):
    text = format_steps(analyze(merge_groups(read_timeline(trace))))
    rows = text.splitlines()
    assert rows[1].split() == ["0", "0.10", "0.09", "0.03", "0.06", "33.3%", "b1", "b0"]
    assert "hidden = communication overlapping" in text


def test_cli_timeline_per_step_and_gantt(trace, tmp_path):
    png = tmp_path / "gantt.png"
    result = CliRunner().invoke(main, ["timeline", str(trace), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert "7 collectives (3 outside steps) in 2 steps" in result.output.splitlines()[-1]
    assert "hidden behind backprop 0.1 of 0.1 ms (37%)" in result.output
    assert png.stat().st_size > 1000
    bad = CliRunner().invoke(main, ["timeline", str(trace), "--per-step", "0"])
    assert bad.exit_code != 0


def test_covered_and_exposed_after_last_enqueue():
    """Two steps of two reduce-scatters; what runs after a step's last enqueue is exposed."""
    def c(name, enq, start, end):
        return Collective(name, "REDUCESCATTER", enq, start, end)
    trips = [c("rs0", 0, 10, 50), c("rs1", 40, 45, 80),        # last enqueue 40: 40 us after
             c("rs0", 100, 100, 120), c("rs1", 130, 130, 135)]  # last enqueue 130: 5 us after
    assert covered(trips) == (80 - 10) + (120 - 100) + 5
    assert exposed_after_last_enqueue(trips) == 40 + 5
