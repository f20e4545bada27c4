"""The closing line of scripts/test: a stage that executed no test fails the run."""

from tests.summarize_junit import main

_SUITE = '<testsuites><testsuite tests="{t}" failures="{f}" errors="0" skipped="{s}"/></testsuites>'


def _reports(tmp_path, **counts):
    paths = []
    for name, (t, f, s) in counts.items():
        p = tmp_path / f"{name}.xml"
        p.write_text(_SUITE.format(t=t, f=f, s=s))
        paths.append(str(p))
    return paths


def test_all_passed_is_success(tmp_path, capsys):
    assert main(_reports(tmp_path, single=(5, 0, 1), rank0=(3, 0, 0), rank1=(3, 0, 0))) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "10 passed, 0 failed, 1 skipped"


def test_a_failure_fails(tmp_path):
    assert main(_reports(tmp_path, single=(5, 1, 0), rank0=(3, 0, 0), rank1=(3, 0, 0))) == 1


def test_ranks_that_skipped_everything_fail(tmp_path, capsys):
    assert main(_reports(tmp_path, single=(5, 0, 0), rank0=(3, 0, 3), rank1=(3, 0, 3))) == 1
    assert "rank0: executed no test" in capsys.readouterr().out


def test_a_missing_rank_report_fails(tmp_path, capsys):
    paths = _reports(tmp_path, single=(5, 0, 0), rank0=(3, 0, 0))
    assert main([*paths, str(tmp_path / "rank1.xml")]) == 1
    assert "missing report rank1.xml" in capsys.readouterr().out
