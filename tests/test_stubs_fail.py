"""A test that cannot fail is a defect: every graded test must fail on the stubs.

The grader grades an empty submission: every graded file is then the stub
generated afresh from solutions/ (so a student's own work in gqa_flash/ does
not matter here), in a temporary copy of the course, in a subprocess.
"""

import pytest

from gqa_flash import layout
from gqa_flash.grader import grade


@pytest.mark.timeout(600)
def test_every_graded_test_fails_on_the_stubs(tmp_path):
    report = grade.grade(tmp_path, workdir=tmp_path)
    assert {t.part for t in report.tests} == set(layout.GRADED_MODULES), grade.table(report)
    passed = [t.id for t in report.tests if t.passed]
    assert not passed, f"graded tests that pass on the stubs (they cannot fail): {passed}"
    assert report.score == 0 and report.max_score == pytest.approx(100)  # bonus points come on top


@pytest.mark.timeout(300)
def test_make_test_graded_ends_with_the_points_table(tmp_path):
    # What a student sees from `make test-graded` on a fresh course: no tracebacks, a line per failure
    # (failures alike share one), then the table `make grade` prints. The stubs, written afresh into a
    # copy of the package, stand in for the student's files.
    import os
    import shutil
    import subprocess
    import sys

    from gqa_flash.grader import release

    shutil.copytree(layout.PACKAGE_DIR, tmp_path / "gqa_flash", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "gqa_flash" / "naive.py").write_text(release.student_text(release.SOLUTIONS_DIR / "naive.py"))
    env = dict(os.environ, GQA_FLASH_IMPL="student", PYTHONPATH=str(tmp_path), TMPDIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "pytest", str(layout.GRADED_TESTS_DIR / "test_naive.py"), "-q",
                           "-p", "no:cacheprovider"], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=240)
    out = done.stdout
    assert done.returncode == 1, out
    assert "Traceback" not in out and "def test_" not in out, out
    table = out[out.index("points (as make grade counts them)"):]
    assert "naive.py" in table and "0 / 20" in table and "NotImplementedError" in table, out
    assert table.strip().splitlines()[-1].split()[:4] == ["total", "0", "/", "20"], out
