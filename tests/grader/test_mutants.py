"""The graded tests bite: every classic student bug in tests/mutants/ costs points, in proportion to its harm.

Each mutant is a solution file with one bug in it. It is graded like a
submission, in full, on the tests of the module it touches only (the other
modules would just add their startup time), several at a time; the
solutions, graded alongside, must score 100.

Each mutant must lose at least its ``loses`` points (the catalog says how
many, by the rule in README.md's "How the points are shared": a bug that shows in
ordinary use loses at least half its part; a bug in the LSE alone, the LSE's share),
and always at least one test's.

A mutant that keeps all its points is a hole in the graded tests: the
catalog marks it ``survives`` (why), and its test here is a strict expected
failure until a graded test catches it.
"""

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gqa_flash.course import impl
from gqa_flash.course.grader import grade, sandbox, testrun
from gqa_flash.course.grader.report import table

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/, where mutants/ is
from mutants.catalog import MUTANTS  # noqa: E402

SOLUTIONS = impl.SOLUTIONS_DIR


def test_each_mutant_is_a_small_edit_of_a_solution():
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names)), "two mutants share a name"
    for m in MUTANTS:
        original = (SOLUTIONS / m.file).read_text()
        mutated = m.apply(original)  # raises unless each edit's old text occurs exactly once
        assert mutated != original, m.name
        compile(mutated, m.file, "exec")


@pytest.fixture(scope="module")
def graded(tmp_path_factory, request):
    """{mutant name or 'solutions': report}, graded os.cpu_count() at a time: the solutions, and the mutants
    whose tests this run selected (``-k backward`` grades backward.py's only)."""
    chosen = {item.callspec.params["mutant"].name for item in request.session.items
              if item.module is request.module and "mutant" in getattr(getattr(item, "callspec", None), "params", {})}
    mutants = [m for m in MUTANTS if m.name in chosen]
    root = tmp_path_factory.mktemp("mutants")
    work = tmp_path_factory.mktemp("grading")  # the grader's copies: a folder of this test's own
    course = sandbox.snapshot()
    solutions = root / "solutions"
    solutions.mkdir()
    for path in SOLUTIONS.glob("*.py"):
        (solutions / path.name).write_text(path.read_text())
    jobs = [("solutions", solutions, None)]
    for m in mutants:
        folder = root / m.name
        folder.mkdir()
        # The other solution files too: a graded test may call into another module.
        for path in SOLUTIONS.glob("*.py"):
            (folder / path.name).write_text(path.read_text())
        (folder / m.file).write_text(m.apply((SOLUTIONS / m.file).read_text()))
        jobs.append((m.name, folder, {m.module}))

    def run(job):
        name, src, only = job
        return name, grade.grade(src, course=course, only=only, workdir=work, limits=testrun.Limits())

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        reports = dict(pool.map(run, jobs))
    print(f"\ngraded {len(mutants)} mutants and the solutions in {time.monotonic() - start:.0f} s")
    print(f"{'mutant':<42}{'module':<16}{'points lost':>12}  (floor)  first failure")
    for m in mutants:
        r = reports[m.name]
        first = next((t.message for t in r.tests if not t.passed), "")
        got, worth = sum(t.score for t in r.tests), sum(t.max_score for t in r.tests)
        print(f"{m.name:<42}{m.module:<16}{worth - got:>6.2f} / {worth:<4.0f} ({m.loses:>4g})  {first[:60]}")
    return reports


# The module's fixture grades every mutant before the first test ends: about 10 minutes on CI's two cores, and
# twice that on a machine that runs another suite beside it. The limit catches a hang, not a slow machine; each
# grading has its own time limits inside.
@pytest.mark.timeout(1800)
def test_the_solutions_score_100(graded):
    report = graded["solutions"]
    assert report.max_score == pytest.approx(100), table(report)
    assert report.score >= 100 and all(t.passed for t in report.tests), table(report)  # bonus on top


@pytest.mark.timeout(1800)
@pytest.mark.parametrize(
    "mutant",
    [pytest.param(m, id=m.name, marks=[pytest.mark.xfail(strict=True, reason=m.survives)] if m.survives else [])
     for m in MUTANTS],
)
def test_the_mutant_loses_points_in_the_module_it_touches(graded, mutant):
    report = graded[mutant.name]
    assert {t.part for t in report.tests} == {mutant.module}, table(report)
    # The module's own points (bonus modules' count on top of the 100, so use the tests' sum).
    got, worth = sum(t.score for t in report.tests), sum(t.max_score for t in report.tests)
    assert worth > 0, table(report)
    assert got < worth, (
        f"mutant {mutant.name} ({mutant.bug}) keeps all {worth:g} points of {mutant.file}: "
        f"no graded test catches it\n{table(report)}")
    assert worth - got >= mutant.loses - 1e-9, (
        f"mutant {mutant.name} ({mutant.bug}) loses {worth - got:.4g} of {worth:g} points of {mutant.file}, "
        f"fewer than the {mutant.loses:g} its harm calls for\n{table(report)}")
