"""Grade one submission, or a batch: the grading itself, with no command line (that is
:mod:`gqa_flash.course.grader.cli`, whose docstring tells the whole path of a submission).

:func:`grade` takes the graded files of a folder, zip or .py file (:mod:`~gqa_flash.course.grader.submission`),
refuses those the static gate refuses (:mod:`~gqa_flash.course.grader.gate`), runs the graded tests on a fresh
copy of the course (:mod:`~gqa_flash.course.grader.sandbox`, :mod:`~gqa_flash.course.grader.testrun`) and returns
a :class:`~gqa_flash.course.grader.report.Report`; :func:`grade_batch` grades many, jobs at a time.
"""

from __future__ import annotations

import ast
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from gqa_flash.course import layout
from gqa_flash.course.grader import downloads, gate, sandbox, submission, testrun
from gqa_flash.course.grader.platforms import Student
from gqa_flash.course.grader.report import GATE, NOT_GRADED, Report, student_name, total
from gqa_flash.course.grader.started import mark_not_started
from gqa_flash.course.grader.testrun import Limits, TestResult

__all__ = ["grade", "grade_batch", "not_graded"]


def zero_parts_not_own(tests: list[TestResult]) -> list[str]:
    """Score 0 every part one of whose tests found its work was not the student's own; one line per such part.

    A kernel that hands its work to the course's fast kernels fails only the tests that see it (the
    causal-skip count, say) and passes the rest: none of its points are the student's, so none count."""
    flags = []
    for part in dict.fromkeys(t.part for t in tests if t.integrity):
        first = next(t for t in tests if t.part == part and t.integrity)
        flags.append(f"{part}.py scores 0: {first.message.removeprefix('integrity: ')} (test {first.name})")
        for t in tests:
            if t.part == part and t.passed:
                t.passed = False
                t.message = f"0 points: {part}.py did not do its own work (see {first.name})"
    return flags


def grade(source: Path | downloads.Piece | None = None, *, course: sandbox.Course | None = None, only=None,
          limits: Limits | None = None, workdir: Path | None = None) -> Report:
    """Grade one submission (a folder, zip or .py file, one student's files of a bulk download; None: the
    working copy). Never raises for a bad one.

    The copy of the course lives in a new folder under ``workdir`` (default: the
    temporary directory, ``TMPDIR``) and is removed when the grading ends.
    """
    start = time.monotonic()
    course = course or sandbox.snapshot()
    limits = limits or Limits()
    test_files = course.tests_of(only)
    expected = needed_files(parts_of(course, only))
    piece = source if isinstance(source, downloads.Piece) else None
    sub = submission.read(piece.folder if piece else source, expected=[f for f in course.graded_files if f in expected])
    report = Report(submission=submission_name(source), notes=list(sub.notes), files=sorted(sub.files),
                    platform=piece.platform if piece else None, student=_student(source, sub),
                    path="" if source is None else str(source))
    stop = sub.stop
    if stop:  # nothing to grade: running the whole suite on stubs would take a minute to say so
        report.stop, report.notes = stop, list(sub.notes)  # the stop line is the last note
        report.tests = not_graded(course, test_files, stop)
        report.seconds = time.monotonic() - start
        return report
    # The static gate first: a file that fails it never runs (its stub stands in) and its part scores 0.
    gated = gate_files(course, sub.files) if limits.gate else {}
    runnable = {name: content for name, content in sub.files.items() if name not in gated}
    scratch = Path(tempfile.mkdtemp(prefix="gqa-flash-grade-", dir=workdir))
    try:
        gated_tests = [t for t in test_files if Path(t).stem.removeprefix("test_") + ".py" in gated]
        to_run = [t for t in test_files if t not in gated_tests]
        run = testrun.run_tests(course, runnable, scratch, to_run, limits) if to_run else testrun.RunReport()
        report.tests = run.tests + refused_by_gate(course, gated_tests, gated)
        report.tests.sort(key=lambda t: test_files.index(t.id.split("::")[0]) if t.id.split("::")[0] in test_files
                          else len(test_files))
        report.isolation = run.isolation if to_run else None  # nothing ran: nothing to isolate
        report.notes.extend(run.notes)
        mark_not_started(report.tests, sub.files, course.graded_files)
        report.integrity = zero_parts_not_own(report.tests) + list(sub.flags)
    except Exception as e:  # a bug of the grader's own must not stop a batch
        report.error = f"the grader failed on this submission: {type(e).__name__}: {e}"
        report.notes.append(report.error)
    finally:
        sandbox.remove(scratch)
    if report.error is None and not report.tests:
        report.error = "no test reported a result" + (f" ({report.notes[-1]})" if report.notes else "")
        report.notes.append(report.error)
    report.seconds = time.monotonic() - start
    return report


def submission_name(source: Path | downloads.Piece | None) -> str:
    """A submission's name as it came, without the path typed to reach it: 'alice.zip', a Moodle folder's
    'José García_12345_assignsubmission_file_', a bulk download's student 'canvas.zip#garciajose'."""
    if isinstance(source, downloads.Piece):
        return source.name
    if source is None:
        return "working copy"
    return Path(source).name or Path(source).resolve().name


def _student(source: Path | downloads.Piece | None, sub: submission.Submission) -> Student | None:
    """Who handed it in: a bulk download's student, else whom the platform's names in it say, else a
    student named after the submission (alice.zip: alice); None for the working copy."""
    if isinstance(source, downloads.Piece):
        return source.student
    if sub.student is not None:
        return sub.student
    return None if source is None else Student(student_name(Path(source)))


def gate_files(course: sandbox.Course, files: dict[str, bytes]) -> dict[str, list]:
    """{graded file: its violations} for each submitted file the static gate refuses (gqa_flash.course.grader.gate),
    checked against its exercise's allow-list and its stub's own imports."""
    found = {}
    for name, content in files.items():
        violations = gate.check(name, content, course.files.get(f"gqa_flash/{name}"))
        if violations:
            found[name] = violations
    return found


def refused_by_gate(course: sandbox.Course, test_files: list[str], gated: dict[str, list]) -> list[TestResult]:
    """A failed test per gated part, worth its points, flagged integrity: its code never ran."""
    tests = not_graded(course, test_files, "")
    for t in tests:
        violations = gated[f"{t.part}.py"]
        more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
        t.name = GATE
        t.id = t.id.replace(NOT_GRADED, t.name)
        t.message = (f"integrity: gate: {violations[0]}{more}; graded code may use only what its exercise needs, "
                     "so it was not run and this part scores 0")
        t.integrity = True
    return tests


def not_graded(course: sandbox.Course, test_files: list[str], note: str) -> list[TestResult]:
    """One failed test per part, worth the part's points, for a submission that held nothing to grade.

    The points are read from the test files' marks (never run), so the table, the CSV and Gradescope show
    each part at 0 out of its points, as for any other submission."""
    tests = []
    for path in test_files:
        part = Path(path).stem.removeprefix("test_")
        hidden = path.startswith(sandbox.HIDDEN_DIR + "/")
        tests.append(TestResult(id=f"{path}::{NOT_GRADED}", part=part, name=NOT_GRADED, message=note,
                                max_score=_points_in(course.files.get(path, b"")), hidden=hidden,
                                bonus=part in sandbox.BONUS_PARTS and not hidden))
    return tests


def _points_in(source: bytes) -> float:
    """The points of a test file: the sum of its tests' @pytest.mark.points(n)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return 0.0
    tests = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]
    return total(float(dec.args[0].value) for test in tests for dec in test.decorator_list
                 if isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and dec.func.attr == "points"
                 and dec.args and isinstance(dec.args[0], ast.Constant))


def grade_batch(sources: list[Path], *, course: sandbox.Course, only=None, limits: Limits | None = None,
                jobs: int = 1, on_done=None, on_start=None, workdir: Path | None = None) -> list[Report]:
    """Grade many submissions, jobs at a time; on_start(source) as each one starts, on_done(source, report) as
    each one finishes.

    Each submission's tests run in their own processes; the threads here only
    wait for them, so `jobs` is how many test processes run at once.
    """
    reports = []
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))

    def one(src):  # on the pool's thread: its lines come in the order things happen
        if on_start is not None and not testrun.STOP.is_set():
            on_start(src)
        report = grade(src, course=course, only=only, limits=limits, workdir=workdir)
        if on_done is not None:
            on_done(src, report)
        return report

    try:
        futures = [pool.submit(one, src) for src in sources]
        for future in as_completed(futures):
            reports.append(future.result())
    except BaseException:  # Ctrl-C: stop the test processes, keep what is written
        testrun.stop()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return reports


def parts_of(course: sandbox.Course, only=None) -> list[str]:
    parts = [Path(t).stem.removeprefix("test_") for t in course.tests_of(only) if t.startswith("tests/graded/")]
    return list(dict.fromkeys(parts))


def needed_files(parts) -> list[str]:
    """The graded files the tests of ``parts`` run: each part's own, then those it builds on (windows.py calls
    forward.py's helpers, so windows.py graded alone still runs on the submission's forward.py)."""
    files = [f"{p}.py" for p in parts]
    for p in parts:
        info = layout.STUDENT_FILES.get(p)
        files += [f"{b}.py" for b in (info.builds_on if info else ()) if f"{b}.py" not in files]
    return files


def has_hidden(course: sandbox.Course, only=None) -> bool:
    return any(t.startswith(sandbox.HIDDEN_DIR + "/") for t in course.tests_of(only))

