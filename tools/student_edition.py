"""The student edition: ``python tools/student_edition.py DEST`` (``make student-edition DEST=dir``).

What an instructor publishes to students, written from the instructor's
repository in the spirit of nbgrader's ``generate_assignment``: the course
with every solution and every instructor-only tool taken out.

It holds:

* the package, with the graded files written afresh from ``solutions/`` as
  stubs (whatever the instructor's ``gqa_flash/`` holds);
* the notebooks with their outputs cleared (the stored outputs come from a run
  with the solutions: their PASS lines would contradict the text, and their
  printed values could give answers away), and ``notebooks/data/``, the
  measurements the notebooks and the README read;
* the graded tests, and the course's own checks that need no solutions
  (``tests/given/``), which the edition's ``make test`` runs for its CI;
* a README for students, built from the instructor's README: the blocks marked
  ``<!-- edition: NAME -->`` ... ``<!-- /edition -->`` there, set into
  :data:`README_TEMPLATE` (one source for the text both editions share);
* ``course.mk``, the make targets a student needs (``lab``, ``test-graded``,
  ``grade``), under a Makefile that adds the edition's ``test``.

It leaves out ``solutions/``, the mutants (they quote solution lines), the
tests that need the solutions, ``tools/`` (they write notebooks from the
instructor's data), the benchmark's exploration and probe scripts, and
``bench/record/``, the rest of the measurements (bench/RESULTS.md discusses
them; the student edition keeps that text, not the files, and each page that cites
such files says so under its title).
:func:`leaks` lists every line of a solution region that can still be read
anywhere in an edition; ``tests/course/test_edition.py`` holds it to none, and proves
the edition works: 0 points on its stubs, full marks with the solutions copied
in, the fast kernels on a CPU, and ``make lab`` answering.

Re-releasing (``make student-edition DEST=dir UPDATE=1``, ``--update``) keeps
the edition's history, as nbgrader's release keeps its course repository: the
edition records the files the course wrote in it (:data:`MANIFEST`), and an
update rewrites those, removes the ones the course no longer has, and leaves
``.git`` and every file the instructor added alone. It says what changed, for
one commit. ``FORCE=1`` (``--force``) replaces the folder whole, ``.git`` included.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gqa_flash.course import layout
from gqa_flash.course.grader import sandbox, started, stubs

COURSE_DIR = layout.COURSE_DIR

# What ships, as path prefixes of the course's own files (tracked by git, or on disk outside ignored folders).
SHIPPED = (
    "gqa_flash/", "notebooks/", "tests/graded/", "tests/gpu/", "bench/", "pyproject.toml", "environment.yml",
    "tests/conftest.py", "tests/given/",  # the tests that need no solutions, whole: the edition's `make test`
    "docs/api.md", "docs/performance.md",  # not docs/instructors.md: the instructor's guide stays here
    "course.mk", ".gitignore",
)
LEFT_OUT = (
    "bench/explore_", "bench/tile_sweep.sh",  # exploration scripts that load the solutions by name, and their runner
    "bench/probe_", "bench/register_report.py",  # probes: one-off timings and compile reports behind bench/RESULTS.md
    "bench/record/",  # the instructor's record: measurements no notebook reads (gqa_flash.course.lab.results)
    "bench/grading_times.py",  # times the grader on submissions written from solutions/
    "bench/out/",  # results of the bench scripts run here (git ignores them)
)
IGNORED_PARTS = {".git", ".venv", "__pycache__", ".ipynb_checkpoints", ".pytest_cache", ".scratch", "build"}

MAKEFILE = """\
# gqa-flash, the student edition.
#   make lab           open the course in JupyterLab
#   make test-graded   the graded tests on your files, ending with the points table
#   make grade         grade your files as the instructor's grader does
#   make submission    the zip you hand in (submission.zip)
#   make test          the edition's own checks (its CI): the notebooks run, the fast kernels are right
include course.mk

.PHONY: test
test: setup
\tGQA_FLASH_IMPL=student $(BIN)/python -m pytest tests -n $(WORKERS) --dist loadfile --ignore=tests/graded
"""

CI_RUN = """\
#!/usr/bin/env bash
# CI of the student edition: the README's test command, on a clean clone.
set -euo pipefail
cd "$(dirname "$0")/.."
make test
"""

README_TEMPLATE = """\
{intro}

This is the **student edition**: the course as you work on it. The graded
files in `gqa_flash/` are yours to write; everything else is given.

## Quick start

{requirements}

```bash
make lab           # set up .venv, then open the course in JupyterLab (notebooks/)
make test-graded   # the graded tests on your files; ends with your points
make grade         # grade your files exactly as your instructor's grader does
make submission    # the zip you hand in: submission.zip, your graded files
```

Each command sets itself up on first use: it creates a virtual environment in
`.venv` and installs the course into it (`pip install -e '.[course,dev]'`).
`make lab` prints a URL with a token: open it in your browser. The notebooks
come without outputs; run each from the top.

{cpu_torch}

{course}

{students}

## What is here

```
notebooks/          the lessons, in order; notebooks/data/ holds results measured on an H200
gqa_flash/          naive.py online_softmax.py tiled.py forward.py windows.py backward.py decode.py ring.py:
                    the graded files, yours to write (windows, backward, decode and ring are bonuses); traffic.py, notebook 05's
                    practice file; the rest is the course's support code (read it, don't edit it)
gqa_flash/fast/     the course's fastest kernels, fully written (notebook 05)
gqa_flash/course/lab/      what the notebooks use: the checks, the pictures, the benchmark
gqa_flash/course/grader/   the grader behind make grade
docs/               api.md (the public API), performance.md (the kernels' speed, measured)
tests/graded/       the graded tests (make test-graded)
tests/given/        the edition's own checks (make test), tests/gpu/ on a GPU
bench/              the scripts that measured notebooks/data/ on a GPU, and RESULTS.md
```

`make test` checks the edition itself, as its CI does: every notebook runs to
its end on your files, the fast kernels match the float64 reference, and the
grading contract holds. It does not grade you: `make test-graded` does.
"""

_BLOCK = re.compile(r"<!-- edition: (\w+) -->\n(.*?)<!-- /edition -->\n", re.S)


def readme_blocks(text: str) -> dict[str, str]:
    """The blocks of the instructor's README marked for the edition, by name."""
    return {name: body.strip() for name, body in _BLOCK.findall(text)}


def student_readme(course_dir: Path = COURSE_DIR) -> str:
    blocks = readme_blocks((course_dir / "README.md").read_text())
    names = set(re.findall(r"{(\w+)}", README_TEMPLATE))
    missing = names - blocks.keys()
    if missing:
        raise ValueError(f"README.md has no <!-- edition: NAME --> block for {', '.join(sorted(missing))}")
    return README_TEMPLATE.format(**{n: blocks[n] for n in names})


def cleared_notebook(text: str) -> str:
    """A notebook with every output and execution count removed (metadata such as nbval's tags kept)."""
    nb = json.loads(text)
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
            cell.get("metadata", {}).pop("execution", None)
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def course_files(course_dir: Path = COURSE_DIR) -> list[str]:
    """The course's files, relative: what git tracks or would track, else what is on disk outside ignored folders."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=course_dir,
                             capture_output=True, check=True).stdout.decode()
        names = [n for n in out.split("\0") if n]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout
        names = [p.relative_to(course_dir).as_posix() for p in course_dir.rglob("*") if p.is_file()]
    return sorted(n for n in names
                  if not IGNORED_PARTS & set(Path(n).parts) and not n.endswith((".pyc", ".egg-info"))
                  and (course_dir / n).is_file())


def plan(course_dir: Path = COURSE_DIR) -> dict[str, bytes]:
    """The edition's files: {relative path: content}."""
    files: dict[str, bytes] = {}
    for name in course_files(course_dir):
        if name.startswith(LEFT_OUT) or not name.startswith(SHIPPED):
            continue
        content = (course_dir / name).read_bytes()
        if name.startswith("notebooks/") and name.endswith(".ipynb"):
            content = cleared_notebook(content.decode()).encode()
        files[name] = content
    written = stubs.plan(course_dir / "solutions", Path("gqa_flash"))
    files.update({p.as_posix(): text.encode() for p, text in written.items()})
    files[started.STUB_PRINTS] = started.stub_manifest(course_dir)  # how the graded run tells a module not started
    files[sandbox.STUB_SOURCES] = sandbox.stub_sources_manifest(written)  # what it grades for a file a zip lacks
    files["README.md"] = student_readme(course_dir).encode()
    files["Makefile"] = MAKEFILE.encode()
    files[".ci/run"] = CI_RUN.encode()
    for name in [n for n in files if n.endswith(".md")]:
        files[name] = _with_record_note(files[name].decode(), files).encode()
    return files


# A path under bench/, tests/, tools/ or solutions/ that a page names (not after "git show COMMIT:", which names
# another commit's file).
BENCH_CITED = re.compile(r"(?<![\w./:-])(?:bench|tests|tools|solutions)/[\w./*-]*[\w*]")
GIT_SHOW = re.compile(r"git show [0-9a-f]{7,40}:")  # a file of another commit: the edition has no history
RECORD_NOTE = ("> **In the student edition** this page cites files that stay with your instructor's copy of the "
               "course: {names}. The numbers, and what they mean, are all here.")


def cited_elsewhere(text: str, files) -> list[str]:
    """What ``text`` cites under bench/, tests/, tools/ or solutions/ that is not in ``files``, by kind: the record
    ("bench/record/"), the probes ("bench/probe_*"), the explorations ("bench/explore_*"), or a file by name.
    bench/out/ (where the scripts write) is no file of the course."""
    found = set()
    for path in BENCH_CITED.findall(text):
        if path in files or any(f.startswith(path + "/") or fnmatch.fnmatch(f, path) for f in files):
            continue
        kind = next((k for k in ("bench/record", "bench/probe_", "bench/explore_", "bench/out") if path.startswith(k)),
                    None)
        if kind != "bench/out":
            found.add({"bench/record": "bench/record/"}.get(kind, f"{kind}*" if kind else path))
    return sorted(found)


def _with_record_note(text: str, files) -> str:
    """``text`` with :data:`RECORD_NOTE` after its title when it cites files the edition leaves out, or the
    course's git history."""
    history = ["the course's git history (the `git show` commands)"] if GIT_SHOW.search(text) else []
    cited = [f"`{p}`" for p in cited_elsewhere(text, files)] + history
    if not cited:
        return text
    names = ", ".join(cited)
    note = RECORD_NOTE.format(names=names)
    title, _, rest = text.partition("\n")
    if not title.startswith("#"):
        return f"{note}\n\n{text}"
    return f"{title}\n\n{note}\n\n{rest.lstrip(chr(10))}"


# --- writing and re-releasing ----------------------------------------------------------------------------------

MANIFEST = ".gqa_flash_edition.json"  # in the edition: the files the course wrote there
MANIFEST_ABOUT = ("The files the course wrote in this edition (tools/student_edition.py). "
                  "make student-edition DEST=<this folder> UPDATE=1 rewrites them and removes those the course "
                  "no longer has; every other file, and .git, is the instructor's and stays.")


def edition_files(course_dir: Path = COURSE_DIR) -> dict[str, bytes]:
    """The edition's files, its manifest included: what a write puts in DEST."""
    files = plan(course_dir)
    manifest = {"about": MANIFEST_ABOUT, "files": sorted(files)}
    files[MANIFEST] = (json.dumps(manifest, indent=1) + "\n").encode()
    return files


@dataclass
class Changes:
    """What a write did to DEST: the course's files by change, and the files it left alone."""

    files: dict[str, bytes]  # the course's files now in DEST
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)  # course files of the previous edition the course dropped
    unchanged: int = 0
    kept: list[str] = field(default_factory=list)  # the instructor's own files (.git aside), untouched
    warnings: list[str] = field(default_factory=list)


def _spell(dest: Path, make: str, flag: str) -> str:
    return f"make student-edition DEST={dest} {make} (python tools/student_edition.py {dest} {flag})"


def previous_files(dest: Path) -> list[str] | None:
    """The course files a previous edition wrote in dest, from its manifest (None: no manifest).

    Only plain relative paths count: a manifest edited by hand cannot point outside
    the edition, nor into its .git."""
    try:
        names = json.loads((dest / MANIFEST).read_text())["files"]
        if not isinstance(names, list):
            raise TypeError("its files are not a list")
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{dest / MANIFEST} is not an edition's manifest ({e}): "
                         f"restore it from the edition's git history, or replace the edition with "
                         f"{_spell(dest, 'FORCE=1', '--force')}") from None
    return sorted(n for n in names if isinstance(n, str) and n and not Path(n).is_absolute()
                  and ".." not in Path(n).parts and ".git" not in Path(n).parts)


def check_dest(dest: Path, course_dir: Path = COURSE_DIR, force: bool = False, update: bool = False) -> None:
    """Refuse a DEST that a write must not touch, naming the spelling that works."""
    dest, where, course = Path(dest), Path(dest).resolve(), course_dir.resolve()
    if where == course or course in where.parents:
        raise ValueError(f"DEST {dest} is inside the course: write the edition somewhere else")
    if where in course.parents:
        raise ValueError(f"DEST {dest} holds the course: write the edition somewhere else")
    if force and update:
        raise ValueError("UPDATE=1 keeps what DEST holds and FORCE=1 replaces it: choose one")
    if dest.exists() and not dest.is_dir():
        raise ValueError(f"DEST {dest} is a file, not a folder")
    if not dest.exists() or not any(dest.iterdir()) or force:
        return
    if not update:
        raise FileExistsError(
            f"DEST {dest} is not empty. To re-release into an edition you publish, keeping its .git and your "
            f"own files: {_spell(dest, 'UPDATE=1', '--update')}. To replace all it holds, .git included: "
            f"{_spell(dest, 'FORCE=1', '--force')}.")
    if previous_files(dest) is None and not (dest / "gqa_flash").is_dir():
        raise FileExistsError(f"DEST {dest} holds no student edition (no {MANIFEST}, no gqa_flash/): "
                              f"UPDATE=1 rewrites an edition. Write a new one in an empty folder.")


def write(dest: Path, course_dir: Path = COURSE_DIR, force: bool = False, update: bool = False,
          files: dict[str, bytes] | None = None) -> Changes:
    """Write the edition at dest: an empty or missing folder; any folder with force (replaced whole);
    an edition with update (the course's files rewritten, .git and the instructor's own files kept)."""
    dest = Path(dest)
    check_dest(dest, course_dir, force=force, update=update)
    if force and dest.exists():
        shutil.rmtree(dest)
    files = files if files is not None else edition_files(course_dir)
    changes = Changes(files=files)
    previous = previous_files(dest) if dest.exists() else None
    if update and previous is None and dest.exists() and any(dest.iterdir()):
        changes.warnings.append(f"{dest} has no {MANIFEST} (written before re-releases were recorded): the "
                                "course's files are rewritten, but files the course has dropped since stay; "
                                "remove them by hand")
    if previous is not None:  # a course file now where the instructor keeps one of theirs: ask, do not overwrite
        theirs = [n for n in files if n not in previous and n != MANIFEST and (dest / n).is_file()
                  and (dest / n).read_bytes() != files[n]]
        if theirs:
            raise FileExistsError(f"the course now has {', '.join(theirs)}, which {dest} holds as your own "
                                  "file: move yours elsewhere, then run this again")
    for name, content in files.items():
        path = dest / name
        old = path.read_bytes() if path.is_file() else None
        if old == content:
            changes.unchanged += 1
            continue
        (changes.added if old is None else changes.changed).append(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    (dest / ".ci" / "run").chmod(0o755)
    for name in previous or []:
        path = dest / name
        if name not in files and (path.is_file() or path.is_symlink()):
            path.unlink()
            changes.removed.append(name)
            _prune(path.parent, dest)
    changes.kept = [n for n in course_files(dest) if n not in files]
    return changes


def _prune(folder: Path, dest: Path) -> None:
    """Remove the folders a removed file leaves empty, up to dest."""
    while folder != dest and dest in folder.parents and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent


def summary(changes: Changes, dest: Path) -> list[str]:
    """What a write did, a line each: the instructor reads it before committing the release."""
    touched = len(changes.added) + len(changes.changed) + len(changes.removed)
    if not touched:
        lines = [f"student-edition: {dest} is up to date with the course ({len(changes.files)} files); "
                 "nothing changed"]
    else:
        lines = [f"student-edition: {dest}: {len(changes.added)} added, {len(changes.changed)} changed, "
                 f"{len(changes.removed)} removed ({changes.unchanged} unchanged)"]
        lines += [f"  {what:<8} {name}" for what, names in (("added", changes.added), ("changed", changes.changed),
                                                           ("removed", changes.removed)) for name in sorted(names)]
    if changes.kept:
        shown = ", ".join(changes.kept[:8]) + (f" and {len(changes.kept) - 8} more" if len(changes.kept) > 8 else "")
        lines.append(f"kept {len(changes.kept)} file(s) of yours: {shown}")
    return lines + [f"warning: {w}" for w in changes.warnings]


# --- the leak check ------------------------------------------------------------------------------------------

MIN_CHARS = 12  # a solution line this short ("else:", "m_i = m_new") says nothing about the solution
# Solution lines that only name what a banner states in words (naive.py Part 1's banner: query head h
# reads KV head h // (n_q_heads // n_kv_heads)), which the support code may use as well.
STATED_IN_BANNERS = {"group_size=N_Q_HEADS//N_KV_HEADS", "group_size=n_q_heads//n_kv_heads"}


def _squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _readable(name: str, content: bytes) -> str:
    """What a student can read in a file: a notebook's sources and outputs, any other file's text."""
    text = content.decode("utf-8", errors="replace")
    if name.endswith(".ipynb"):
        cells = json.loads(text)["cells"]
        parts = ["".join(c["source"]) for c in cells]
        for c in cells:
            for out in c.get("outputs", []):
                parts += ["".join(out.get("text", ""))]
                parts += ["".join(v) if isinstance(v, list) else str(v) for v in out.get("data", {}).values()]
        text = "\n".join(parts)
    return text


# The fast kernels ship complete, as a course's published solutions do (issue 36): they implement the
# graded forward and backward, and the window's runs and sinks of the bonus windows.py, and a few of their lines
# read like the solutions'. Their docstrings, the graded files' and the README ask students to finish first.
# Only these pairs are let through.
PUBLISHED_SOLUTIONS = {"gqa_flash/fast/backward.py": "backward.py", "gqa_flash/fast/forward.py": "forward.py",
                       "gqa_flash/fast/windows.py": "windows.py"}


def leaks(files: dict[str, bytes], solutions_dir: Path) -> list[str]:
    """Every solution line (whitespace ignored) that can be read in files, as 'where: which line'.

    A line counts unless it is shorter than MIN_CHARS without its spaces, or it is
    code that the same file's stub hands out anyway (outside its regions, comments
    aside). Only the same file's: a line that another stub hands out word for word
    (a bonus file's given code repeating a graded part, say) is a leak there.
    """
    readable = {name: _squeeze(_readable(name, content)) for name, content in files.items()}
    found = []
    for solution in sorted(solutions_dir.glob("*.py")):
        given = "\n".join(_squeeze(line) for line in stubs.student_text(solution).splitlines()
                           if not line.strip().startswith("#"))
        for part, lines in stubs.solution_lines(solution.read_text()).items():
            for line in lines:
                squeezed = _squeeze(line)
                if len(squeezed) < MIN_CHARS or squeezed in given or squeezed in STATED_IN_BANNERS:
                    continue
                found += [f"{where}: {solution.name} Part {part}: {line!r}"
                          for where, text in readable.items()
                          if squeezed in text and PUBLISHED_SOLUTIONS.get(where) != solution.name]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/student_edition.py", description="Write the student edition of the course.",
        epilog="Through make: make student-edition DEST=dir [UPDATE=1 | FORCE=1].")
    parser.add_argument("dest", type=Path, help="the folder to write it to (empty or missing, or an edition to update)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--update", action="store_true",
                      help="re-release into an edition: rewrite the course's files, remove those it dropped, keep "
                           ".git and your own files, and say what changed (make: UPDATE=1)")
    mode.add_argument("--force", action="store_true", help="replace all DEST holds, .git included (make: FORCE=1)")
    args = parser.parse_args(argv)
    try:
        check_dest(args.dest, force=args.force, update=args.update)  # before the minutes of work below
        files = edition_files()
        found = leaks(files, stubs.COMPLETED_DIR)
        for line in found:
            print(f"leak: {line}", file=sys.stderr)
        if found:  # nothing written: an edition in use keeps its last release
            print(f"student-edition: {len(found)} solution line(s) would be readable in the edition; "
                  f"nothing was written to {args.dest}", file=sys.stderr)
            return 1
        changes = write(args.dest, force=args.force, update=args.update, files=files)
    except (ValueError, FileExistsError, stubs.MarkerError, FileNotFoundError) as e:
        print(f"student-edition: {e}", file=sys.stderr)
        return 2
    if args.update:
        print("\n".join(summary(changes, args.dest)))
        print("no solution line can be read in the course's files")
        if changes.added or changes.changed or changes.removed:
            print(f"next: cd {args.dest} && git status && git add -A && git commit -m 'Release: ...'   "
                  "(one commit; students git pull it)")
        return 0
    print(f"student-edition: wrote {len(files)} files to {args.dest}; no solution line can be read in them")
    print(f"next: cd {args.dest} && git init && make test   (its CI), then publish it")
    print(f"later releases: make student-edition DEST={args.dest} UPDATE=1   (keeps its .git and your own files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
