"""``checks.progress()``: one wording for a file not started, and the bonus heading names every bonus notebook
(issue 47: unstarted files were worded three ways, "Part 1 is not implemented yet", "not started: ... (the
placeholder)" and a wrong answer such as "loads the wrong numbers", and ring.py was left out).

A file not started is one the grader would call so (gqa_flash.course.grader.started: still, comments aside, the stub
the course hands out); its checks are not run.
"""

import pytest

from gqa_flash.course import impl, layout
from gqa_flash.course.lab import checks

pytestmark = pytest.mark.skipif(not impl.SOLUTIONS_DIR.is_dir(), reason="the student edition has no solutions/")


@pytest.fixture
def stubs(tmp_path, monkeypatch):
    """Every graded file the checks run is its stub, as on a fresh course."""
    from gqa_flash.course.grader import stubs

    plan = stubs.plan(impl.SOLUTIONS_DIR, tmp_path)
    written = {}
    for path, text in plan.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written[path.stem] = path
    real = impl.path_of
    monkeypatch.setattr(impl, "path_of", lambda name, choice=None: written.get(name) or real(name, choice))
    return written


def test_a_fresh_course_reads_one_line_per_file_in_one_wording(stubs, capsys):
    checks.progress()
    lines = capsys.readouterr().out.splitlines()
    files = [line for line in lines if line.startswith("FAIL ")]
    assert [line.split()[1] for line in files] == list(layout.GRADED_FILES), lines
    assert {line.split(": ", 1)[1] for line in files} == {checks.NOT_STARTED}, lines


def test_the_bonus_heading_names_every_bonus_notebook_and_ring_is_under_it(stubs, capsys):
    checks.progress()
    lines = capsys.readouterr().out.splitlines()
    heading = lines.index(checks.BONUS_HEADING)
    assert "08" in checks.BONUS_HEADING and "06" in checks.BONUS_HEADING and "07" in checks.BONUS_HEADING
    assert [line.split()[1] for line in lines[heading + 1:]] == [f"{m}.py" for m in layout.BONUS_MODULES], lines


def test_a_started_file_is_not_taken_for_a_stub(monkeypatch):
    monkeypatch.setenv("GQA_FLASH_IMPL", "solutions")
    assert checks.not_started() == set()
