"""The grader's command line: ``python -m gqa_flash.course.grader [SUBMISSION ...]``.

A submission is a folder, a zip or a .py file holding some of the graded
files (``layout.GRADED_FILES``: ``naive.py`` ... ``ring.py``, at any depth);
with none, the student's own working copy (``gqa_flash/``) is graded. For
each one the grader

1. takes only the graded files, as bytes (:mod:`gqa_flash.course.grader.submission`);
2. writes a fresh copy of the course in a temporary folder, from a snapshot
   read once (:mod:`gqa_flash.course.grader.sandbox`): the course's own support modules
   and tests, the submission's graded files, the stubs for the missing ones,
   never the completed files;
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
:func:`~gqa_flash.course.grader.started.not_started`) runs no test: a stub
passes none (tests/grader/test_not_started.py), so each of its tests scores 0 at
once, and it is reported as one line, "not started", in the table and in
Gradescope's results. A run of some modules only (``--only``, ``make grade
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
import os
import signal
import sys
import tempfile
import threading
import unicodedata
from pathlib import Path

from gqa_flash.course.grader import bundle, downloads, grade, sandbox, testrun
from gqa_flash.course.grader.gradescope import write_json
from gqa_flash.course.grader.progress import Progress, batch_summary, progress_line, summary_row
from gqa_flash.course.grader.report import GradeBook, Report, results_names, stem, student_name, table
from gqa_flash.course.grader.testrun import Limits


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
        names = bundle.write_bundle(args.gradescope_bundle, extra_tests=args.extra_tests)
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
        print(f"grade: --only {args.only}: no module {', '.join(unknown)} "
              f"(the modules: {', '.join(grade.parts_of(course))})", file=sys.stderr)
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
    book = GradeBook(args.csv, grade.parts_of(course, only), grade.has_hidden(course, only)) if args.csv else None
    report = grade.grade(source, course=course, only=only, limits=limits, workdir=args.workdir)
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
    book = GradeBook(args.csv, grade.parts_of(course, only), grade.has_hidden(course, only)) if args.csv else None
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
    reports = grade.grade_batch(todo, course=course, only=only, limits=limits, jobs=args.jobs, on_done=on_done,
                          on_start=lambda src: progress.started(src, grade.submission_name(src)), workdir=args.workdir)
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


if __name__ == "__main__":
    sys.exit(main())
