"""Gradescope's ``results.json``: what it shows a student of one graded submission.

Gradescope runs ``run_autograder`` (:mod:`gqa_flash.course.grader.bundle` writes it) once per submission and reads
``/autograder/results/results.json`` (https://gradescope-autograders.readthedocs.io/en/latest/specs/). The
fields written here, as Gradescope's specification names them: ``score``, ``execution_time``, ``output``,
``visibility``, ``stdout_visibility`` and ``tests``, each test with ``name``, ``score``, ``max_score``,
``status``, ``output`` and ``visibility``; and one of the course's own, ``submission``, the file the results
are of (not a field of Gradescope's; a batch's folder of results files needs it). Test points are whole
hundredths that add up exactly to each part's points (``plugin.shares``): no 0.6667 on Gradescope, and no total
of 134.9999. A module the student has not started (still its stub: ``started.not_started``) is one entry, "not
started", worth its module's points, not a red entry per test: a student who skips the bonus sees three lines, not
some thirty failures. The bundle holds its stubs' fingerprints (``started.STUB_PRINTS``) to tell.
"""

from __future__ import annotations

import json
from pathlib import Path

from gqa_flash.course.grader.report import NOT_HANDED_IN, Report, total

HIDDEN = "after_due_date"  # Gradescope shows hidden tests' results once the due date has passed


def results_json(report: Report) -> dict:
    """Gradescope's results.json for one graded submission."""
    tests = []
    for part in report.parts().values():
        if all(t.not_started for t in part):
            tests.append(_not_started(part))
            continue
        for t in part:
            tests.append(
                dict(
                    name=_name(t),
                    score=round(t.score, 6),
                    max_score=round(t.max_score, 6),
                    status="passed" if t.passed else "failed",
                    output=t.message,
                    visibility=HIDDEN if t.hidden else "visible",
                )
            )
    return dict(
        submission=report.submission,  # which file these results are of (the batch's CSV says it too)
        score=round(report.score, 6),
        execution_time=int(round(report.seconds)),
        output=report.summary(),
        visibility="visible",
        stdout_visibility="hidden",
        tests=tests,
    )


def _name(test, name: str | None = None) -> str:
    if test.hidden:
        return f"hidden ({test.part}): {test.name}"
    return f"{test.part}.py{' (bonus)' if test.bonus else ''}: {name or test.name}"


def _not_started(tests) -> dict:
    """One entry for a module still holding its stub: its points, and what to do."""
    first = tests[0]
    missing = first.message == NOT_HANDED_IN
    what = (f"{first.part}.py was not handed in: it is graded as the stub you were given" if missing else
            f"{first.part}.py is not started: it is the stub you were given")
    return dict(
        name=_name(first, "not handed in" if missing else "not started"),
        score=0,
        max_score=total(t.max_score for t in tests),
        status="failed",
        output=(f"{what}, so none of its {len(tests)} tests can pass."
                + (" It is a bonus: its points come on top of the 100." if first.bonus else "")),
        visibility="visible",
    )


def write_json(path: Path, report: Report) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results_json(report), indent=2, ensure_ascii=False), encoding="utf-8")
    tmp.replace(path)  # whole or not at all, even if interrupted
