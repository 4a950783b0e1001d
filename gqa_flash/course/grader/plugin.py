"""The pytest plugin the grader loads into each test run (``-p gqa_flash.course.grader.plugin``).

It runs inside the test process, next to the submission's code, and does four
things the grader outside cannot:

* it reads each test's points (``@pytest.mark.points(n)``; a parametrized
  test's points are shared among its cases in whole hundredths, so that they
  add up exactly: :func:`shares`) and its timeout mark, and
  caps that timeout when the grader asks (``--grade-timeout-cap``: the
  grader's own tests use a few seconds instead of a minute);
* it writes one JSON line per event to ``--grade-log`` as the run goes:
  ``collected`` (every test, its part and points) before any test runs,
  ``start`` when a test begins, ``result`` when it ends. A run that dies in
  the middle of a test (a segfault, ``os._exit``) leaves a ``start`` with no
  ``result``: the grader knows which test killed it, and restarts the run
  without it;
* it turns a failure into one short line a student can act on: the
  exception, its first line, and where in the graded file it was raised;
* it gives up on a part that has already timed out or crashed ``--grade-strikes``
  times (counting the strikes of earlier runs, ``--grade-struck``): a
  submission that hangs in every test would otherwise cost a full timeout per
  test;
* it runs none of the tests of a part the grader found not started
  (``--grade-not-started``: its file is still the stub, which passes none of
  them): each is collected, with its points, and gets its failed ``result``
  at once, as "not started".

It also lowers the process's own limits before any student code runs: no core
dumps, no file larger than ``--grade-max-file-mb`` (a submission that prints
forever fills the disk otherwise), and, on a machine with no GPU, at most
``--grade-memory-gb`` of address space.

Everything here runs *before* the submission's code is imported (the graded
modules are loaded lazily, by the first test that calls them), so the
``collected`` line, the points and the limits cannot be touched by it.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest

from gqa_flash.course import integrity
from gqa_flash.course.grader.calls import StudentCrash, StudentRaised
from gqa_flash.course.grader.isolation import set_limit
from gqa_flash.course.grader.report import TIMED_OUT, clip
from gqa_flash.course.grader.started import NOT_STARTED
from gqa_flash.course.layout import GRADED_FILES
from gqa_flash.course.grader.sandbox import HIDDEN_DIR  # where the grader puts an instructor's extra tests

DEFAULT_TIMEOUT = 60.0  # seconds, for a test without a timeout mark (an instructor's hidden test)
MESSAGE_CHARS = 300  # one failure line; the rest is noise in a gradebook


def pytest_addoption(parser):
    group = parser.getgroup("gqa-flash grading")
    group.addoption("--grade-log", help="write JSON lines (collected/start/result) to this file")
    group.addoption("--grade-timeout-cap", type=float, default=None, help="cap every test's timeout (seconds)")
    group.addoption("--grade-strikes", type=int, default=2, help="stop running a part after this many hangs or crashes")
    group.addoption("--grade-struck", default="", help="strikes from earlier runs: part:n,part:n")
    group.addoption("--grade-max-file-mb", type=float, default=256, help="largest file the run may write")
    group.addoption("--grade-memory-gb", type=float, default=16, help="address space limit on a CPU-only machine")
    group.addoption("--grade-not-started", default="", help="parts still their stubs, not run: part,part")


class _Recorder:
    def __init__(self, config):
        self.log = open(config.getoption("grade_log"), "a", buffering=1)
        self.cap = config.getoption("grade_timeout_cap")
        self.strike_limit = config.getoption("grade_strikes")
        self.strikes = {}
        for entry in filter(None, config.getoption("grade_struck").split(",")):
            part, _, n = entry.rpartition(":")
            self.strikes[part] = int(n)
        self.rootdir = Path(config.rootpath)
        self.not_started = set(filter(None, config.getoption("grade_not_started").split(",")))
        self.outcome = {}  # nodeid -> (passed, message, timed_out) so far, over setup/call/teardown
        self.integrity = set()  # nodeids whose graded call was not the student's own work
        self.started = {}
        self.parts = {}  # nodeid -> part

    def write(self, **record):
        self.log.write(json.dumps(record) + "\n")

    # --- collection: points, parts, timeouts ---------------------------------

    def part_of(self, item) -> tuple[str, bool]:
        """The graded module a test belongs to (test_naive.py -> naive), and whether it is hidden."""
        rel = item.path.relative_to(self.rootdir).as_posix()
        stem = item.path.stem.removeprefix("test_")
        return stem, rel.startswith(HIDDEN_DIR + "/")

    def collected(self, items) -> list:
        """Write every test's points, part and timeout; return the tests not to run (their parts not started),
        each with its result written. Points are shared among the cases of one test function. (A restarted run
        collects fewer cases; the grader keeps the shares of the first run.)"""
        cases = {}
        for item in items:
            cases.setdefault((item.path, item.originalname), []).append(item)
        tests = []
        for item in items:
            marker = item.get_closest_marker("points")
            points = float(marker.args[0]) if marker and marker.args else 0.0
            siblings = cases[(item.path, item.originalname)]
            share = shares(points, len(siblings))[siblings.index(item)]
            marker = item.get_closest_marker("timeout")
            timeout = float(marker.args[0]) if marker and marker.args else DEFAULT_TIMEOUT
            if self.cap is not None:
                timeout = min(timeout, self.cap)
            # Prepended, so it is the closest timeout mark: pytest-timeout reads that one.
            item.add_marker(pytest.mark.timeout(timeout), append=False)
            part, hidden = self.part_of(item)
            self.parts[item.nodeid] = part
            tests.append(dict(id=item.nodeid, part=part, hidden=hidden, name=item.name,
                              max_score=share, timeout=timeout))
        self.write(event="collected", tests=tests)
        idle = [item for item in items if self.part_of(item) in {(p, False) for p in self.not_started}]
        for item in idle:
            self.write(event="result", id=item.nodeid, passed=False, message=NOT_STARTED, timed_out=False,
                       seconds=0.0, integrity=False, not_started=True)
        return idle

    # --- running ----------------------------------------------------------------

    def refuse_if_struck_out(self, item) -> None:
        part = self.parts.get(item.nodeid) or self.part_of(item)[0]
        if self.strikes.get(part, 0) >= self.strike_limit:
            # Failing in setup (not skipping the protocol) keeps pytest's fixture bookkeeping right.
            pytest.fail(f"not run: {part} already hung or crashed {self.strikes[part]} times", pytrace=False)

    def start(self, nodeid):
        self.started[nodeid] = time.monotonic()
        self.outcome[nodeid] = (True, "", False)
        self.write(event="start", id=nodeid)

    def report(self, report, excinfo, graded_files):
        passed, message, timed_out = self.outcome.get(report.nodeid, (True, "", False))
        if not passed:  # the first failure of a test is the one worth reading
            return
        if report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else "skipped"
            self.outcome[report.nodeid] = (False, f"not run: {reason}", False)
        elif report.failed:
            message, timed_out = describe(excinfo, graded_files)
            if excinfo is not None and integrity.is_violation(excinfo.value):
                self.integrity.add(report.nodeid)
            message = message.replace(f"{self.rootdir}{os.sep}", "")  # paths relative to the course copy
            self.outcome[report.nodeid] = (False, message, timed_out)

    def finish(self, nodeid):
        passed, message, timed_out = self.outcome.pop(nodeid, (False, "no report", False))
        if timed_out:
            part = self.parts[nodeid]
            self.strikes[part] = self.strikes.get(part, 0) + 1
        seconds = time.monotonic() - self.started.pop(nodeid, time.monotonic())
        self.write(event="result", id=nodeid, passed=passed, message=message,
                   timed_out=timed_out, seconds=round(seconds, 3), integrity=nodeid in self.integrity)


def shares(points: float, n: int) -> list[float]:
    """A test's points shared among its n cases, in whole hundredths, the remainder on the last cases.

    So the shares add up to the points exactly, in decimal (2 over 3 cases: 0.66, 0.67, 0.67; never
    0.6667 three times, which Gradescope shows and adds up to 1.9999). Points finer than a hundredth
    (an instructor's hidden test worth 0.125) are shared in the finest unit they need."""
    unit = 100
    while abs(points * unit - round(points * unit)) > 1e-6 and unit < 10**6:
        unit *= 10
    base, extra = divmod(round(points * unit), n)
    return [(base + (i >= n - extra)) / unit for i in range(n)]


def describe(excinfo, graded_files) -> tuple[str, bool]:
    """One line: what went wrong, and where in the submission's files. Also: was it a timeout?"""
    if excinfo is None:
        return "failed", False
    exc = integrity.unwrap(excinfo.value) or excinfo.value  # the course's own message, out of Triton's wrapping
    text = str(exc)
    if "Timeout" in text and "pytest-timeout" in text and not hasattr(exc, "student_type"):
        seconds = text.split("(>", 1)[-1].split("s)", 1)[0].removesuffix(".0")
        return f"{TIMED_OUT}{seconds} s: an endless loop, or far too slow", True
    if isinstance(exc, StudentCrash):  # the executor died: a strike, as a hang is
        return clip(text.strip().splitlines()[0], 2 * MESSAGE_CHARS), True
    if integrity.unwrap(exc) is not None:  # integrity: or address check: the message says it all
        return clip(text.strip().splitlines()[0], 2 * MESSAGE_CHARS), False
    if isinstance(exc, pytest.fail.Exception):  # pytest.fail(...): the message says it all
        return clip(text.strip().splitlines()[0], MESSAGE_CHARS) if text.strip() else "failed", False
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"SyntaxError in {Path(exc.filename).name}, line {exc.lineno}: {exc.msg}", False
    first = clip(text.strip().splitlines()[0], MESSAGE_CHARS) if text.strip() else ""  # at a word, with …
    name = getattr(exc, "student_type", None) if isinstance(exc, StudentRaised) else type(exc).__name__
    if isinstance(exc, StudentRaised):
        first = first.split(": ", 1)[1] if ": " in first else ""
    line = f"{name}: {first}" if first else name
    if getattr(exc, "student_where", None):  # the executor said where in the graded file it was raised
        return f"{line} ({exc.student_where})", False
    # Where the submission raised it: the deepest frame in a graded file.
    for entry in reversed(excinfo.traceback):
        path = Path(str(entry.path))
        if path.name in graded_files and path.parent.name == "gqa_flash":
            line += f" ({path.name}, line {entry.lineno + 1})"
            break
    return line, False


# --- hooks ------------------------------------------------------------------------

_recorder: _Recorder | None = None


def pytest_configure(config):
    global _recorder
    if not config.getoption("grade_log"):
        return
    set_limit(resource.RLIMIT_CORE, 0)
    set_limit(resource.RLIMIT_FSIZE, int(config.getoption("grade_max_file_mb") * 2**20))
    from gqa_flash.course import runtime

    if runtime.DEVICE.type == "cpu":  # CUDA maps far more address space than it uses
        set_limit(resource.RLIMIT_AS, int(config.getoption("grade_memory_gb") * 2**30))
    _recorder = _Recorder(config)
    from gqa_flash.course.grader.calls import student

    student().start()  # the executor boots while the tests are collected (the graded conftest waits for it)


def pytest_collectreport(report):
    if _recorder is not None and report.failed:
        _recorder.write(event="collect_error", path=report.nodeid, message=str(report.longrepr)[-2000:])


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    if _recorder is not None:
        idle = _recorder.collected(items)
        if idle:  # not started: their results are written, they are not run
            items[:] = [item for item in items if item not in idle]
            config.hook.pytest_deselected(items=idle)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if _recorder is not None:
        _recorder.refuse_if_struck_out(item)


def pytest_runtest_logstart(nodeid, location):
    if _recorder is not None:
        _recorder.start(nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if _recorder is not None:
        _recorder.report(outcome.get_result(), call.excinfo, set(GRADED_FILES))


def pytest_runtest_logfinish(nodeid, location):
    if _recorder is not None:
        _recorder.finish(nodeid)
