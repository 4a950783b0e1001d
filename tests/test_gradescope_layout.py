"""The Gradescope autograder, end to end in Gradescope's own layout: ``make test-gradescope``.

Gradescope unpacks ``autograder.zip`` into ``/autograder/source``, runs its
``setup.sh`` once to build the image, then for each submission puts the
student's files in ``/autograder/submission``, runs ``run_autograder`` and
reads ``/autograder/results/results.json``. Here ``AUTOGRADER_ROOT`` moves that
layout into a temporary folder; ``setup.sh`` builds a fresh virtual environment
there, and three submissions are graded with it: the solutions (full marks),
the stubs (0) and a file with a syntax error (a results.json that says why).

``setup.sh`` downloads torch, so this takes minutes and runs only when asked:
``GQA_FLASH_TEST_GRADESCOPE=1`` (make test-gradescope sets it). Where PyTorch's
CPU index cannot be reached, choose torch's source as setup.sh reads it, e.g.
``TORCH_INDEX_URL= TORCH_REQUIREMENT=torch==2.13.0 make test-gradescope``.
(tests/test_grade.py runs the same run_autograder in this layout on every
``make test``, with the current Python instead of setup.sh's.)
"""

import json
import os
import shutil
import subprocess
import zipfile

import pytest

from gqa_flash.grader import gradescope, release

pytestmark = pytest.mark.skipif(os.environ.get("GQA_FLASH_TEST_GRADESCOPE") != "1",
                                reason="minutes and a torch download: make test-gradescope runs it")

# The fields of results.json that Gradescope reads and the grader writes
# (https://gradescope-autograders.readthedocs.io/en/latest/specs/#output-format).
TOP_FIELDS = {"score", "execution_time", "output", "visibility", "stdout_visibility", "tests"}
TEST_FIELDS = {"name", "score", "max_score", "status", "output", "visibility"}


def _grade(root, files: dict[str, str]) -> dict:
    submission = root / "submission"
    shutil.rmtree(submission, ignore_errors=True)
    submission.mkdir()
    for name, text in files.items():
        (submission / name).write_text(text)
    (root / "results").mkdir(exist_ok=True)
    (root / "results" / "results.json").unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("GQA_FLASH_IMPL", "PYTHONPATH", "TRITON_INTERPRET")}
    proc = subprocess.run(["bash", str(root / "source" / "run_autograder")], env=dict(env, AUTOGRADER_ROOT=str(root)),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((root / "results" / "results.json").read_text())
    assert TOP_FIELDS <= results.keys(), results.keys()
    assert results["tests"] and all(TEST_FIELDS <= t.keys() for t in results["tests"])
    return results


@pytest.mark.timeout(1800)
def test_setup_sh_and_run_autograder_in_gradescopes_layout(tmp_path):
    bundle = tmp_path / "autograder.zip"
    gradescope.write_bundle(bundle)
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

    solutions = {p.name: p.read_text() for p in sorted(release.SOLUTIONS_DIR.glob("*.py"))}
    results = _grade(root, solutions)
    assert all(t["status"] == "passed" for t in results["tests"]), results["output"]
    assert results["score"] == pytest.approx(sum(t["max_score"] for t in results["tests"])), results["output"]
    assert results["score"] >= 100

    stubs = {p.name: text for p, text in release.plan(release.SOLUTIONS_DIR).items()}
    results = _grade(root, stubs)
    assert results["score"] == 0 and all(t["status"] == "failed" for t in results["tests"]), results["output"]

    broken = dict(solutions)
    broken["naive.py"] = solutions["naive.py"].replace("def naive_attention(", "def naive_attention((", 1)
    results = _grade(root, broken)
    naive = [t for t in results["tests"] if t["name"].startswith("naive.py")]
    assert naive and all(t["status"] == "failed" and "SyntaxError" in t["output"] for t in naive), naive[:2]
    assert results["score"] == pytest.approx(sum(t["max_score"] for t in results["tests"] if t not in naive))
