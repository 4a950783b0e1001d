"""Submissions as they arrive: what the grader takes from each, and the one note that says so.

Each kind the instructor's trial met is built here in tmp_path and read with
``submission.read`` (no test is run, so these are fast): the names learning
platforms give files in a bulk download, a graded name at the end of a longer
one, files that are not graded (each named, with the graded name it probably
meant), a zip of a whole course folder, a notebook or nothing at all (the grader
stops at once), unicode names and a zip inside a zip.
"""

from __future__ import annotations

import unicodedata
import zipfile
from pathlib import Path

from gqa_flash.course import layout
from gqa_flash.course.grader import downloads, report, submission

NAIVE = b"def naive_attention(q, k, v, causal=True, sm_scale=None):\n    return q\n"
TILED = b"def tiled_attention(q, k, v, causal=True, sm_scale=None):\n    return q\n"
FORWARD = b"def flash_attention_forward(q, k, v, causal=True, sm_scale=None, return_lse=False):\n    return q\n"


def make_zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, content in members.items():
            z.writestr(name, content)
    return path


def make_folder(path: Path, files: dict[str, bytes]) -> Path:
    for rel, content in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_bytes(content)
    return path


def notes_of(sub: submission.Submission) -> str:
    return "\n".join(sub.notes)


# --- learning platforms' names ---------------------------------------------------------------


def test_canvas_names_are_graded_as_their_files(tmp_path):
    sub = submission.read(make_zip(tmp_path / "submissions.zip", {
        "garciajose_12345_678901_naive.py": NAIVE,
        "garciajose_LATE_12345_678901_tiled-1.py": TILED,  # late, and re-submitted once
        "garciajose_12345_678901_forward.py": b"old = 1\n",
        "garciajose_12345_678901_forward-2.py": FORWARD,  # the second re-submission: the latest
    }))
    assert sub.files == {"naive.py": NAIVE, "tiled.py": TILED, "forward.py": FORWARD}, sub.notes
    notes = notes_of(sub)
    assert "graded garciajose_12345_678901_naive.py as naive.py (a Canvas download name)" in notes
    assert ("graded garciajose_LATE_12345_678901_tiled-1.py as tiled.py "
            "(a Canvas download name, -1 marking a re-submission)") in notes
    assert ("found 2 files for forward.py: graded garciajose_12345_678901_forward-2.py (the latest re-submission), "
            "ignored garciajose_12345_678901_forward.py") in notes
    assert sub.stop is None


def test_a_run_of_some_modules_names_only_their_files(tmp_path):
    # --only naive: the notes named the Canvas download names of tiled.py and forward.py too, which that run
    # never graded.
    sub = submission.read(make_zip(tmp_path / "submissions.zip", {
        "garciajose_12345_678901_naive.py": NAIVE,
        "garciajose_LATE_12345_678901_tiled-1.py": TILED,
        "garciajose_12345_678901_forward.py": b"old = 1\n",
        "garciajose_12345_678901_forward-2.py": FORWARD,
    }), expected=["naive.py"])
    assert sub.files == {"naive.py": NAIVE}, sub.notes
    notes = notes_of(sub)
    assert "as naive.py (a Canvas download name)" in notes
    assert "tiled" not in notes and "forward" not in notes, notes


def test_moodle_folders_and_names(tmp_path):
    folder = "José García_12345_assignsubmission_file_"
    sub = submission.read(make_folder(tmp_path / "moodle", {
        f"{folder}/naive.py": NAIVE,  # "download submissions in folders": the student's own names
        "José García_12345_assignsubmission_file_tiled.py": TILED,  # without folders: a prefix
        "José García_12345_assignsubmission_onlinetext_onlinetext.html": b"<p>see my files</p>",
    }))
    assert sub.files == {"naive.py": NAIVE, "tiled.py": TILED}, sub.notes
    notes = notes_of(sub)
    assert "graded José García_12345_assignsubmission_file_tiled.py as tiled.py (a Moodle download name)" in notes
    assert "ignored José García_12345_assignsubmission_onlinetext_onlinetext.html: only naive.py," in notes
    assert "students'" not in notes, "one student's files, in a folder and by prefix"


def test_blackboard_names(tmp_path):
    name = "Assignment 1_jgarcia_attempt_2026-12-01-10-00-00_naive.py"
    sub = submission.read(make_folder(tmp_path / "bb", {
        name: NAIVE, "Assignment 1_jgarcia_attempt_2026-12-01-10-00-00.txt": b"Name: Jose Garcia\n"}))
    assert sub.files == {"naive.py": NAIVE}
    assert f"graded {name} as naive.py (a Blackboard download name)" in notes_of(sub)
    assert "ignored Assignment 1_jgarcia_attempt_2026-12-01-10-00-00.txt: only naive.py" in notes_of(sub)


def test_one_file_handed_in_under_a_platforms_name(tmp_path):
    path = tmp_path / "garciajose_12345_678901_naive.py"
    path.write_bytes(NAIVE)
    sub = submission.read(path, expected=("naive.py",))
    assert sub.files == {"naive.py": NAIVE} and sub.stop is None


def test_several_students_files_in_one_submission_are_pointed_out(tmp_path):
    sub = submission.read(make_folder(tmp_path / "canvas", {
        "garciajose_12345_678901_naive.py": NAIVE, "smithanna_23456_789012_naive.py": NAIVE}))
    assert "these files are 2 students' (garciajose, smithanna): grade each student's files" in notes_of(sub)


# --- a graded name at the end of a longer one ----------------------------------------------------


def test_a_graded_name_at_the_end_counts_and_the_exact_name_wins(tmp_path):
    sub = submission.read(make_folder(tmp_path / "sub", {
        "l_single_naive.py": NAIVE,
        "forward.py": FORWARD, "fast_forward.py": b"faster = 1\n",  # two claim forward.py: the exact name wins
        "test_tiled.py": b"def test_it():\n    pass\n",  # a test file, never the graded file
    }))
    assert sub.files == {"naive.py": NAIVE, "forward.py": FORWARD}, sub.notes
    notes = notes_of(sub)
    assert "graded l_single_naive.py as naive.py (its name ends with naive.py)" in notes
    assert "found 2 files for forward.py: graded forward.py (its exact name), ignored fast_forward.py" in notes
    assert "ignored test_tiled.py: not a graded file name (did you mean tiled.py?)" in notes


# --- every ignored file named ------------------------------------------------------------------


def test_every_ignored_file_is_named_with_its_nearest_graded_name(tmp_path):
    members = {
        "hw/Naive.py": NAIVE,
        "hw/my_tiled_test.py": TILED,
        "hw/forward.py.txt": FORWARD,  # Windows hid the .txt
        "hw/forward (1).py": FORWARD,
        "hw/notes.txt": b"it works\n", "hw/report.pdf": b"%PDF",
        "__MACOSX/hw/._Naive.py": b"\0", "hw/.DS_Store": b"\0",  # junk: skipped without a word
    }
    sub = submission.read(make_zip(tmp_path / "alice.zip", {**members, "hw/decode.py": b"x = 1\n"}))
    assert list(sub.files) == ["decode.py"]
    notes = notes_of(sub)
    for name, near in (("hw/Naive.py", "naive.py"), ("hw/my_tiled_test.py", "tiled.py"),
                       ("hw/forward.py.txt", "forward.py"), ("hw/forward (1).py", "forward.py")):
        assert f"ignored {name}: not a graded file name (did you mean {near}?)" in notes, notes
    assert "ignored hw/notes.txt, hw/report.pdf: only naive.py, online_softmax.py" in notes
    assert "MACOSX" not in notes and "DS_Store" not in notes
    # Nothing graded: the line that stops the grader names the misnamed files itself, and what to hand in.
    sub = submission.read(make_zip(tmp_path / "bob.zip", members))
    assert sub.stop == ("nothing to grade: no graded file found (expected naive.py, online_softmax.py, tiled.py, "
                        "forward.py, windows.py, backward.py, decode.py, ring.py) among its 6 files; hw/Naive.py is "
                        "not named "
                        "naive.py; hw/my_tiled_test.py is not named tiled.py; hw/forward.py.txt is not named "
                        "forward.py; hw/forward (1).py is not named forward.py; hand in gqa_flash/naive.py, "
                        "gqa_flash/tiled.py, "
                        "gqa_flash/forward.py (your graded files), e.g. with make submission"), sub.stop
    assert sub.notes == ["ignored hw/notes.txt, hw/report.pdf: only naive.py, online_softmax.py, tiled.py, "
                         "forward.py, windows.py, backward.py, decode.py, ring.py are graded", sub.stop], sub.notes


def test_a_near_name_beside_the_graded_file_says_which_was_graded(tmp_path):
    sub = submission.read(make_folder(tmp_path / "sub", {"naive.py": NAIVE, "naive_old.py": b"x = 1\n"}))
    assert sub.files == {"naive.py": NAIVE}
    assert "ignored naive_old.py: not a graded file name; naive.py is graded from naive.py" in notes_of(sub)


# --- a whole course folder ----------------------------------------------------------------------


def course_folder_members(top: str) -> dict[str, bytes]:
    """A zip of a student's whole course folder: the package (its graded files the student's), the tests,
    the notebooks, and other copies of the graded names (the fast kernels, the mutants)."""
    members = {}
    for path in sorted(layout.PACKAGE_DIR.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            members[f"{top}/gqa_flash/{path.relative_to(layout.PACKAGE_DIR).as_posix()}"] = b"# the course's\n"
    for name in layout.GRADED_FILES:
        members[f"{top}/gqa_flash/{name}"] = f"student_{name[:-3]} = 1\n".encode()
        members[f"{top}/tests/graded/test_{name}"] = b"# a graded test\n"
        members[f"{top}/tests/mutants/{name}"] = b"# a mutant\n"
    for path in sorted(layout.NOTEBOOKS_DIR.glob("*.ipynb")):
        members[f"{top}/notebooks/{path.name}"] = b"{}"
    members[f"{top}/README.md"] = b"# gqa-flash\n"
    return members


def test_a_whole_course_folder_takes_the_packages_files_in_one_line(tmp_path):
    members = course_folder_members("gqa-flash-main")
    sub = submission.read(make_zip(tmp_path / "everything.zip", members))
    assert sub.files == {name: f"student_{name[:-3]} = 1\n".encode() for name in layout.GRADED_FILES}
    ignored = len(members) - len(layout.GRADED_FILES)
    assert sub.notes == [f"a whole course folder: graded {', '.join(layout.GRADED_FILES)} from its package "
                         f"gqa-flash-main/gqa_flash/, ignored its other {ignored} files"], sub.notes
    assert sub.stop is None


# --- nothing to grade: stop at once -------------------------------------------------------------


def test_a_notebook_alone_stops_with_what_to_hand_in(tmp_path):
    sub = submission.read(make_zip(tmp_path / "alice.zip", {"naive_attention.ipynb": b"{}"}))
    assert sub.files == {}
    assert sub.stop == ("naive_attention.ipynb is a notebook: notebooks are not graded; "
                        "hand in gqa_flash/naive.py (your graded file), e.g. with make submission")
    assert sub.notes[-1] == sub.stop and len(sub.notes) == 1, "one note, not one per part"
    # Handed in alone, not zipped: the same.
    notebook = tmp_path / "04_triton_kernel.ipynb"
    notebook.write_bytes(b"{}")
    assert "hand in gqa_flash/forward.py (your graded file)" in submission.read(notebook).stop


def test_a_notebook_beside_graded_files_is_named_not_a_stop(tmp_path):
    sub = submission.read(make_folder(tmp_path / "sub", {"naive.py": NAIVE, "03_tiled_attention.ipynb": b"{}"}))
    assert sub.stop is None and sub.files == {"naive.py": NAIVE}
    assert "ignored 03_tiled_attention.ipynb: notebooks are not graded; hand in gqa_flash/tiled.py" in notes_of(sub)


def test_an_empty_zip_stops(tmp_path):
    expected = ("naive.py", "tiled.py")
    sub = submission.read(make_zip(tmp_path / "empty.zip", {}), expected=expected)
    assert sub.stop == ("empty.zip is empty: no graded file found (expected naive.py, tiled.py); hand in "
                        "gqa_flash/naive.py, gqa_flash/tiled.py (your graded files), e.g. with make submission")
    # Every module: the bonus files are asked for only if started, as the README says (it listed all of them).
    whole = submission.read(make_zip(tmp_path / "erin.zip", {}))
    assert whole.stop.endswith("hand in gqa_flash/naive.py, gqa_flash/online_softmax.py, gqa_flash/tiled.py, "
                               "gqa_flash/forward.py (your graded files), and each bonus file you started "
                               "(windows.py, backward.py, decode.py, ring.py), e.g. with make submission"), whole.stop
    # The review column cuts it at a word, never inside the open parenthesis of the expected files.
    assert report.short(whole.stop) == "erin.zip is empty: no graded file found…"
    junk = submission.read(make_zip(tmp_path / "junk.zip", {"__MACOSX/._x": b"\0", ".DS_Store": b"\0"}))
    assert junk.stop is not None and junk.stop.startswith("junk.zip is empty")
    broken = tmp_path / "broken.zip"
    broken.write_bytes(b"not a zip")
    sub = submission.read(broken)
    assert sub.notes[0].startswith("broken.zip is not a readable zip file") and sub.stop.startswith("nothing to grade")


def test_the_working_copy_never_stops():
    assert submission.read(None).stop is None


# --- unicode, nested zips, CRLF -----------------------------------------------------------------


def clear_utf8_flags(path: Path) -> None:
    """Rewrite a zip as macOS's Archive Utility writes one: UTF-8 names, not marked UTF-8 (zipfile reads cp437)."""
    data = bytearray(path.read_bytes())
    for signature, flag_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        start = 0
        while (start := data.find(signature, start)) >= 0:
            data[start + flag_at + 1] &= ~0x08  # bit 11 of the little-endian flags
            start += 4
    path.write_bytes(bytes(data))


def test_unicode_names(tmp_path):
    nfd = unicodedata.normalize("NFD", "Zoë Müller_23456_assignsubmission_file_")
    path = make_zip(tmp_path / "Zoë.zip", {f"{nfd}/naive.py": NAIVE, "Zoë/Tiled.py": TILED})
    clear_utf8_flags(path)
    sub = submission.read(path)
    assert sub.files == {"naive.py": NAIVE}
    assert "ignored Zoë/Tiled.py: not a graded file name (did you mean tiled.py?)" in notes_of(sub), sub.notes
    sub = submission.read(make_folder(tmp_path / "José García", {"José_naive.py": NAIVE}))
    assert sub.files == {"naive.py": NAIVE} and sub.name.endswith("José García")
    assert "graded José_naive.py as naive.py (its name ends with naive.py)" in notes_of(sub)


def test_a_zip_inside_a_zip(tmp_path):
    inner = make_zip(tmp_path / "inner.zip", {"hw3/naive.py": NAIVE, "__MACOSX/hw3/._naive.py": b"\0"})
    outer = make_zip(tmp_path / "outer.zip", {"alice.zip": inner.read_bytes(), "alice/README.md": b"hi"})
    sub = submission.read(outer, expected=("naive.py",))
    assert sub.files == {"naive.py": NAIVE}, sub.notes
    assert sub.notes == ["ignored alice/README.md: only naive.py, online_softmax.py, tiled.py, forward.py, "
                         "windows.py, backward.py, decode.py, ring.py are graded"], sub.notes
    # A Moodle folder holding the student's zip: read the same way.
    folder = make_folder(tmp_path / "José García_12345_assignsubmission_file_", {"hw.zip": inner.read_bytes()})
    assert submission.read(folder).files == {"naive.py": NAIVE}
    # Zips nested deeper than anyone hands in are named and skipped.
    deep = inner.read_bytes()
    for n in range(3):
        deep = make_zip(tmp_path / f"deep{n}.zip", {f"level{n}.zip": deep}).read_bytes()
    sub = submission.read(tmp_path / "deep2.zip")
    assert sub.files == {} and "skipped level2.zip/level1.zip/level0.zip: a zip 3 zips deep" in notes_of(sub)


def test_crlf_and_a_byte_order_mark_are_read_as_they_are(tmp_path):
    crlf = b"\xef\xbb\xbf" + NAIVE.replace(b"\n", b"\r\n")
    sub = submission.read(make_zip(tmp_path / "win.zip", {"HW\\naive.py": crlf}), expected=("naive.py",))
    assert sub.files == {"naive.py": crlf} and sub.notes == [], sub.notes


# --- who handed it in: the student a platform's names give ---------------------------------------


def test_a_platforms_names_say_the_student_their_id_and_whether_it_was_late(tmp_path):
    Student = submission.Student
    canvas = submission.read(make_zip(tmp_path / "hw.zip", {"garciajose_LATE_12345_678901_naive.py": NAIVE,
                                                            "garciajose_LATE_12345_678902_tiled.py": TILED}))
    assert canvas.student == Student("garciajose", "12345", True, "Canvas")
    on_time = submission.read(make_zip(tmp_path / "on_time.zip", {"leekim_34567_890123_naive.py": NAIVE}))
    assert on_time.student == Student("leekim", "34567", False, "Canvas")
    # A Moodle folder handed to the grader as it is, or zipped with the student's files in it.
    moodle = make_folder(tmp_path / "José García_12345_assignsubmission_file_", {"naive.py": NAIVE})
    assert submission.read(moodle).student == Student("José García", "12345", None, "Moodle")
    zipped = make_zip(tmp_path / "z.zip", {"Zoë Müller_23456_assignsubmission_file_/naive.py": NAIVE})
    assert submission.read(zipped).student == Student("Zoë Müller", "23456", None, "Moodle")
    blackboard = make_folder(tmp_path / "bb", {"Assignment 1_jgarcia_attempt_2026-12-01-10-00-00_naive.py": NAIVE})
    assert submission.read(blackboard).student == Student("jgarcia", "jgarcia", None, "Blackboard")
    # No platform's name, or two students: no one in particular.
    assert submission.read(make_folder(tmp_path / "alice", {"naive.py": NAIVE})).student is None
    two = submission.read(make_folder(tmp_path / "two", {"smithjohn_12345_678901_naive.py": NAIVE,
                                                         "smithjohn_23456_789012_tiled.py": TILED}))
    assert two.student is None
    assert ("these files are 2 students' (smithjohn (12345), smithjohn (23456)): grade each student's files as a "
            "submission of its own") in notes_of(two)


def test_a_download_is_split_by_student_their_id_and_lateness_kept(tmp_path):
    canvas = make_zip(tmp_path / "canvas.zip", {
        "garciajose_12345_678901_naive.py": NAIVE,
        "smithjohn_LATE_23456_789012_naive.py": NAIVE, "smithjohn_LATE_23456_789013_tiled.py": TILED,
        "smithjohn_34567_890123_naive.py": NAIVE,  # another John Smith: his own submission
    })
    pieces, line = downloads.split(canvas, tmp_path / "split")
    assert [(p.who, p.name, p.student.user_id, p.student.late) for p in pieces] == [
        ("garciajose", "canvas.zip#garciajose", "12345", False),
        ("smithjohn_23456", "canvas.zip#smithjohn_23456", "23456", True),
        ("smithjohn_34567", "canvas.zip#smithjohn_34567", "34567", False)]
    assert line == (f"{canvas}: a Canvas download: 3 students (garciajose, smithjohn_23456, smithjohn_34567), "
                    "each graded as a submission of its own")
    assert sorted(p.name for p in pieces[1].folder.iterdir()) == ["smithjohn_LATE_23456_789012_naive.py",
                                                                  "smithjohn_LATE_23456_789013_tiled.py"]


def test_a_download_with_a_zip_that_cannot_be_read_keeps_every_student(tmp_path):
    # smithann's only file was a corrupt zip: the download was not split, and the one row was garciajose's,
    # with smithann's file in its notes. Each student now has a row; smithann's says the zip cannot be read.
    canvas = make_zip(tmp_path / "canvas.zip", {"garciajose_12345_678901_naive.py": NAIVE,
                                                "smithann_LATE_23456_789012_work.zip": b"PK\x03\x04 truncated"})
    pieces, line = downloads.split(canvas, tmp_path / "split")
    assert [(p.who, p.student.late) for p in pieces] == [("garciajose", False), ("smithann", True)], line
    assert "not a readable zip" in notes_of(submission.read(pieces[1].folder))


def test_a_download_that_is_not_a_zip_is_one_submission_that_says_so(tmp_path):
    # A truncated download (or any file named .zip) stopped the whole batch: "zipfile.BadZipFile: File is not a
    # zip file", from downloads.py. It is now one submission, graded as nothing, whose note says why.
    broken = tmp_path / "canvas.zip"
    broken.write_bytes(b"PK\x03\x04 cut short")
    assert downloads.split(broken, tmp_path / "split") is None
    assert "not a readable zip" in notes_of(submission.read(broken))


# --- the routine notes ------------------------------------------------------------------------------


def test_a_bonus_not_handed_in_is_a_note_of_its_own(tmp_path):
    required = {"naive.py": NAIVE, "online_softmax.py": b"x = 1\n", "tiled.py": TILED, "forward.py": FORWARD}
    sub = submission.read(make_folder(tmp_path / "all", required))
    assert sub.notes == ["bonus not handed in: windows.py, backward.py, decode.py, ring.py (graded as the stubs: "
                         "no bonus points)"], sub.notes
    sub = submission.read(make_folder(tmp_path / "some", {"naive.py": NAIVE, "decode.py": b"x = 1\n"}))
    assert sub.notes == ["missing online_softmax.py, tiled.py, forward.py: graded as the unmodified stub",
                         "bonus not handed in: windows.py, backward.py, ring.py (graded as the stubs: no bonus "
                         "points)"]
    sub = submission.read(make_folder(tmp_path / "one", {"naive.py": NAIVE}), expected=("naive.py",))
    assert sub.notes == []


def test_a_whole_course_folders_stubs_are_not_called_graded(tmp_path):
    members = course_folder_members("gqa-flash-main")
    for name in ("tiled.py", *(f"{m}.py" for m in layout.BONUS_MODULES)):  # as the course handed them out
        members[f"gqa-flash-main/gqa_flash/{name}"] = (layout.PACKAGE_DIR / name).read_bytes()
    sub = submission.read(make_zip(tmp_path / "everything.zip", members))
    ignored = len(members) - len(layout.GRADED_FILES)
    assert sub.notes == [f"a whole course folder: graded naive.py, online_softmax.py, forward.py from its package "
                         f"gqa-flash-main/gqa_flash/, ignored its other {ignored} files; tiled.py is still the stub "
                         "handed out: not started; not graded: windows.py, backward.py, decode.py, ring.py, still "
                         "the stubs "
                         "handed out (bonus not started)"], sub.notes
