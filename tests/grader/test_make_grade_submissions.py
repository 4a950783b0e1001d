"""`make grade-submissions` (course.mk): the instructor's grading command, with the course's .venv.

`python -m gqa_flash.course.grader` typed in a fresh shell runs whatever `python` the PATH finds, which has no
torch ("No module named 'torch'"). The make target runs the grader with $(VENV)/bin/python, as `make grade`
does for a student: here in a shell whose PATH holds no virtual environment at all.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gqa_flash.course import layout
from gqa_flash.course.grader import stubs

COURSE = layout.COURSE_DIR
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def _make(*args, cwd=COURSE, env=None, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_make_grade_submissions_spells_the_graders_options():
    def command(*args) -> str:
        done = _make("-n", "-o", ".venv/.installed", "grade-submissions", *args)
        return next(line for line in done.stdout.splitlines() if "-m gqa_flash.course.grader" in line)

    assert command("SUBMISSIONS=alice.zip") == ".venv/bin/python -m gqa_flash.course.grader alice.zip"
    assert command("SUBMISSIONS=subs/a.zip subs/b", "CSV=grades.csv", "OUT=results/", "JOBS=4", "MODULE=naive tiled") \
        == '.venv/bin/python -m gqa_flash.course.grader subs/a.zip subs/b --csv "grades.csv" --out "results/" ' \
           '--jobs 4 --only "naive tiled"'
    # --regrade takes the rest of the line: it comes last, after ARGS.
    assert command("CSV=grades.csv", "REGRADE=alice bob", "ARGS=--timeout 100") \
        == '.venv/bin/python -m gqa_flash.course.grader --csv "grades.csv" --timeout 100 --regrade alice bob'
    assert command("SUBMISSIONS=a.zip", "VENV=/opt/course-venv").startswith("/opt/course-venv/bin/python -m ")


def test_make_grade_submissions_asks_which_when_given_none():
    done = _make("-o", ".venv/.installed", "grade-submissions")
    assert done.returncode == 2 and "make grade-submissions: say which, e.g. SUBMISSIONS=alice.zip" in done.stdout, done


def test_make_grade_submissions_takes_a_name_with_spaces_as_the_docs_write_it(tmp_path):
    """The documented SUBMISSIONS='"José García.zip"' once failed before the grader ran ("test: José: unexpected
    operator", then "say which"): the recipe's own shell test split the quoted value. The grader must get the
    name whole (here a stand-in python prints the arguments it got, one a line)."""
    fake = tmp_path / "venv"
    (fake / "bin").mkdir(parents=True)
    (fake / "bin" / "python").write_text('#!/bin/sh\nfor a in "$@"; do echo "arg:$a"; done\n')
    (fake / "bin" / "python").chmod(0o755)
    done = _make("-o", f"{fake}/.installed", "grade-submissions", f"VENV={fake}",
                 "SUBMISSIONS=\"José García.zip\" bob.zip", "CSV=grades.csv")
    assert done.returncode == 0, done.stdout + done.stderr
    args = [line[4:] for line in done.stdout.splitlines() if line.startswith("arg:")]
    assert args == ["-m", "gqa_flash.course.grader", "José García.zip", "bob.zip", "--csv", "grades.csv"], done.stdout


@pytest.mark.timeout(300)
def test_make_grade_submissions_grades_from_a_fresh_shell(tmp_path):
    """A TA's shell: no virtual environment active, none on PATH. One submission, naive only, graded in full."""
    venv = Path(sys.prefix)  # this test's environment stands in for the .venv that setup makes (-o: not again)
    submitted = tmp_path / "alice"
    submitted.mkdir()
    shutil.copy2(stubs.COMPLETED_DIR / "naive.py", submitted / "naive.py")
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "GQA_FLASH_IMPL", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    prefixes = {str(Path(sys.prefix)), str(Path(sys.prefix).resolve()), str(COURSE / ".venv")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not any(p.startswith(prefix) for prefix in prefixes))
    out = tmp_path / "results.json"
    done = _make("-o", f"{venv}/.installed", "grade-submissions", f"VENV={venv}", f"SUBMISSIONS={submitted}",
                 "MODULE=naive", f"OUT={out}", "ARGS=--test-timeout-cap 60", env=dict(env, TMPDIR=str(tmp_path)),
                 timeout=280)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No module named" not in done.stderr and "20 / 20 points of the modules run" in done.stdout, done.stdout
    results = json.loads(out.read_text())
    assert results["score"] == 20 and results["submission"] == submitted.name, results
