"""The Gradescope autograder, end to end in Gradescope's own layout.

Gradescope unpacks ``autograder.zip`` into ``/autograder/source``, runs its
``setup.sh`` once to build the image, then for each submission puts the
student's files in ``/autograder/submission``, runs ``run_autograder`` and
reads ``/autograder/results/results.json``. Here ``AUTOGRADER_ROOT`` moves that
layout into a temporary folder.

On every ``make test``, ``run_autograder`` grades a submission there with the
current Python. With ``make test-gradescope``, ``setup.sh`` also builds a fresh
virtual environment, and three submissions are graded with it: the solutions
(full marks), the stubs (0) and a file with a syntax error (a results.json that
says why). ``setup.sh`` downloads torch, so that takes minutes and runs only
when asked: ``GQA_FLASH_TEST_GRADESCOPE=1`` (make test-gradescope sets it).
Where PyTorch's CPU index cannot be reached, choose torch's source as setup.sh
reads it, e.g. ``TORCH_INDEX_URL= TORCH_REQUIREMENT=torch==2.13.0 make test-gradescope``.
"""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gqa_flash.course.grader import cli, started, stubs
from gqa_flash.course.grader.bundle import write_bundle
from gqa_flash.course.testing import folder

SOLUTIONS = stubs.COMPLETED_DIR

# The fields of results.json that Gradescope reads and the grader writes
# (https://gradescope-autograders.readthedocs.io/en/latest/specs/#output-format).
TOP_FIELDS = {"score", "execution_time", "output", "visibility", "stdout_visibility", "tests"}
TEST_FIELDS = {"name", "score", "max_score", "status", "output", "visibility"}


def _grade(root, files: dict[str, str], **extra_env) -> dict:
    submission = root / "submission"
    shutil.rmtree(submission, ignore_errors=True)
    submission.mkdir()
    for name, text in files.items():
        (submission / name).write_text(text)
    (root / "results").mkdir(exist_ok=True)
    (root / "results" / "results.json").unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("GQA_FLASH_IMPL", "PYTHONPATH", "TRITON_INTERPRET")}
    proc = subprocess.run(["bash", str(root / "source" / "run_autograder")],
                          env=dict(env, AUTOGRADER_ROOT=str(root), **extra_env),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((root / "results" / "results.json").read_text())
    assert TOP_FIELDS <= results.keys(), results.keys()
    assert results["tests"] and all(TEST_FIELDS <= t.keys() for t in results["tests"])
    return results


@pytest.mark.skipif(os.environ.get("GQA_FLASH_TEST_GRADESCOPE") != "1",
                    reason="minutes and a torch download: make test-gradescope runs it")
@pytest.mark.timeout(1800)
def test_setup_sh_and_run_autograder_in_gradescopes_layout(tmp_path):
    bundle = tmp_path / "autograder.zip"
    write_bundle(bundle)
    root = tmp_path / "autograder"  # stands in for /autograder
    with zipfile.ZipFile(bundle) as z:
        z.extractall(root / "source")
    env = dict(os.environ, AUTOGRADER_ROOT=str(root))
    setup = subprocess.run(["bash", str(root / "source" / "setup.sh")], env=env, capture_output=True, text=True,
                           timeout=1500)
    assert setup.returncode == 0, setup.stdout[-3000:] + setup.stderr[-3000:]
    venv_python = root / "venv" / "bin" / "python"
    probe = subprocess.run([str(venv_python), "-c", "import torch, triton, numpy, pytest, pytest_timeout;"
                            "print(torch.__version__, triton.__version__)"], capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr
    print("setup.sh built a virtual environment with torch, triton:", probe.stdout.strip())

    solutions = {p.name: p.read_text() for p in sorted(stubs.COMPLETED_DIR.glob("*.py"))}
    results = _grade(root, solutions)
    assert all(t["status"] == "passed" for t in results["tests"]), results["output"]
    assert results["score"] == pytest.approx(sum(t["max_score"] for t in results["tests"])), results["output"]
    assert results["score"] >= 100

    written = {p.name: text for p, text in stubs.plan(stubs.COMPLETED_DIR).items()}
    results = _grade(root, written)
    assert results["score"] == 0 and all(t["status"] == "failed" for t in results["tests"]), results["output"]
    assert all(t["name"].endswith(": not started") for t in results["tests"]), results["output"]  # one per module

    broken = dict(solutions)
    broken["naive.py"] = solutions["naive.py"].replace("def naive_attention(", "def naive_attention((", 1)
    results = _grade(root, broken)
    naive = [t for t in results["tests"] if t["name"].startswith("naive.py")]
    assert naive and all(t["status"] == "failed" and "SyntaxError" in t["output"] for t in naive), naive[:2]
    assert results["score"] == pytest.approx(sum(t["max_score"] for t in results["tests"] if t not in naive))

    # Where the container forbids namespaces, the executor runs as setup.sh's unprivileged user instead.
    if os.geteuid() != 0:
        return
    user_python = subprocess.run(["runuser", "-u", "gqa-flash-executor", "--", str(venv_python), "-c", "pass"],
                                 capture_output=True, text=True)
    if user_python.returncode != 0:  # e.g. a Python under /root, which no other user may enter
        print("the executor's user cannot run this venv's Python, so the user isolation was not tried:",
              user_python.stderr.strip()[-300:])
        return
    results = _grade(root, {"naive.py": solutions["naive.py"]}, GQA_FLASH_ISOLATION="user")
    assert results["score"] == 20, results["output"]
    assert "NOT ISOLATED" not in results["output"], results["output"]


# --- run_autograder with the current Python, on every make test ------------------------------

HIDDEN_TEST = '''
import pytest
import torch
import gqa_flash
from gqa_flash.course.grader.calls import own_work, student


@pytest.mark.points(5)
@pytest.mark.timeout(30)
@pytest.mark.parametrize("n", [3, 70])
def test_naive_long_and_short(n):
    q = torch.randn(1, 2, n, 16)
    out = student().call("naive_attention", q, q, q, watch=own_work("naive")).value  # the student's code runs apart
    ref, _ = gqa_flash.reference_attention(q, q, q)
    assert torch.allclose(out.double(), ref, atol=1e-4)
'''


def test_the_gradescope_bundle_grades_a_submission_in_an_autograder_layout(tmp_path):
    hidden = folder(tmp_path, "hidden", {"test_hidden_naive.py": HIDDEN_TEST})
    bundle = tmp_path / "autograder.zip"
    assert cli.main(["--gradescope-bundle", str(bundle), "--extra-tests", str(hidden)]) == 0

    root = tmp_path / "autograder"  # stands in for /autograder
    with zipfile.ZipFile(bundle) as z:
        names = z.namelist()
        assert {"setup.sh", "run_autograder", "requirements.txt", "gqa_flash/course/grader/grade.py",
                "tests/graded/test_forward.py", "hidden_tests/test_hidden_naive.py"} <= set(names)
        assert not any(n.startswith("solutions") for n in names)
        for name in stubs.plan(SOLUTIONS, Path("gqa_flash")):  # the stubs, never the solutions
            assert z.read(name.as_posix()).decode() == stubs.plan(SOLUTIONS, Path("gqa_flash"))[name]
        assert z.getinfo("run_autograder").external_attr >> 16 & 0o111
        z.extractall(root / "source")
    assert "download.pytorch.org/whl/cpu" in (root / "source" / "setup.sh").read_text()
    folder(root, "submission", {n: (SOLUTIONS / n).read_text() for n in ("naive.py", "tiled.py")})

    env = dict(os.environ, AUTOGRADER_ROOT=str(root), GQA_FLASH_PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(root / "source" / "run_autograder")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["score"] == 20 + 25 + 5, results["output"]
    # The modules not submitted are graded as their stubs, and each is one line that says so: the bonus ones too.
    assert started.STUB_PRINTS in names
    lines = {t["name"]: (t["score"], t["max_score"]) for t in results["tests"] if "not handed in" in t["name"]}
    assert lines == {"online_softmax.py: not handed in": (0, 15), "forward.py: not handed in": (0, 40),
                     "windows.py (bonus): not handed in": (0, 15),
                     "backward.py (bonus): not handed in": (0, 20), "decode.py (bonus): not handed in": (0, 15),
                     "ring.py (bonus): not handed in": (0, 10)}, lines
    others = [t for t in results["tests"] if t["name"] not in lines]
    assert all(t["status"] == "passed" and t["name"].startswith(("naive.py: ", "tiled.py: ", "hidden ("))
               for t in others), [t["name"] for t in others]
    hidden_tests = [t for t in results["tests"] if t["visibility"] == "after_due_date"]
    assert len(hidden_tests) == 2 and all(t["status"] == "passed" for t in hidden_tests)
    assert all(t["max_score"] == 2.5 for t in hidden_tests)
    assert sorted(p.name for p in root.iterdir()) == ["results", "source", "submission"]


def test_writing_the_bundle_says_what_to_set_the_assignments_total_to(tmp_path, capsys):
    # The tests' maxima add up to 160 (100 required, 60 bonus): Gradescope's total is the instructor's to set.
    assert cli.main(["--gradescope-bundle", str(tmp_path / "autograder.zip")]) == 0
    err = capsys.readouterr().err
    assert "set the assignment's total points to 100, the required modules' (naive 20, online_softmax 15, " \
           "tiled 25, forward 40)" in err, err
    assert "(windows 15, backward 20, decode 15, ring 10) come on top, so a submission scores up to 160 / 100; 160, " \
           "the sum " \
           "of the tests' maxima, is not the total to set" in err, err
    hidden = folder(tmp_path, "hidden", {"test_hidden_naive.py": HIDDEN_TEST})  # 5 points, not a bonus
    assert cli.main(["--gradescope-bundle", str(tmp_path / "with_hidden.zip"), "--extra-tests", str(hidden)]) == 0
    err = capsys.readouterr().err
    assert "total points to 105, the required modules' (naive 20, online_softmax 15, tiled 25, forward 40; " \
           "hidden tests 5)" in err and "up to 165 / 105" in err, err


def test_the_gradescope_fallback_is_json_when_the_grader_cannot_start(tmp_path):
    # run_autograder with a Python that does not exist: the grader never runs, and the one file meant to tell
    # the student to ask their instructor must still be JSON that Gradescope accepts.
    bundle = tmp_path / "autograder.zip"
    assert cli.main(["--gradescope-bundle", str(bundle)]) == 0
    root = tmp_path / "autograder"
    with zipfile.ZipFile(bundle) as z:
        z.extractall(root / "source")
    folder(root, "submission", {"naive.py": (SOLUTIONS / "naive.py").read_text()})
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), GQA_FLASH_PYTHON=str(tmp_path / "no-such-python"))
    proc = subprocess.run(["bash", str(root / "source" / "run_autograder")], env=env, capture_output=True,
                          text=True, timeout=60)
    results = json.loads((root / "results" / "results.json").read_text())  # raises unless valid JSON
    assert results["score"] == 0 and results["tests"] == [], results
    assert "tell your instructor" in results["output"], (proc.stderr, results)
