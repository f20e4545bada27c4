"""Reading Horovod timelines: nested spans, grouped tensors, an unterminated file, the CLI."""

from click.testing import CliRunner

from hvd_overlap.tools.cli import main
from hvd_overlap.tools.timeline import merge_groups, origin_us, read_timeline

# Shaped like Horovod's output: metadata, NEGOTIATE span, the op with nested spans, no closing ].
TRACE = """[
{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros":1000}},
{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "p.b0_1of2"}},
{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 10, "pid": 1},
{"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "p.b0_2of2"}},
{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 11, "pid": 2},
{"ph": "E", "ts": 20, "pid": 1},
{"ph": "E", "ts": 20, "pid": 2},
{"ph": "B", "name": "ALLREDUCE", "ts": 21, "pid": 1},
{"ph": "B", "name": "ALLREDUCE", "ts": 22, "pid": 2},
{"ph": "B", "name": "GLOO_ALLREDUCE", "ts": 23, "pid": 1},
{"ph": "E", "ts": 40, "pid": 1},
{"ph": "E", "ts": 41, "pid": 1, "args": {"dtype": "float32"}},
{"ph": "E", "ts": 42, "pid": 2},
{"name": "process_name", "ph": "M", "pid": 3, "args": {"name": "p.b1"}},
{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 30, "pid": 3},
{"ph": "E", "ts": 43, "pid": 3},
{"ph": "B", "name": "ALLREDUCE", "ts": 44, "pid": 3},
{"ph": "E", "ts": 50, "pid": 3},
{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 60, "pid": 1},
"""


def write(tmp_path):
    p = tmp_path / "timeline.json"
    p.write_text(TRACE)
    return p


def test_read_timeline_pairs_spans_and_skips_nested_ones(tmp_path):
    trips = read_timeline(write(tmp_path))
    assert [(c.tensor, c.enqueued, c.start, c.end) for c in trips] == [
        ("p.b0_1of2", 10, 21, 41), ("p.b0_2of2", 11, 22, 42), ("p.b1", 30, 44, 50)]
    assert [c.bucket for c in trips] == [0, 0, 1]
    assert origin_us(write(tmp_path)) == 1000


def test_merge_groups_makes_one_trip_per_bucket(tmp_path):
    merged = merge_groups(read_timeline(write(tmp_path)))
    assert [(c.tensor, c.enqueued, c.start, c.end, c.bucket) for c in merged] == [
        ("p.b0", 10, 21, 42, 0), ("p.b1", 30, 44, 50, 1)]


def test_cli_timeline(tmp_path):
    result = CliRunner().invoke(main, ["timeline", str(write(tmp_path))])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[1].split()[-1] == "p.b0" and lines[2].split()[-1] == "p.b1"
    assert "2 collectives" in lines[-1]


def test_bucket_index_of_every_kind_of_name():
    from hvd_overlap.tools.timeline import Collective

    def bucket(name):
        return Collective(name, "X", 0, 0, 1).bucket

    assert bucket("hvdo0.b3") == 3 and bucket("hvdo0.b3_1of2") == 3
    assert bucket("hvdo0.b12.v4.values") == 12           # sparse gradient
    assert bucket("hvdo1.b5.rs") == 5 and bucket("hvdo1.b5.ag") == 5  # sharded
    assert bucket("hvdo1.state5") is None and bucket("timeline_barrier") is None
