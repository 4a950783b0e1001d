"""The stubs as a student first meets them: ``make test-graded`` on a fresh course.

(That every graded test fails on the stubs, a test that cannot fail being a defect, is
tests/grader/test_not_started.py's: it hands in all eight stubs and runs every test. Grading an
empty folder proved nothing: the grader stops it as "nothing to grade" and runs no test.)
"""

import pytest

from gqa_flash.course import layout


@pytest.mark.timeout(300)
def test_make_test_graded_ends_with_the_points_table(tmp_path):
    # What a student sees from `make test-graded` on a fresh course: no tracebacks, a line per failure
    # (failures alike share one), then the table `make grade` prints. The stubs, written afresh into a
    # copy of the package, stand in for the student's files.
    import os
    import shutil
    import subprocess
    import sys

    from gqa_flash.course.grader import stubs

    shutil.copytree(layout.PACKAGE_DIR, tmp_path / "gqa_flash", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "gqa_flash" / "naive.py").write_text(stubs.student_text(stubs.COMPLETED_DIR / "naive.py"))
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


@pytest.mark.timeout(300)
def test_a_run_narrowed_with_k_counts_only_the_tests_it_ran(tmp_path):
    # `pytest tests/graded/test_naive.py -k causal` ended with every deselected test in the table as
    # "not run", 0 points of the module's 20: the table was made before -k deselected them.
    import os
    import subprocess
    import sys

    env = dict(os.environ, GQA_FLASH_IMPL="solutions", TMPDIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "pytest", str(layout.GRADED_TESTS_DIR / "test_naive.py"), "-q",
                           "-p", "no:cacheprovider", "-k", "causal"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=240)
    out = done.stdout
    assert done.returncode == 0 and "deselected" in out, out
    table = out[out.index("points (as make grade counts them)"):]
    assert "not run" not in table, out
    total = table.strip().splitlines()[-1].split()
    assert total[0] == "total" and total[1] == total[3] and float(total[3]) < 20, out
    # Its points are of the tests run, not "of the modules run": naive.py's other tests did not run.
    assert " ".join(total[4:]) == "of the tests run (100 in the course)", out


@pytest.mark.timeout(300)
def test_a_run_in_several_processes_says_why_it_has_no_points_table(tmp_path):
    # make test-graded ARGS="-n 4" ended at "21 failed, 19 passed" with no table and no word why.
    import os
    import subprocess
    import sys

    env = dict(os.environ, GQA_FLASH_IMPL="solutions", TMPDIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "pytest", str(layout.GRADED_TESTS_DIR / "test_naive.py"), "-q",
                           "-p", "no:cacheprovider", "-n", "2", "-k", "causal"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=240)
    assert "no points table: the tests ran in several processes (-n)" in done.stdout, done.stdout[-2000:]
