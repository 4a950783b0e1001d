"""The single-sourced solutions: release writes the stubs, --check catches drift, bad markers are errors."""

import subprocess
import sys
import textwrap

import pytest

from gqa_flash.course import layout
from gqa_flash.course.grader import stubs
from gqa_flash.course.grader.stubs import BEGIN, END, STUB, MarkerError, strip_answers
from tools_path import release

BANNER = "# --- STUDENT IMPLEMENTATION REQUIRED HERE (Part {n}) ---"
BANNER_END = "# --- END OF STUDENT IMPLEMENTATION ---"


def src(body: str) -> str:
    return textwrap.dedent(body).format(BEGIN=BEGIN, END=END, STUB=STUB, B1=BANNER.format(n=1), BE=BANNER_END)


def test_student_files_are_in_sync_with_solutions():
    result = subprocess.run([sys.executable, "tools/release.py", "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_no_solution_marker_in_the_package():
    for path in layout.PACKAGE_DIR.glob("*.py"):
        text = path.read_text()
        assert BEGIN not in text and END not in text, f"{path} holds a solution marker"


def test_default_stub_raises_naming_the_part():
    out = strip_answers(src("""
        def f():
            {B1}
            # explain
            {BEGIN}
            secret = 42
            {END}
            {BE}
            return secret
        """), "naive.py")
    assert "secret = 42" not in out
    assert 'raise NotImplementedError("Part 1 of naive.py is not implemented yet")' in out
    assert "# explain" in out and "return secret" in out


def test_explicit_stub_is_uncommented_at_the_marker_indent():
    out = strip_answers(src("""
        def f():
            {B1}
            {BEGIN}
            x = solve()
            {STUB}
            # x = 0  # placeholder
            #
            {END}
            {BE}
        """), "forward.py")
    assert "solve()" not in out
    assert "    x = 0  # placeholder\n" in out


@pytest.mark.parametrize(
    "body,message",
    [
        ("{B1}\n{BEGIN}\n{BEGIN}\nx\n{END}\n{END}\n{BE}\n", "nested"),
        ("{B1}\n{BEGIN}\nx = 1\n", "never closed"),
        ("{B1}\nx = 1\n{END}\n{BE}\n", "without"),
        ("{BEGIN}\nx = 1\n{END}\n", "outside a STUDENT IMPLEMENTATION banner"),
        ("{B1}\n{STUB}\n{BE}\n", "outside a solution region"),
        ("{B1}\n{BEGIN}\nx\n{STUB}\ny = 0\n{END}\n{BE}\n", "commented out"),
        ("{B1}\n### BEGIN SOLUTIONS\n{BE}\n", "unknown marker"),
        ("{B1}\n{BEGIN}\nx\n{END}\n", "banner is never closed"),
    ],
)
def test_malformed_markers_are_errors_with_file_and_line(body, message):
    with pytest.raises(MarkerError) as info:
        strip_answers(src(body), "solutions/bad.py")
    assert "solutions/bad.py:" in str(info.value) and message in str(info.value)


def test_check_reports_drift(tmp_path):
    sol, stu = tmp_path / "solutions", tmp_path / "student"
    sol.mkdir()
    (sol / "mod.py").write_text(src("{B1}\n{BEGIN}\nx = 1\n{END}\n{BE}\n"))
    assert release.main(["--solutions", str(sol), "--out", str(stu)]) == 0
    assert release.main(["--check", "--solutions", str(sol), "--out", str(stu)]) == 0
    (stu / "mod.py").write_text((stu / "mod.py").read_text() + "# edited\n")
    assert release.main(["--check", "--solutions", str(sol), "--out", str(stu)]) == 1
    (sol / "bad.py").write_text(src("{B1}\n{BEGIN}\n"))
    assert release.main(["--solutions", str(sol), "--out", str(stu)]) == 2


# --- What the student writes -----------------------------------------

# The course asks for the kernel, not for a few lines inside one: floors on the solution regions' code.
MIN_SOLUTION_LINES = {"forward.py": 45, "tiled.py": 25, "decode.py": 40}


def test_the_student_writes_the_kernel():
    for name, floor in MIN_SOLUTION_LINES.items():
        lines = stubs.solution_lines((stubs.COMPLETED_DIR / name).read_text())
        count = sum(len(v) for v in lines.values())
        assert count >= floor, f"solutions/{name}: {count} lines of code in the solution regions, fewer than {floor}"


# What a student can read is checked on what a student receives: tests/course/test_edition.py builds the
# student edition and finds no solution line anywhere in it.
