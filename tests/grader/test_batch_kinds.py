"""A batch of the kinds of submission an instructor's trial met, graded right, each with one readable note.

One real batch (``--only naive``, the solutions' naive.py as every student's work): a file under a learning
platform's name, a zip of a whole course folder, a notebook alone, an empty zip, a unicode name, a zip inside
a zip, and a Canvas bulk download of two students, split into a submission each. Each submission with
naive.py scores 20 / 20; the notebook and the empty zip score 0 at once, with no test run; each row names its
student as a gradebook needs (the platform's name and id, late or not). Two more tests, with the test run faked
(only the bookkeeping is checked), regrade one student of a download by name and name Moodle's folders after
their students.
"""

import csv
import io
import json
import zipfile
from pathlib import Path

from gqa_flash.course import impl, layout
from gqa_flash.course.grader import cli, plugin, submission, testrun
from gqa_flash.course.grader.testrun import TestResult as Result

NAIVE = (impl.SOLUTIONS_DIR / "naive.py").read_bytes()
COURSE_FILES = submission.COURSE_FILES  # the course's own files in its package, beside the graded ones


def make_zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, content in members.items():
            z.writestr(name, content)
    return path


def zipped(members: dict[str, bytes]) -> bytes:
    """A zip's bytes, to go inside another."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, content in members.items():
            z.writestr(name, content)
    return buffer.getvalue()


def the_kinds(root: Path) -> dict[str, Path]:
    """Every kind of submission, built under root: {what it is: the path the grader is given}."""
    root.mkdir()
    course_files = {f"gqa-flash-main/gqa_flash/{name}": (layout.PACKAGE_DIR / name).read_bytes()
                    for name in COURSE_FILES | set(layout.GRADED_FILES) - {"naive.py"}}  # the stubs as given
    (root / "leekim_34567_890123_naive.py").write_bytes(NAIVE)
    return {
        "platform": root / "leekim_34567_890123_naive.py",
        "course folder": make_zip(root / "course.zip", {**course_files, "gqa-flash-main/README.md": b"# course\n",
                                                        "gqa-flash-main/gqa_flash/naive.py": NAIVE}),
        "notebook": make_zip(root / "notebook.zip", {"01_naive_attention.ipynb": b'{"cells": []}'}),
        "empty": make_zip(root / "empty.zip", {}),
        "unicode": make_zip(root / "José García.zip", {"José García/naive.py": NAIVE}),
        "zip in zip": make_zip(root / "outer.zip", {"hw1/inner.zip": zipped({"naive.py": NAIVE})}),
        "canvas": make_zip(root / "canvas.zip", {"garciajose_12345_678901_naive.py": NAIVE,
                                                 "smithann_LATE_23456_789012_naive.py": NAIVE}),
    }


def test_a_batch_of_every_kind_is_graded_right_with_one_readable_note_each(tmp_path, capsys):
    kinds = the_kinds(tmp_path / "in")
    out, book = tmp_path / "results", tmp_path / "grades.csv"
    assert cli.main([*map(str, kinds.values()), "--only", "naive", "--csv", str(book), "--out", f"{out}/",
                       "--jobs", "2", "--test-timeout-cap", "60", "--workdir", str(tmp_path)]) == 0
    printed = capsys.readouterr()
    canvas = kinds["canvas"]
    assert (f"{canvas}: a Canvas download: 2 students (garciajose, smithann), each graded as a submission of "
            "its own") in printed.err
    rows = {r["path"]: r for r in csv.DictReader(book.open(encoding="utf-8"))}
    name = {kind: str(path) for kind, path in kinds.items() if kind != "canvas"}
    name |= {"garciajose": f"{canvas}#garciajose", "smithann": f"{canvas}#smithann"}
    assert sorted(rows) == sorted(name.values())
    row = {kind: rows[n] for kind, n in name.items()}
    # Each row names its submission as it came, not the path typed, and its student for a gradebook: the
    # platform's name and id, and whether Canvas marked it late.
    assert {kind: (r["submission"], r["student"], r["user_id"], r["late"]) for kind, r in row.items()} == {
        "platform": ("leekim_34567_890123_naive.py", "leekim", "34567", "no"),
        "course folder": ("course.zip", "course", "", ""), "notebook": ("notebook.zip", "notebook", "", ""),
        "empty": ("empty.zip", "empty", "", ""), "unicode": ("José García.zip", "José García", "", ""),
        "zip in zip": ("outer.zip", "outer", "", ""),
        "garciajose": ("canvas.zip#garciajose", "garciajose", "12345", "no"),
        "smithann": ("canvas.zip#smithann", "smithann", "23456", "yes")}

    def note(kind: str) -> str:
        assert " | " not in row[kind]["notes"], row[kind]["notes"]  # one note
        return row[kind]["notes"]

    for kind in ("platform", "course folder", "unicode", "zip in zip", "garciajose", "smithann"):
        assert (row[kind]["score"], row[kind]["naive"], row[kind]["max_score"]) == ("20", "20", "20"), row[kind]
    # A platform's name: graded as naive.py, and worth a look when it is not part of a download.
    assert note("platform") == "graded leekim_34567_890123_naive.py as naive.py (a Canvas download name)"
    assert row["platform"]["review"] == "a file graded under another name"
    # A whole course folder: one line, not a note per course file. This run grades naive.py only: the folder's
    # other graded files (here its stubs) are not named (tests/grader/test_intake.py: a whole run names them).
    assert note("course folder") == (
        f"a whole course folder: graded naive.py from its package gqa-flash-main/gqa_flash/, ignored its other "
        f"{len(COURSE_FILES) + 1} files")
    # A notebook, an empty zip: 0 at once, with the stop note saying what to hand in; no test ran.
    assert note("notebook") == ("01_naive_attention.ipynb is a notebook: notebooks are not graded; hand in "
                                "gqa_flash/naive.py (your graded file), e.g. with make submission")
    assert note("empty").startswith("empty.zip is empty: no graded file found (expected naive.py); hand in "
                                    "gqa_flash/naive.py")
    for kind in ("notebook", "empty"):
        assert row[kind]["score"] == "0" and row[kind]["review"].startswith("nothing graded: ")
        assert int(row[kind]["seconds"]) < 5
    # Unicode: the results file keeps the name, and records its submission.
    assert Path(row["unicode"]["results"]).name == "José García.json" and note("unicode") == ""
    # A zip inside a zip is read as the files it holds.
    assert note("zip in zip") == ""
    # A Canvas download: a row per student, named after them, their results file too; Canvas's names are
    # how a download's files arrive, so they are noted but need no second look.
    for who in ("garciajose", "smithann"):
        assert Path(row[who]["results"]).name == f"{who}.json" and row[who]["review"] == ""
        assert "(a Canvas download name)" in note(who) and note(who).startswith(f"graded {who}_")
    for r in rows.values():
        results = json.loads(Path(r["results"]).read_text(encoding="utf-8"))
        assert results["submission"] == r["submission"] and results["score"] == float(r["score"])
    # The mean leaves out the notebook and the empty zip (it was 15 / 20 with their zeros).
    assert printed.out.splitlines()[:2] == [
        "graded 8 submissions; 3 need a second look (the CSV's review column)",
        "mean 20 of the 20 points of the modules run over the 6 submissions with something to grade; 2 held "
        "nothing to grade (0 points each) and are left out"]


def fake_run(calls: list):
    """A test run that passes naive's three cases whatever the file; records the file of each run."""
    def run(course, files, workdir, test_files, limits=None):
        calls.append(files.get("naive.py"))
        return testrun.RunReport(runs=1, tests=[
            Result(id=f"tests/graded/test_naive.py::test_case[{i}]", part="naive", name=f"test_case[{i}]",
                       max_score=share, passed=True) for i, share in enumerate(plugin.shares(20, 3))])
    return run


def test_one_student_of_a_download_is_regraded_by_name(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(testrun, "run_tests", fake_run(calls))
    canvas = make_zip(tmp_path / "canvas.zip", {"garciajose_12345_678901_naive.py": b"# garcia\n",
                                                "smithann_23456_789012_naive.py": b"# smith\n"})
    book = tmp_path / "grades.csv"
    args = ["--only", "naive", "--csv", str(book), "--out", f"{tmp_path / 'results'}/"]
    assert cli.main([str(canvas), *args]) == 0 and len(calls) == 2  # alone, a download is a batch
    assert cli.main([str(canvas), *args, "--regrade", "garciajose"]) == 0 and calls[2:] == [b"# garcia\n"]
    # With no submission given, the CSV's: its DOWNLOAD#STUDENT names are split from the download again.
    assert cli.main([*args, "--regrade", "canvas.zip#smithann"]) == 0 and calls[3:] == [b"# smith\n"]
    assert [(r["submission"], r["path"]) for r in csv.DictReader(book.open(encoding="utf-8"))] == [
        ("canvas.zip#garciajose", f"{canvas}#garciajose"), ("canvas.zip#smithann", f"{canvas}#smithann")]
    assert "graded 2 submissions (1 now, 1 in an earlier run);" in capsys.readouterr().out
    # One student's platform-named files stay one submission.
    one = make_zip(tmp_path / "one.zip", {"garciajose_12345_678901_naive.py": b"# garcia\n",
                                          "garciajose_12345_678901_tiled.py": b"# garcia\n"})
    assert cli.main([str(one), "--only", "naive"]) == 0 and "a Canvas download" not in capsys.readouterr().err


def test_moodle_folders_are_named_after_their_students(tmp_path, monkeypatch, capsys):
    """Moodle's 'download submissions in folders', passed as submissions/*/: each row and results file is named
    after its student (as a Canvas download's are), with Moodle's participant id, and a regrade by name finds it."""
    calls = []
    monkeypatch.setattr(testrun, "run_tests", fake_run(calls))
    folders = []
    for who, number in (("José García", "12345"), ("Zoë Müller", "23456")):
        folder = tmp_path / "moodle" / f"{who}_{number}_assignsubmission_file_"
        folder.mkdir(parents=True)
        (folder / "naive.py").write_bytes(f"# {who}\n".encode())
        folders.append(folder)
    book, out = tmp_path / "grades.csv", tmp_path / "results"
    args = ["--only", "naive", "--csv", str(book), "--out", f"{out}/"]
    assert cli.main([*map(str, folders), *args]) == 0
    rows = list(csv.DictReader(book.open(encoding="utf-8")))
    assert [(r["student"], r["user_id"], r["late"], r["submission"], r["path"]) for r in rows] == [
        ("José García", "12345", "", "José García_12345_assignsubmission_file_", str(folders[0])),
        ("Zoë Müller", "23456", "", "Zoë Müller_23456_assignsubmission_file_", str(folders[1]))]
    assert sorted(p.name for p in out.iterdir()) == ["José García.json", "Zoë Müller.json"]
    assert cli.main([*args, "--regrade", "Zoë Müller"]) == 0 and calls[2:] == ["# Zoë Müller\n".encode()]
