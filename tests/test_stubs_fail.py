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
