"""Running the graded tests on a submission: a subprocess, a watchdog, and restarts.

The tests run in a separate Python process (``python -m pytest``) in a fresh
copy of the course (:mod:`gqa_flash.course.grader.sandbox`), with ``GQA_FLASH_IMPL=student``
and the copy first on ``PYTHONPATH``, so that ``import gqa_flash`` is the
copy's package and its graded files are the submission's. The process writes
what happens, test by test, to a log (:mod:`gqa_flash.course.grader.plugin`), which
this module reads while it runs.

Whatever the submission does, every test ends up with a result:

* an exception, a wrong value, a missing file, a syntax error, an import that
  fails: the test fails, with its message, and the run goes on (graded
  modules are imported by the tests that call them, so ``forward.py``
  failing to import costs the forward tests and nothing else);
* an endless loop in Python or in an interpreted kernel: pytest-timeout stops
  the test at its time limit (the test's own ``timeout`` mark);
* a test that will not stop (a loop that swallows the timeout, a hang in C,
  a GPU kernel that never returns): the watchdog here kills the process a
  little after the test's limit;
* a crash (a segfault, ``os._exit``, an interpreter that dies): the log shows
  which test was running, that test fails, and the run restarts, in a fresh
  copy, with the tests not yet done.

A part (a graded module) that hangs or crashes ``strikes`` times is not run
any further: its remaining tests fail with a message saying so. The whole
submission has a time limit too; tests it leaves unrun fail with a message.

A part whose file is still its stub (:func:`gqa_flash.course.grader.started.parts_not_started`) is not run at
all: its tests are collected, for their names and points, and each fails at once as "not started" (a stub
passes none of them), so a submission of two modules takes the time of two modules' tests.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from gqa_flash.course.grader import isolation, sandbox, started

LOG_TAIL = 2000  # characters of pytest's own output kept for a message when a run goes wrong


@dataclass
class Limits:
    submission_s: float = 600.0  # all the runs of one submission together
    timeout_cap_s: float | None = None  # caps every test's own timeout mark (the grader's tests use a few seconds)
    strikes: int = 2  # hangs or crashes before a part is given up
    grace_s: float = 10.0  # past a test's timeout, before the watchdog kills the process
    max_file_mb: float = 256  # the largest file the test process may write (a submission that prints forever)
    memory_gb: float = 16  # address space of the test process, on a machine with no GPU
    first_failure: bool = False  # stop at the first failing test (a quick "does it lose points?"; the rest: not run)
    # Run the tests of a module still holding its stub too (they all fail: tests/grader/test_not_started.py runs
    # them so).
    run_not_started: bool = False
    # The defences before and around the student's code; off only in the grader's own tests of those beneath.
    gate: bool = True  # the static gate (gqa_flash.course.grader.gate): a refused file never runs
    audit: bool = True  # the executor's audit hook (gqa_flash.course.grader.audit)


@dataclass
class TestResult:
    id: str  # pytest's node id, e.g. tests/graded/test_naive.py::test_naive_gqa_head_mapping[8-2]
    part: str  # the graded module it tests (naive, ...), or the stem of an extra test file
    name: str  # the test function and its case
    max_score: float
    passed: bool = False
    message: str = ""
    hidden: bool = False  # an instructor's extra test
    bonus: bool = False  # a bonus module's test: its points are on top of the maximum
    seconds: float = 0.0
    integrity: bool = False  # failed because the graded call was not the student's own work (integrity.py)
    not_started: bool = False  # its module is still the stub the course hands out (started.not_started)

    @property
    def score(self) -> float:
        return self.max_score if self.passed else 0.0


@dataclass
class RunReport:
    tests: list[TestResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # problems that belong to no single test
    runs: int = 0  # pytest processes started (1 unless something crashed)
    isolation: str = "none"  # how the executor ran the student's code (gqa_flash.course.grader.isolation)


RUN_MARK = "GQA_FLASH_GRADE_RUN"  # an environment variable that marks every process of one test run
EXIT_GRACE_S = 15.0  # how long a test process may take to exit once every test has its result

# Live test processes, so that an interrupted batch can kill them (they run in
# their own sessions, out of reach of the terminal's Ctrl-C).
_live: set[subprocess.Popen] = set()
_live_lock = threading.Lock()
STOP = threading.Event()  # set: start no more test processes (cleared by whoever starts grading again)


def stop() -> None:
    """Kill every running test process and start no more (an interrupted batch)."""
    STOP.set()
    with _live_lock:
        for proc in list(_live):
            _kill(proc)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole group: anything the submission spawned too
    except (ProcessLookupError, PermissionError):
        pass


def run_tests(course: sandbox.Course, files: dict[str, bytes], workdir: Path, test_files: list[str],
              limits: Limits = Limits()) -> RunReport:
    """Run test_files of course on the submitted files, in workdir; every collected test gets a result."""
    report = RunReport()
    deadline = time.monotonic() + limits.submission_s
    collected: dict[str, dict] | None = None  # id -> what the plugin said about it, from the first run
    done: dict[str, TestResult] = {}
    strikes: dict[str, int] = {}
    targets = list(test_files)
    copy = workdir / "course"  # the judge's: the course's tests and package; no student code
    tree = workdir / "executor"  # the executor's: the package with the submission's graded files, nothing else
    report.isolation = isolation.choose()
    if report.isolation == "user":  # the executor's user must reach its folder (only that: no listing)
        workdir.chmod(0o711)
    tampering: list[str] = []
    idle = [] if limits.run_not_started else started.parts_not_started(files, test_files, course.graded_files)
    while not (STOP.is_set() and collected is None):
        sandbox.build(course, copy, {})
        tree_files = sandbox.build_executor(course, tree, files)
        log = workdir / f"run{report.runs}.jsonl"
        out = workdir / f"run{report.runs}.out"
        run = _run_once(copy, targets, log, out, limits, strikes, deadline, tree, report.isolation, limits.audit,
                        idle)
        report.runs += 1
        found = sandbox.tampered(course, copy) + sandbox.tampered(course, tree, tree_files)
        tampering.extend(p for p in found if p not in tampering)
        if run.lingered:
            report.notes.append(f"the test process did not exit within {EXIT_GRACE_S:.0f} s of its last test's result "
                                "(a thread or process the submission left running?): it was killed")
        if collected is None:
            collected = run.collected
            if collected is None:  # pytest died before collecting: nothing to attribute
                report.notes.append("the tests could not start: " + _tail(out))
                break
            report.notes.extend(run.collect_errors)
        done_before = len(done)
        for test_id, rec in run.results.items():
            if test_id in collected and test_id not in done:
                done[test_id] = _result(collected[test_id], rec["passed"], rec["message"], rec.get("seconds", 0.0),
                                        integrity=rec.get("integrity") is True,
                                        not_started=rec.get("not_started") is True)
                if rec.get("timed_out"):
                    strikes[collected[test_id]["part"]] = strikes.get(collected[test_id]["part"], 0) + 1
        if run.in_progress in collected and run.in_progress not in done:
            info = collected[run.in_progress]
            done[run.in_progress] = _result(info, False, run.death, 0.0)
            strikes[info["part"]] = strikes.get(info["part"], 0) + 1
        remaining = [t for t in collected if t not in done]
        if not remaining:
            break
        if limits.first_failure and any(not r.passed for r in done.values()):
            done.update({t: _result(collected[t], False, "not run: grading stopped at the first failure", 0.0)
                         for t in remaining})
            break
        if STOP.is_set():
            reason = "not run: grading was interrupted"
            done.update({t: _result(collected[t], False, reason, 0.0) for t in remaining})
            break
        if time.monotonic() >= deadline:
            reason = f"not run: the submission used up its {limits.submission_s:.0f} s"
            done.update({t: _result(collected[t], False, reason, 0.0) for t in remaining})
            break
        if len(done) == done_before:  # no progress: the same run would end the same way
            reason = f"not run: the test process ended early ({_exit_status(run.returncode)}): {_tail(out, 300)}"
            done.update({t: _result(collected[t], False, reason, 0.0) for t in remaining})
            break
        targets = remaining
    report.tests = [done[t] for t in (collected or {}) if t in done]
    if tampering:  # harmless (each run starts from a fresh copy), but no honest submission does it
        report.notes.append(f"the submission modified the course copy ({', '.join(tampering)}); nothing it "
                            "wrote was used, as every run starts from a fresh copy: check this submission by hand")
    return report


def _result(info: dict, passed: bool, message: str, seconds: float, integrity: bool = False,
            not_started: bool = False) -> TestResult:
    return TestResult(id=info["id"], part=info["part"], name=info["name"], max_score=info["max_score"],
                      passed=passed, message=message, hidden=info.get("hidden", False), seconds=seconds,
                      bonus=info["part"] in sandbox.BONUS_PARTS and not info.get("hidden", False),
                      integrity=integrity and not passed, not_started=not_started and not passed)


@dataclass
class _Run:
    collected: dict[str, dict] | None = None
    collect_errors: list[str] = field(default_factory=list)
    results: dict[str, dict] = field(default_factory=dict)
    in_progress: str | None = None  # the test that was running when the process ended
    death: str = ""  # why it ended, as a test's failure message
    returncode: int | None = None
    lingered: bool = False  # every test had its result, but the process did not exit: killed


def _command(targets, log: Path, limits: Limits, strikes: dict[str, int], idle=()) -> list[str]:
    cmd = [
        sys.executable, "-m", "pytest", *targets,
        "-p", "gqa_flash.course.grader.plugin", "-p", "pytest_timeout",
        f"--grade-log={log}",
        f"--grade-strikes={limits.strikes}",
        f"--grade-struck={','.join(f'{p}:{n}' for p, n in strikes.items())}",
        f"--grade-max-file-mb={limits.max_file_mb}",
        f"--grade-memory-gb={limits.memory_gb}",
        f"--grade-not-started={','.join(idle)}",
        "-q", "--tb=short", "--show-capture=no", "--import-mode=importlib",
        "-p", "no:cacheprovider", "--continue-on-collection-errors",
        "-o", "addopts=",
    ]
    if limits.timeout_cap_s is not None:
        cmd.append(f"--grade-timeout-cap={limits.timeout_cap_s}")
    if limits.first_failure:
        cmd.append("--exitfirst")
    return cmd


def _environment(copy: Path, mark: str, tree: Path, kind: str, audit: bool = True) -> dict[str, str]:
    # GQA_FLASH_MODULE (make test-graded MODULE=...) is for a run on its own: the grader chooses with --only.
    # Nothing that leads back to the course (PWD, OLDPWD, PATH entries, VIRTUAL_ENV...): sandbox.environment.
    env = {k: v for k, v in sandbox.environment(os.environ, copy).items()
           if not k.startswith(("PYTEST_", "PYTHON", "GQA_FLASH_IMPL", "GQA_FLASH_MODULE"))}
    env[RUN_MARK] = mark  # inherited by whatever the test process starts: _kill_marked finds it by this
    scratch = copy.parent / "tmp"  # the tests' temporary files stay in this grading's folder, removed with it
    scratch.mkdir(exist_ok=True)
    env.update(
        TMPDIR=str(scratch),
        GQA_FLASH_IMPL="student",  # the copy's graded files are the submission's
        PYTHONPATH=str(copy),  # ahead of any installed gqa_flash
        PYTHONDONTWRITEBYTECODE="1",
        PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",  # only the plugins named on the command line
        GQA_FLASH_EXECUTOR_TREE=str(tree),  # where the student's code runs: gqa_flash.course.grader.calls
        GQA_FLASH_ISOLATION=kind,
    )
    env.pop("GQA_FLASH_AUDIT", None)
    if not audit:
        env["GQA_FLASH_AUDIT"] = "0"
    return env


def _kill_marked(mark: str) -> None:
    """Kill every process whose environment carries ``mark``: what a test process started and left running,
    also in a session of its own (setsid), which killing the process group misses. Linux only (/proc); a
    process that replaced its environment on purpose escapes this."""
    needle = f"{RUN_MARK}={mark}".encode()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if int(entry.name) != os.getpid() and needle in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ValueError):  # gone already, or not ours to read
            continue


def _run_once(copy: Path, targets, log: Path, out: Path, limits: Limits, strikes, deadline, tree: Path,
              kind: str, audit: bool = True, idle=()) -> _Run:
    run = _Run()
    log.touch()
    mark = uuid.uuid4().hex
    with open(out, "wb") as out_file:
        proc = subprocess.Popen(
            _command(targets, log, limits, strikes, idle), cwd=copy, env=_environment(copy, mark, tree, kind, audit),
            stdin=subprocess.DEVNULL, stdout=out_file, stderr=subprocess.STDOUT, start_new_session=True,
        )
    with _live_lock:
        _live.add(proc)
        if STOP.is_set():  # stop() ran while this process was starting
            _kill(proc)
    killed = ""
    all_done = 0.0  # when every collected test had its result (0: not yet)
    current: tuple[str, float] | None = None  # the running test and when we saw it start
    timeouts: dict[str, float] = {}
    position = 0
    try:
        while True:
            finished = proc.poll() is not None
            position, records = _read_new(log, position)
            for rec in records:
                try:
                    current, timeouts = _take(rec, run, current, timeouts)
                except (KeyError, TypeError, ValueError):  # a line that is not the plugin's: ignore it
                    continue
            if finished:
                break
            now = time.monotonic()
            if run.collected is not None and run.results.keys() >= run.collected.keys():
                # Every test has its result. A process that does not exit now is held by something the
                # submission left running (a non-daemon thread, say): it must not cost the whole deadline.
                all_done = all_done or now
                if now - all_done > EXIT_GRACE_S:
                    run.lingered = True
                    _kill(proc)
            if current is not None:
                limit = timeouts.get(current[0], 60.0) + limits.grace_s
                if now - current[1] > limit:
                    killed = (f"still running {now - current[1]:.0f} s after it started, past its "
                              f"{timeouts.get(current[0], 60.0):.0f} s limit; killed")
                    _kill(proc)
            if now > deadline and not killed:
                killed = f"not finished when the submission's {limits.submission_s:.0f} s were up; killed"
                _kill(proc)
            time.sleep(0.05)
    except BaseException:  # Ctrl-C, or a bug here: the test process must not outlive us
        _kill(proc)
        raise
    finally:
        run.returncode = proc.wait()
        _kill(proc)  # whatever the submission left running in the process group
        _kill_marked(mark)  # and in sessions of its own
        with _live_lock:
            _live.discard(proc)
    if current is not None:
        run.in_progress = current[0]
        run.death = killed or _death(run.returncode)
    return run


def _take(rec: dict, run: _Run, current, timeouts):
    """Fold one log record into what we know of the run; returns the running test and the timeouts."""
    event = rec["event"]
    if event == "collected" and run.collected is None:
        run.collected = {str(t["id"]): t for t in rec["tests"]}
        timeouts = {str(t["id"]): float(t["timeout"]) for t in rec["tests"]}
    elif event == "collect_error":
        run.collect_errors.append(f"could not collect {rec.get('path')}: {str(rec.get('message', ''))[-300:]}")
    elif event == "start":
        current = (str(rec["id"]), time.monotonic())
    elif event == "result":
        rec = dict(rec, passed=rec["passed"] is True, message=str(rec.get("message", "")),
                   seconds=float(rec.get("seconds", 0.0)))
        run.results.setdefault(str(rec["id"]), rec)
        if current and current[0] == rec["id"]:
            current = None
    return current, timeouts


def _read_new(log: Path, position: int) -> tuple[int, list[dict]]:
    """Whole JSON lines appended to the log since position. A line that does not parse is skipped."""
    try:
        with open(log, "rb") as f:
            f.seek(position)
            data = f.read()
    except OSError:  # deleted by the submission: what was read so far stands
        return position, []
    end = data.rfind(b"\n") + 1
    records = []
    for line in data[:end].splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            records.append(rec)
    return position + end, records


def _exit_status(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exit code {returncode}"


def _death(returncode: int | None) -> str:
    """A test's failure message when the process died during it."""
    if returncode is not None and returncode < 0:
        what = {signal.SIGSEGV: "a segmentation fault", signal.SIGABRT: "an abort", signal.SIGBUS: "a bus error",
                signal.SIGKILL: "killed (out of memory?)",
                signal.SIGXFSZ: "wrote a file larger than allowed (printing too much?)"}
        sig = -returncode
        return f"the test process crashed during this test: {_exit_status(returncode)}, {what.get(sig, 'a signal')}"
    return (f"the test process exited during this test ({_exit_status(returncode)}): "
            f"does the submission call os._exit, sys.exit or quit, or raise KeyboardInterrupt?")


def _tail(path: Path, chars: int = LOG_TAIL) -> str:
    try:
        text = path.read_bytes()[-chars:].decode(errors="replace")
    except OSError:
        return ""
    return text.strip()
