"""A graded process cannot find ``solutions/`` through its environment or its working directory.

Graded from the instructor's repository, a submission once found ``solutions/forward.py``
through the ``PWD`` it inherited (issue 37). Here a ``naive.py`` looks for the answers
wherever its environment and working directory lead and, if it finds them, hands in the
course's own ``naive.py``, which would score full marks. It must find nothing.
(The interpreter itself may still live in the course's ``.venv``: the README advises
grading from the student edition or the Gradescope bundle, which hold no solutions.)
"""

import os
import re
from pathlib import Path

import pytest

from gqa_flash.course import layout
from gqa_flash.course.grader import grade, sandbox
from gqa_flash.course.grader.testrun import Limits

COURSE = layout.COURSE_DIR

PROBE = r'''
"""A submission that hands in the course's answers if its environment or working directory lead to them."""
import importlib.util
import os
import re
from pathlib import Path


def find_solutions():
    """solutions/naive.py beside any path an environment variable names, or the working directory, or above."""
    places = [Path(p) for value in os.environ.values() for p in re.findall(r"/[^\s:;,'\"=]*", value)]
    places.append(Path.cwd())
    for place in places:
        for folder in (place, *place.parents):
            candidate = folder / "solutions" / "naive.py"
            if candidate.is_file():
                return candidate
    return None


def naive_attention(q, k, v, causal=True, sm_scale=None):
    found = find_solutions()
    if found is None:
        raise NotImplementedError(f"found no solutions/naive.py (working directory {os.getcwd()})")
    spec = importlib.util.spec_from_file_location("the_course_naive", found)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.naive_attention(q, k, v, causal=causal, sm_scale=sm_scale)
'''


def _probe() -> dict:
    namespace: dict = {}
    exec(compile(PROBE, "naive.py", "exec"), namespace)
    return namespace


def test_the_probe_finds_the_solutions_where_the_grader_was_started(monkeypatch, tmp_path):
    """A probe that cannot find anything proves nothing: in the grader's own environment it does."""
    assert (COURSE / "solutions" / "naive.py").is_file(), "run this in the instructor's repository"
    monkeypatch.chdir(tmp_path)
    for name, value in list(os.environ.items()):  # only PWD may lead anywhere (OLDPWD may be another clone's)
        if "/" in value:
            monkeypatch.delenv(name)
    monkeypatch.setenv("PWD", str(COURSE))
    assert _probe()["find_solutions"]() == COURSE / "solutions" / "naive.py"


def test_the_environment_keeps_nothing_that_leads_to_the_course(tmp_path):
    course, copy = Path("/srv/course"), tmp_path / "grading" / "course"
    base = {
        "PWD": "/srv/course", "OLDPWD": "/home/ta",  # where the grader was started
        "PATH": f"/srv/course/.venv/bin{os.pathsep}/usr/bin",  # a list: only the course's entry goes
        "VIRTUAL_ENV": "/srv/course/.venv", "TOOL_OPTS": "--root=/srv/course --quiet", "SOLUTIONS": "/srv/course",
        "HOME": "/home/ta", "OTHER": "/srv/course-archive/x",  # a neighbour whose name starts alike stays
        "TMPDIR": str(tmp_path / "grading" / "tmp"),  # the grading's own folder stays
    }
    env = sandbox.environment(base, copy, course)
    assert env == {"PATH": "/usr/bin", "HOME": "/home/ta", "OTHER": "/srv/course-archive/x",
                   "TMPDIR": str(tmp_path / "grading" / "tmp")}


@pytest.mark.timeout(400)
def test_a_submission_cannot_read_the_solutions_through_its_environment(monkeypatch, tmp_path):
    submitted = tmp_path / "sub"
    submitted.mkdir()
    (submitted / "naive.py").write_text(PROBE)
    # The grader started in the course, as an instructor starts it, with the course's paths about.
    monkeypatch.chdir(COURSE)
    monkeypatch.setenv("PWD", str(COURSE))
    monkeypatch.setenv("OLDPWD", str(COURSE / "notebooks"))
    monkeypatch.setenv("PATH", f"{COURSE / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '/usr/bin')}")
    monkeypatch.setenv("GQA_FLASH_TEST_COURSE_OPTS", f"--root={COURSE}")

    work = tmp_path / "work"
    work.mkdir()
    # Beneath the static gate (which refuses the probe's imports) and the audit hook: the environment alone.
    report = grade.grade(submitted, only={"naive"}, workdir=work, limits=Limits(submission_s=300, gate=False,
                                                                                 audit=False))

    assert report.error is None and report.tests, report.notes
    scored = sum(t.score for t in report.tests)
    leaked = [t.name for t in report.tests if t.passed]
    assert scored == 0 and not leaked, f"the submission found the solutions and scored {scored}: {leaked}"
    # Each test failed because the probe found nothing, run in the grading's copy of the course.
    calls = [t for t in report.tests if "found no solutions/naive.py" in t.message]
    assert calls, [t.message for t in report.tests]
    for test in calls:
        cwd = Path(re.search(r"working directory (\S+?)\)", test.message).group(1))
        assert cwd.name == "executor" and work.resolve() in cwd.resolve().parents, test.message
