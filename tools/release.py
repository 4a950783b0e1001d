"""Write the student files from the solutions: ``python tools/release.py [--check]`` (``make release``,
``make check-release``).

The solutions (``solutions/<module>.py``) are the single source of truth: the stub of each is the file without
its answers (``gqa_flash/course/grader/stubs.py`` says how, and writes them). ``--check`` writes nothing and
exits 1 when ``gqa_flash/`` and ``solutions/`` have drifted apart.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from gqa_flash.course.grader import stubs


def check(solutions_dir: Path = stubs.COMPLETED_DIR, student_dir: Path = stubs.STUDENT_DIR) -> list[str]:
    """Problems, one line each; empty when the student files are in sync."""
    problems = []
    for path, text in stubs.plan(solutions_dir, student_dir).items():
        if not path.exists():
            problems.append(f"{path}: missing (run `make release`)")
        elif path.read_text() != text:
            diff = difflib.unified_diff(
                text.splitlines(), path.read_text().splitlines(), "expected (from solutions)", str(path),
                lineterm="", n=1
            )
            problems.append(f"{path}: differs from its solution's stubs:\n" + "\n".join(list(diff)[:40]))
    for path in sorted(student_dir.glob("*.py")):
        content = path.read_text()
        for marker in (stubs.BEGIN, stubs.END):
            if marker in content:
                problems.append(f"{path}: contains {marker!r}; solution text must never reach gqa_flash/")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/release.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the student files have drifted")
    parser.add_argument("--solutions", type=Path, default=stubs.COMPLETED_DIR, help="folder of the solution files")
    parser.add_argument("--out", type=Path, default=stubs.STUDENT_DIR, help="folder the student files go to")
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = check(args.solutions, args.out)
            for p in problems:
                print(p, file=sys.stderr)
            if problems:
                print(f"release check: {len(problems)} problem(s)", file=sys.stderr)
                return 1
            print(f"release check: student files in {args.out} match {args.solutions}")
            return 0
        for path, text in stubs.plan(args.solutions, args.out).items():
            path.parent.mkdir(parents=True, exist_ok=True)
            changed = not path.exists() or path.read_text() != text
            path.write_text(text)
            print(f"{'wrote' if changed else 'unchanged'} {path}")
        return 0
    except (stubs.MarkerError, FileNotFoundError) as e:
        print(f"release: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
