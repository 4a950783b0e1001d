"""A batch on the terminal: its lines on stderr as it goes, and the summary it ends with on stdout.

The lines (:class:`Progress`): one when the batch starts, one as each submission starts, and one as each is
graded (:func:`progress_line`), each with ``[graded/all]``, the time so far and, once a submission is done,
an estimate of the time left::

    grading 15 submissions, 2 at a time: a line as each starts and as each is graded
    [0/15] started José García.zip  (0 s so far)
    [0/15] started alice.zip  (0 s so far)
    [1/15]     80 / 100  José García.zip  (1 min 52 s so far, about 24 min left)

The routine notes (a bonus file not handed in, a platform's names for a download's files) are left off the
lines; the summary (:func:`batch_summary`) counts the first kind once.
"""

from __future__ import annotations

import math
from decimal import Decimal
import sys
import threading
import time
from pathlib import Path

from gqa_flash.course.grader import isolation
from gqa_flash.course.grader.report import NOTHING_GRADED, PLATFORM_ONLY, GradeBook, Report, num, review, total
from gqa_flash.course.grader.submission import BONUS_NOT_HANDED_IN, BONUS_NOT_STARTED


def duration(seconds: float) -> str:
    """'42 s', '3 min 05 s', '1 h 02 min'."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def about(seconds: float) -> str:
    """An estimate, as rounded as it is: 'under a minute', 'about 24 min', 'about 1 h 10 min'."""
    if seconds < 45:
        return "under a minute"
    minutes = max(1, round(seconds / 60))
    if minutes < 60:
        return f"about {minutes} min"
    return f"about {minutes // 60} h {minutes % 60:02d} min"


class Progress:
    """The lines of a batch on stderr: when it starts, as each submission starts, as each is graded.

    The time left is the mean time of the submissions graded so far, for each one waiting and for what each
    running one has not used of it yet, shared among the ``jobs`` graded at once."""

    def __init__(self, total: int, jobs: int = 1, stream=None, clock=time.monotonic):
        self.total, self.jobs = total, max(1, jobs)
        self.stream = stream or sys.stderr  # sys.stderr now: a test may have replaced it
        self.clock = clock
        self.start = clock()
        self.count = 0
        self.running: dict[object, float] = {}  # submission -> when it started
        self.durations: list[float] = []
        self.lock = threading.Lock()  # submissions start on the pool's threads

    def begin(self) -> None:
        if not self.total:
            return  # every submission is in the CSV already: the line that skips them says so
        many = f"{self.total} submission{'s' * (self.total != 1)}"
        at_once = f", {min(self.jobs, self.total)} at a time" if min(self.jobs, self.total) > 1 else ""
        self._write(f"grading {many}{at_once}: a line as each starts and as each is graded")

    def started(self, key, name: str) -> None:
        with self.lock:
            self.running[key] = self.clock()
            self._write(f"[{self.count}/{self.total}] started {name}  ({self.times()})")

    def done(self, key, line: str) -> None:
        with self.lock:
            began = self.running.pop(key, None)
            if began is not None:
                self.durations.append(self.clock() - began)
            self.count += 1
            self._write(f"[{self.count}/{self.total}] {line}  ({self.times()})")

    def left(self) -> float | None:
        """Seconds the batch still needs, by the mean time of those graded so far; None before the first."""
        if not self.durations:
            return None
        mean = math.fsum(self.durations) / len(self.durations)
        now = self.clock()
        waiting = max(0, self.total - self.count - len(self.running))
        work = waiting * mean + math.fsum(max(0.0, mean - (now - t)) for t in self.running.values())
        return work / min(self.jobs, max(1, self.total - self.count))

    def times(self) -> str:
        """'1 min 52 s so far, about 24 min left'."""
        text = f"{duration(self.clock() - self.start)} so far"
        left = self.left()
        if self.count < self.total and left is not None:
            text += f", {about(left)} left"
        return text

    def _write(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()


def routine(report: Report, note: str) -> bool:
    """A note every submission of a kind has: a bonus file not handed in (the summary counts it once), a
    platform's name for a download's file (how its files arrive). It stays in the results and the CSV."""
    return note.startswith(BONUS_NOT_HANDED_IN) or bool(report.platform and PLATFORM_ONLY.search(note))


def progress_line(report: Report) -> str:
    """A submission's line as a batch grades it: its score, its name, its notes but the routine ones, and why
    to look at it."""
    score = "ERROR" if report.error is not None else f"{num(report.score):>6} / {num(report.max_score)}"
    line = f"{score}  {report.submission}"
    notes = [n for n in report.notes if not routine(report, n)]
    if notes:
        line += f"  ({len(notes)} note{'s' * (len(notes) != 1)})"
    look = review(report)
    return line + (f"  LOOK: {look}" if look else "")


def summary_row(report: Report) -> dict[str, str]:
    """What the summary reads of a submission graded with no CSV: the CSV's columns it needs."""
    return {"score": GradeBook.ERROR if report.error is not None else num(report.score),
            "max_score": num(report.max_score), "bonus": num(total(t.score for t in report.tests if t.bonus)),
            "review": review(report), "isolation": report.isolation or "", "notes": " | ".join(report.notes)}


def batch_summary(rows: list[dict[str, str]], *, now: int, csv_path: Path | None, out: str | None,
                  partial: bool = False) -> str:
    """The lines a batch ends with: how many graded and how many to look at; the mean of the required points
    over the submissions that held something to grade (bonus not counted; those that held nothing left out, and
    counted); how many did not hand in the bonus; where everything went.

    rows: the CSV's rows (the whole batch, earlier runs too), or this run's own when there is no CSV.
    partial: some modules only (--only): the mean is of the points of the modules run."""
    graded = [r for r in rows if r["score"] != GradeBook.ERROR]
    errors = len(rows) - len(graded)
    held = [r for r in graded if not r["review"].startswith(NOTHING_GRADED)]
    empty = len(graded) - len(held)
    earlier = f" ({now} now, {len(rows) - now} in an earlier run)" if len(rows) > now else ""
    line = f"graded {len(graded)} submission{'s' * (len(graded) != 1)}{earlier}"
    looks = sum(bool(r["review"]) for r in rows)
    line += f"; {looks} need{'s' * (looks == 1)} a second look" + (" (the CSV's review column)" if looks else "")
    if errors:
        line += f"; {errors} could not be graded ({GradeBook.ERROR})"
    bare = sum(r.get("isolation") == "none" for r in rows)
    if bare:
        line += (f"; {bare} ran NOT ISOLATED (the CSV's isolation column): {isolation.describe('none')}")
    lines = [line]
    if held:
        lines.append(_mean(held, empty, partial))
    elif graded:
        lines.append(f"no mean: none of the {len(graded)} held anything to grade")
    # Left out (a routine note) or handed in as the stubs within a whole course folder (that folder's own note).
    no_bonus = sum(BONUS_NOT_HANDED_IN in r.get("notes", "") or BONUS_NOT_STARTED in r.get("notes", "") for r in held)
    if no_bonus:
        lines.append(f"{no_bonus} of the {len(held)} left out or never started some or all of the bonus files: "
                     "said in their results and the CSV's notes")
    lines.append(f"CSV: {csv_path}" if csv_path else
                 "CSV: none (--csv FILE keeps one, and lets a batch run again go on)")
    lines.append(f"results: {out} (a .json per submission)" if out else
                 "results: none (--out FOLDER/ writes a .json each)")
    return "\n".join(lines)


def _mean(held: list[dict[str, str]], empty: int, partial: bool) -> str:
    """'mean 72.5 of the 100 required points (bonus not counted) over the 13 submissions with something to
    grade; 2 held nothing to grade (0 points each) and are left out'."""
    worth = max(float(r["max_score"]) for r in held)
    # In decimal, from the CSV's own digits: a float mean of 80, 80, ..., 80.15 is 80.02499..., not 80.025.
    bonus = [Decimal(r.get("bonus") or "0") for r in held]
    if worth:
        mean = sum((Decimal(r["score"]) - b for r, b in zip(held, bonus)), Decimal(0)) / len(held)
        what = f"the {num(worth)} points of the modules run" if partial else f"the {num(worth)} required points"
        text = f"mean {num(mean)} of {what}" + (" (bonus not counted)" if any(bonus) or not partial else "")
    else:  # bonus modules only (--only backward): their points are all there is
        text = f"mean {num(sum(bonus, Decimal(0)) / len(held))} bonus points"
    text += f" over the {len(held)} submission{'s' * (len(held) != 1)} with something to grade"
    if empty:
        text += f"; {empty} held nothing to grade (0 points each) and {'are' if empty > 1 else 'is'} left out"
    return text
