"""The mutant check: every mechanism the tests claim is switched off in turn
(``hvd_overlap.core.mutants``, through ``HVDO_MUTANT``), and the tests that claim it must fail.

Run by ``scripts/mutants`` (all mutants, or those named) and by ``scripts/test`` (a rotating
part, to fit CI's time). For each mutant it runs its tests -- single-process ones with pytest,
2-rank ones under ``horovodrun`` as ``scripts/test`` does -- stopping at the first failure, and
prints one line: ``killed`` (a named test failed, or the job was ended by Horovod's stall
shutdown or the per-test timeout: the mutant made a rank wait), ``survived`` (every test passed:
the check fails) or ``error`` (no test ran, or the tests could not be collected: the check
fails too, since that proves nothing). docs/testing.md lists the mutants and what kills each.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hvd_overlap.core.mutants import MUTANTS  # noqa: E402  (pure Python: no TensorFlow)

#: a launch of one mutant's tests ends after this (a mutant that hangs is ended by the stall
#: shutdown or the per-test timeout long before)
LAUNCH_LIMIT_S = 420
#: each test of a mutant's selection may take this long (pytest-timeout)
TEST_LIMIT_S = 240


@dataclass(frozen=True)
class Kill:
    """The tests that must fail when mutant ``name`` is on: ``single`` in one process,
    ``ranks`` on 2 ranks; ``timeline``: the 2-rank ones read Horovod's timeline; ``limit_s``:
    the per-test timeout, for a mutant whose ranks fall out of step and wait."""

    name: str
    single: tuple[str, ...] = ()
    ranks: tuple[str, ...] = ()
    timeline: bool = False
    limit_s: int = 0  # per-test timeout if not TEST_LIMIT_S (a mutant that hangs: shorter)


M = "tests/multirank/"
KILLS: tuple[Kill, ...] = (
    Kill("deferral",
         single=("tests/test_optimizer_local.py::test_a_registered_bucket_method_sends_every_"
                 "bucket_in_plan_order",),
         ranks=(M + "test_deferred.py::test_update_really_waits_for_the_next_step_until_flushed",
                M + "test_sharded.py::test_fit_matches_stock[adam]")),
    Kill("gather_order",
         single=("tests/test_optimizer_local.py::test_sharded_bucket_method_is_swappable_and_"
                 "gathers_in_forward_order",),
         ranks=(M + "test_timeline.py::test_deferred_buckets_go_out_in_forward_order_under_the_"
                "next_forward",), timeline=True),
    Kill("sharded_update",
         ranks=(M + "test_sharded.py::test_update_waits_for_the_next_forward_and_slots_are_"
                "slices",)),
    Kill("exchange",
         ranks=(M + "test_exchange.py::test_custom_loop_matches_distributed_tape[adam-rows]",
                M + "test_exchange.py::test_fit_matches_stock[sgd_momentum-gather]")),
    Kill("auto_never_switches",
         ranks=(M + "test_auto.py::test_a_plan_clearly_faster_in_its_trial_ends_the_check",
                M + "test_auto.py::test_fit_switching_plans_matches_stock[adam]")),
    Kill("auto_drops_state",
         ranks=(M + "test_auto.py::test_switching_out_of_a_sharded_plan_carries_adams_state",
                M + "test_auto.py::test_sharded_auto_checkpoint_resume_equals_uninterrupted_"
                "run")),
    Kill("reconsider",
         ranks=(M + "test_batch_growth.py::test_auto_predicts_for_a_batch_too_short_lived_to_"
                "check",
                M + "test_batch_growth.py::test_auto_chooses_again_at_a_growth_and_equals_stock")),
    Kill("resume",
         ranks=(M + "test_sharded.py::test_checkpoint_resume_equals_uninterrupted_run"
                "[adam-sharded]",
                M + "test_sharded.py::test_checkpoint_from_one_rank_resumes_on_two")),
    Kill("bucket_order",
         single=("tests/test_plan.py::test_buckets_are_in_backprop_order_and_cover_every_"
                 "variable_once",
                 "tests/test_exchange_plan.py::test_exchange_plan_keeps_backprop_order"),
         ranks=(M + "test_timeline.py::test_layerwise_buckets_go_out_in_plan_order_during_"
                "backprop",), timeline=True),
    Kill("skip_agreement",
         ranks=(M + "test_keras_usage.py::test_mixed_precision_with_overflow_on_one_rank_equals_"
                "stock[layerwise]",),
         limit_s=150),
    Kill("nadam_refusal",
         ranks=(M + "test_keras_usage.py::test_nadam_is_refused_where_it_cannot_be_exact",)),
    Kill("stall_shutdown",
         single=("tests/test_stall.py::test_a_stalled_rank_ends_the_multirank_run",)),
    Kill("quiet_hold",
         single=("tests/test_compute_clock.py::test_every_collective_waits_for_the_whole_"
                 "backward_pass",)),
)
BY_NAME = {k.name: k for k in KILLS}
assert set(BY_NAME) == set(MUTANTS), "every mutant needs its tests, and only mutants have them"


@dataclass
class Outcome:
    verdict: str   # killed / survived / error
    why: str
    seconds: float


def _junit(paths: list[Path]) -> tuple[int, list[str]]:
    """(test cases run, "name: first line of the message" of those that failed or errored)
    over the reports found."""
    run, failed = 0, []
    for path in paths:
        if not path.exists():
            continue
        for case in ET.parse(path).getroot().iter("testcase"):
            run += 1
            bad = case.find("failure")
            bad = case.find("error") if bad is None else bad
            if bad is not None:
                message = (bad.get("message") or "").strip().splitlines()[:1]
                failed.append(f"{case.get('name', '?')}: {''.join(message)[:160]}")
    return run, failed


def _env(kill: Kill, venv: Path, mutate: bool) -> dict[str, str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONDONTWRITEBYTECODE": "1",
           "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "2",
           "HVDO_VENV": str(venv)}
    env.pop("HOROVOD_TIMELINE", None)
    env.pop("HVDO_MUTANT", None)
    if mutate:
        env["HVDO_MUTANT"] = kill.name
    return env


def _launch(kill: Kill, venv: Path, out: Path, mutate: bool) -> tuple[int, list[Path], str]:
    """Run the mutant's tests (single-process, then 2-rank), the mutant on unless ``mutate`` is
    False: (exit status of the last launch that ran, the JUnit reports, the log's tail)."""
    env, reports, log, rc = _env(kill, venv, mutate), [], "", 0
    py = str(venv / "bin" / "python")
    limit = kill.limit_s or TEST_LIMIT_S
    common = ["-x", "-q", "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning"]
    if kill.single:
        report = out / "single.xml"
        cmd = [py, "-m", "pytest", *kill.single, *common, f"--timeout={limit}",
               f"--junitxml={report}"]
        rc, text = _run(cmd, env)
        reports.append(report)
        log += text
        if rc != 0:
            return rc, reports, log
    if kill.ranks:
        if kill.timeline:
            env["HOROVOD_TIMELINE"] = "DYNAMIC"
        env["HVDO_MULTIRANK_TESTS"] = " ".join(kill.ranks)
        env["HVDO_REPORT"] = "rank"
        cmd = [str(venv / "bin" / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
               str(ROOT / "tests" / "multirank" / "run_rank"), str(out), "-x",
               f"--timeout={limit}"]
        rc, text = _run(cmd, env)
        reports += [out / "rank0.xml", out / "rank1.xml"]
        log += text
    return rc, reports, log


def _run(cmd: list[str], env: dict[str, str]) -> tuple[int, str]:
    try:
        proc = subprocess.run(["timeout", "--kill-after=20", str(LAUNCH_LIMIT_S), *cmd],
                              cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=LAUNCH_LIMIT_S + 60)
    except subprocess.TimeoutExpired as e:
        return 124, f"{e}"
    return proc.returncode, (proc.stdout + proc.stderr)[-6000:]


#: what a launch's log shows when the mutant left a rank waiting and the per-test timeout (or,
#: under MPI, Horovod's stall shutdown) ended it
HANG_SIGNS = ("+ Timeout +", "stall shutdown", "Stall shutdown", "HorovodInternalError",
              "Horovod has been shut down")


def check(kill: Kill, venv: Path, mutate: bool = True) -> Outcome:
    """Run one mutant's tests and judge them (``mutate`` False: the same tests without the
    mutant, which must all pass -- the ``--baseline`` run)."""
    start = time.time()
    with tempfile.TemporaryDirectory(prefix=f"mutant-{kill.name}-") as tmp:
        rc, reports, log = _launch(kill, venv, Path(tmp), mutate)
        run, failed = _junit(reports)
    seconds = time.time() - start
    if failed:
        return Outcome("killed", f"failed: {sorted(set(failed))[0]}", seconds)
    if rc != 0 and any(sign in log for sign in HANG_SIGNS):
        return Outcome("killed", "a rank was left waiting, ended by the per-test timeout",
                       seconds)
    if run and rc == 0:
        return Outcome("survived", f"{run} test runs passed", seconds)
    tail = " | ".join(line for line in log.splitlines()[-6:] if line.strip())
    return Outcome("error", f"exit {rc}, {run} test runs reported: {tail[-300:]}", seconds)


def markdown_table() -> str:
    """The rows of docs/testing.md's mutant table (a test checks the page holds them)."""
    rows = []
    for k in KILLS:
        tests = [t.removeprefix("tests/") for t in (*k.single, *k.ranks)]
        where = " (2 ranks)" if k.ranks and not k.single else ""
        rows.append(f"| `{k.name}` | {MUTANTS[k.name]} | "
                    + "<br>".join(f"`{t}`" for t in tests) + f"{where} |")
    return "\n".join(rows)


def rotation(names: list[str], part: int, parts: int) -> list[str]:
    """Part ``part`` of ``parts`` of the mutants (every ``parts``-th, from ``part``)."""
    return names[part % parts::parts]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="mutants to check (default: all)")
    ap.add_argument("--venv", default=str(ROOT / ".venv"))
    ap.add_argument("--parts", type=int, default=1,
                    help="check one part of this many (CI: the day of the year picks it)")
    ap.add_argument("--part", type=int, default=None,
                    help="which part (default: the day of the year modulo --parts)")
    ap.add_argument("--list", action="store_true", help="list the mutants and their tests")
    ap.add_argument("--markdown", action="store_true",
                    help="print docs/testing.md's table of the mutants")
    ap.add_argument("--baseline", action="store_true",
                    help="run the same tests without the mutants: every one must pass")
    args = ap.parse_args(argv)
    if args.markdown:
        print(markdown_table())
        return 0
    if args.list:
        for k in KILLS:
            print(f"{k.name}: {MUTANTS[k.name]}")
            for t in (*k.single, *k.ranks):
                print(f"    {t}")
        return 0
    unknown = [n for n in args.names if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown mutants {unknown}; known: {', '.join(BY_NAME)}")
    names = args.names or [k.name for k in KILLS]
    if args.parts > 1:
        part = args.part if args.part is not None else \
            datetime.date.today().timetuple().tm_yday
        names = rotation(names, part, args.parts)
        print(f"mutants, part {part % args.parts + 1} of {args.parts}: {', '.join(names)}")
    bad, want = 0, "survived" if args.baseline else "killed"
    for name in names:
        outcome = check(BY_NAME[name], Path(args.venv), mutate=not args.baseline)
        bad += outcome.verdict != want
        verdict = "passed" if args.baseline and outcome.verdict == "survived" else outcome.verdict
        print(f"mutant {name:20s} {verdict:8s} {outcome.seconds:5.0f} s  {outcome.why}",
              flush=True)
    if args.baseline:
        print(f"mutant tests without the mutants: {len(names) - bad} passed, {bad} did not")
    else:
        print(f"mutants: {len(names) - bad} killed, {bad} not killed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
