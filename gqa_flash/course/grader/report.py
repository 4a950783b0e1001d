"""What a grading shows and keeps: the report of a submission, the table, the CSV of a batch.

Everything here reads a graded submission (a :class:`Report`) and writes it
down for a person:

* :func:`table`, the verdict on the terminal: a row per part, the failed
  tests under it;
* :class:`GradeBook`, the CSV of a batch: a row per submission, ready for a
  gradebook (the student, the platform's id for them, whether it was late,
  the points), sorted by student, rewritten whole as each one is graded (a
  batch run again goes on where it stopped); a ``lost`` column says in a few
  words why each part lost points (:func:`lost`), a ``review`` column why a
  row needs a second look (:func:`review`);
* :func:`results_names`, one readable results file name per submission
  (``José García.zip`` -> ``José García.json``); :mod:`gqa_flash.course.grader.gradescope` writes them.

The lines of a batch on the terminal are :mod:`gqa_flash.course.grader.progress`'s.

Text is cut, where a cell or a line has no room for it, at a sentence or a
word, with an ellipsis (:func:`clip`).
"""

from __future__ import annotations

import csv
import math
import re
from decimal import ROUND_HALF_UP, Decimal
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gqa_flash.course import layout
from gqa_flash.course.grader import isolation
from gqa_flash.course.grader.platforms import Student, student_of
from gqa_flash.course.grader.started import NOT_HANDED_IN, NOT_STARTED

if TYPE_CHECKING:
    from gqa_flash.course.grader.testrun import TestResult

NOT_GRADED = "not graded"  # the one test of each part of a submission that held nothing to grade (Report.stop)
NOTHING_GRADED = "nothing graded: "  # how the review column begins for such a submission


# The points of the required modules (tests/given/test_points.py holds the graded tests to it); bonus on top.
COURSE_POINTS = 100
REQUIRED_PARTS = tuple(m for m in layout.GRADED_MODULES if m not in layout.BONUS_MODULES)


def total(points) -> float:
    """A sum of points, exact in decimal: test points are whole hundredths (plugin.shares), so the float
    sum of 0.66 + 0.67 + 0.67 is rounded back to the 2 it is, never 1.9999999999999998."""
    return round(math.fsum(points), 6) + 0.0


def num(x: float) -> str:
    """x to two decimals, halves rounded up as a spreadsheet rounds them (75.625 -> 75.63, where Python's format
    gives 75.62), trailing zeros dropped."""
    exact = x if isinstance(x, Decimal) else Decimal(repr(float(x)))
    rounded = exact.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
    return "0" if not rounded else f"{rounded:f}".rstrip("0").rstrip(".")


def part_name(test: TestResult) -> str:
    if test.hidden:
        return f"hidden tests ({test.part})"
    return f"{test.part}.py (bonus)" if test.bonus else f"{test.part}.py"


def verdict(tests: list[TestResult]) -> str:
    if all(t.name == NOT_GRADED for t in tests):
        return "not graded (see the note)"
    if all(t.not_started for t in tests):
        return NOT_HANDED_IN if tests[0].message == NOT_HANDED_IN else NOT_STARTED
    if all(t.name == GATE for t in tests):
        return "not run: the static gate refused the file (the integrity line says why)"
    failed = [t for t in tests if not t.passed]
    n = len(tests)
    if not failed:
        return f"passed ({n} test{'s' * (n != 1)})"
    hung = sum(t.message.startswith(TIMED_OUT) for t in failed)
    skipped = sum(t.message.startswith(NOT_RUN) for t in failed)
    wrong = len(failed) - hung - skipped
    if not hung and not skipped:
        return f"failed (all {n})" if wrong == n else f"{wrong} of {n} failed"
    # A hang, and the tests not run after it, are not wrong answers: say which is which.
    said = [f"{k} {what}" for k, what in ((wrong, "failed"), (hung, "timed out"), (skipped, "not run")) if k]
    return f"of {n}: {', '.join(said)}"


def integrity_lines(flags: list[str]) -> list[str]:
    """A part scored 0 for work not its own reads INTEGRITY; a name worth a look (no points lost) reads review."""
    return [f"integrity {flag}" if flag.startswith("review:") else f"INTEGRITY: {flag}" for flag in flags]


def table(report: Report) -> str:
    """The readable verdict: one row per part, the failed tests under it with what went wrong."""
    if report.error is not None:
        return "\n".join([f"{report.submission}: NOT GRADED ({report.seconds:.0f} s): {report.error}", "",
                          "notes:", *[f"  - {n}" for n in report.notes]])
    rows = [f"{report.submission}: {report.points()} ({report.seconds:.0f} s)",
            *[f"  {line}" for line in integrity_lines(report.integrity)],
            *([f"  {isolation.describe('none')}"] if report.isolation == "none" else []), "",
            f"  {'part':<24} {'points':>11}  verdict"]
    for tests in report.parts().values():
        got, worth = total(t.score for t in tests), total(t.max_score for t in tests)
        rows.append(f"  {part_name(tests[0]):<24} {num(got):>5} / {num(worth):<3}  {verdict(tests)}")
        # Failed tests, those that failed the same way on one line (a stub fails every test alike).
        by_message: dict[str, list[TestResult]] = {}  # by kind: the first message of each stands for the rest
        for t in tests:
            if not t.passed and not t.not_started and t.name != NOT_GRADED:
                by_message.setdefault(kind(t.message), []).append(t)
        for failed in by_message.values():
            message = failed[0].message
            names = failed[0].name if len(failed) == 1 else f"{failed[0].name} and {len(failed) - 1} more"
            if len(failed) == len(tests) > 1:
                names = f"all {len(tests)} tests"
            rows.append(f"      {names}: {message}")
    rows.append(f"  {'total':<24} {num(report.score):>5} / {report.out_of()}".rstrip())
    if report.notes:
        rows += ["", "notes:"] + [f"  - {n}" for n in report.notes]
    return "\n".join(rows)


# --- rows that need a second look ------------------------------------------------------

# A note saying a file was graded under another name (a learning platform's download name, say).
RENAMED = re.compile(rf"\bas (?:\S+/)?(?:{'|'.join(layout.GRADED_MODULES)})\.py\b|\brenamed\b")
# The same, for nothing but a platform's name: how a bulk download's files arrive (Report.platform).
PLATFORM_ONLY = re.compile(r"\(a \w+ download name(?:, -\d+ marking a re-submission)?\)$")


# How a kernel test's failure reads when the graded path computed attention with PyTorch (gqa_flash.course.testing's
# KernelOnlyViolation): no integrity flag (the points are lost anyway), but worth a look.
KERNEL_ONLY = "must compute attention in the Triton kernel"


def review(report: Report) -> str:
    """Why a person should look at this row, in a few words ('' if nothing): the grade may not be the whole
    story. A stop note (nothing to grade), a grader failure, a required part scored 0 because its file was not
    found, a file graded under another name or ignored for a near-miss one, an integrity flag, PyTorch in
    place of the kernel, tampering.
    A bulk download's platform names (garciajose_12345_678901_naive.py, split from canvas.zip) are how its files
    arrive: not a rename worth a look, unless the name the student gave is one too (..._l_single_naive.py)."""
    if report.stop:
        return NOTHING_GRADED + short(report.stop)
    if report.error is not None:
        return "not graded: the grader failed"
    reasons = []
    missing = [f"{part}.py" for (part, hidden), tests in report.parts().items()
               if not hidden and not tests[0].bonus and f"{part}.py" not in report.files
               and total(t.score for t in tests) == 0]
    if missing:
        reasons.append(f"no {', '.join(missing)} found")
    if any(RENAMED.search(n) and not (report.platform and PLATFORM_ONLY.search(n)) for n in report.notes):
        reasons.append("a file graded under another name")
    if any("did you mean" in n for n in report.notes):
        reasons.append("a file ignored for its name")
    scored = sum(not f.startswith("review:") for f in report.integrity)
    if scored:
        reasons.append(f"integrity: {scored} part{'s' * (scored != 1)} scored 0")
    if len(report.integrity) > scored:
        reasons.append("integrity: code worth a look")
    if any(not t.passed and KERNEL_ONLY in t.message for t in report.tests):  # testing.kernel_only's refusal
        reasons.append("PyTorch in place of the kernel")
    if any("by hand" in n for n in report.notes):
        reasons.append("it modified the course copy")
    return "; ".join(reasons)


def short(text: str, chars: int = 80) -> str:
    """A few words for a CSV cell: text, cut at a sentence or a word to fit in chars (see clip)."""
    return clip(text, chars)


ELLIPSIS = "…"


def clip(text: str, chars: int) -> str:
    """text in at most chars characters: whole if it fits, else cut where a reader can stop, with an ellipsis.

    The cut is at the end of a sentence or clause if one ends past the first 40% of the room ('was anything
    written? …'), else after the last whole word in the last half ('the stub you were…'), else (one long word,
    a path) wherever the room ends."""
    if len(text) <= chars:
        return text
    return _cut(text, chars)


def _cut(text: str, chars: int) -> str:
    """text, cut back to a sentence or a word (see clip), with an ellipsis: at most chars characters."""
    room = text[:max(1, chars - 2)]  # a sentence's end, then " …"
    end = max(room.rfind(stop) + 1 for stop in (". ", "? ", "! ", "; "))
    if end >= 0.4 * chars:
        return room[:end].rstrip(";") + " " + ELLIPSIS
    space = text.rfind(" ", 0, chars + 1)  # a word's end, then "…"
    while space >= chars // 2:
        kept = text[:space].rstrip(" ,;:(-")
        if kept.count("(") > kept.count(")") and kept.rfind("(") >= chars // 2:  # not inside a parenthesis
            kept = kept[:kept.rfind("(")].rstrip(" ,;:(-")
        if len(kept) < chars:
            return kept + ELLIPSIS
        space = text.rfind(" ", 0, space)
    return text[:chars - 1] + ELLIPSIS


# --- why points were lost ----------------------------------------------------------------

LOST_CHARS = 180  # the reason of one part, in the CSV's lost column
NOT_RUN = "not run: "  # a test the grader gave up on (a part that hung twice, the submission's time used up)
TIMED_OUT = "timed out after "  # a test that ran past its time limit (plugin.describe)
GATE = "static gate"  # the one test of a part whose file the static gate refused (grade.refused_by_gate)


def lost(report: Report) -> str:
    """Why each part that lost points lost them, one short reason a part, for the CSV's lost column:
    'naive.py 0/20: timed out after 60 s: an endless loop, or far too slow (2 of 5 tests; 3 not run)'.

    The reason is the failure most of the part's failed tests share (a test the grader did not run, after a
    hang, says why the others failed only when nothing else does). A bonus module not handed in or not started
    loses nothing worth a word; a required one reads 'not handed in' or 'not started'."""
    if report.stop:
        return "every part: nothing to grade (the review column says what it held)"
    if report.error is not None:
        return ""
    reasons = []
    for tests in report.parts().values():
        got, worth = total(t.score for t in tests), total(t.max_score for t in tests)
        if got >= worth:
            continue
        first = tests[0]
        if all(t.not_started for t in tests):
            if first.bonus:
                continue
            why = "not started" if f"{first.part}.py" in report.files else "not handed in"
        elif any(t.integrity for t in tests):
            why = "scored 0: not the student's own work (the integrity column)"
        else:
            why = _why_failed([t for t in tests if not t.passed], len(tests))
        reasons.append(f"{part_name(first)} {num(got)}/{num(worth)}: {why}")
    return " | ".join(reasons)


_NUMBERS = re.compile(r"(?<!Part )(?<![\w-])-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")  # "Part 2" is no case's number
CASE = "; seed "  # where a graded test's message names its case (testing.case_context): seed, shape, dtype, layout


def kind(message: str) -> str:
    """What a failure message says, without its case and its numbers: the same wrong O at another shape, dtype
    or layout is the same failure."""
    return _NUMBERS.sub("#", message.split(CASE, 1)[0])


def _why_failed(failed: list[TestResult], n: int) -> str:
    """The failure most of these tests share, clipped, and how many tests it stands for. Messages of one
    :func:`kind` are one failure; the first one stands for it, without its exception's name."""
    ran = [t for t in failed if not t.message.startswith(NOT_RUN)] or failed
    kinds: dict[str, list] = {}
    for t in ran:
        message = t.message or "failed"
        kinds.setdefault(kind(message), [message, 0])[1] += 1
    message, same = max(kinds.values(), key=lambda k: k[1])  # the first of the most common
    message = message.removeprefix("AssertionError: ")
    count = f"all {n} tests" if same == n > 1 else f"{same} of {n} test{'s' * (n != 1)}"
    others = len(ran) - same
    not_run = len(failed) - len(ran)
    count += f"; {others} more failed otherwise" if others else ""
    count += f"; {'the other ' if not others else ''}{not_run} not run" if not_run else ""
    return f"{short(message, LOST_CHARS)} ({count})"


# --- the CSV of a batch -------------------------------------------------------------------


def sort_key(name: str) -> tuple[str, str]:
    """Submissions in the order a person looks for them: by name, whatever the case or the accents' encoding."""
    return unicodedata.normalize("NFC", name).casefold(), name


CELL_CHARS = 1000  # the notes and integrity cells: a gradebook's cell, not the results file


def late(report: Report) -> str:
    """The CSV's late column: 'yes' or 'no' where the platform's names say (Canvas's _LATE_), else ''."""
    flag = report.student.late if report.student else None
    return "" if flag is None else "yes" if flag else "no"


class GradeBook:
    """The CSV of a batch: one row per submission, sorted by student, flushed as each is graded; it knows
    who is done (by the path column: where the batch found each submission)."""

    ERROR = "ERROR"  # the score of a submission that could not be graded

    def __init__(self, path: Path, parts: list[str], hidden: bool):
        self.path = Path(path)
        self.parts = parts
        self.columns = ["student", "user_id", "late", "submission", "score", "max_score", "bonus", *parts,
                        *(["hidden"] if hidden else []), "lost", "review", "integrity", "isolation", "seconds",
                        "notes", "results", "path"]
        self.done: set[str] = set()
        if self.path.exists() and self.path.stat().st_size:
            with open(self.path, newline="", encoding="utf-8") as f:
                reader = csv.DictReader(f)
                if reader.fieldnames != self.columns:
                    raise SystemExit(self._other_columns(reader.fieldnames or []))
                # A row that says ERROR is not done: the submission is graded again, and its new row
                # replaces that one (add).
                self.done = {row["path"] for row in reader if row["score"] != self.ERROR}
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._write([])

    def _other_columns(self, found: list[str]) -> str:
        """Why the CSV cannot take this run's rows: its modules are not this run's (--only), or its columns are
        another version's."""

        modules = [c for c in found if c in layout.GRADED_MODULES]
        others = [c for c in found if c not in layout.GRADED_MODULES]
        if others == [c for c in self.columns if c not in layout.GRADED_MODULES]:  # the same version, other modules
            return (f"{self.path} holds the modules {', '.join(modules) or 'none'}, and this run grades "
                    f"{', '.join(p for p in self.parts if p in layout.GRADED_MODULES)}: a CSV keeps one set of "
                    f"modules; give this run another --csv file (or run it with the CSV's modules)")
        return (f"{self.path} has the columns {', '.join(found)}, not this version's {', '.join(self.columns)} "
                "(written by another version of the grader): use another --csv file")

    def rows(self) -> list[dict[str, str]]:
        with open(self.path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))

    def row(self, report: Report, results: str = "") -> dict[str, str]:
        student = report.student
        row = {"student": student.name if student else "", "user_id": student.user_id if student else "",
               "late": late(report), "submission": report.submission, "score": num(report.score),
               "max_score": num(report.max_score), "bonus": num(total(t.score for t in report.tests if t.bonus)),
               "lost": lost(report), "review": review(report),
               "integrity": clip(" | ".join(report.integrity), CELL_CHARS), "isolation": report.isolation or "",
               "seconds": f"{report.seconds:.0f}", "notes": clip(" | ".join(report.notes), CELL_CHARS),
               "results": results, "path": report.key}
        if report.error is not None:
            row["score"] = self.ERROR
        for part in self.parts:
            row[part] = num(report.part_score(part)[0])
        if "hidden" in self.columns:
            row["hidden"] = num(total(t.score for t in report.tests if t.hidden))
        return row

    def add(self, report: Report, results: str = "") -> None:
        """Write report's row (results: its results file), in place of any earlier row of that submission."""
        row = self.row(report, results)
        self._write([r for r in self.rows() if r["path"] != row["path"]] + [row])
        if row["score"] != self.ERROR:
            self.done.add(row["path"])

    def _write(self, rows: list[dict[str, str]]) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", newline="", encoding="utf-8") as f:  # whole or not at all: a kill loses no graded row
            writer = csv.DictWriter(f, self.columns)
            writer.writeheader()
            writer.writerows(sorted(rows, key=lambda r: (sort_key(r["student"]), sort_key(r["submission"]),
                                                         r["path"])))
        tmp.replace(self.path)


# --- results files ----------------------------------------------------------------------------


def stem(source: Path) -> str:
    """A submission's name without its .zip or .py: 'submissions/José García.zip' -> 'José García'."""
    return source.stem if source.suffix else source.name


def readable_name(text: str) -> str:
    """text as a file name on any system, changed only where one refuses it: no slash, backslash or control
    character, no leading dot, at most 200 bytes. Accents and spaces stay: 'José García' is 'José García'."""
    text = unicodedata.normalize("NFC", text)
    text = "".join("_" if c in "/\\" or unicodedata.category(c) == "Cc" else c for c in text)
    text = text.strip().lstrip(".").strip()
    while len(text.encode()) > 200:
        text = text[:-1]
    return text or "submission"


def student_name(source: Path) -> str:
    """Who a submission is, by its name: the student a platform's name gives (a Moodle folder
    'José García_12345_assignsubmission_file_', a Canvas file 'leekim_34567_890123_naive.py'), else the
    submission's name without its .zip or .py ('José García.zip' -> 'José García')."""
    found = student_of(source.name, folder=True) or student_of(stem(source))
    return found.name if found else stem(source)


def results_names(sources: list) -> dict:
    """A distinct, readable results file name per submission: 'José García.zip' -> 'José García.json', a
    student of a bulk download (downloads.Piece, 'canvas.zip#garciajose') -> 'garciajose.json', and a
    platform's name the same way: 'José García_12345_assignsubmission_file_' -> 'José García.json'.

    Two that would be one file on a case-blind disk (macOS, Windows) are told apart by a number: 'alice.zip'
    and 'Alice/' are 'alice.json' and 'Alice-2.json'."""
    names, used = {}, set()
    for src in sources:
        base = readable_name(getattr(src, "who", None) or student_name(Path(src)))
        name, n = base, 1
        while name.casefold() in used:
            n += 1
            name = f"{base}-{n}"
        used.add(name.casefold())
        names[src] = name + ".json"
    return names


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
    # Tests a pytest -k or -m left out (make test-graded ARGS="-k ..."): the table then counts the tests run.
    deselected: int = 0

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
        """Every required module was graded, every test of it: not a run of some modules only (--only,
        MODULE=...) or of some tests (-k)."""
        return not self.deselected and set(REQUIRED_PARTS) <= {t.part for t in self.tests if not t.hidden}

    @property
    def scope(self) -> str:
        """What an incomplete run's points are of: 'the modules run', or 'the tests run' after -k or -m."""
        return "the tests run" if self.deselected else "the modules run"

    @property
    def worth(self) -> float:
        """What the score is out of: the required points (bonus on top) when every required module ran,
        else every point of the modules that ran (a bonus module alone is worth its own points, not 0)."""
        return self.max_score if self.complete else total(t.max_score for t in self.tests)

    def out_of(self) -> str:
        """The table's total, after the score: '100', '100  (with 20 bonus)', or, for some modules only,
        '20 of the modules run (100 in the course)'."""
        if not self.complete:
            return f"{num(self.worth)} of {self.scope} ({COURSE_POINTS} in the course)"
        bonus = total(t.score for t in self.tests if t.bonus)
        return f"{num(self.worth):<3}" + (f"  (with {num(bonus)} bonus)" if bonus else "")

    def points(self) -> str:
        """The headline: '20 / 100 points', or '20 / 20 points of the modules run'."""
        return f"{num(self.score)} / {num(self.worth)} points" + ("" if self.complete else f" of {self.scope}")

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
