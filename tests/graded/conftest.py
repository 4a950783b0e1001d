"""Graded tests: each test function carries @pytest.mark.points(n) (100 in all) and a timeout.

A parametrized test's points are shared equally among its cases, so a
submission that gets some cases right earns part of them.

They compare against the trusted float64 reference (gqa_flash.reference) on
fresh random inputs, never against a student's own naive code. A test's name
says what it checks, and its failure says where the first wrong value is.
"""

import time
from pathlib import Path

import pytest

# --- make test-graded's verdict: one line per failure, then the points table make grade prints -------------
#
# Run on their own (pytest tests/graded, or one file of it), the graded tests end with the same
# per-module table as `make grade`, and each failure takes one line (-v: the full tracebacks). In a
# larger run (make test) and under the grader (its plugin prints its own), they print nothing extra.

_ITEMS: dict = {}  # nodeid -> (module, points share, test name)
_START: list = []  # when the run began
_OUTCOMES: dict = {}  # nodeid -> (passed, one-line message)
_INTEGRITY: set = set()  # nodeids whose graded call was not the student's own work (gqa_flash.integrity)
_MESSAGES: dict = {}  # nodeid -> an integrity or address-check message, unwrapped


def _standalone(config) -> bool:
    return not config.pluginmanager.has_plugin("gqa_flash.grader.plugin")


def pytest_configure(config):
    # No tracebacks and no second list of failures: the table at the end gives each failed test one
    # line (tests that failed alike share one).
    if _standalone(config) and config.option.verbose <= 0 and config.option.tbstyle == "auto":
        config.option.tbstyle = "no"
        config.option.reportchars = ""
    _START.append(time.monotonic())
    from gqa_flash import integrity

    integrity.warm_up()  # the guard's one-time import, before any test's time limit starts


def pytest_collection_modifyitems(session, config, items):
    graded = Path(__file__).parent
    if not _standalone(config) or not items or any(graded not in Path(i.path).parents for i in items):
        return
    cases: dict = {}
    for item in items:
        cases.setdefault((item.path, item.originalname), []).append(item)
    for item in items:
        marker = item.get_closest_marker("points")
        points = float(marker.args[0]) if marker and marker.args else 0.0
        module = Path(item.path).stem.removeprefix("test_")
        _ITEMS[item.nodeid] = (module, points / len(cases[(item.path, item.originalname)]), item.name)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # A failure that says the graded call was not the student's own work zeroes its part in the table.
    yield
    if item.nodeid in _ITEMS and call.excinfo is not None:
        from gqa_flash import integrity

        found = integrity.unwrap(call.excinfo.value)
        if found is not None:
            if integrity.is_violation(found):
                _INTEGRITY.add(item.nodeid)
            _MESSAGES[item.nodeid] = str(found).splitlines()[0]


def pytest_runtest_logreport(report):
    if report.nodeid not in _ITEMS or (report.when != "call" and report.passed):
        return
    if report.failed or report.skipped:
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else str(report.longrepr).strip().splitlines()[-1]
        message = _MESSAGES.get(report.nodeid, message)  # the course's own message, out of Triton's wrapping
        _OUTCOMES[report.nodeid] = (False, message.splitlines()[0] if message else "failed")
    elif report.nodeid not in _OUTCOMES:
        _OUTCOMES[report.nodeid] = (True, "")


def pytest_unconfigure(config):
    # After pytest's own summary, so that the run ends with the table.
    terminalreporter = config.pluginmanager.get_plugin("terminalreporter")
    if not _ITEMS or terminalreporter is None:
        return
    from gqa_flash import layout
    from gqa_flash.grader.grade import Report, table, zero_parts_not_own
    from gqa_flash.grader.testrun import TestResult

    order = {m: i for i, m in enumerate(layout.GRADED_MODULES)}  # the course's order, the bonus last
    tests = [TestResult(id=nodeid, part=module, name=name, max_score=share,
                        passed=_OUTCOMES.get(nodeid, (False, ""))[0],
                        message=_OUTCOMES.get(nodeid, (False, "not run"))[1] or "not run",
                        bonus=module in layout.BONUS_MODULES, integrity=nodeid in _INTEGRITY)
             for nodeid, (module, share, name) in sorted(_ITEMS.items(), key=lambda kv: order.get(kv[1][0], 99))]
    terminalreporter.write_sep("=", "points (as make grade counts them)")
    seconds = time.monotonic() - _START[0] if _START else 0.0
    report = Report(submission="your files in gqa_flash/", tests=tests, seconds=seconds)
    report.integrity = zero_parts_not_own(tests)  # as the grader does: a part not the student's own scores 0
    terminalreporter.write_line(table(report))
