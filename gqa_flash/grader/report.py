"""What a grading shows and keeps: the table, the CSV of a batch, the results files, the batch's summary.

Everything here reads a graded submission (a ``grade.Report``) and writes it
down for a person:

* :func:`table`, the verdict on the terminal: a row per part, the failed
  tests under it;
* :class:`GradeBook`, the CSV of a batch: a row per submission, sorted by
  submission, rewritten whole as each one is graded (a batch run again goes
  on where it stopped); a ``review`` column says, in a few words, why a row
  needs a second look (:func:`review`);
* :func:`results_names`, one readable results file name per submission
  (``José García.zip`` -> ``José García.json``), and :func:`write_json`;
* :class:`Progress`, a line per submission on stderr, and
  :func:`batch_summary`, the lines a batch ends with on stdout.
"""

from __future__ import annotations

import csv
import json
import math
import re
import sys
import time
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING

from gqa_flash.grader import gradescope, isolation

if TYPE_CHECKING:
    from gqa_flash.grader.grade import Report
    from gqa_flash.grader.testrun import TestResult

NOT_STARTED = "not started (still the stub you were given)"
NOT_GRADED = "not graded"  # the one test of each part of a submission that held nothing to grade (Report.stop)


def total(points) -> float:
    """A sum of points, exact in decimal: test points are whole hundredths (plugin.shares), so the float
    sum of 0.66 + 0.67 + 0.67 is rounded back to the 2 it is, never 1.9999999999999998."""
    return round(math.fsum(points), 6) + 0.0


def num(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


def part_name(test: TestResult) -> str:
    if test.hidden:
        return f"hidden tests ({test.part})"
    return f"{test.part}.py (bonus)" if test.bonus else f"{test.part}.py"


def verdict(tests: list[TestResult]) -> str:
    if all(t.name == NOT_GRADED for t in tests):
        return "not graded (see the note)"
    if all(t.not_started for t in tests):
        return NOT_STARTED
    failed = sum(not t.passed for t in tests)
    if not failed:
        return f"passed ({len(tests)} test{'s' * (len(tests) != 1)})"
    if failed == len(tests):
        return f"failed (all {len(tests)})"
    return f"{failed} of {len(tests)} failed"


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
        by_message: dict[str, list[TestResult]] = {}
        for t in tests:
            if not t.passed and not t.not_started and t.name != NOT_GRADED:
                by_message.setdefault(t.message, []).append(t)
        for message, failed in by_message.items():
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
RENAMED = re.compile(r"\bas (?:\S+/)?(?:naive|online_softmax|tiled|forward|backward|decode|ring)\.py\b|\brenamed\b")
# The same, for nothing but a platform's name: how a bulk download's files arrive (Report.platform).
PLATFORM_ONLY = re.compile(r"\(a \w+ download name(?:, -\d+ marking a re-submission)?\)$")


# How a kernel test's failure reads when the graded path computed attention with PyTorch (gqa_flash.testing's
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
        return f"nothing graded: {short(report.stop)}"
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
    return text if len(text) <= chars else text[:chars - 3].rstrip() + "..."


# --- the CSV of a batch -------------------------------------------------------------------


def sort_key(name: str) -> tuple[str, str]:
    """Submissions in the order a person looks for them: by name, whatever the case or the accents' encoding."""
    return unicodedata.normalize("NFC", name).casefold(), name


class GradeBook:
    """The CSV of a batch: one row per submission, sorted by submission, flushed as each is graded; it knows
    who is done."""

    ERROR = "ERROR"  # the score of a submission that could not be graded

    def __init__(self, path: Path, parts: list[str], hidden: bool):
        self.path = Path(path)
        self.parts = parts
        self.columns = ["submission", "results", "score", "max_score", *parts, *(["hidden"] if hidden else []),
                        "review", "integrity", "isolation", "seconds", "notes"]
        self.done: set[str] = set()
        if self.path.exists() and self.path.stat().st_size:
            with open(self.path, newline="", encoding="utf-8") as f:
                reader = csv.DictReader(f)
                if reader.fieldnames != self.columns:
                    raise SystemExit(f"{self.path} has columns {reader.fieldnames}, not {self.columns}: "
                                     "use another --csv file")
                # A row that says ERROR is not done: the submission is graded again, and its new row
                # replaces that one (add).
                self.done = {row["submission"] for row in reader if row["score"] != self.ERROR}
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._write([])

    def rows(self) -> list[dict[str, str]]:
        with open(self.path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))

    def row(self, report: Report, results: str = "") -> dict[str, str]:
        row = {"submission": report.submission, "results": results, "score": num(report.score),
               "max_score": num(report.max_score), "review": review(report),
               "integrity": " | ".join(report.integrity)[:1000], "isolation": report.isolation or "",
               "seconds": f"{report.seconds:.0f}",
               "notes": " | ".join(report.notes)[:1000]}
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
        self._write([r for r in self.rows() if r["submission"] != row["submission"]] + [row])
        if row["score"] != self.ERROR:
            self.done.add(row["submission"])

    def _write(self, rows: list[dict[str, str]]) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", newline="", encoding="utf-8") as f:  # whole or not at all: a kill loses no graded row
            writer = csv.DictWriter(f, self.columns)
            writer.writeheader()
            writer.writerows(sorted(rows, key=lambda r: sort_key(r["submission"])))
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


def results_names(sources: list) -> dict:
    """A distinct, readable results file name per submission: 'José García.zip' -> 'José García.json', and
    a student of a bulk download (downloads.Piece, 'canvas.zip#garciajose') -> 'garciajose.json'.

    Two that would be one file on a case-blind disk (macOS, Windows) are told apart by a number: 'alice.zip'
    and 'Alice/' are 'alice.json' and 'Alice-2.json'."""
    names, used = {}, set()
    for src in sources:
        base = readable_name(getattr(src, "who", None) or stem(Path(src)))
        name, n = base, 1
        while name.casefold() in used:
            n += 1
            name = f"{base}-{n}"
        used.add(name.casefold())
        names[src] = name + ".json"
    return names


def write_json(path: Path, report: Report) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(gradescope.results_json(report), indent=2, ensure_ascii=False), encoding="utf-8")
    tmp.replace(path)  # whole or not at all, even if interrupted


# --- the batch on the terminal ------------------------------------------------------------


class Progress:
    """A progress bar on stderr (a line per submission when stderr is not a terminal)."""

    def __init__(self, total: int, stream=None):
        self.total, self.count, self.stream = total, 0, stream or sys.stderr  # sys.stderr now: it may be replaced
        self.tty = self.stream.isatty()
        self.start = time.monotonic()

    def done(self, line: str) -> None:
        self.count += 1
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(line + "\n")
        if self.tty:
            width = 30
            filled = width * self.count // max(1, self.total)
            elapsed = time.monotonic() - self.start
            eta = elapsed / self.count * (self.total - self.count)
            self.stream.write(f"[{'#' * filled}{'.' * (width - filled)}] {self.count}/{self.total}  "
                              f"{elapsed:.0f} s, about {eta:.0f} s to go")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def progress_line(report: Report) -> str:
    """A submission's line as a batch grades it: its score, its name, its notes and why to look at it."""
    score = "ERROR" if report.error is not None else f"{num(report.score):>6} / {num(report.max_score)}"
    line = f"{score}  {report.submission}"
    if report.notes:
        line += f"  ({len(report.notes)} note{'s' * (len(report.notes) != 1)})"
    look = review(report)
    return line + (f"  LOOK: {look}" if look else "")


def batch_summary(rows: list[dict[str, str]], *, now: int, csv_path: Path | None, out: str | None) -> str:
    """The lines a batch ends with: how many graded, the mean, how many to look at, where everything went.

    rows: the CSV's rows (the whole batch, earlier runs too), or this run's own when there is no CSV."""
    graded = [r for r in rows if r["score"] != GradeBook.ERROR]
    errors = len(rows) - len(graded)
    earlier = f" ({now} now, {len(rows) - now} in an earlier run)" if len(rows) > now else ""
    line = f"graded {len(graded)} submission{'s' * (len(graded) != 1)}{earlier}"
    if graded:
        mean = sum(float(r["score"]) for r in graded) / len(graded)
        worth = max(float(r["max_score"]) for r in graded)
        line += f": mean {num(mean)} / {num(worth)}"
    looks = sum(bool(r["review"]) for r in rows)
    line += f"; {looks} need{'s' * (looks == 1)} a second look" + (" (the CSV's review column)" if looks else "")
    if errors:
        line += f"; {errors} could not be graded ({GradeBook.ERROR})"
    bare = sum(r.get("isolation") == "none" for r in rows)
    if bare:
        line += (f"; {bare} ran NOT ISOLATED (the CSV's isolation column): {isolation.describe('none')}")
    return "\n".join([
        line,
        f"CSV: {csv_path}" if csv_path else "CSV: none (--csv FILE keeps one, and lets a batch run again go on)",
        f"results: {out} (a .json per submission)" if out else "results: none (--out FOLDER/ writes a .json each)",
    ])
