"""A batch on the terminal, as the instructor reads it: a line when it starts and as each submission starts and
is graded ([graded/all], the time so far, the time left), the routine notes left off the lines, and a summary
whose mean is of the required points over the submissions that held something to grade.

The test runs are faked (only what the grader prints is checked) and the clock too, where times are read.
"""

import io
import zipfile

from gqa_flash.course.grader import cli, plugin, progress, report, submission, testrun
from gqa_flash.course.grader.testrun import TestResult as Result
from gqa_flash.course.testing import folder

BONUS_NOTE = ("bonus not handed in: windows.py, backward.py, decode.py, ring.py (graded as the stubs: no bonus "
              "points)")


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_each_line_says_how_far_the_batch_is_and_how_long_it_has_left():
    clock, out = Clock(), io.StringIO()
    lines = progress.Progress(4, jobs=2, stream=out, clock=clock)
    lines.begin()
    lines.started("a", "alice.zip")
    lines.started("b", "bob.zip")
    clock.now = 100
    lines.done("a", "    80 / 100  alice.zip")
    lines.started("c", "carol.zip")
    clock.now = 130
    lines.done("b", "   100 / 100  bob.zip")
    lines.started("d", "dan.zip")
    clock.now = 3700
    lines.done("c", "ERROR  carol.zip")
    lines.done("d", "    20 / 100  dan.zip")
    assert out.getvalue().splitlines() == [
        "grading 4 submissions, 2 at a time: a line as each starts and as each is graded",
        "[0/4] started alice.zip  (0 s so far)",
        "[0/4] started bob.zip  (0 s so far)",
        # one took 100 s: bob has used all of it, carol and dan wait; 200 s of work, two at a time
        "[1/4]     80 / 100  alice.zip  (1 min 40 s so far, about 2 min left)",
        "[1/4] started carol.zip  (1 min 40 s so far, about 2 min left)",
        "[2/4]    100 / 100  bob.zip  (2 min 10 s so far, about 2 min left)",
        "[2/4] started dan.zip  (2 min 10 s so far, about 2 min left)",
        "[3/4] ERROR  carol.zip  (1 h 01 min so far, under a minute left)",
        "[4/4]     20 / 100  dan.zip  (1 h 01 min so far)"]
    assert progress.duration(59.4) == "59 s" and progress.duration(61) == "1 min 01 s"
    assert progress.about(20) == "under a minute" and progress.about(95 * 60) == "about 1 h 35 min"


def graded(notes=(), platform=None, score=True) -> report.Report:
    tests = [Result(id="tests/graded/test_naive.py::t", part="naive", name="t", max_score=20, passed=score)]
    return report.Report("alice.zip", tests=tests, notes=list(notes), files=["naive.py"], platform=platform)


def test_the_routine_notes_are_left_off_a_submissions_line():
    assert progress.progress_line(graded([BONUS_NOTE])) == "    20 / 20  alice.zip"
    canvas = "graded garciajose_12345_678901_naive.py as naive.py (a Canvas download name)"
    assert progress.progress_line(graded([canvas, BONUS_NOTE], platform="Canvas")) == "    20 / 20  alice.zip"
    # Handed in alone under Canvas's name, it is no download: a note, and worth a look.
    assert progress.progress_line(graded([canvas, BONUS_NOTE])) == (
        "    20 / 20  alice.zip  (1 note)  LOOK: a file graded under another name")


def row(score, bonus="0", review="", notes="", max_score="100"):
    return {"score": score, "max_score": max_score, "bonus": bonus, "review": review, "notes": notes,
            "isolation": "bwrap"}


def test_the_mean_is_of_the_required_points_over_the_submissions_with_something_to_grade():
    rows = [row("80", notes=BONUS_NOTE), row("120", bonus="30"), row("70", notes=f"x | {BONUS_NOTE}"),
            row("0", review="nothing graded: empty.zip is empty"), row("0", review="nothing graded: a notebook"),
            row("ERROR", review="not graded: the grader failed")]
    summary = progress.batch_summary(rows, now=6, csv_path=None, out="results/").splitlines()
    assert summary == [
        "graded 5 submissions; 3 need a second look (the CSV's review column); 1 could not be graded (ERROR)",
        "mean 80 of the 100 required points (bonus not counted) over the 3 submissions with something to grade; "
        "2 held nothing to grade (0 points each) and are left out",
        "2 of the 3 left out or never started some or all of the bonus files: said in their results and the "
        "CSV's notes",
        "CSV: none (--csv FILE keeps one, and lets a batch run again go on)",
        "results: results/ (a .json per submission)"]
    # A whole course folder hands the bonus in as its stubs: its own note says so, and the count has it.
    folder_note = ("a whole course folder: graded naive.py, online_softmax.py, tiled.py, forward.py from the package "
                   "at its top, ignored its other 40 files; not graded: backward.py, decode.py, ring.py, still the "
                   f"stubs handed out {submission.BONUS_NOT_STARTED}")
    with_folder = progress.batch_summary([row("100", notes=folder_note), row("90")], now=2, csv_path=None, out=None)
    assert "1 of the 2 left out or never started some or all of the bonus files" in with_folder, with_folder
    partial = progress.batch_summary([row("20", max_score="20")], now=1, csv_path=None, out=None, partial=True)
    assert partial.splitlines()[1] == "mean 20 of the 20 points of the modules run over the 1 submission with " \
                                      "something to grade"
    empty = progress.batch_summary([row("0", review="nothing graded: x")], now=1, csv_path=None, out=None)
    assert empty.splitlines()[1] == "no mean: none of the 1 held anything to grade"


def test_a_batch_says_it_started_before_any_submission_is_graded(tmp_path, monkeypatch, capsys):
    def run(course, files, workdir, test_files, limits=None):
        tests = [Result(id=f"tests/graded/test_naive.py::t[{i}]", part="naive", name=f"t[{i}]", max_score=share,
                        passed=b"right" in files.get("naive.py", b""), message="AssertionError: wrong")
                 for i, share in enumerate(plugin.shares(20, 2))]
        return testrun.RunReport(tests=tests, runs=1, isolation="bwrap")

    monkeypatch.setattr(testrun, "run_tests", run)
    required = {"online_softmax.py": "# mine\n", "tiled.py": "# mine\n", "forward.py": "# mine\n"}
    subs = [folder(tmp_path, "bob", {"naive.py": "# right\n", **required}),
            folder(tmp_path, "alice", {"naive.py": "# no\n", **required})]
    with zipfile.ZipFile(tmp_path / "empty.zip", "w"):
        pass
    assert cli.main([*map(str, subs), str(tmp_path / "empty.zip"), "--jobs", "1"]) == 0
    printed = capsys.readouterr()
    err = printed.err.splitlines()
    assert err[0] == "grading 3 submissions: a line as each starts and as each is graded", err
    assert [line.split("  (")[0] for line in err[1:]] == [
        "[0/3] started bob", "[1/3]     20 / 20  bob", "[1/3] started alice", "[2/3]      0 / 20  alice",
        "[2/3] started empty.zip", "[3/3]      0 / 100  empty.zip"], err
    assert err[2].endswith("left)")  # an estimate of the time left, once one is done; no "(1 note)" for the bonus
    assert err[-1].startswith("[3/3]      0 / 100  empty.zip  (1 note)  LOOK: nothing graded: empty.zip is empty")
    assert printed.out.splitlines()[1:3] == [
        "mean 10 of the 20 required points (bonus not counted) over the 2 submissions with something to grade; 1 "
        "held nothing to grade (0 points each) and is left out",
        "2 of the 2 left out or never started some or all of the bonus files: said in their results and the "
        "CSV's notes"]
    assert submission.BONUS_NOT_HANDED_IN.strip(": ") in BONUS_NOTE


def test_a_mean_rounds_halves_up_as_a_spreadsheet_does():
    # After a regrade the mean was 605/8 = 75.625, printed "75.62" (Python rounds the half to even); a
    # spreadsheet shows 75.63.
    from gqa_flash.course.grader import report

    assert [report.num(x) for x in (75.625, 2.675, 20.0, 7.6923, 0.0, -0.0, 145.0)] == [
        "75.63", "2.68", "20", "7.69", "0", "0", "145"]
    rows = [row(s) for s in ("80", "75", "72.5", "75", "78", "75", "74.5", "75")]
    assert progress.batch_summary(rows, now=8, csv_path=None, out=None).splitlines()[1].startswith("mean 75.63 ")
    # A float mean of five 80s and 80.15 is 80.02499..., which rounded down: the mean is taken in decimal.
    rows = [row(s) for s in ("80",) * 5 + ("80.15",)]
    assert progress.batch_summary(rows, now=6, csv_path=None, out=None).splitlines()[1].startswith("mean 80.03 ")
