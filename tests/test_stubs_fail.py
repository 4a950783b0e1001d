"""A test that cannot fail is a defect: every graded test must fail on the stubs.

The stubs are generated afresh from solutions/ into a temporary copy of the
course (so a student's own work in gqa_flash/ does not matter here), and the
graded tests run there in a subprocess with GQA_FLASH_IMPL=student.
"""

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from gqa_flash import release

COURSE = release.COURSE_DIR


@pytest.mark.timeout(600)
def test_every_graded_test_fails_on_the_stubs(tmp_path):
    course = tmp_path / "course"
    shutil.copytree(COURSE / "gqa_flash", course / "gqa_flash", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(COURSE / "tests", course / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(COURSE / "pyproject.toml", course / "pyproject.toml")
    for path, text in release.plan(COURSE / "solutions", course / "gqa_flash").items():
        path.write_text(text)

    report = tmp_path / "report.xml"
    env = dict(os.environ, GQA_FLASH_IMPL="student", PYTHONPATH=str(course))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/graded", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"],
        cwd=course, env=env, capture_output=True, text=True, timeout=580,
    )
    cases = ET.parse(report).getroot().iter("testcase")
    passed = [
        f"{c.get('classname')}::{c.get('name')}"
        for c in cases
        if not any(child.tag in ("failure", "error", "skipped") for child in c)
    ]
    assert proc.returncode == 1, f"pytest on the stubs ended with {proc.returncode}:\n{proc.stdout[-2000:]}"
    assert not passed, f"graded tests that pass on the stubs (they cannot fail): {passed}"
