"""The judge's side of a graded call: the student's code runs in the executor, and only tensors come back.

The graded tests never import a student's module. They call
``student.call("naive_attention", q, k, v, causal=True, watch=own_work("naive"))``:
the arguments go to the executor process (:mod:`gqa_flash.course.grader.executor`),
which runs the call under the watches named, and the reply comes back as
plain values and dense tensors (:mod:`gqa_flash.course.grader.wire`). Every
assertion is then made here, in the judge, which the student's code cannot
reach: whatever it does to its own process, the reference, the comparison,
the points and the log stay as the course wrote them.

A failure in the executor comes back as the exception a test expects: an
``IntegrityViolation`` (the grader scores the part 0), a
``KernelOnlyViolation``, an address-check ``AssertionError``, or the
student's own exception (``ValueError``, ``NotImplementedError``...) with the
graded file's line. An executor that dies during a call (a segfault,
``os._exit``, a memory limit) fails that call with :class:`StudentCrash`; one
that does not answer in time is stopped by the test's own time limit. Either
way the next call starts a fresh executor.

Where the executor runs: the grader names its folder (the course's package
and the submission's graded files, nothing else) and its isolation in
``GQA_FLASH_EXECUTOR_TREE`` and ``GQA_FLASH_ISOLATION``; a plain ``pytest
tests/graded`` runs it on the course itself, unisolated, which is fine for a
student checking their own work.
"""

from __future__ import annotations

import builtins
import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gqa_flash.course import layout
from gqa_flash.course.grader import isolation, wire

TREE_VARIABLE = "GQA_FLASH_EXECUTOR_TREE"
# The student's exceptions that come back as themselves (pytest.raises(ValueError) must see a ValueError).
RAISED = {name: getattr(builtins, name) for name in (
    "ValueError", "TypeError", "RuntimeError", "NotImplementedError", "IndexError", "KeyError", "AssertionError",
    "ZeroDivisionError", "AttributeError", "NameError", "ImportError", "ModuleNotFoundError", "OverflowError",
    "ArithmeticError", "RecursionError", "MemoryError", "UnboundLocalError", "LookupError")}


class StudentCrash(RuntimeError):
    """The executor died during a call: the student's code crashed it, exited, or ran past a limit."""


class StudentRaised(RuntimeError):
    """The student's code raised an exception of a type the judge does not rebuild (its name is in the text)."""


def own_work(part: str, what: str | None = None) -> dict:
    """Watch: the graded module ``part`` must do its own work (gqa_flash.course.integrity.own_work)."""
    return {"own_work": [part, what or part]}


def kernel_only(what: str = "flash_attention_forward", part: str | None = None) -> dict:
    """Watch: only Triton kernels of the graded file compute (gqa_flash.course.testing.kernel_only); counts launches."""
    from gqa_flash.course.kernel_guard import PART_OF

    return {"kernel_only": [what, part or PART_OF.get(what)]}


def score_products(head_dim: int) -> dict:
    """Watch: count the score products PyTorch computes (gqa_flash.course.tile_counts.ScoreProducts)."""
    return {"score_products": head_dim}


def whole_rows(n: int, block_size: int) -> dict:
    """Watch: refuse a reduction over a whole row of n columns (the online softmax's blocks)."""
    return {"whole_rows": [n, block_size]}


@dataclass
class Reply:
    value: object
    seen: dict = field(default_factory=dict)  # what the watches counted: launches, products, elements, largest


class Executor:
    """One executor process, started when first needed and again after it dies."""

    def __init__(self, tree: Path | None = None, kind: str | None = None, impl: str | None = None,
                 interpreter: bool = False):
        tree_env = os.environ.get(TREE_VARIABLE)
        self.tree = Path(tree or tree_env or layout.COURSE_DIR).resolve()
        # A graded run (the grader names the tree) takes the best isolation there is; a student's own run none.
        self.kind = kind or (isolation.choose() if tree_env or os.environ.get(isolation.VARIABLE) else "none")
        self.proc: subprocess.Popen | None = None
        self.tmp: str | None = None  # its private temporary folder (bubblewrap gives it one of its own)
        self.impl = impl  # GQA_FLASH_IMPL for the executor (default: the judge's)
        self.log = None  # the executor's standard error: what the student's code printed, and its tracebacks
        # On a GPU machine, a second executor with the GPU hidden, for the harnesses that count a kernel's work
        # program by program in Triton's interpreter (score_tiles, probe); the first never starts a process.
        self.interpreter = interpreter
        self._sibling: Executor | None = None

    # --- the process -------------------------------------------------------------------------------------

    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        self.log = tempfile.TemporaryFile()
        env = isolation.environment(self.tree, self.kind, dict(os.environ))
        if self.impl is not None:
            env["GQA_FLASH_IMPL"] = self.impl
        if self.interpreter:
            env.update(CUDA_VISIBLE_DEVICES="", TRITON_INTERPRET="1")
        if self.kind != "bwrap":  # (bubblewrap's /tmp is its own already)
            self.tmp = env["TMPDIR"] = env["HOME"] = _private_tmp(self.kind == "user")
        self.proc = subprocess.Popen(
            isolation.command(self.kind, self.tree), cwd=self.tree, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.log,
            preexec_fn=isolation.limits(self.kind, cpu_s=3600, file_mb=256,
                                        memory_gb=None if _gpu() and not self.interpreter else 16))
        self._ready = False

    def warm(self) -> None:
        """Start the executor and wait until it has imported the course (never raises: a call will say why)."""
        try:
            self._ensure_ready()
        except Exception:
            self.stop()

    def _ensure_ready(self) -> None:
        self.start()
        if not self._ready:
            try:
                self._read()  # its greeting: the course is imported, the audit hook installed
            except StudentCrash:
                raise StudentCrash(f"the process that runs the student's code could not start ({self.kind} "
                                   f"isolation): {self.stderr_tail(400)}") from None
            self._ready = True

    def stop(self) -> None:
        """Kill the executor (and whatever it started): the next call starts a fresh one."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self.proc = None
        if self.tmp is not None:
            import shutil

            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def _read(self):
        try:
            return wire.recv(self.proc.stdout, dense=True)
        except EOFError:
            code = self.proc.wait()
            self.proc = None
            raise StudentCrash(death(code, self.stderr_tail())) from None

    def stderr_tail(self, chars: int = 600) -> str:
        if self.log is None:
            return ""
        try:
            self.log.seek(0, os.SEEK_END)
            size = self.log.tell()
            self.log.seek(max(0, size - chars))
            return self.log.read().decode(errors="replace").strip()
        except OSError:
            return ""

    # --- a request ----------------------------------------------------------------------------------------

    def request(self, message: dict) -> Reply:
        try:
            self._ensure_ready()
            wire.send(self.proc.stdin, message)
            reply = self._read()
        except BrokenPipeError:
            code = self.proc.wait() if self.proc is not None else None
            self.proc = None
            raise StudentCrash(death(code, self.stderr_tail())) from None
        except BaseException:  # a time limit, a broken reply: this executor is no longer to be trusted in step
            self.stop()
            raise
        if not isinstance(reply, dict) or not isinstance(reply.get("seen", {}), dict):
            self.stop()
            raise wire.WireError("the executor's reply is not one")
        if reply.get("ok") is not True:
            raise rebuilt(reply.get("error"))
        return Reply(reply.get("value"), reply.get("seen", {}))

    def call(self, entry: str, *args, watch: dict | None = None, **kwargs) -> Reply:
        """``entry(*args, **kwargs)`` in the executor under ``watch``; raises what the student's code raised."""
        return self.request({"op": "call", "entry": entry, "args": list(args), "kwargs": kwargs,
                             "watch": watch or {}})

    def in_interpreter(self) -> Executor:
        """The executor that runs kernels in Triton's interpreter: this one, or on a GPU machine its sibling."""
        if self.interpreter or not _gpu():
            return self
        if self._sibling is None:
            self._sibling = Executor(self.tree, self.kind, self.impl, interpreter=True)
        return self._sibling

    def score_tiles(self, kernel: str = "forward", **kwargs) -> tuple[dict, dict]:
        """Each program's score tiles, counted in the interpreter: ``kernel`` "forward"
        (tile_counts.score_tiles_per_program), "windows" (tile_counts.windowed_score_tiles_per_program) or
        "backward" (tile_counts.backward_score_tiles_per_program)."""
        request = {"op": "score_tiles", "kwargs": kwargs} | ({"kernel": kernel} if kernel != "forward" else {})
        counts, config = self.in_interpreter().request(request).value
        return counts, config

    def probe(self, function: str):
        return self.in_interpreter().request({"op": "probe", "function": function}).value

    def ring(self, world_size: int, cases: list) -> list:
        return self.request({"op": "ring", "world_size": world_size, "cases": cases}).value


def _gpu() -> bool:
    from gqa_flash.course import runtime

    return runtime.DEVICE.type == "cuda"


def _private_tmp(for_user: bool) -> str:
    """A temporary folder of the executor's own, inside the judge's (removed with the grading); owned by the
    executor's user under ``user`` isolation."""
    path = tempfile.mkdtemp(prefix="gqa-flash-executor-")
    if for_user:
        import pwd

        entry = pwd.getpwnam(isolation.executor_user())
        os.chown(path, entry.pw_uid, entry.pw_gid)
    return path


def rebuilt(error) -> BaseException:
    """The exception a failed call raises in the judge, from the executor's description of it."""
    from gqa_flash.course import integrity, testing

    error = error if isinstance(error, dict) else {}
    kind, name = str(error.get("kind", "raised")), str(error.get("type", "Exception"))
    message = str(error.get("message", ""))
    if kind == "integrity":
        return integrity.IntegrityViolation(message if message.startswith(integrity.PREFIX)
                                            else integrity.PREFIX + message)
    if kind == "kernel_only":
        return testing.KernelOnlyViolation(message)
    if kind == "address":
        return AssertionError(message if message.startswith("address check: ") else "address check: " + message)
    if name == "SyntaxError":
        exc = SyntaxError(str(error.get("text", message)),
                          (str(error.get("file", "?")), int(error.get("line") or 0), 0, ""))
    elif name in RAISED:
        exc = RAISED[name](message)
    else:
        exc = StudentRaised(f"{name}: {message}" if message else name)
    exc.student_where = error.get("where") if isinstance(error.get("where"), str) else None
    exc.student_type = name
    return exc


def death(code: int | None, stderr: str = "") -> str:
    """Why the executor ended during a call, as a test's failure message."""
    if code is not None and code > 128 and code - 128 in {s.value for s in signal.Signals}:
        code = 128 - code  # bubblewrap exits 128 + N when the program it ran died of signal N
    if code is not None and code < 0:
        what = {signal.SIGSEGV: "a segmentation fault", signal.SIGABRT: "an abort", signal.SIGBUS: "a bus error",
                signal.SIGKILL: "killed (out of memory?)", signal.SIGXCPU: "past its CPU time",
                signal.SIGXFSZ: "wrote a file larger than allowed (printing too much?)"}
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        text = f"the student's code crashed the process running it: killed by {name}, {what.get(-code, 'a signal')}"
    else:
        text = (f"the process running the student's code exited during this call (exit code {code}): does the "
                "submission call os._exit, sys.exit or quit?")
    last = stderr.strip().splitlines()[-1:] if stderr else []
    return text + (f" (its last words: {last[0][:200]})" if last and code is not None and code > 0 else "")


_student: Executor | None = None


def student() -> Executor:
    """The executor of this judge process (one, started on first use)."""
    global _student
    if _student is None:
        _student = Executor()
    return _student
