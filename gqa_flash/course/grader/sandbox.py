"""The pristine course a submission is graded in.

The grader never trusts the files it grades, nor what they might do to the
disk. So it reads the course *once*, into memory (:func:`snapshot`): the
support modules of ``gqa_flash/``, the stubs of the graded modules, the graded
tests and ``pyproject.toml`` (which registers the ``points`` mark). Every test
run then gets a fresh copy written from that snapshot (:func:`build`), with
the submission's graded files in place of the stubs. A submission that
rewrites the tests, the reference, or the course on disk changes nothing for
the next run nor for the next submission; :func:`tampered` says what it
touched, so the instructor hears about it.

The copy never holds the completed files: a missing graded file gets the stub
the release tool would write (:mod:`~gqa_flash.course.grader.stubs`). The student edition has no
completed files and its package's graded files are the student's own, so it
carries the stubs in ``STUB_SOURCES`` (a zip without forward.py, graded there,
once got the student's finished forward.py in its place and full marks). In a
Gradescope bundle the package's own graded files are the stubs.

Nor does the graded process learn where the course is: it runs in the copy,
from an environment with no variable that leads back to the course
(:func:`environment`). A grader started in the instructor's repository
inherits ``PWD``; a submission once found the completed ``forward.py`` through it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gqa_flash.course import impl, layout
from gqa_flash.course.layout import COURSE_DIR, GRADED_FILES

# Bonus modules: their tests' points come on top of the 100 of the required ones,
# so they are not in the maximum.
BONUS_PARTS = layout.BONUS_MODULES
HIDDEN_DIR = "tests/extra"  # where an instructor's extra tests go in the copy
MAX_TEST_FILE_BYTES = 1 << 20  # per test file (an extra test is code, not a data set)
STUB_SOURCES = "tests/graded/stub_sources.json"  # {graded file: its stub}, written with the student edition


@dataclass(frozen=True)
class Course:
    """The course files a copy is made of: {path relative to the copy: content}."""

    files: dict[str, bytes]
    graded_files: tuple[str, ...] = GRADED_FILES
    test_files: tuple[str, ...] = field(default=())  # the test modules to run, graded first

    def tests_of(self, parts=None) -> list[str]:
        """The test files of the chosen parts (``test_naive.py`` is part ``naive``), all when None."""
        if parts is None:
            return list(self.test_files)
        return [t for t in self.test_files if Path(t).stem.removeprefix("test_") in parts]


def stub_files(course_dir: Path) -> dict[str, bytes]:
    completed = impl.completed_dir(course_dir)
    if completed.is_dir():
        from gqa_flash.course.grader import stubs

        found = {p.as_posix(): text.encode() for p, text in stubs.plan(completed, Path("gqa_flash")).items()}
    else:  # the student edition: the stubs it was written with; a Gradescope bundle: none, its files are the stubs
        found = read_stub_sources(course_dir)
    for name in GRADED_FILES:
        key = f"gqa_flash/{name}"
        if key not in found and (course_dir / key).is_file():
            found[key] = (course_dir / key).read_bytes()
    return found


def stub_sources_manifest(stubs: Mapping[Path, str]) -> bytes:
    """STUB_SOURCES's content: {graded file's name: its stub's text}, from ``stubs.plan``'s {path: text}."""
    return (json.dumps({p.name: text for p, text in sorted(stubs.items())}, indent=1, sort_keys=True) + "\n").encode()


def read_stub_sources(course_dir: Path) -> dict[str, bytes]:
    """The stubs in course_dir's STUB_SOURCES, keyed gqa_flash/<name>; {} where there is none or it is unreadable."""
    try:
        sources = json.loads((course_dir / STUB_SOURCES).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(sources, dict):
        return {}
    return {f"gqa_flash/{name}": text.encode() for name, text in sources.items()
            if name in GRADED_FILES and isinstance(text, str)}


def read_tree(root: Path, prefix: str) -> dict[str, bytes]:
    """Every regular file under root (no caches, no links), keyed prefix/relative path."""
    files = {}
    for path in sorted(root.rglob("*")):
        if "__pycache__" in path.parts or path.is_symlink() or not path.is_file():
            continue
        if path.stat().st_size > MAX_TEST_FILE_BYTES:
            raise ValueError(f"{path} is larger than {MAX_TEST_FILE_BYTES} bytes; test files should be small")
        files[f"{prefix}/{path.relative_to(root).as_posix()}"] = path.read_bytes()
    return files


def snapshot(course_dir: Path = COURSE_DIR, extra_tests: Path | None = None) -> Course:
    """Read the course into memory: support modules, stubs, graded tests, and the extra tests if any."""
    package = course_dir / "gqa_flash"
    # The whole package (its wings too: the grader's plugin runs in the copy), but the graded files.
    files = {
        f"gqa_flash/{p.relative_to(package).as_posix()}": p.read_bytes()
        for p in sorted(package.rglob("*.py"))
        if "__pycache__" not in p.parts and p.relative_to(package).as_posix() not in GRADED_FILES
    }
    files.update(stub_files(course_dir))
    files["pyproject.toml"] = (course_dir / "pyproject.toml").read_bytes()
    files["tests/conftest.py"] = (course_dir / "tests" / "conftest.py").read_bytes()
    files.update(read_tree(course_dir / "tests" / "graded", "tests/graded"))
    if extra_tests is not None:
        if not Path(extra_tests).is_dir():
            raise FileNotFoundError(f"--extra-tests: {extra_tests} is not a folder")
        files.update(read_tree(Path(extra_tests), HIDDEN_DIR))
    tests = [
        k for k in files
        if k.startswith(("tests/graded/", HIDDEN_DIR + "/")) and Path(k).name.startswith("test_") and k.endswith(".py")
    ]
    # The graded tests first, each in the order of the course's modules; then the extra ones.
    order = {f"test_{m}.py": i for i, m in enumerate(layout.GRADED_MODULES)}
    tests.sort(key=lambda k: (k.startswith(HIDDEN_DIR), order.get(Path(k).name, len(order)), k))
    return Course(files=files, test_files=tuple(tests))


def build(course: Course, dest: Path, submitted: dict[str, bytes]) -> None:
    """Write a fresh copy of the course at dest, the submitted graded files in place of the stubs."""
    remove(dest)
    for rel, content in course.files.items():
        _write(dest / rel, content)
    for name, content in submitted.items():
        if name not in course.graded_files:  # belt and braces: submission.read only returns these
            raise ValueError(f"{name} is not a graded file")
        _write(dest / "gqa_flash" / name, content)


def build_executor(course: Course, dest: Path, submitted: dict[str, bytes]) -> dict[str, bytes]:
    """Write the executor's folder at dest: the course's package, the submitted graded files in place of the
    stubs, and nothing else (no tests, no pyproject, never the completed files). Returns what it wrote, for tampered."""
    files = {rel: content for rel, content in course.files.items() if rel.startswith("gqa_flash/")}
    for name, content in submitted.items():
        if name not in course.graded_files:
            raise ValueError(f"{name} is not a graded file")
        files[f"gqa_flash/{name}"] = content
    remove(dest)
    for rel, content in files.items():
        _write(dest / rel, content)
    for folder in [dest, *(p for p in dest.rglob("*") if p.is_dir())]:  # readable by another user (isolation)
        folder.chmod(0o755)
    return files


def remove(path: Path, patience_s: float = 10.0) -> None:
    """Delete a copy, even one whose folders the submission made read-only.

    A killed test run's processes can still be finishing a write when the
    first attempt runs (SIGKILL is delivered, not awaited): try again for a
    while until the folder is gone."""
    deadline = time.monotonic() + patience_s
    while path.exists():
        _unlock(path)
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists() or time.monotonic() > deadline:
            return
        time.sleep(0.1)


def _unlock(folder) -> None:
    try:
        os.chmod(folder, 0o700)
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            _unlock(entry.path)


def _write(path: Path, content: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)


def tampered(course: Course, dest: Path, files: dict[str, bytes] | None = None) -> list[str]:
    """Course files in the copy at dest (``files``, default the course's) that a run changed, deleted or
    added (graded files aside)."""
    problems = []
    files = course.files if files is None else files
    for rel, content in files.items():
        if Path(rel).parent.as_posix() == "gqa_flash" and Path(rel).name in course.graded_files:
            continue
        path = dest / rel
        if not path.is_file():
            problems.append(f"deleted {rel}")
        elif hashlib.sha256(path.read_bytes()).digest() != hashlib.sha256(content).digest():
            problems.append(f"changed {rel}")
    for path in dest.rglob("*"):
        rel = path.relative_to(dest).as_posix()
        if "__pycache__" in path.parts or path.is_dir() or rel in files:
            continue
        if rel.startswith("gqa_flash/") and path.name in course.graded_files:
            continue
        problems.append(f"added {rel}")
    return problems


# --- the graded process's environment ---------------------------------------------------------------------------

FORGOTTEN = ("PWD", "OLDPWD")  # where the grader was started, and before: in the course, as often as not


def environment(base: Mapping[str, str], copy: Path, course_dir: Path = COURSE_DIR) -> dict[str, str]:
    """The environment a graded process starts from: base, less whatever leads to the course.

    ``PWD`` and ``OLDPWD`` go, and every path into ``course_dir`` goes: an entry
    of a list such as ``PATH`` (the course's ``.venv/bin``) is taken out of its
    list, any other value that names the course (``VIRTUAL_ENV``, an option
    string) goes whole. Paths into the grading's own folder (the copy's parent)
    stay. The caller then adds what the run needs (``PYTHONPATH`` to the copy),
    and starts the process in the copy.
    """
    roots = {str(course_dir), str(Path(course_dir).resolve())}
    into_course = re.compile("|".join(rf"{re.escape(r.rstrip(os.sep))}(?=$|[{re.escape(os.sep)}\s\"',;:=])"
                                      for r in sorted(roots)))
    scratch = Path(copy).resolve().parent

    def leads_to_course(entry: str) -> bool:
        if not into_course.search(entry):
            return False
        try:
            return not Path(entry).resolve().is_relative_to(scratch)
        except (OSError, ValueError):
            return True

    env = {}
    for key, value in base.items():
        if key in FORGOTTEN:
            continue
        entries = value.split(os.pathsep)
        kept = [e for e in entries if not leads_to_course(e)]
        if len(kept) == len(entries):
            env[key] = value
        elif len(entries) > 1 and any(kept):  # a list of paths: the rest of it still serves
            env[key] = os.pathsep.join(kept)
    return env
