"""`make submission` writes the zip the grader expects, and says what went in, what stayed out and why.

Each test works in a temporary course: the graded files in ``gqa_flash/`` (the
stubs, or the solutions standing in for a student's work) and the stubs'
fingerprints in ``tests/graded/stub_fingerprints.json``, as in the student
edition, where there is no ``solutions/`` to tell a stub by.
"""

import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from gqa_flash.course import impl, layout
from gqa_flash.course.grader import grade, handin, started, stubs, submission
from gqa_flash.course.grader.report import table
from gqa_flash.course.grader.testrun import Limits

SOLUTIONS = impl.SOLUTIONS_DIR
REQUIRED = [f for f in layout.GRADED_FILES if Path(f).stem not in layout.BONUS_MODULES]
BONUS = [f for f in layout.GRADED_FILES if f not in REQUIRED]


def course(root: Path, solved=(), whole: bool = False) -> Path:
    """A course at root: the files named in ``solved`` hold the solutions, the other graded files their stubs.

    ``whole``: the entire package, course.mk and pyproject.toml too, for make and ``python -m``."""
    package = root / "gqa_flash"
    if whole:
        shutil.copytree(layout.PACKAGE_DIR, package, ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("course.mk", "pyproject.toml"):
            shutil.copy2(layout.COURSE_DIR / name, root / name)
    package.mkdir(exist_ok=True)
    for name in layout.GRADED_FILES:
        source = SOLUTIONS / name
        (package / name).write_text(source.read_text() if name in solved else stubs.student_text(source))
    prints = root / started.STUB_PRINTS
    prints.parent.mkdir(parents=True, exist_ok=True)
    prints.write_bytes(started.stub_manifest())
    return package


def hand_in(package: Path, capsys, *args: str) -> tuple[int, str, str]:
    code = handin.main(list(args), package_dir=package)
    out, err = capsys.readouterr()
    return code, out, err


def names_in(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as archive:
        return archive.namelist()


# --- the solutions, handed in and graded ------------------------------------------------


@pytest.fixture(scope="module")
def solved_zip(tmp_path_factory):
    """`make submission` in a course copy whose eight graded files are the solutions: (zip, make's output)."""
    root = tmp_path_factory.mktemp("course")
    course(root, solved=layout.GRADED_FILES, whole=True)
    venv = layout.COURSE_DIR / ".venv"
    env = dict(os.environ, PYTHONPATH=str(root))
    env.pop("GQA_FLASH_IMPL", None)  # the student's files, as make submission sees them
    done = subprocess.run(["make", "--no-print-directory", "-f", "course.mk", "submission", f"VENV={venv}",
                           "-o", f"{venv}/.installed"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return root / handin.DEFAULT_NAME, done.stdout


def test_make_submission_zips_the_seven_files_flat(solved_zip):
    path, out = solved_zip
    assert sorted(names_in(path)) == sorted(layout.GRADED_FILES), out
    with zipfile.ZipFile(path) as archive:
        for name in layout.GRADED_FILES:
            assert archive.read(name) == (SOLUTIONS / name).read_bytes(), name
    sub = submission.read(path)
    assert sorted(sub.files) == sorted(layout.GRADED_FILES) and not sub.notes, sub.notes
    assert "Left out" not in out and "WARNING" not in out, out
    assert f"Wrote {handin.DEFAULT_NAME} ({len(layout.GRADED_FILES)} files)" in out, out
    assert "upload submission.zip to your course's platform" in out, out
    assert all(name in out for name in layout.GRADED_FILES), out


@pytest.mark.timeout(300)
def test_the_grader_scores_the_zip_in_full(solved_zip, tmp_path):
    report = grade.grade(solved_zip[0], only={"naive"}, limits=Limits(timeout_cap_s=60), workdir=tmp_path)
    assert report.error is None and report.tests, table(report)
    assert report.score == pytest.approx(report.worth) and report.score > 0, table(report)
    assert not report.notes and not report.integrity, table(report)


# --- what stays out ---------------------------------------------------------------------


def test_stubs_only_write_no_zip_and_say_nothing_is_started(tmp_path, capsys):
    code, out, err = hand_in(course(tmp_path), capsys)
    assert code == 1 and not out
    assert "nothing to hand in" in err and "No zip written" in err, err
    assert all(name in err for name in layout.GRADED_FILES), err
    assert not (tmp_path / handin.DEFAULT_NAME).exists()


def test_a_started_module_goes_in_and_the_unstarted_bonus_is_left_out_and_named(tmp_path, capsys):
    package = course(tmp_path, solved=["naive.py"])
    with open(package / "decode.py", "a") as f:  # notes in comments do not start a file
        f.write("\n# TODO: the split-K loop, after forward.py\n")
    code, out, err = hand_in(package, capsys)
    assert code == 0, err
    assert names_in(tmp_path / handin.DEFAULT_NAME) == ["naive.py"]
    left_out = out[out.index("Left out"):out.index("Wrote")]
    for name in ["online_softmax.py", "tiled.py", "forward.py", *BONUS]:
        line = next((line for line in left_out.splitlines() if line.split()[:1] == [name]), None)
        assert line is not None and "not started" in line, out
        assert ("bonus" in line) == (name in BONUS), line
    assert "naive.py" not in left_out, out


def test_a_syntax_error_warns_loudly_but_still_goes_in(tmp_path, capsys):
    package = course(tmp_path, solved=["naive.py", "tiled.py"])
    with open(package / "tiled.py", "a") as f:
        f.write("\nif True\n    pass\n")
    code, out, _ = hand_in(package, capsys)
    assert code == 0
    assert sorted(names_in(tmp_path / handin.DEFAULT_NAME)) == ["naive.py", "tiled.py"]
    warning = out[out.index("WARNING"):]
    assert "gqa_flash/tiled.py does not compile (line " in warning and "SyntaxError" in warning, out
    assert "score 0 for tiled.py" in warning, out


def test_a_missing_file_is_named(tmp_path, capsys):
    package = course(tmp_path, solved=["naive.py"])
    (package / "forward.py").unlink()
    code, out, _ = hand_in(package, capsys)
    assert code == 0 and "missing: no gqa_flash/forward.py" in out, out


def test_out_takes_a_zip_or_a_folder(tmp_path, capsys):
    package = course(tmp_path, solved=["naive.py"])
    folder = tmp_path / "handed"
    folder.mkdir()
    assert hand_in(package, capsys, "--out", str(folder))[0] == 0
    assert names_in(folder / handin.DEFAULT_NAME) == ["naive.py"]
    assert hand_in(package, capsys, "--out", str(tmp_path / "mine.zip"))[0] == 0
    assert names_in(tmp_path / "mine.zip") == ["naive.py"]
    code, _, err = hand_in(package, capsys, "--out", str(tmp_path / "mine.tar"))
    assert code == 2 and "ending in .zip" in err, err
