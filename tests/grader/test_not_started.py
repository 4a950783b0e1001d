"""A module not started (its file still the stub) is not run by the grader, and scores as if it had been.

A submission of two modules once took 107 s against 123 s for all of them: the stubs' tests ran, to fail.
Now they are collected (names and points) and fail at once as "not started" (gqa_flash/course/grader/started.py,
testrun.py, plugin.py), with the same verdict and points as when they run (Limits.run_not_started). That
rests on one fact, checked here too: run on the stubs, every graded test fails.
"""

import json
from pathlib import Path

import pytest

from gqa_flash.course import layout
from gqa_flash.course.grader import grade, gradescope, sandbox, started, stubs, testrun
from gqa_flash.course.grader.report import NOT_STARTED, table
from gqa_flash.course.grader.testrun import Limits

SOLUTIONS = stubs.COMPLETED_DIR
STUBS = {p.name: text for p, text in stubs.plan(SOLUTIONS, Path("gqa_flash")).items()}
LIMITS = Limits(timeout_cap_s=60, submission_s=400)


def _events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def test_which_parts_are_not_started():
    prints = started.stub_fingerprints()
    files = {"naive.py": (SOLUTIONS / "naive.py").read_bytes(), "tiled.py": STUBS["tiled.py"].encode(),
             "forward.py": ("# my notes\n" + STUBS["forward.py"]).encode()}  # a comment starts nothing
    tests = ["tests/graded/test_naive.py", "tests/graded/test_tiled.py", "tests/graded/test_forward.py",
             "tests/graded/test_decode.py", "tests/extra/test_tiled.py"]  # decode.py not submitted: its stub
    assert started.parts_not_started(files, tests, prints=prints) == ["tiled", "forward", "decode"]
    assert started.parts_not_started(files, tests, prints={}) == []  # stubs unknown: every part runs


@pytest.mark.timeout(600)
def test_the_tests_of_a_module_not_started_do_not_run(tmp_path):
    course = sandbox.snapshot()
    files = {"naive.py": (SOLUTIONS / "naive.py").read_bytes(),
             "online_softmax.py": STUBS["online_softmax.py"].encode()}
    test_files = course.tests_of({"naive", "online_softmax"})
    report = testrun.run_tests(course, files, tmp_path, test_files, LIMITS)
    events = _events(tmp_path / "run0.jsonl")
    collected = {t["id"]: t["part"] for t in next(e for e in events if e["event"] == "collected")["tests"]}
    ran = {collected[e["id"]] for e in events if e["event"] == "start"}
    assert ran == {"naive"}, f"tests started in parts {ran}: online_softmax is the stub and must not run"
    stub_tests = [t for t in report.tests if t.part == "online_softmax"]
    assert stub_tests and len(stub_tests) == sum(p == "online_softmax" for p in collected.values())
    assert all(not t.passed and t.not_started and t.seconds == 0 and t.message == NOT_STARTED for t in stub_tests)
    assert sum(t.max_score for t in stub_tests) == pytest.approx(15)
    assert all(t.passed for t in report.tests if t.part == "naive"), [t.message for t in report.tests]


@pytest.mark.timeout(600)
def test_the_verdict_and_points_are_those_of_running_the_stubs_tests(tmp_path):
    submitted = tmp_path / "alice"
    submitted.mkdir()
    (submitted / "online_softmax.py").write_text(STUBS["online_softmax.py"])
    course = sandbox.snapshot()
    skipped = grade.grade(submitted, course=course, only={"online_softmax"}, limits=LIMITS, workdir=tmp_path)
    ran = grade.grade(submitted, course=course, only={"online_softmax"},
                      limits=Limits(timeout_cap_s=60, submission_s=400, run_not_started=True), workdir=tmp_path)
    assert any(t.seconds > 0 for t in ran.tests), "run_not_started ran none of the stub's tests"
    assert all(t.seconds == 0 for t in skipped.tests)

    def outcome(report):
        return [(t.id, t.max_score, t.score, t.not_started, t.message) for t in report.tests]

    assert outcome(skipped) == outcome(ran) and skipped.tests and skipped.score == 0
    assert table(skipped).splitlines()[1:] == table(ran).splitlines()[1:]
    assert gradescope.results_json(skipped)["tests"] == gradescope.results_json(ran)["tests"]
    assert gradescope.results_json(skipped)["tests"][0]["name"] == "online_softmax.py: not started"


@pytest.mark.timeout(900)
def test_every_graded_test_fails_on_the_stubs_when_run(tmp_path):
    """What skipping a stub's tests rests on: run, none of them passes. (A submission with no file at all is
    not run, "nothing to grade": the stubs are handed in, and run_not_started runs their tests.)"""
    submitted = tmp_path / "stubs"
    submitted.mkdir()
    for name in layout.GRADED_FILES:
        (submitted / name).write_text(STUBS[name])
    report = grade.grade(submitted, limits=Limits(run_not_started=True), workdir=tmp_path)
    assert report.stop is None and {t.part for t in report.tests} == set(layout.GRADED_MODULES), table(report)
    ran = {t.part for t in report.tests if t.seconds > 0}
    assert ran == set(layout.GRADED_MODULES), f"parts whose tests did not run: {set(layout.GRADED_MODULES) - ran}"
    passed = [t.id for t in report.tests if t.passed]
    assert not passed, f"graded tests that pass on the stubs (skipping them would cost their points): {passed}"
    assert report.score == 0 and all(t.not_started for t in report.tests), table(report)


def test_a_file_not_handed_in_is_named_so_not_not_started():
    """A submission without online_softmax.py is graded as its stub; what the student reads (the table's verdict,
    Gradescope's entry) once said "not started (still the stub you were given)", only a note saying the file
    was missing. Unit level: the marking, with no test run."""
    from gqa_flash.course.grader import report as report_module
    from gqa_flash.course.grader.testrun import TestResult

    def result(part, i):
        return TestResult(id=f"tests/graded/test_{part}.py::t[{i}]", part=part, name=f"t[{i}]", max_score=5,
                          passed=False, message="failed")

    tests = [result("online_softmax", i) for i in range(3)] + [result("tiled", i) for i in range(2)]
    files = {"tiled.py": STUBS["tiled.py"].encode()}  # online_softmax.py not handed in, tiled.py still the stub
    assert started.mark_not_started(tests, files) == ["online_softmax", "tiled"]
    missing, stub = tests[:3], tests[3:]
    assert report_module.verdict(missing) == report_module.NOT_HANDED_IN
    assert report_module.verdict(stub) == NOT_STARTED
    entry = gradescope._not_started(missing)
    assert entry["name"].endswith("not handed in") and "was not handed in" in entry["output"], entry
    assert gradescope._not_started(stub)["name"].endswith("not started")
