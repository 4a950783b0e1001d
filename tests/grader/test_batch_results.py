"""A batch's results map back to their submissions, for the TA who reads them.

Results files keep the submission's readable name and record it; the CSV is sorted by submission, has a
``review`` column for rows that need a second look, and a batch ends with a summary on stdout;
``--regrade`` replaces a row; every total of points is exact. Most tests here fake the test run
(:func:`fake_run`): what they check is the bookkeeping around it, and tests/grader/test_grade.py runs the real
thing. One batch grades one real submission (naive.py only), and the points are read from the real graded
tests by collecting them (nothing runs).
"""

import csv
import json
import os
import re
import subprocess
import sys
import zipfile
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace

import pytest

from gqa_flash.course import impl, layout
from gqa_flash.course.testing import folder
from gqa_flash.course.grader import cli, grade, gradescope, isolation, plugin, report, submission, testrun
from gqa_flash.course.grader.testrun import TestResult as Result

RIGHT = "# right\n"  # a naive.py the fake test run passes
STOP = "nothing to grade: the submission holds no graded file"  # submission.read's own note, where it has one


def fake_run(calls: list):
    """A test run that passes naive's three cases if naive.py says RIGHT; records each run in calls."""
    def run(course, files, workdir, test_files, limits=None):
        calls.append(files.get("naive.py"))
        good = RIGHT.encode() in files.get("naive.py", b"")
        tests = [Result(id=f"tests/graded/test_naive.py::test_case[{i}]", part="naive", name=f"test_case[{i}]",
                            max_score=share, passed=good, message="" if good else "AssertionError: wrong")
                 for i, share in enumerate(plugin.shares(20, 3))]
        return testrun.RunReport(tests=tests, runs=1)
    return run


@pytest.fixture
def stops_when_empty(monkeypatch):
    """submission.read, with Submission.stop set for a submission with no graded file (as the real one does,
    once it says so itself: then this changes nothing)."""
    real = submission.read

    def read(source, expected=layout.GRADED_FILES):
        sub = real(source, expected)
        if not sub.files and getattr(sub, "stop", None) is None:
            sub.stop = STOP
        return sub

    monkeypatch.setattr(submission, "read", read)


def rows(book: Path) -> list[dict]:
    return list(csv.DictReader(book.open(encoding="utf-8")))


def test_results_files_keep_readable_names():
    sources = [Path(p) for p in ("in/José García.zip", "in/Zoé", "in/Zoë", "in/alice.zip", "in/Alice",
                                 "in/..hidden.zip", "in/tab\there.py", "in/back\\slash.zip")]
    names = report.results_names(sources)
    assert list(names.values()) == ["José García.json", "Zoé.json", "Zoë.json", "alice.json", "Alice-2.json",
                                    "hidden.json", "tab_here.json", "back_slash.json"]
    # The same name, its accent written two ways (macOS writes é as e and a combining accent): one file.
    assert report.results_names([Path("Zoe\u0301"), Path("Zo\u00e9.zip")]) == {
        Path("Zoe\u0301"): "Zoé.json", Path("Zo\u00e9.zip"): "Zoé-2.json"}
    assert len(report.readable_name("é" * 300).encode()) <= 200


def test_a_batch_records_each_submission_sorts_its_rows_and_ends_with_a_summary(tmp_path, capsys,
                                                                                 stops_when_empty):
    """One real grading (José García's naive.py); Zoé and Zoë hold nothing, so they run no test."""
    (tmp_path / "in").mkdir()
    with zipfile.ZipFile(tmp_path / "in" / "José García.zip", "w") as z:
        z.writestr("José García/naive.py", (impl.SOLUTIONS_DIR / "naive.py").read_text())
    subs = [folder(tmp_path / "in", "Zoë", {}), tmp_path / "in" / "José García.zip", folder(tmp_path / "in", "Zoé", {})]
    out, book = tmp_path / "results", tmp_path / "grades.csv"
    args = [*map(str, subs), "--only", "naive", "--csv", str(book), "--out", f"{out}/", "--jobs", "2",
            "--test-timeout-cap", "30", "--workdir", str(tmp_path)]
    assert cli.main(args) == 0
    printed = capsys.readouterr()
    # The summary on stdout, a line per submission on stderr.
    # The mean is of the required points, over the one submission with something to grade.
    assert printed.out.splitlines() == [
        "graded 3 submissions; 2 need a second look (the CSV's review column)",
        "mean 20 of the 20 points of the modules run over the 1 submission with something to grade; 2 held "
        "nothing to grade (0 points each) and are left out",
        f"CSV: {book}", f"results: {out}/ (a .json per submission)"], printed.out
    assert all(f"started {s.name}" in printed.err for s in subs) and "LOOK: nothing graded" in printed.err
    # Sorted by student, whatever order they finished in; each row names its submission (as it came, without
    # the path typed), where it was found, and its results file.
    table = rows(book)
    assert [(r["student"], r["submission"]) for r in table] == [
        ("José García", "José García.zip"), ("Zoé", "Zoé"), ("Zoë", "Zoë")]
    assert [r["path"] for r in table] == [str(subs[1]), str(subs[2]), str(subs[0])]
    assert sorted(p.name for p in out.iterdir()) == ["José García.json", "Zoé.json", "Zoë.json"]
    for row in table:
        results = json.loads(Path(row["results"]).read_text(encoding="utf-8"))
        assert results["submission"] == row["submission"] and results["score"] == float(row["score"])
    assert [r["score"] for r in table] == ["20", "0", "0"] and table[0]["review"] == ""
    for row in table[1:]:  # nothing to grade: the stop note is the one note, and the row is marked
        assert row["review"] == f"nothing graded: {report.short(row['notes'])}" and " | " not in row["notes"]
    stopped = json.loads((out / "Zoë.json").read_text(encoding="utf-8"))
    assert [(t["name"], t["score"], t["max_score"], t["output"]) for t in stopped["tests"]] == [
        ("naive.py: not graded", 0, 20, table[2]["notes"])]


def test_regrade_replaces_a_row(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(testrun, "run_tests", fake_run(calls))
    subs = [folder(tmp_path, "bob", {"naive.py": RIGHT}), folder(tmp_path, "alice", {"naive.py": "# wrong\n"})]
    book, out = tmp_path / "grades.csv", tmp_path / "results"
    args = ["--only", "naive", "--csv", str(book), "--out", f"{out}/"]
    assert cli.main([*map(str, subs), *args]) == 0
    assert [(r["submission"], r["score"]) for r in rows(book)] == [("alice", "0"), ("bob", "20")]
    # Run again: nothing to do. Fix alice's file, regrade her by name: her row (and results file) is replaced.
    assert cli.main([*map(str, subs), *args]) == 0 and len(calls) == 2
    (subs[1] / "naive.py").write_text(RIGHT)
    assert cli.main([*map(str, subs), *args, "--regrade", "alice"]) == 0 and len(calls) == 3
    assert [(r["submission"], r["score"]) for r in rows(book)] == [("alice", "20"), ("bob", "20")]
    assert json.loads((out / "alice.json").read_text())["score"] == 20
    # With no submission given, the batch is the CSV's; a name is the CSV's submission column too.
    capsys.readouterr()
    assert cli.main([*args, "--regrade", str(subs[0])]) == 0 and calls[-1] == RIGHT.encode() and len(calls) == 4
    assert capsys.readouterr().out.splitlines()[:2] == [
        "graded 2 submissions (1 now, 1 in an earlier run); 0 need a second look; 2 ran NOT ISOLATED (the CSV's "
        f"isolation column): {isolation.describe('none')}",
        "mean 20 of the 20 points of the modules run over the 2 submissions with something to grade"]
    assert len(rows(book)) == 2
    assert cli.main([*args, "--regrade", "carol"]) == 2
    assert "--regrade carol: no such submission" in capsys.readouterr().err
    assert cli.main([str(subs[0]), "--regrade", "bob"]) == 2  # a row to replace needs its CSV


def test_a_submission_with_nothing_to_grade_runs_no_test(tmp_path, monkeypatch, stops_when_empty):
    def no_run(*args, **kwargs):
        raise AssertionError("a submission with nothing to grade ran the tests")

    monkeypatch.setattr(testrun, "run_tests", no_run)
    with zipfile.ZipFile(tmp_path / "empty.zip", "w"):
        pass
    result = grade.grade(tmp_path / "empty.zip", workdir=tmp_path)
    assert result.stop and result.notes == [result.stop] and result.error is None
    assert result.score == 0 and result.max_score == report.COURSE_POINTS
    assert {part: result.part_score(part) for part in layout.GRADED_MODULES} == {
        "naive": (0, 20), "online_softmax": (0, 15), "tiled": (0, 25), "forward": (0, 40), "windows": (0, 15),
        "backward": (0, 20), "decode": (0, 15), "ring": (0, 10)}
    text = report.table(result)
    assert text.count("not graded (see the note)") == len(layout.GRADED_MODULES) and result.stop in text
    book = report.GradeBook(tmp_path / "grades.csv", list(layout.GRADED_MODULES), hidden=False)
    book.add(result)
    assert book.rows()[0]["review"].startswith("nothing graded: ")


def test_review_marks_the_rows_that_need_a_second_look(tmp_path):
    def graded(notes=(), files=("naive.py",), passed=True, integrity=()):
        tests = [Result(id="t", part="naive", name="t", max_score=20, passed=passed)]
        return report.Report("x", tests=tests, notes=list(notes), files=list(files), integrity=list(integrity))

    assert report.review(graded()) == ""
    assert report.review(graded(passed=False)) == ""  # a wrong answer is a grade, not a question
    assert report.review(graded(files=(), passed=False)) == "no naive.py found"
    assert report.review(graded(notes=["graded garciajose_12345_678901_naive.py as naive.py"])) == \
        "a file graded under another name"
    assert report.review(graded(notes=["ignored Naive.py: not a graded file name (did you mean naive.py?)"],
                                files=(), passed=False)) == "no naive.py found; a file ignored for its name"
    assert report.review(graded(integrity=["naive.py scores 0: ..."])) == "integrity: 1 part scored 0"
    assert report.review(graded(integrity=["review: naive.py names reference"])) == "integrity: code worth a look"
    failed = report.Report("x", error="the grader failed")
    assert report.review(failed) == "not graded: the grader failed"


# --- points that add up exactly --------------------------------------------------------------------------


def test_a_tests_points_are_shared_in_whole_hundredths():
    assert plugin.shares(2, 3) == [0.66, 0.67, 0.67] and plugin.shares(4, 3) == [1.33, 1.33, 1.34]
    assert plugin.shares(8, 4) == [2.0] * 4 and plugin.shares(0, 2) == [0.0, 0.0]
    assert sum(map(Decimal, map(str, plugin.shares(0.125, 3)))) == Decimal("0.125")  # finer than a hundredth
    for points in (1, 1.5, 2, 3, 4, 5, 8, 12, 16, 20):
        for n in range(1, 13):
            shares = plugin.shares(points, n)
            assert sum(Decimal(str(s)) for s in shares) == Decimal(str(points)), (points, n, shares)
            assert max(shares) - min(shares) <= 0.01 + 1e-9


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """Every graded test, with its points, as the grader's plugin shares them: collected, never run."""
    log = tmp_path_factory.mktemp("collect") / "log.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    subprocess.run([sys.executable, "-m", "pytest", str(layout.GRADED_TESTS_DIR), "--collect-only", "-q",
                    "-p", "gqa_flash.course.grader.plugin", "-p", "pytest_timeout", f"--grade-log={log}",
                    "-p", "no:cacheprovider", "-o", "addopts="],
                   cwd=layout.COURSE_DIR, env=env, check=True, capture_output=True, timeout=300)
    record = [json.loads(line) for line in log.read_text().splitlines()][-1]
    assert record["event"] == "collected"
    return record["tests"]


def test_every_total_is_exact(collected):
    tests = [Result(id=t["id"], part=t["part"], name=t["name"], max_score=t["max_score"], passed=True,
                        bonus=t["part"] in layout.BONUS_MODULES) for t in collected]
    full = report.Report("full marks", tests=tests)
    results = json.loads(json.dumps(gradescope.results_json(full)), parse_float=Decimal)
    assert sum(t["max_score"] for t in results["tests"]) == 160 and results["score"] == 160
    assert all(t["max_score"] == round(t["max_score"], 2) for t in results["tests"])  # whole hundredths
    for part, points in {"naive": 20, "online_softmax": 15, "tiled": 25, "forward": 40, "windows": 15,
                         "backward": 20, "decode": 15, "ring": 10}.items():
        assert sum(t["max_score"] for t in results["tests"] if t["name"].startswith(f"{part}.py")) == points, part
    assert full.max_score == 100 and full.score == 160
    assert report.table(full).splitlines()[-1].split() == "total 160 / 100 (with 60 bonus)".split()


def test_the_csv_totals_are_exact(collected, tmp_path):
    tests = [Result(id=t["id"], part=t["part"], name=t["name"], max_score=t["max_score"], passed=True,
                        bonus=t["part"] in layout.BONUS_MODULES) for t in collected]
    book = report.GradeBook(tmp_path / "grades.csv", list(layout.GRADED_MODULES), hidden=False)
    book.add(report.Report("full marks", tests=tests))
    row = book.rows()[0]
    assert (row["score"], row["max_score"]) == ("160", "100")
    assert [row[m] for m in layout.GRADED_MODULES] == ["20", "15", "25", "40", "15", "20", "15", "10"]



# --- why points were lost, and text cut where a reader can stop --------------------------------------------

# The all-NaN message of testing.Mismatch as the test process writes it: clipped at a word
# (plugin.MESSAGE_CHARS), then where in the graded file it was raised.
NAN_CUT = ("AssertionError: O: first wrong at batch 0, head 0, row 0, col 0: got nan, expected 0.12 (512 of 512 "
           "entries wrong, max |error| inf); every entry is NaN: was anything written? … (forward.py, line 40)")
HANG = "timed out after 60 s: an endless loop, or far too slow"


def results(part: str, outcomes: list, points: float, **flags) -> list[Result]:
    """A part's tests: True passes, a string fails with that message."""
    return [Result(id=f"tests/graded/test_{part}.py::t[{i}]", part=part, name=f"test_{part}[{i}]", max_score=share,
                   passed=o is True, message="" if o is True else o, **flags)
            for i, (o, share) in enumerate(zip(outcomes, plugin.shares(points, len(outcomes))))]


def test_the_csv_says_why_each_part_lost_points():
    tests = (results("naive", [HANG, HANG] + ["not run: naive already hung or crashed 2 times"] * 3, 20)
             + results("online_softmax", [report.NOT_STARTED] * 3, 15, not_started=True)
             + results("tiled", [report.NOT_STARTED] * 4, 25, not_started=True)
             + results("forward", [True] + [NAN_CUT] * 6 + ["ValueError: head_dim 80"], 40)
             + results("backward", [report.NOT_STARTED] * 2, 20, not_started=True, bonus=True)
             + results("decode", [True, "AssertionError: LSE wrong"], 15, bonus=True))
    graded = report.Report("alice.zip", tests=tests, files=["naive.py", "tiled.py", "forward.py", "decode.py"])
    assert report.lost(graded).split(" | ") == [
        "naive.py 0/20: timed out after 60 s: an endless loop, or far too slow (2 of 5 tests; the other 3 not run)",
        "online_softmax.py 0/15: not handed in",
        "tiled.py 0/25: not started",
        "forward.py 5/40: O: first wrong at batch 0, head 0, row 0, col 0: got nan, expected 0.12 "
        "(512 of 512 entries wrong, max |error| inf); every entry is NaN: was anything written? … (6 of 8 tests; 1 "
        "more failed otherwise)",
        "decode.py (bonus) 7.5/15: LSE wrong (1 of 2 tests)"]  # backward: a bonus not started
    book = report.GradeBook(Path("/nonexistent/never-written.csv"), [], hidden=False)
    assert book.row(graded)["lost"] == report.lost(graded)
    zeroed = report.Report("x", tests=results("naive", [True, "0 points: naive.py did not do its own work"], 20,
                                             integrity=True), files=["naive.py"])
    assert report.lost(zeroed) == "naive.py 10/20: scored 0: not the student's own work (the integrity column)"
    assert report.lost(report.Report("x", tests=results("naive", [True], 20))) == ""
    # The same NaN output at other shapes is one failure, not "1 of 8 tests; 5 more failed otherwise"
    nan = [f"AssertionError: O: first wrong at batch 0, head 0, row 0, col 0: got nan, expected 0.{i}1 "
           f"({64 * i} of {64 * i} entries wrong)" for i in range(1, 7)]
    shapes = report.Report("x", tests=results("forward", [True, True] + nan, 40), files=["forward.py"])
    assert report.lost(shapes).endswith("(6 of 8 tests)"), report.lost(shapes)
    assert "expected 0.11 (64 of 64 entries wrong)" in report.lost(shapes)


def test_text_is_cut_at_a_sentence_or_a_word_with_an_ellipsis():
    assert report.clip("short enough", 12) == "short enough"
    assert report.clip("the stub you were given, still", 24) == "the stub you were given…"
    assert report.clip("no graded file found; hand in gqa_flash/naive.py", 40) == "no graded file found …"
    assert report.clip("x" * 30, 10) == "x" * 9 + "…"
    for n in range(5, 120):
        assert len(report.clip(NAN_CUT, n)) <= n
    # The review column: a stop note cut at a word, not mid-word.
    stopped = report.Report("nb.zip", stop="01_naive_attention.ipynb is a notebook: notebooks are not graded; hand in "
                                          "gqa_flash/naive.py (your graded file), e.g. with make submission")
    assert report.review(stopped) == ("nothing graded: 01_naive_attention.ipynb is a notebook: notebooks are not "
                                      "graded …")
    # The test process clips a failure at a word (it cut one mid-word: "... Or was 0 divid..."); the table
    # shows it as written.
    long = ValueError("every entry is NaN: was anything written? " + "Or was 0 divided by 0? " * 30)
    message, _ = plugin.describe(SimpleNamespace(value=long, traceback=[]), set())
    assert message.startswith("ValueError: every entry is NaN") and message.endswith("…"), message
    assert "divid" not in message.split("?")[-1] and len(message) <= plugin.MESSAGE_CHARS + len("ValueError: ")
    graded = report.Report("a.zip", tests=results("forward", [True, NAN_CUT], 40), files=["forward.py"])
    assert "was anything written? … (forward.py, line 40)" in report.table(graded)


def test_the_csvs_columns_go_straight_into_a_gradebook(tmp_path):
    student = submission.Student("smithann", "23456", True, "Canvas")
    graded = report.Report("canvas.zip#smithann", tests=results("naive", [True], 20) + results("decode", [True], 15,
                                                                                               bonus=True),
                          files=["naive.py", "decode.py"], student=student, path="in/canvas.zip#smithann",
                          notes=["graded smithann_LATE_23456_789012_naive.py as naive.py (a Canvas download name)"],
                          platform="Canvas")
    book = report.GradeBook(tmp_path / "grades.csv", ["naive", "decode"], hidden=False)
    book.add(graded, "results/smithann.json")
    book.add(report.Report("alice", tests=results("naive", [True], 20), files=["naive.py"], path="in/alice",
                          student=submission.Student("alice")))
    assert [(r["student"], r["user_id"], r["late"], r["submission"], r["score"], r["max_score"], r["bonus"],
             r["path"]) for r in rows(tmp_path / "grades.csv")] == [
        ("alice", "", "", "alice", "20", "20", "0", "in/alice"),
        ("smithann", "23456", "yes", "canvas.zip#smithann", "35", "20", "15", "in/canvas.zip#smithann")]
    assert book.done == {"in/alice", "in/canvas.zip#smithann"}
    # The notes cell, cut at 1000 characters, ends at a word.
    long = report.Report("b", tests=results("naive", [True], 20), notes=["ignored " + "some_file.txt, " * 100])
    assert report.GradeBook(tmp_path / "b.csv", ["naive"], hidden=False).row(long)["notes"].endswith("some_file.txt…")
    # A CSV of another layout is refused, by name.
    old = tmp_path / "old.csv"
    old.write_text("submission,results,score\n")
    with pytest.raises(SystemExit, match="use another --csv file"):
        report.GradeBook(old, ["naive"], hidden=False)


def test_the_tables_verdict_tells_a_hang_and_a_gate_from_wrong_answers():
    # A hang read "naive.py 0 / 20 failed (all 8)": 2 tests timed out and 6 were not run; a file the static
    # gate refused read "failed (all 1)".
    hung = results("naive", [HANG, HANG] + ["not run: naive already hung or crashed 2 times"] * 6, 20)
    assert report.verdict(hung) == "of 8: 2 timed out, 6 not run"
    mixed = results("naive", [True, "AssertionError: wrong", HANG, "not run: the submission's time is up"], 20)
    assert report.verdict(mixed) == "of 4: 1 failed, 1 timed out, 1 not run"
    assert report.verdict(results("naive", ["AssertionError: wrong"] * 3, 20)) == "failed (all 3)"
    assert report.verdict(results("naive", [True, "AssertionError: wrong"], 20)) == "1 of 2 failed"
    gated = grade.refused_by_gate(grade.sandbox.snapshot(), ["tests/graded/test_naive.py"],
                                  {"naive.py": ["line 3: imports numpy"]})
    assert report.verdict(gated).startswith("not run: the static gate refused the file"), report.verdict(gated)
    assert HANG.startswith(report.TIMED_OUT)


def test_one_wrong_o_at_many_cases_is_one_failure_in_the_csv_and_the_table():
    # acc never rescaled: 21 of forward's 26 tests failed with the same wrong O at other shapes, dtypes and
    # layouts. The lost cell said "AssertionError: O: first wrong ... (4 of 26 tests; 17 more failed otherwise)",
    # and the table listed 21 lines.
    cases = [("causal=True, float32, layout contiguous, V layout bnhd", "[2, 8, 29, 24] with 2"),
             ("causal=True, float16, layout bnhd, V layout contiguous", "[2, 6, 21, 48] with 3"),
             ("causal=False, float32, layout strided, V layout padded", "[1, 4, 40, 80] with 1")] * 7
    # The values' signs differ too: a minus sign split them into two failures.
    wrong = [f"AssertionError: O: first wrong at batch 0, head {i % 3}, row 2{i % 10}, col 0: got "
             f"{'-' * (i % 2)}0.{i}4, expected {'-' * (i % 3 == 0)}0.25 ({100 + i} of 11136 entries wrong, max "
             f"|error| 2.0{i}); seed {1000 + i}, shape {shape} KV heads, {case}"
             for i, (case, shape) in enumerate(cases)]
    graded = report.Report("bob.zip", tests=results("forward", [True] * 5 + wrong, 40), files=["forward.py"])
    lost = report.lost(graded)
    assert re.match(r"forward\.py [\d.]+/40: O: first wrong at batch 0", lost), lost
    assert lost.endswith("(21 of 26 tests)"), lost
    failures = [line for line in report.table(graded).splitlines() if line.startswith("      ")]
    assert len(failures) == 1 and failures[0].startswith("      test_forward[5] and 20 more: AssertionError: O:")


def test_a_csv_of_other_modules_stops_one_submission_before_it_is_graded(tmp_path, monkeypatch):
    # One submission graded with --only naive into a full run's CSV ran for 11 s and wrote its results, then
    # refused with two long lists of columns that never said "this run grades only naive".
    book = tmp_path / "grades.csv"
    report.GradeBook(book, list(layout.GRADED_MODULES), hidden=False)  # a full run's header
    monkeypatch.setattr(grade, "grade", lambda *a, **k: pytest.fail("graded before the CSV was checked"))
    sub = folder(tmp_path, "zoe", {"naive.py": "x = 1\n"})
    with pytest.raises(SystemExit) as stop:
        cli.main([str(sub), "--only", "naive", "--csv", str(book)])
    assert str(stop.value) == (f"{book} holds the modules naive, online_softmax, tiled, forward, windows, backward, "
                               "decode, ring, and this run grades naive: a CSV keeps one set of modules; give this run "
                               "another --csv file (or run it with the CSV's modules)")
