"""Graded tests: each test function carries @pytest.mark.points(n) (100 in all) and a timeout.

A parametrized test's points are shared equally among its cases, so a
submission that gets some cases right earns part of them.

They compare against the trusted float64 reference (gqa_flash.reference) on
fresh random inputs, never against a student's own naive code. A test's name
says what it checks, and its failure says where the first wrong value is.
"""

import os
import time
from pathlib import Path

import pytest

# --- make test-graded's verdict: one line per failure, then the points table make grade prints -------------
#
# Run on their own (pytest tests/graded, or one file of it), the graded tests end with the same
# per-module table as `make grade`, and each failure takes one line (-v: the full tracebacks). In a
# larger run (make test) and under the grader (its plugin prints its own), they print nothing extra.
#
# Run on their own, they also
# - grade only the modules GQA_FLASH_MODULE names (make test-graded MODULE="naive online_softmax"), and
#   count the points out of those modules' own;
# - skip, as one line "not started", the tests of a module still holding its stub (started.not_started: its
#   code, comments aside, is the stub's), so that the run fails only for real failures of started modules.
#   One line of code in a part starts a module, and its tests run and fail as they should.

MODULE_VARIABLE = "GQA_FLASH_MODULE"
_ITEMS: dict = {}  # nodeid -> (module, points share, test name)
_START: list = []  # when the run began
_OUTCOMES: dict = {}  # nodeid -> (passed, one-line message)
_INTEGRITY: set = set()  # nodeids whose graded call was not the student's own work (gqa_flash.course.integrity)
_MESSAGES: dict = {}  # nodeid -> an integrity or address-check message, unwrapped
_NOT_STARTED: set = set()  # modules still holding their stubs, their tests skipped
_GATED: dict = {}  # modules the static gate refuses (gqa_flash.course.grader.gate): {module: its verdict}
_UNCOLLECTED: list = []  # a line for each graded test file that could not be collected
_DESELECTED: list = []  # the tests -k or -m left out: the table's points are then of the tests run


def _chosen_modules() -> set[str]:
    """The modules GQA_FLASH_MODULE names (spaces or commas between; naive.py is naive), none: all."""
    from gqa_flash.course import layout

    names = {n.removesuffix(".py") for n in os.environ.get(MODULE_VARIABLE, "").replace(",", " ").split()}
    unknown = sorted(names - set(layout.GRADED_MODULES))
    if unknown:
        raise pytest.UsageError(f"MODULE={' '.join(unknown)}: no such graded module; the modules are "
                                f"{' '.join(layout.GRADED_MODULES)} (e.g. make test-graded MODULE=naive)")
    return names


def _standalone(config) -> bool:
    return not config.pluginmanager.has_plugin("gqa_flash.course.grader.plugin")


def pytest_ignore_collect(collection_path, config):
    # The other modules' test files are not even imported: one module's run does not hang on another's.
    name = collection_path.name
    if _standalone(config) and name.startswith("test_") and name.endswith(".py"):
        chosen = _chosen_modules()
        if chosen and collection_path.stem.removeprefix("test_") not in chosen:
            return True
    return None


def pytest_collectreport(report):
    # Without tracebacks (pytest_configure), a test file that does not import would go unexplained.
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        lines = str(report.longrepr).strip().splitlines()
        why = crash.message if crash is not None else next((ln for ln in reversed(lines) if ln.startswith("E ")),
                                                            lines[-1] if lines else "")
        _UNCOLLECTED.append(f"could not collect {report.nodeid}: {why.removeprefix('E').strip()} "
                            f"(pytest --tb=short {report.nodeid} shows where)")


def pytest_configure(config):
    # No tracebacks and no second list of failures: the table at the end gives each failed test one
    # line (tests that failed alike share one).
    if _standalone(config) and config.option.verbose <= 0 and config.option.tbstyle == "auto":
        config.option.tbstyle = "no"
        config.option.reportchars = ""
    _START.append(time.monotonic())
    if _standalone(config):
        _chosen_modules()  # a misspelt module stops the run before anything is collected


def pytest_sessionfinish(session):
    from gqa_flash.course.grader import calls

    if calls._student is not None:
        calls._student.stop()


def pytest_deselected(items):
    _DESELECTED.extend(items)


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected: the table counts only the tests that run
def pytest_collection_modifyitems(session, config, items):
    graded = Path(__file__).parent
    if any(graded in Path(i.path).parents for i in items) and not config.option.collectonly:
        # The executor (the process that runs the student's code) starts before the first test, so that its
        # imports count against no test's time limit. A student's code that breaks it breaks a test, not this.
        from gqa_flash.course.grader.calls import student

        student().warm()
    if not _standalone(config) or not items or any(graded not in Path(i.path).parents for i in items):
        return
    _NOT_STARTED.update(_stubs_among({_module(i) for i in items}))
    _GATED.update(_gated_among({_module(i) for i in items} - _NOT_STARTED))
    skip = pytest.mark.skip(reason="not started: the module is still the stub you were given")
    cases: dict = {}
    for item in items:
        cases.setdefault((item.path, item.originalname), []).append(item)
    for item in items:
        marker = item.get_closest_marker("points")
        points = float(marker.args[0]) if marker and marker.args else 0.0
        module = _module(item)
        _ITEMS[item.nodeid] = (module, points / len(cases[(item.path, item.originalname)]), item.name)
        if module in _NOT_STARTED:
            item.add_marker(skip)


def pytest_runtest_setup(item):
    # A graded file the static gate refuses is not run: its tests fail, flagged, as the grader scores them.
    module = _module(item)
    if item.nodeid in _ITEMS and module in _GATED:
        from gqa_flash.course.integrity import IntegrityViolation

        raise IntegrityViolation(_GATED[module])


def _gated_among(modules) -> dict[str, str]:
    """{module: the gate's first verdict} for each module whose file the static gate refuses (grader.gate)."""
    from gqa_flash.course import impl
    from gqa_flash.course.grader import gate, sandbox
    from gqa_flash.course.layout import COURSE_DIR

    stubs = sandbox.stub_files(COURSE_DIR)
    found = {}
    for module in modules:
        try:
            text = impl.path_of(module).read_text()
        except (OSError, ValueError):
            continue
        violations = gate.check(f"{module}.py", text, stubs.get(f"gqa_flash/{module}.py"))
        if violations:
            more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
            found[module] = (f"integrity: gate: {violations[0]}{more}; graded code may use only what its exercise "
                             "needs, so it is not run and this part scores 0")
    return found


def _module(item) -> str:
    return Path(item.path).stem.removeprefix("test_")


def _stubs_among(modules) -> set[str]:
    """The modules whose file, the one these tests load, is still its stub (none with GQA_FLASH_IMPL=solutions)."""
    from gqa_flash.course import impl
    from gqa_flash.course.grader.started import not_started, stub_fingerprints

    if impl.current() != "student":
        return set()
    prints = stub_fingerprints()
    stubs = set()
    for module in modules:
        try:
            text = impl.path_of(module).read_text()
        except (OSError, ValueError):  # no file: its tests say so
            continue
        if not_started(f"{module}.py", text, prints):
            stubs.add(module)
    return stubs


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # A failure that says the graded call was not the student's own work zeroes its part in the table.
    yield
    if item.nodeid in _ITEMS and call.excinfo is not None:
        from gqa_flash.course import integrity

        where = getattr(call.excinfo.value, "student_where", None)
        if where:  # the executor said where in the graded file the student's code raised it
            name = getattr(call.excinfo.value, "student_type", type(call.excinfo.value).__name__)
            text = str(call.excinfo.value).removeprefix(f"{name}: ")
            _MESSAGES[item.nodeid] = f"{name}: {text.splitlines()[0] if text else ''} ({where})"
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
    if terminalreporter is None or config.option.collectonly:
        return
    if not _ITEMS:
        if _standalone(config) and getattr(config.option, "numprocesses", None):  # pytest-xdist's -n
            terminalreporter.write_line("no points table: the tests ran in several processes (-n); run without "
                                        "-n for the table (make test-graded runs in one)")
        return
    from gqa_flash.course import layout
    from gqa_flash.course.grader.grade import zero_parts_not_own
    from gqa_flash.course.grader.report import Report, table
    from gqa_flash.course.grader.testrun import TestResult

    order = {m: i for i, m in enumerate(layout.GRADED_MODULES)}  # the course's order, the bonus last
    tests = [TestResult(id=nodeid, part=module, name=name, max_score=share,
                        passed=_OUTCOMES.get(nodeid, (False, ""))[0],
                        message=_OUTCOMES.get(nodeid, (False, "not run"))[1] or "not run",
                        bonus=module in layout.BONUS_MODULES, integrity=nodeid in _INTEGRITY,
                        not_started=module in _NOT_STARTED)
             for nodeid, (module, share, name) in sorted(_ITEMS.items(), key=lambda kv: order.get(kv[1][0], 99))]
    terminalreporter.write_sep("=", "points (as make grade counts them)")
    seconds = time.monotonic() - _START[0] if _START else 0.0
    report = Report(submission="your files in gqa_flash/", tests=tests, seconds=seconds, notes=list(_UNCOLLECTED),
                    deselected=len(_DESELECTED))
    report.integrity = zero_parts_not_own(tests)  # as the grader does: a part not the student's own scores 0
    terminalreporter.write_line(table(report))
