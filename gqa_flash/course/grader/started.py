"""Modules not started: a graded file that is still, comments aside, the stub the course hands out.

Such a module's tests are not run (:func:`parts_not_started`, read by :mod:`gqa_flash.course.grader.testrun`): a
stub passes none of them (tests/grader/test_not_started.py runs them all on the stubs), so they would score 0
after minutes of the interpreter. Each of its tests scores 0, and the module is reported as one line, "not
started", in the table and in Gradescope's results (:func:`mark_not_started`). A course with its completed files
computes the stubs' fingerprints from them; the student edition and the Gradescope bundle carry them in
:data:`STUB_PRINTS`. A module whose stub is unknown is never taken for not started: its tests run.
"""

from __future__ import annotations

import hashlib
import io
import json
import tokenize
from pathlib import Path

from typing import TYPE_CHECKING

from gqa_flash.course import impl, layout

if TYPE_CHECKING:  # testrun imports this module
    from gqa_flash.course.grader.testrun import TestResult


# How a module not started, or not handed in, reads in the table and in each of its tests.
NOT_STARTED = "not started (still the stub you were given)"
NOT_HANDED_IN = "not handed in (graded as the stub you were given)"  # a graded file the submission lacks

# Where a course without its completed files (the student edition, a Gradescope bundle) keeps its stubs' fingerprints:
# there the graded files are the student's, so they cannot tell what the stubs were.
STUB_PRINTS = "tests/graded/stub_fingerprints.json"


def code_fingerprint(text: str) -> str | None:
    """A hash of a Python file's code: its text without comments, blank lines and trailing spaces.

    Two files with the same fingerprint run the same code, so a file with its stub's fingerprint is not
    started: notes in comments do not start it, one line of code does. The same on every Python version
    (unlike ast.dump). None if the file does not tokenize (a syntax error is a start, and its own failure)."""
    try:
        comments = [tok.start for tok in tokenize.generate_tokens(io.StringIO(text).readline)
                    if tok.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError):
        return None
    lines = text.splitlines()
    for row, col in comments:
        lines[row - 1] = lines[row - 1][:col]
    code = "\n".join(line.rstrip() for line in lines if line.strip())
    return hashlib.sha256(code.encode()).hexdigest()


def stub_fingerprints(course_dir: Path = layout.COURSE_DIR) -> dict[str, str]:
    """{graded file: its stub's fingerprint}: from the completed files (the instructor's copy, through the release
    tool), else from STUB_PRINTS (written with the student edition and the Gradescope bundle), else {}:
    no module is then taken for not started."""
    completed = impl.completed_dir(course_dir)
    if completed.is_dir():
        from gqa_flash.course.grader import stubs

        written = stubs.plan(completed, Path("gqa_flash"))
        return {p.name: code_fingerprint(text) for p, text in written.items() if p.name in layout.GRADED_FILES}
    try:
        prints = json.loads((course_dir / STUB_PRINTS).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in prints.items() if isinstance(v, str)} if isinstance(prints, dict) else {}


def stub_manifest(course_dir: Path = layout.COURSE_DIR) -> bytes:
    """STUB_PRINTS's content for an edition or a bundle written from course_dir."""
    return (json.dumps(stub_fingerprints(course_dir), indent=1, sort_keys=True) + "\n").encode()


def not_started(name: str, text: str | bytes | None, prints: dict[str, str]) -> bool:
    """Is graded file ``name`` (e.g. naive.py) still its stub? ``text`` None: not submitted, so the stub
    is graded. False whenever the stub is unknown: a module is graded as started unless it surely is not."""
    if name not in prints:
        return False
    if text is None:
        return True
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    return code_fingerprint(text) == prints[name]


def parts_not_started(files: dict[str, bytes], test_files, graded_files=layout.GRADED_FILES,
                      prints: dict[str, str] | None = None) -> list[str]:
    """The parts of test_files (``tests/graded/test_naive.py`` is part ``naive``) whose graded file in ``files``
    (a submission's: {name: content}; a name it lacks is graded as its stub) is still its stub: their tests
    need not run. An instructor's extra tests (not under tests/graded/) always run."""
    prints = stub_fingerprints() if prints is None else prints
    parts = [Path(t).stem.removeprefix("test_") for t in test_files if Path(t).parent.as_posix() == "tests/graded"]
    return [part for part in dict.fromkeys(parts)
            if f"{part}.py" in graded_files and not_started(f"{part}.py", files.get(f"{part}.py"), prints)]


def mark_not_started(tests: list[TestResult], files: dict[str, bytes], graded_files=layout.GRADED_FILES,
                     prints: dict[str, str] | None = None) -> list[str]:
    """Mark the tests of each module whose submitted file (``files``) is still its stub; returns those modules.

    Their tests were not run (:func:`parts_not_started`), or ran and failed (a stub passes none:
    tests/grader/test_not_started.py), so marking changes no points, only the report: one line per module, "not
    started", instead of a failure per test."""
    prints = stub_fingerprints() if prints is None else prints
    marked = []
    for part in dict.fromkeys(t.part for t in tests if not t.hidden):
        name = f"{part}.py"
        tests_of = [t for t in tests if t.part == part and not t.hidden]
        if name in graded_files and not any(t.passed for t in tests_of) and not_started(name, files.get(name), prints):
            for t in tests_of:  # a file the submission lacks is graded as its stub: it says which it was
                t.not_started, t.message = True, NOT_STARTED if name in files else NOT_HANDED_IN
            marked.append(part)
    return marked
