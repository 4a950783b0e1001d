"""Grade submissions: ``python -m gqa_flash.course.grader [SUBMISSION ...]``.

A submission is a folder, a zip or a .py file holding some of the graded
files (``naive.py``, ``online_softmax.py``, ``tiled.py``, ``forward.py``, at
any depth); with none, the student's own working copy (``gqa_flash/``) is
graded. For each one the grader

1. takes only the graded files, as bytes (:mod:`gqa_flash.course.grader.submission`);
2. writes a fresh copy of the course in a temporary folder, from a snapshot
   read once (:mod:`gqa_flash.course.grader.sandbox`): the course's own support modules
   and tests, the submission's graded files, the stubs for the missing ones,
   no ``solutions/``;
3. runs the graded tests there, in a subprocess, with a time limit per test
   and per submission, restarting after a crash (:mod:`gqa_flash.course.grader.testrun`,
   :mod:`gqa_flash.course.grader.plugin`);
4. scores each test with its points (a parametrized test's points shared
   among its cases in whole hundredths, so that every total is exact), removes
   the copy, and reports (:mod:`gqa_flash.course.grader.report`): a table on the
   terminal, Gradescope's ``results.json`` (``--out``;
   :mod:`gqa_flash.course.grader.gradescope`), a CSV row per submission for a batch
   (``--csv``).

A learning platform's bulk download (Canvas, Blackboard: one flat folder or zip
of the whole class, ``garciajose_12345_678901_naive.py``...) is split into a
submission per student (:mod:`gqa_flash.course.grader.downloads`), named
``DOWNLOAD#STUDENT`` in the CSV (``canvas.zip#garciajose``) and
``STUDENT.json`` in the results. The CSV's row of a submission names its
student as the platform's names say (:mod:`gqa_flash.course.grader.platforms`: the
name, the platform's id, whether Canvas marked it late; else the submission's
own name), and the submission by its own name, without the path typed.

A submission that holds nothing to grade (``Submission.stop``: an empty zip, a
notebook only) runs no test: each part scores 0, with its one note.

A module the student has not started (its file is still the stub, see
:func:`not_started`) runs no test: a stub passes none (tests/grader/test_not_started.py),
so each of its tests scores 0 at once, and it is reported as one line, "not
started", in the table and in Gradescope's results. A run of some modules only (``--only``, ``make grade
MODULE=...``) counts its points out of those modules' own
("20 / 20 of the modules run (100 in the course)").

The course's Python is ``.venv/bin/python`` (``make grade-submissions`` runs it for you).

Examples::

    python -m gqa_flash.course.grader                                  # your own files
    python -m gqa_flash.course.grader alice.zip --out results.json
    python -m gqa_flash.course.grader submissions/*.zip --csv grades.csv --out results/ --jobs 4
    python -m gqa_flash.course.grader --csv grades.csv --out results/ --regrade "José García" alice
    python -m gqa_flash.course.grader canvas.zip --csv grades.csv --out results/  # one each; --regrade garciajose
    python -m gqa_flash.course.grader --gradescope-bundle autograder.zip [--extra-tests hidden/]

A batch writes each submission's row (and its results file, named after the
student: ``José García.zip`` -> ``José García.json``) as soon as it is
graded, keeps the CSV sorted by student, prints on stderr a line when it
starts and as each submission starts and is graded (``[graded/all]``, the
time so far, the time left: :mod:`gqa_flash.course.grader.progress`), and ends with a
summary on stdout: how many were graded, the mean of the required points over
those that held something to grade, how many rows need a second look (the
CSV's ``review`` column), where the CSV and the results went. Run the same
command again after an interruption and the submissions already in the CSV
are skipped; ``--regrade NAME...`` grades those again and replaces their rows.
"""

from __future__ import annotations

import argparse
import ast
import os
import signal
import unicodedata
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from gqa_flash.course import layout
from gqa_flash.course.grader import downloads, gate, gradescope, isolation, sandbox, submission, testrun
from gqa_flash.course.grader.platforms import Student
from gqa_flash.course.grader.progress import Progress, batch_summary, progress_line, summary_row
from gqa_flash.course.grader.report import (GATE, NOT_GRADED, GradeBook, integrity_lines, num, part_name, results_names,
                                     stem, student_name, table, total, verdict, write_json)
from gqa_flash.course.grader.started import (STUB_PRINTS, code_fingerprint, mark_not_started, not_started,  # noqa: F401
                                      stub_fingerprints, stub_manifest)  # re-exported: conftest, handin, edition...
from gqa_flash.course.grader.testrun import Limits, TestResult

__all__ = ["GradeBook", "Report", "grade", "grade_batch", "main", "table"]

# The points of the required modules (tests/given/test_points.py holds the graded tests to it); bonus on top.
COURSE_POINTS = 100
REQUIRED_PARTS = tuple(m for m in layout.GRADED_MODULES if m not in layout.BONUS_MODULES)


@dataclass
class Report:
    """One graded submission."""

    submission: str  # its name as it came (alice.zip, a Moodle folder's name, canvas.zip#garciajose)
    tests: list[TestResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # the graded files it submitted
    seconds: float = 0.0
    # Set when no grade could be given (the grader failed, or no test reported a result): such a
    # submission is not a 0, it is for a person to look at, and a batch run again grades it again.
    error: str | None = None
    # Work that was not the student's own: a part that reached the course's kernels, reference or checks
    # (scored 0, see zero_parts_not_own), and code worth a look (submission.py's "review" flags).
    integrity: list[str] = field(default_factory=list)
    # Set when the submission held nothing to grade (empty, a notebook only): no test ran, every part
    # scores 0, and this is the submission's one note (submission.Submission.stop).
    stop: str | None = None
    # The platform ("Canvas") when this is one student's files of a bulk download (downloads.Piece): its
    # download names are then how the files arrive, not a rename worth a second look.
    platform: str | None = None
    # How the executor ran the student's code: "bwrap", "user" or "none" (gqa_flash.course.grader.isolation); None
    # when no code ran (nothing to grade).
    isolation: str | None = None
    # Who handed it in: as a platform's names say (with its id for them, and whether it was late), else the
    # submission's own name; None for the working copy.
    student: Student | None = None
    path: str = ""  # where the grader found it, as given (the CSV's path column: a batch run again finds it)

    @property
    def key(self) -> str:
        """One submission of a batch: its path as given (two alice.zip of two folders are two)."""
        return self.path or self.submission

    @property
    def score(self) -> float:
        return total(t.score for t in self.tests)

    @property
    def max_score(self) -> float:
        """The points of the required parts (and hidden tests): bonus points come on top."""
        return total(t.max_score for t in self.tests if not t.bonus)

    @property
    def complete(self) -> bool:
        """Every required module was graded: not a run of some modules only (--only, MODULE=...)."""
        return set(REQUIRED_PARTS) <= {t.part for t in self.tests if not t.hidden}

    @property
    def worth(self) -> float:
        """What the score is out of: the required points (bonus on top) when every required module ran,
        else every point of the modules that ran (a bonus module alone is worth its own points, not 0)."""
        return self.max_score if self.complete else total(t.max_score for t in self.tests)

    def out_of(self) -> str:
        """The table's total, after the score: '100', '100  (with 20 bonus)', or, for some modules only,
        '20 of the modules run (100 in the course)'."""
        if not self.complete:
            return f"{num(self.worth)} of the modules run ({COURSE_POINTS} in the course)"
        bonus = total(t.score for t in self.tests if t.bonus)
        return f"{num(self.worth):<3}" + (f"  (with {num(bonus)} bonus)" if bonus else "")

    def points(self) -> str:
        """The headline: '20 / 100 points', or '20 / 20 points of the modules run'."""
        return f"{num(self.score)} / {num(self.worth)} points" + ("" if self.complete else " of the modules run")

    def parts(self) -> dict[tuple[str, bool], list[TestResult]]:
        """Tests by (part, hidden), in the order they ran: the graded modules first."""
        parts: dict[tuple[str, bool], list[TestResult]] = {}
        for t in self.tests:
            parts.setdefault((t.part, t.hidden), []).append(t)
        return parts

    def part_score(self, part: str, hidden: bool = False) -> tuple[float, float]:
        tests = self.parts().get((part, hidden), [])
        return total(t.score for t in tests), total(t.max_score for t in tests)

    def summary(self) -> str:
        """A few lines for the top of Gradescope's results: the total, each part, the notes."""
        lines = [f"gqa-flash: {self.points()}"]
        if self.error is not None:
            lines = [f"gqa-flash: not graded ({self.error}); ask the course staff to look at this submission"]
        lines.extend(integrity_lines(self.integrity))
        if self.isolation == "none":
            lines.append(f"  {isolation.describe('none')}")
        for tests in self.parts().values():
            got, worth = total(t.score for t in tests), total(t.max_score for t in tests)
            lines.append(f"  {part_name(tests[0])}: {num(got)} / {num(worth)}  {verdict(tests)}")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


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
    expected = [f"{p}.py" for p in _parts(course, only)]
    piece = source if isinstance(source, downloads.Piece) else None
    sub = submission.read(piece.folder if piece else source, expected=[f for f in course.graded_files if f in expected])
    report = Report(submission=_name(source), notes=list(sub.notes), files=sorted(sub.files),
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


def _name(source: Path | downloads.Piece | None) -> str:
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


# --- the command line -----------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m gqa_flash.course.grader", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Grade gqa-flash submissions: a table, Gradescope's results.json, a CSV row each.",
        epilog="examples:\n" + __doc__.split("Examples::\n\n", 1)[1].split("\n\n", 1)[0],
    )
    p.add_argument("submissions", nargs="*", type=Path,
                   help="folders, zips or .py files (default: your own files in gqa_flash/)")
    p.add_argument("--out", help="results.json (one submission) or a folder of them (several, or a path ending in /)")
    p.add_argument("--csv", type=Path, help="one row per submission; submissions already in it are skipped")
    p.add_argument("--regrade", nargs="+", action="extend", default=[], metavar="NAME",
                   help="grade these again though they are in the CSV, replacing their rows: names as in the CSV's "
                        "submission column, or file names without .zip; put it last. With no submissions given, "
                        "the batch is the CSV's")
    p.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                   help="submissions graded at once (default: half the cores)")
    p.add_argument("--only", help="grade only these modules, e.g. naive,forward (make grade MODULE=...)")
    p.add_argument("--extra-tests", type=Path, help="a folder of hidden tests (shown after the due date)")
    p.add_argument("--timeout", type=float, default=Limits.submission_s,
                   help="seconds per submission (default %(default)s)")
    p.add_argument("--test-timeout-cap", type=float, help="cap each test's own time limit (seconds)")
    p.add_argument("--strikes", type=int, default=Limits.strikes,
                   help="hangs or crashes after which a part's remaining tests are not run (default %(default)s)")
    p.add_argument("--workdir", type=Path,
                   help="where the temporary copies of the course go (default: TMPDIR, else the system's)")
    p.add_argument("--gradescope-bundle", type=Path, metavar="ZIP",
                   help="write Gradescope's autograder zip (with --extra-tests if given) and grade nothing")
    return p


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM too (a batch killed by a scheduler): clean up, keep what is written


def main(argv: list[str] | None = None) -> int:
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if on_main_thread else None
    testrun.STOP.clear()
    try:
        return _main(argv)
    except KeyboardInterrupt:
        testrun.stop()
        print("interrupted: the submissions graded so far are written; run the same command again to go on",
              file=sys.stderr)
        return 130
    finally:
        if on_main_thread:
            signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.gradescope_bundle:
        names = gradescope.write_bundle(args.gradescope_bundle, extra_tests=args.extra_tests)
        print(f"wrote {args.gradescope_bundle} ({len(names)} files): upload it as the autograder "
              "(Ubuntu base image; the course runs on the CPU there)")
        return 0
    if args.workdir is not None and not args.workdir.is_dir():
        print(f"grade: --workdir {args.workdir} is not a folder", file=sys.stderr)
        return 2
    if args.workdir is not None:
        args.workdir = args.workdir.resolve()  # the tests run in a copy elsewhere: a relative path would miss
    only = set(args.only.replace(",", " ").split()) if args.only else None
    limits = Limits(submission_s=args.timeout, timeout_cap_s=args.test_timeout_cap, strikes=args.strikes)
    if args.regrade and not args.csv:
        print("grade: --regrade replaces rows of a CSV: give it with --csv", file=sys.stderr)
        return 2
    if not args.regrade:
        missing = [str(s) for s in args.submissions if not Path(s).exists()]
        if missing:
            print(f"grade: no such submission: {', '.join(missing)}", file=sys.stderr)
            return 2
    try:
        course = sandbox.snapshot(extra_tests=args.extra_tests)
    except (OSError, ValueError) as e:
        print(f"grade: {e}", file=sys.stderr)
        return 2
    unknown = sorted(only - {Path(f).stem.removeprefix("test_") for f in course.tests_of(only)}) if only else []
    if unknown:
        print(f"grade: --only {args.only}: no module {', '.join(unknown)} (the modules: {', '.join(_parts(course))})",
              file=sys.stderr)
        return 2
    scratch = Path(tempfile.mkdtemp(prefix="gqa-flash-downloads-", dir=args.workdir))  # students' files, split
    try:
        sources = _split(args.submissions, scratch)
        if len(sources) <= 1 and not args.regrade:
            return _grade_one(args, sources, course, only, limits)
        return _grade_batch(args, sources, scratch, course, only, limits)
    finally:
        sandbox.remove(scratch)


def _split(sources: list[Path], scratch: Path) -> list:
    """sources, each learning platform's bulk download among them replaced by its students (said on stderr)."""
    split = []
    for source in sources:
        found = downloads.split(source, Path(tempfile.mkdtemp(dir=scratch)))
        if found is None:
            split.append(source)
        else:
            print(found[1], file=sys.stderr)
            split.extend(found[0])
    return split


def _grade_one(args, sources: list, course: sandbox.Course, only, limits: Limits) -> int:
    """One submission (or the working copy): its table on stdout, and its results file and CSV row if asked."""
    source = sources[0] if sources else None
    # The CSV first: one that cannot take this run's row stops it before any grading.
    book = GradeBook(args.csv, _parts(course, only), _has_hidden(course, only)) if args.csv else None
    report = grade(source, course=course, only=only, limits=limits, workdir=args.workdir)
    print(table(report))
    out = None
    if args.out:
        out = Path(args.out)
        if out.is_dir() or args.out.endswith(os.sep):  # a folder: name the file after the submission
            src = source or Path("working_copy")
            out = out / results_names([src])[src]
        write_json(out, report)
    if book is not None:
        book.add(report, str(out or ""))
    if report.error is not None:
        print(f"grade: not graded: {report.error}", file=sys.stderr)
        return 1
    return 0


def _grade_batch(args, sources: list, scratch: Path, course: sandbox.Course, only, limits: Limits) -> int:
    """Many submissions: a line each on stderr as it is graded, its row and results file written at once,
    and a summary on stdout at the end. Those already in the CSV are skipped, but for --regrade's."""
    book = GradeBook(args.csv, _parts(course, only), _has_hidden(course, only)) if args.csv else None
    sources = sources or _of_the_csv(book, scratch)  # --regrade alone: the CSV's
    regrade = set()
    for name in args.regrade:
        picked = [s for s in sources if _named(s, name)]
        if not picked:
            print(f"grade: --regrade {name}: no such submission in the batch (a name of the CSV's submission "
                  "column, or a file name without .zip)", file=sys.stderr)
            return 2
        regrade.update(picked)
    missing = [str(s) for s in sources if not (s.download if isinstance(s, downloads.Piece) else s).exists()]
    if missing:
        print(f"grade: no such submission: {', '.join(missing)}", file=sys.stderr)
        return 2
    todo = [s for s in sources if book is None or s in regrade or str(s) not in book.done]
    if len(todo) < len(sources):
        print(f"skipping {len(sources) - len(todo)} submission(s) already in {args.csv}", file=sys.stderr)
    names = results_names(sources)  # of the whole batch, so that a submission keeps its file from run to run
    progress = Progress(len(todo), jobs=args.jobs)
    lock = threading.Lock()
    rows = []  # this run's, for the summary when there is no CSV

    def on_done(src: Path, report: Report) -> None:
        with lock:
            results = Path(args.out) / names[src] if args.out else None
            if results is not None:
                write_json(results, report)
            if book is not None:
                book.add(report, str(results or ""))
            if book is None:
                rows.append(summary_row(report))
            progress.done(src, progress_line(report))

    progress.begin()
    reports = grade_batch(todo, course=course, only=only, limits=limits, jobs=args.jobs, on_done=on_done,
                          on_start=lambda src: progress.started(src, _name(src)), workdir=args.workdir)
    print(batch_summary(book.rows() if book else rows, now=len(reports), csv_path=args.csv, out=args.out,
                        partial=only is not None))
    errors = [r for r in reports if r.error is not None]
    if errors:
        where = f" (score {GradeBook.ERROR} in {args.csv})" if args.csv else ""
        print(f"grade: {len(errors)} submission(s) could not be graded{where}; run the same command again to "
              f"retry them: {', '.join(r.submission for r in errors)}", file=sys.stderr)
        return 1
    return 0


def _of_the_csv(book: GradeBook, scratch: Path) -> list:
    """The submissions of the CSV's rows (its path column), a bulk download's students (DOWNLOAD#STUDENT) split
    from it again."""
    names = [row["path"] for row in book.rows()]
    downloaded = [n.rpartition("#")[0] for n in names if "#" in n and not Path(n).exists()]
    pieces = {str(p): p for p in _split([Path(d) for d in dict.fromkeys(downloaded) if Path(d).exists()], scratch)
              if isinstance(p, downloads.Piece)}
    return [pieces.get(n, Path(n)) for n in names]


def _named(source: Path | downloads.Piece, name: str) -> bool:
    """Is name (from --regrade) this submission: its path as given, its file name, or its name without .zip?
    A student of a bulk download: DOWNLOAD#STUDENT as in the CSV, canvas.zip#STUDENT, canvas#STUDENT, STUDENT."""
    def nfc(text: str) -> str:
        return unicodedata.normalize("NFC", text)

    if isinstance(source, downloads.Piece):
        return nfc(name) in {nfc(n) for n in source.names()}
    return nfc(name.rstrip("/")) in {nfc(str(source)), nfc(source.name), nfc(stem(source)),
                                     nfc(student_name(source))}


def _parts(course: sandbox.Course, only=None) -> list[str]:
    parts = [Path(t).stem.removeprefix("test_") for t in course.tests_of(only) if t.startswith("tests/graded/")]
    return list(dict.fromkeys(parts))


def _has_hidden(course: sandbox.Course, only=None) -> bool:
    return any(t.startswith(sandbox.HIDDEN_DIR + "/") for t in course.tests_of(only))


if __name__ == "__main__":
    sys.exit(main())
