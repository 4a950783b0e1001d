"""The grader survives any submission: each misbehaviour costs the points of what it broke, and nothing else.

The misbehaving submissions are graded once, side by side (``graded``
below), with short time limits (a hang costs a few seconds, not a minute);
each test then reads its report. Several misbehaviours share a submission
when they live in different modules: that also shows that one broken module
does not sink the others.
"""

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gqa_flash.course import impl, layout
from gqa_flash.course.grader import cli, grade, gradescope, sandbox, started, stubs, submission, testrun
from gqa_flash.course.grader.report import Report, table
from gqa_flash.course.grader import report as report_module
from gqa_flash.course.grader.testrun import Limits
from gqa_flash.course.testing import folder

COURSE = layout.COURSE_DIR
SOLUTIONS = impl.SOLUTIONS_DIR
# A test's own limit capped at CAP s (the graded tests take 0.2-2.5 s each here, under the integrity and
# address checks, and a loaded 2-core CI machine can stretch a good one several times over),
# and the watchdog's grace after it at 3 s.
CAP = 30
FAST = Limits(timeout_cap_s=CAP, grace_s=3)
# The layers beneath the static gate and the audit hook, each tested on its own: with the gate off a misbehaving
# file runs (the executor and the judge must survive it); with the audit hook off too, it may crash or spawn.
NO_GATE = Limits(timeout_cap_s=CAP, grace_s=3, gate=False)
BARE = Limits(timeout_cap_s=CAP, grace_s=3, gate=False, audit=False)
# The required modules; the bonus module's tests would only add their run time here.
REQUIRED = set(layout.GRADED_MODULES) - set(sandbox.BONUS_PARTS)


def solution(name: str) -> str:
    return (SOLUTIONS / name).read_text()


def patched(name: str, old: str, new: str) -> str:
    text = solution(name)
    assert text.count(old) == 1, f"{old!r} not found once in solutions/{name}"
    return text.replace(old, new)


# --- the misbehaving submissions --------------------------------------------------------

# A hang that swallows pytest-timeout's exception: only the watchdog can stop it.
STUBBORN_HANG = '''
import time
def naive_attention(q, k, v, causal=True, sm_scale=None):
    while True:
        try:
            time.sleep(0.2)
        except BaseException:
            pass
'''

PLAIN_HANG = '''
def naive_attention(q, k, v, causal=True, sm_scale=None):
    while True:
        pass
'''

SYNTAX_ERROR = "def block_state(x_block)\n    return x_block\n"

EXITS_AT_IMPORT = "import os\nos._exit(3)\n"

# Writes passing tests over the graded tests beside its own folder, then looks for the solutions there.
TAMPERS = '''
from pathlib import Path
course = Path(__file__).resolve().parent.parent
for name in ("test_naive.py", "test_tiled.py"):
    (course / "tests" / "graded" / name).write_text("def test_free_points():\\n    pass\\n")
(course / "conftest.py").write_text("")
exec((course / "solutions" / "naive.py").read_text())
'''

# The forward pass done by PyTorch, with no kernel at all.
PYTORCH_FORWARD = '''
import torch
import torch.nn.functional as F

def flash_attention_forward(q, k, v, causal=True, sm_scale=None, return_lse=False):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = (q.float() @ k.float().transpose(-1, -2)) * sm_scale
    if causal:
        n = q.shape[2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    o = (torch.softmax(s, dim=-1) @ v.float()).to(q.dtype)
    return (o, torch.logsumexp(s, dim=-1)) if return_lse else o
'''

# PyTorch again, but with elementwise products and sums (no matmul, no softmax), and a
# do-nothing kernel launched for show: kernel_only does not see it (a known hole).
SNEAKY_PYTORCH_FORWARD = '''
import torch
import triton

@triton.jit
def _touch(X):
    pass

def flash_attention_forward(q, k, v, causal=True, sm_scale=None, return_lse=False):
    _touch[(1,)](q)
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1).float()
    v = v.repeat_interleave(group, dim=1).float()
    s = (q.float().unsqueeze(-2) * k.unsqueeze(-3)).sum(-1) * sm_scale
    if causal:
        n = q.shape[2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    m = s.amax(-1, keepdim=True)
    p = (s - m).exp()
    l = p.sum(-1, keepdim=True)
    o = ((p / l).unsqueeze(-1) * v.unsqueeze(-3)).sum(-2).to(q.dtype)
    return (o, (m + l.log()).squeeze(-1)) if return_lse else o
'''


def traces_in_the_course() -> list[str]:
    """What the misbehaving submissions would leave in the course itself, had the grader let them."""
    found = [str(p) for p in (COURSE / "conftest.py", COURSE.parent / "evil.py") if p.exists()]
    for path in (COURSE / "tests").rglob("test_*.py"):
        if "test_free_points" in path.read_text() and path.name != "test_grade.py":
            found.append(str(path))
    return found


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Every misbehaving submission, graded two at a time; {name: (report, submission folder)}."""
    root = tmp_path_factory.mktemp("submissions")
    # The grader's copies go to a folder of this test's own: another grading run on the same
    # machine (a shared server, a busy CI host) cannot leave anything in it.
    work = tmp_path_factory.mktemp("grading")
    segfault_on_one_row = patched(
        "tiled.py", "    if sm_scale is None:\n",
        "    if q.shape[2] == 1:  # a crash on the one-row case only\n"
        "        import ctypes\n        ctypes.string_at(0)\n    if sm_scale is None:\n")
    kernel_hang = patched(
        "forward.py", "    kv_head_idx = q_head_idx // group_size\n",
        "    spin = q_head_idx\n    while spin >= 0:  # never ends\n        spin = spin + 1\n"
        "    kv_head_idx = q_head_idx // group_size\n")
    noisy_naive = "print('x' * 5_000_000)\n" + patched(
        "naive.py", "    q32, k32, v32 = q.float(), k.float(), v.float()\n",
        "    q32, k32, v32 = q.float(), k.float(), v.float()\n    print('y' * 1_000_000)\n")

    zipped = root / "zipped.zip"
    with zipfile.ZipFile(zipped, "w") as z:
        z.writestr("alice/hw3/naive.py", solution("naive.py"))
        z.writestr("../naive.py", PLAIN_HANG)  # zip slip: skipped
        z.writestr("alice/../../evil.py", "raise SystemExit")
        z.writestr("/etc/forward.py", PYTORCH_FORWARD)
        z.writestr("__MACOSX/alice/._naive.py", "\x00\x01")
        z.writestr("alice/Tiled.py", solution("tiled.py"))

    jobs = {
        # One broken module per part, and one good one: the good one keeps its 40 points.
        "broken_parts": (folder(root, "broken_parts", {
            "naive.py": STUBBORN_HANG,
            "online_softmax.py": SYNTAX_ERROR,
            "tiled.py": "import module_that_does_not_exist\n" + solution("tiled.py"),
            "forward.py": solution("forward.py"),
        }), REQUIRED, Limits(timeout_cap_s=CAP, grace_s=3, strikes=1, gate=False)),
        "crashes": (folder(root, "crashes", {
            "naive.py": noisy_naive,
            "online_softmax.py": EXITS_AT_IMPORT,
            "tiled.py": segfault_on_one_row,
            "forward.py": kernel_hang,
        }), REQUIRED, BARE),
        "cheats": (folder(root, "cheats", {
            "naive.py": TAMPERS,
            "online_softmax.py": solution("online_softmax.py"),
            "forward.py": PYTORCH_FORWARD,
        }), REQUIRED, NO_GATE),
        # The same misbehaviours as the static gate meets them: refused before anything runs.
        "gated": (folder(root, "gated", {
            "naive.py": STUBBORN_HANG,
            "online_softmax.py": EXITS_AT_IMPORT,
            "tiled.py": segfault_on_one_row,
            "forward.py": PYTORCH_FORWARD,
        }), REQUIRED, FAST),
        "zipped": (zipped, {"naive", "tiled"}, FAST),
        "deadline": (folder(root, "deadline", {"naive.py": PLAIN_HANG}), {"naive"},
                     Limits(timeout_cap_s=60, submission_s=12)),
        "sneaky": (folder(root, "sneaky", {"forward.py": SNEAKY_PYTORCH_FORWARD}), {"forward"}, NO_GATE),
    }
    course = sandbox.snapshot()

    def run(item):
        name, (src, only, limits) = item
        return name, (grade.grade(src, course=course, only=only, limits=limits, workdir=work), src)

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        reports = dict(pool.map(run, jobs.items()))
    reports["_traces"] = traces_in_the_course()
    reports["_new_copies_left"] = {p.name for p in work.iterdir()}
    return reports


def points(report, part):
    return report.part_score(part)[0]


def messages(report, part):
    return {t.message for t in report.tests if t.part == part and not t.passed}


# --- one broken module costs that module only ----------------------------------------


def test_a_broken_module_does_not_cost_the_others(graded):
    report, _ = graded["broken_parts"]
    assert points(report, "forward") == 40, table(report)
    assert report.score == 40, table(report)


def test_a_hang_that_ignores_its_timeout_is_killed(graded):
    report, _ = graded["broken_parts"]
    (first, *rest) = [t for t in report.tests if t.part == "naive"]
    # The judge's own time limit ends its wait, whatever the student's code swallows, and the executor is killed.
    assert first.message.startswith(f"timed out after {CAP} s"), first.message
    assert all("not run: naive already hung or crashed" in t.message for t in rest), table(report)


def test_a_syntax_error_is_reported_with_its_line(graded):
    report, _ = graded["broken_parts"]
    assert messages(report, "online_softmax") == {"SyntaxError in online_softmax.py, line 1: expected ':'"}
    assert any("online_softmax.py, line 1: SyntaxError" in n for n in report.notes), report.notes


def test_an_import_of_a_missing_module_fails_that_module(graded):
    report, _ = graded["broken_parts"]
    assert points(report, "tiled") == 0
    (message,) = messages(report, "tiled")
    assert "No module named 'module_that_does_not_exist'" in message and "tiled.py, line 1" in message


# --- crashes, hangs in a kernel, megabytes of output ------------------------------------


def test_printing_megabytes_costs_nothing(graded):
    report, _ = graded["crashes"]
    assert points(report, "naive") == 20, table(report)


def test_os_exit_at_import_fails_that_module_after_two_strikes(graded):
    report, _ = graded["crashes"]
    tests = [t for t in report.tests if t.part == "online_softmax"]
    assert points(report, "online_softmax") == 0
    assert "exit code 3" in tests[0].message and "os._exit" in tests[0].message, tests[0].message
    assert "exit code 3" in tests[1].message
    assert all("not run" in t.message for t in tests[2:]), table(report)


def test_a_segfault_costs_only_the_case_that_crashed(graded):
    report, _ = graded["crashes"]
    (crashed,) = [t for t in report.tests if t.part == "tiled" and not t.passed]
    assert crashed.name == "test_tiled_ragged_tiles[1-4-4-True]"
    assert "SIGSEGV" in crashed.message
    assert points(report, "tiled") == pytest.approx(25 - crashed.max_score)  # the one case, nothing more


def test_an_endless_loop_in_a_kernel_times_out(graded):
    report, _ = graded["crashes"]
    tests = [t for t in report.tests if t.part == "forward"]
    assert points(report, "forward") == 0
    assert tests[0].message.startswith(f"timed out after {CAP} s"), tests[0].message
    assert "not run: forward already hung or crashed 2 times" in tests[-1].message


def test_the_submission_time_limit_stops_everything(graded):
    report, _ = graded["deadline"]
    assert report.score == 0 and len(report.tests) == 8
    timed_out = [t for t in report.tests if "used up its 12 s" in t.message or "12 s were up" in t.message]
    assert timed_out, table(report)
    assert report.seconds < 40


# --- cheating --------------------------------------------------------------------------


def test_writing_over_the_tests_earns_nothing_and_is_flagged(graded):
    report, _ = graded["cheats"]
    assert points(report, "naive") == 0 and points(report, "tiled") == 0, table(report)
    assert points(report, "online_softmax") == 15
    # The executor's folder holds no tests to write over, and the audit hook refuses the write itself.
    (message,) = messages(report, "naive")
    assert message.startswith("integrity: naive.py line 5 opened ") and "to write" in message, message
    assert report.isolation in ("bwrap", "user", "none")
    assert not any("modified the course copy" in n for n in report.notes), report.notes


def test_the_copy_holds_no_solutions(graded):
    assert not any(path.startswith("solutions/") for path in sandbox.snapshot().files)


def test_the_static_gate_refuses_before_anything_runs(graded):
    report, _ = graded["gated"]
    assert report.score == 0, table(report)
    flags = " | ".join(report.integrity)
    for part, line, what in [("naive", 2, "imports time"), ("online_softmax", 1, "imports os"),
                             ("tiled", None, "imports ctypes"), ("forward", None, "")]:
        assert f"{part}.py scores 0: gate: {part}.py line {line or ''}" in flags and what in flags, flags
    assert all(t.name == "static gate" for t in report.tests), table(report)
    assert report.seconds < 20, "a refused file runs no test"


def test_a_pytorch_forward_loses_all_the_forward_points(graded):
    report, _ = graded["cheats"]
    assert points(report, "forward") == 0
    assert any("must compute attention in the Triton kernel" in m for m in messages(report, "forward"))
    assert "PyTorch in place of the kernel" in report_module.review(report), report_module.review(report)  # CSV review


def test_a_pytorch_forward_without_matmul_loses_the_forward_points(graded):
    report, _ = graded["sneaky"]
    assert points(report, "forward") == 0, table(report)


def test_nothing_is_written_outside_the_copy(graded):
    assert not graded["_traces"], f"grading changed the course's own files: {graded['_traces']}"
    assert not graded["_new_copies_left"], f"temporary copies left behind: {graded['_new_copies_left']}"
    _, src = graded["cheats"]
    assert sorted(p.name for p in src.iterdir()) == ["forward.py", "naive.py", "online_softmax.py"]


# --- zips ------------------------------------------------------------------------------


def test_a_zip_is_graded_from_its_nested_folder_and_its_slips_are_skipped(graded):
    report, src = graded["zipped"]
    assert points(report, "naive") == 20 and points(report, "tiled") == 0, table(report)
    notes = "\n".join(report.notes)
    for member in ("../naive.py", "alice/../../evil.py", "/etc/forward.py"):
        assert f"skipped zip member {member!r}" in notes, notes
    assert "ignored alice/Tiled.py: not a graded file name (did you mean tiled.py?)" in notes
    assert not (src.parent.parent / "evil.py").exists() and not (src.parent.parent / "naive.py").exists()


# --- reading submissions (no test run) -----------------------------------------------------


def test_an_empty_submission_says_what_it_expected(tmp_path):
    sub = submission.read(tmp_path)
    assert sub.files == {}
    assert any("no graded file found (expected naive.py" in n for n in sub.notes), sub.notes


def test_the_shallowest_copy_wins_and_links_are_refused(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "naive.py").write_text("old = 1\n")
    (tmp_path / "naive.py").write_text("new = 1\n")
    (tmp_path / "forward.py").symlink_to(SOLUTIONS / "forward.py")
    (tmp_path / "forward (1).py").write_text("x = 1\n")
    sub = submission.read(tmp_path)
    assert sub.files == {"naive.py": b"new = 1\n"}
    notes = "\n".join(sub.notes)
    assert "found 2 copies of naive.py: graded naive.py, ignored old/naive.py" in notes
    assert "skipped forward.py: a symbolic link" in notes
    assert "ignored forward (1).py: not a graded file name (did you mean forward.py?)" in notes


def test_unusual_imports_are_flagged_for_review(tmp_path):
    (tmp_path / "naive.py").write_text(
        "import torch\nimport ctypes\nfrom gqa_flash.reference import reference_attention\n")
    notes = submission.read(tmp_path).notes
    assert any(n.startswith("review: naive.py imports ctypes, gqa_flash.reference") for n in notes), notes


def test_not_a_submission(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    assert "is not a folder, a .zip or a .py file" in submission.read(tmp_path / "notes.txt").notes[0]
    assert "does not exist" in submission.read(tmp_path / "missing").notes[0]
    (tmp_path / "broken.zip").write_bytes(b"not a zip")
    assert "is not a readable zip file" in submission.read(tmp_path / "broken.zip").notes[0]


def test_the_snapshot_holds_stubs_and_tests_but_no_solution():
    course = sandbox.snapshot()
    for path, text in stubs.plan(SOLUTIONS, Path("gqa_flash")).items():
        assert course.files[path.as_posix()] == text.encode()
    assert "tests/graded/test_forward.py" in course.files and "pyproject.toml" in course.files
    assert not any(k.startswith("solutions") for k in course.files)
    # Every graded test file, in the order of the course's modules.
    graded_files = {p.name for p in (COURSE / "tests" / "graded").glob("test_*.py")}
    assert [Path(t).name for t in course.test_files] == [
        f"test_{m}.py" for m in layout.GRADED_MODULES if f"test_{m}.py" in graded_files]
    assert {Path(t).name for t in course.test_files} == graded_files


# --- results: Gradescope's json, the table, the CSV of a batch ---------------------------------


def test_results_json_follows_gradescopes_format(graded):
    report, _ = graded["broken_parts"]
    results = gradescope.results_json(report)
    assert results["score"] == 40 and isinstance(results["execution_time"], int)
    required = [t for t in results["tests"] if "(bonus)" not in t["name"]]
    assert sum(t["max_score"] for t in required) == pytest.approx(100)
    for t in results["tests"]:
        assert set(t) == {"name", "score", "max_score", "status", "output", "visibility"}
        assert t["status"] in ("passed", "failed") and t["visibility"] == "visible"
    shared = [t for t in results["tests"] if "test_forward_ragged_lengths[" in t["name"]]
    assert len(shared) == 4 and all(t["max_score"] == 1.5 for t in shared)  # 6 points over 4 cases
    assert "forward.py: 40 / 40" in results["output"]
    json.dumps(results)


def test_the_table_names_each_part_and_its_verdict(graded):
    report, _ = graded["broken_parts"]
    text = table(report)
    n_forward = sum(1 for t in report.tests if t.part == "forward")
    assert "forward.py" in text and "40 / 40" in text and f"passed ({n_forward} tests)" in text
    assert "all 8 tests: SyntaxError in online_softmax.py, line 1" in text


def test_a_batch_writes_a_row_as_each_finishes_and_resumes(tmp_path, capsys):
    subs = [folder(tmp_path, "good", {"naive.py": solution("naive.py")}),
            folder(tmp_path, "empty", {}),
            folder(tmp_path, "hangs", {"naive.py": PLAIN_HANG})]
    out, book = tmp_path / "results", tmp_path / "grades.csv"
    args = [*map(str, subs), "--only", "naive", "--csv", str(book), "--out", str(out), "--jobs", "2",
            "--test-timeout-cap", "10", "--workdir", str(tmp_path)]
    assert cli.main(args) == 0
    rows = {r["submission"]: r for r in csv.DictReader(book.open())}
    assert {s: rows[s]["score"] for s in rows} == {"good": "20", "empty": "0", "hangs": "0"}
    assert list(rows["good"]) == ["student", "user_id", "late", "submission", "score", "max_score", "bonus", "naive",
                                  "lost", "review", "integrity", "isolation", "seconds", "notes", "results", "path"]
    # Why the hang lost its points is in the CSV, not only in its results file.
    assert rows["hangs"]["lost"].startswith("naive.py 0/20: timed out after "), rows["hangs"]
    assert rows["good"]["lost"] == "" and rows["hangs"]["review"] == ""
    assert json.loads((out / "good.json").read_text())["score"] == 20
    assert sorted(p.name for p in out.iterdir()) == ["empty.json", "good.json", "hangs.json"]
    # Run again, one more submission: only that one is graded.
    more = folder(tmp_path, "more", {"naive.py": solution("naive.py")})
    assert cli.main([*args[:3], str(more), *args[3:]]) == 0
    assert "skipping 3 submission(s) already in" in capsys.readouterr().err
    assert len(list(csv.DictReader(book.open()))) == 4


def test_a_submission_the_grader_cannot_grade_is_an_error_not_a_zero(tmp_path, monkeypatch, capsys):
    """A grader failure is no grade: the row says ERROR, the command fails, and a run again grades it."""
    subs = [folder(tmp_path, "good", {"naive.py": solution("naive.py")}),
            folder(tmp_path, "unlucky", {"naive.py": solution("naive.py")})]
    book = tmp_path / "grades.csv"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "work").mkdir()
    args = [*map(str, subs), "--only", "naive", "--csv", str(book), "--jobs", "1", "--workdir", "work"]  # relative
    real = testrun.run_tests

    def flaky(course, files, workdir, *rest):
        if b"unlucky" in files.get("naive.py", b"") or "unlucky" in str(workdir):
            raise OSError("disk full")
        return real(course, files, workdir, *rest)

    subs[1].joinpath("naive.py").write_text(solution("naive.py") + "\n# unlucky\n")
    monkeypatch.setattr(testrun, "run_tests", flaky)
    assert cli.main(args) == 1
    assert "1 submission(s) could not be graded" in capsys.readouterr().err
    rows = {Path(r["submission"]).name: r["score"] for r in csv.DictReader(book.open())}
    assert rows == {"good": "20", "unlucky": "ERROR"}
    monkeypatch.setattr(testrun, "run_tests", real)
    assert cli.main(args) == 0
    rows = [(Path(r["submission"]).name, r["score"]) for r in csv.DictReader(book.open())]
    assert sorted(rows) == [("good", "20"), ("unlucky", "20")], rows
    assert cli.main([str(tmp_path / "no-such-folder"), "--only", "naive"]) == 2
    assert "no such submission" in capsys.readouterr().err
    failed = Report("x.zip", notes=["the grader failed on this submission: OSError: disk full"],
                          error="the grader failed on this submission: OSError: disk full")
    assert table(failed).startswith("x.zip: NOT GRADED") and "0 / 0" not in table(failed)
    assert failed.summary().startswith("gqa-flash: not graded")


def test_a_process_that_will_not_exit_after_the_last_test_costs_seconds_not_the_deadline(tmp_path, monkeypatch):
    """Something the submission left behind (here an atexit handler that sleeps; a thread would be refused by
    the audit hook) cannot keep the grading alive: it lives in the executor, which the judge kills once its
    tests are done, instead of running on to the submission's deadline. (Beneath the gate, which refuses
    atexit.)"""
    stays = "import atexit, time\natexit.register(time.sleep, 600)\n"
    lingers = solution("naive.py") + "\n" + stays
    sub = folder(tmp_path, "lingers", {"naive.py": lingers})
    monkeypatch.setattr(testrun, "EXIT_GRACE_S", 1.0)
    report = grade.grade(sub, only={"naive"}, limits=Limits(submission_s=300, gate=False), workdir=tmp_path)
    assert report.score == 20, table(report)
    assert report.seconds < 120, f"{report.seconds:.0f} s: the lingering process ran on"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie is dead, waiting for its new parent to reap it


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="the grader finds left processes through /proc")
def test_a_process_left_running_in_a_session_of_its_own_is_killed(tmp_path, monkeypatch):
    """A child the submission starts with setsid leaves the test process's group, which the grader kills;
    it still carries the run's mark in its environment, and the grader kills it by that."""
    pid_file = tmp_path / "child.pid"
    spawn = ("import subprocess, sys\n"
             "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
             "start_new_session=True)\n"
             f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n")
    sub = folder(tmp_path, "spawns", {"naive.py": solution("naive.py") + "\n" + spawn})
    # Beneath the gate and the audit hook (which refuse the spawn), and outside bubblewrap (whose PID
    # namespace ends it anyway): the grader's last layer, the run's mark.
    monkeypatch.setenv("GQA_FLASH_ISOLATION", "none")
    report = grade.grade(sub, only={"naive"}, limits=Limits(submission_s=300, gate=False, audit=False),
                         workdir=tmp_path)
    assert report.score == 20, table(report)
    pid = int(pid_file.read_text())
    for _ in range(50):  # SIGKILL is sent; the kernel may take a moment
        if not _alive(pid):
            break
        time.sleep(0.1)
    assert not _alive(pid), f"the child {pid} the submission started with setsid outlived its grading"


# --- one module at a time, and modules not started (the reports themselves: tests/given/test_points.py) ---------


def _stub(name: str) -> str:
    return stubs.plan(SOLUTIONS, Path("gqa_flash"))[Path("gqa_flash") / name]


def test_a_module_is_not_started_while_its_code_is_the_stubs(tmp_path):
    prints = started.stub_fingerprints()  # from solutions/ here
    assert set(prints) == set(layout.GRADED_FILES)
    for name in layout.GRADED_FILES:
        assert started.not_started(name, _stub(name), prints)
        assert started.not_started(name, _stub(name).encode(), prints)
        assert not started.not_started(name, solution(name), prints), name
    stub, part_1 = _stub("naive.py"), '    raise NotImplementedError("Part 1'
    noted = stub.replace("    # ", "    # my notes: ", 1) + "\n\n# more notes\n"  # comments and blank lines
    assert noted != stub and started.not_started("naive.py", noted, prints)
    assert not started.not_started("naive.py", stub.replace(part_1, "    group = 2\n" + part_1, 1), prints)  # a line
    assert not started.not_started("naive.py", stub + "def broken(:\n", prints)
    assert started.not_started("naive.py", None, prints)  # not submitted: the stub is graded
    assert not started.not_started("naive.py", stub, {})  # no stub known: graded as started
    # Without solutions/, the fingerprints written with the edition (or the bundle), else none.
    assert started.stub_fingerprints(tmp_path) == {}
    (tmp_path / started.STUB_PRINTS).parent.mkdir(parents=True)
    (tmp_path / started.STUB_PRINTS).write_bytes(started.stub_manifest())
    assert started.stub_fingerprints(tmp_path) == prints


def _edition_copy(root: Path, files: dict[str, str]) -> Path:
    """The course as the student edition holds it (no solutions/, the stubs' fingerprints), with files."""
    ignore = shutil.ignore_patterns("__pycache__", ".triton")
    shutil.copytree(layout.PACKAGE_DIR, root / "gqa_flash", ignore=ignore)
    shutil.copytree(layout.GRADED_TESTS_DIR, root / "tests" / "graded", ignore=ignore)
    shutil.copy(COURSE / "tests" / "conftest.py", root / "tests" / "conftest.py")
    shutil.copy(COURSE / "pyproject.toml", root / "pyproject.toml")
    for path, text in stubs.plan(SOLUTIONS, root / "gqa_flash").items():
        path.write_text(files.get(path.name, text))
    (root / started.STUB_PRINTS).write_bytes(started.stub_manifest())
    return root


def _test_graded(copy: Path, module: str) -> tuple[int, str]:
    """make test-graded MODULE=module, in copy: its exit code and its output."""
    env = dict(os.environ, GQA_FLASH_IMPL="student", GQA_FLASH_MODULE=module, PYTHONPATH=str(copy), TMPDIR=str(copy))
    done = subprocess.run([sys.executable, "-m", "pytest", "tests/graded", "-p", "no:cacheprovider"], cwd=copy,
                          env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.timeout(600)
def test_make_test_graded_grades_the_chosen_modules_and_a_stub_in_one_line(tmp_path):
    part_1 = '    raise NotImplementedError("Part 1'
    copy = _edition_copy(tmp_path, {
        "naive.py": solution("naive.py"),
        "online_softmax.py": _stub("online_softmax.py").replace(part_1, "    m = x_block.amax(-1)\n" + part_1, 1),
        "tiled.py": _stub("tiled.py").replace("    # ", "    # (read this twice) ", 1),  # a comment: not started
    })
    # The module chosen, and a module not started beside it: the run passes.
    code, out = _test_graded(copy, "naive tiled")
    table = out[out.index("points (as make grade counts them)"):]
    assert code == 0 and re.search(r"naive\.py\s+20 / 20\s+passed", table), out[-3000:]
    assert re.search(r"tiled\.py\s+0 / 25\s+not started", table) and "NotImplementedError" not in out, table
    assert " ".join(table.splitlines()[-1].split()) == "total 20 / 45 of the modules run (100 in the course)", table
    assert "8 passed" in out and "skipped" in out and "online_softmax" not in table
    # A module partly started is graded, and its failures (a line each) fail the run; a bonus not started is a line.
    code, out = _test_graded(copy, "online_softmax,backward.py")
    table = out[out.index("points (as make grade counts them)"):]
    assert code == 1 and "Traceback" not in out and "NotImplementedError: Part 2 of online_softmax.py" in table, out
    assert re.search(r"backward\.py \(bonus\)\s+0 / 20\s+not started", table) and not re.search(r"/ 0\b", table)
    code, out = _test_graded(copy, "naive nave")
    assert code == 4 and "MODULE=nave: no such graded module; the modules are naive online_softmax tiled" in out, out


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_passes_module_to_test_graded_and_grade(tmp_path):
    done = subprocess.run(["make", "-n", "-f", "course.mk", "test-graded", "grade", "MODULE=naive tiled",
                           f"VENV={tmp_path / 'venv'}"], cwd=COURSE, capture_output=True, text=True, timeout=60)
    assert 'GQA_FLASH_MODULE="naive tiled"' in done.stdout and "-m pytest tests/graded" in done.stdout, done
    assert '-m gqa_flash.course.grader --only "naive tiled"' in done.stdout, done


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_pytest_options_go_in_args_and_one_typed_after_the_target_stops_at_once(tmp_path):
    # `make test-graded MODULE=backward -k causal` ran all 13 tests (make took -k as its own), then said
    # "No rule to make target 'causal'"; and the README's "-v for tracebacks" did not say how.
    done = subprocess.run(["make", "-n", "-f", "course.mk", "test-graded", "MODULE=forward", "ARGS=-k causal -v",
                           f"VENV={tmp_path / 'venv'}"], cwd=COURSE, capture_output=True, text=True, timeout=60)
    assert "-m pytest tests/graded -k causal -v" in done.stdout, done
    venv = tmp_path / "installed"
    (venv / "bin").mkdir(parents=True)
    (venv / ".installed").touch()  # newer than pyproject.toml: setup has nothing to do
    done = subprocess.run(["make", "-f", "course.mk", "test-graded", "MODULE=backward", "causal", f"VENV={venv}"],
                          cwd=COURSE, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "pytest" not in done.stdout, done
    assert ("make: no target 'causal'. Options for pytest go in ARGS, e.g. make test-graded MODULE=backward "
            'ARGS="-k causal -v"') in done.stderr, done


def test_a_failure_line_is_cut_at_a_word_not_mid_word():
    """Grader lines were cut mid-word ("Or was 0 divid..."); they end at a sentence or a word, with an ellipsis."""
    from gqa_flash.course.grader import plugin

    message = "O: first wrong at [0, 0, 3, 1]. " + "Every entry is NaN: was anything written? " * 5 + (
        "Or was 0 divided by 0 in the normaliser, where a row sees no key at all?")

    class Info:
        value = AssertionError(message)
        traceback = []

    line, timed_out = plugin.describe(Info(), [])
    assert not timed_out and line.startswith("AssertionError: O: first wrong") and line.endswith("…")
    assert len(line) <= len("AssertionError: ") + plugin.MESSAGE_CHARS
    body = line.removeprefix("AssertionError: ").removesuffix("…").rstrip()
    assert message.startswith(body) and message[len(body)] in " .?!;", body[-30:]
