"""The student edition: ``python -m gqa_flash.grader.edition DEST`` (``make student-edition DEST=dir``).

What an instructor publishes to students, written from the instructor's
repository in the spirit of nbgrader's ``generate_assignment``: the course
with every solution and every instructor-only tool taken out.

It holds:

* the package, with the graded files written afresh from ``solutions/`` as
  stubs (whatever the instructor's ``gqa_flash/`` holds), and without the
  release tool (it needs ``solutions/``);
* the notebooks with their outputs cleared (the stored outputs come from a run
  with the solutions: their PASS lines would contradict the text, and their
  printed values could give answers away), and ``notebooks/data/``, the
  measurements the notebooks and the README read;
* the graded tests, and the course's own checks that need no solutions
  (:data:`EDITION_TESTS`), which the edition's ``make test`` runs for its CI;
* a README for students, built from the instructor's README: the blocks marked
  ``<!-- edition: NAME -->`` ... ``<!-- /edition -->`` there, set into
  :data:`README_TEMPLATE` (one source for the text both editions share);
* ``course.mk``, the make targets a student needs (``lab``, ``test-graded``,
  ``grade``), under a Makefile that adds the edition's ``test``.

It leaves out ``solutions/``, the mutants (they quote solution lines), the
tests that need the solutions, ``tools/`` (they write notebooks from the
instructor's data), the benchmark's exploration and probe scripts, and
``bench/record/``, the rest of the measurements (bench/RESULTS.md discusses
them; the student edition keeps that text, not the files).
:func:`leaks` lists every line of a solution region that can still be read
anywhere in an edition; ``tests/test_edition.py`` holds it to none, and proves
the edition works: 0 points on its stubs, full marks with the solutions copied
in, the fast kernels on a CPU, and ``make lab`` answering.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from gqa_flash import layout
from gqa_flash.grader import grade, release

COURSE_DIR = layout.COURSE_DIR

# What ships, as path prefixes of the course's own files (tracked by git, or on disk outside ignored folders).
SHIPPED = (
    "gqa_flash/", "notebooks/", "tests/graded/", "tests/gpu/", "bench/", "pyproject.toml", "environment.yml",
    "course.mk", ".gitignore",
)
LEFT_OUT = (
    "gqa_flash/grader/release.py",  # writes the stubs from solutions/
    "gqa_flash/grader/edition.py",  # this file: writes the edition from the instructor's repository
    "bench/explore_", "bench/tile_sweep.sh",  # exploration scripts that load the solutions by name, and their runner
    "bench/probe_", "bench/register_report.py",  # probes: one-off timings and compile reports behind bench/RESULTS.md
    "bench/record/",  # the instructor's record: measurements no notebook reads (gqa_flash.lab.results)
    "bench/out/",  # results of the bench scripts run here (git ignores them)
)
# The course's own checks that need no solutions: the edition's `make test` runs them.
EDITION_TESTS = (
    "tests/conftest.py",
    "tests/test_fast_kernels.py",  # the fast kernels against the float64 reference
    "tests/test_notebooks.py",  # every notebook runs to its end on the student's files
    "tests/test_points.py",  # the grading contract: points and timeouts
    "tests/test_runtime.py",  # GPU or interpreter, and the implementation switch
    "tests/test_validation.py",  # bad input gets an error naming the argument
    "tests/test_bench_decode.py",  # the decode benchmark's logic, on a CPU
)
IGNORED_PARTS = {".git", ".venv", "__pycache__", ".ipynb_checkpoints", ".pytest_cache", ".scratch", "build"}

MAKEFILE = """\
# gqa-flash, the student edition.
#   make lab           open the course in JupyterLab
#   make test-graded   the graded tests on your files, ending with the points table
#   make grade         grade your files as the instructor's grader does
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
gqa_flash/          naive.py online_softmax.py tiled.py forward.py backward.py decode.py: the graded
                    files, yours to write (backward and decode are bonuses); traffic.py, notebook 05's
                    practice file; the rest is the course's support code (read it, don't edit it)
gqa_flash/fast/     the course's fastest kernels, fully written (notebook 05)
gqa_flash/lab/      what the notebooks use: the checks, the pictures, the benchmark
gqa_flash/grader/   the grader behind make grade
tests/graded/       the graded tests (make test-graded)
tests/              the edition's own checks (make test), tests/gpu/ on a GPU
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
        if name.startswith(LEFT_OUT) or not (name.startswith(SHIPPED) or name in EDITION_TESTS):
            continue
        content = (course_dir / name).read_bytes()
        if name.startswith("notebooks/") and name.endswith(".ipynb"):
            content = cleared_notebook(content.decode()).encode()
        files[name] = content
    stubs = release.plan(course_dir / "solutions", Path("gqa_flash"))
    files.update({p.as_posix(): text.encode() for p, text in stubs.items()})
    files[grade.STUB_PRINTS] = grade.stub_manifest(course_dir)  # how the graded run tells a module not started
    files["README.md"] = student_readme(course_dir).encode()
    files["Makefile"] = MAKEFILE.encode()
    files[".ci/run"] = CI_RUN.encode()
    return files


def write(dest: Path, course_dir: Path = COURSE_DIR, force: bool = False) -> dict[str, bytes]:
    """Write the edition at dest (an empty or missing folder, or any folder with force)."""
    dest = Path(dest)
    if dest.resolve() == course_dir.resolve() or course_dir.resolve() in dest.resolve().parents:
        raise ValueError(f"DEST {dest} is inside the course: write the edition somewhere else")
    if dest.exists() and any(dest.iterdir()):
        if not force:
            raise FileExistsError(f"DEST {dest} is not empty (add --force to replace it)")
        shutil.rmtree(dest)
    files = plan(course_dir)
    for name, content in files.items():
        path = dest / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    (dest / ".ci" / "run").chmod(0o755)
    return files


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
# graded forward and backward, and a few of their lines read like the solutions'. Their docstrings, the
# graded files' and the README ask students to finish first. Only these pairs are let through.
PUBLISHED_SOLUTIONS = {"gqa_flash/fast/backward.py": "backward.py", "gqa_flash/fast/forward.py": "forward.py"}


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
        given = "\n".join(_squeeze(line) for line in release.student_text(solution).splitlines()
                           if not line.strip().startswith("#"))
        for part, lines in release.solution_lines(solution.read_text()).items():
            for line in lines:
                squeezed = _squeeze(line)
                if len(squeezed) < MIN_CHARS or squeezed in given or squeezed in STATED_IN_BANNERS:
                    continue
                found += [f"{where}: {solution.name} Part {part}: {line!r}"
                          for where, text in readable.items()
                          if squeezed in text and PUBLISHED_SOLUTIONS.get(where) != solution.name]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gqa_flash.grader.edition",
                                     description="Write the student edition of the course.")
    parser.add_argument("dest", type=Path, help="the folder to write it to (empty or missing)")
    parser.add_argument("--force", action="store_true", help="replace what DEST holds")
    args = parser.parse_args(argv)
    try:
        files = write(args.dest, force=args.force)
    except (ValueError, FileExistsError, release.MarkerError, FileNotFoundError) as e:
        print(f"student-edition: {e}", file=sys.stderr)
        return 2
    found = leaks(files, release.SOLUTIONS_DIR)
    for line in found:
        print(f"leak: {line}", file=sys.stderr)
    if found:
        print(f"student-edition: {len(found)} solution line(s) readable in {args.dest}; do not publish it",
              file=sys.stderr)
        return 1
    print(f"student-edition: wrote {len(files)} files to {args.dest}; no solution line can be read in them")
    print(f"next: cd {args.dest} && git init && make test   (its CI), then publish it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
