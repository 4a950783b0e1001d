"""The student's own work: what a graded call may reach.

A graded test passes only when the student's code computed the answer. While a
test runs a graded module (``with own_work("forward"): ...``), the work must be
done by that module's own code:

* every Triton kernel launched is one the graded file defines (its given code
  included), never one of the course's fast kernels, a notebook probe or
  another file's kernel; the helpers it calls may also be those of the student
  files it builds on (``layout.StudentFile.builds_on``: windows.py calls
  forward.py's, whichever file the switch chose for it);
* the course's answers are out of reach: the fast kernels and their public
  entry points (``gqa_flash.fast``, ``gqa_flash.fast_attention_forward``...),
  the float64 reference (``gqa_flash.reference``), the notebook checks and their
  models (``gqa_flash.course.lab``), the completed files (``solutions/``), and PyTorch's
  own attention (``F.scaled_dot_product_attention``, FlexAttention).

A call that reaches one raises :class:`IntegrityViolation`, whose message names
the graded file, its line and what it called, and starts with ``integrity:``.
The grader scores the whole part 0 for it and flags the submission in its own
CSV column; a plain ``pytest tests/graded`` run does the same in its table.

How it sees them, cheaply: every ATen op run inside (a dispatch mode, which
``DisableTorchFunction`` does not switch off) looks at the Python stack for a
frame of a forbidden file or function, and PyTorch's attention is refused by
name; every Triton launch (and, in the interpreter, every call of a
``@triton.jit`` helper) checks the file the kernel was defined in, and every
interpreted dot, load and store looks at the stack too (a fast helper run as
plain Python, ``.fn``). The switches that turn PyTorch's modes off are refused
while it runs, and so, in the interpreter, is starting a thread (the modes are
per thread). It runs in the executor (gqa_flash.course.grader.executor), beside the
student's code, which could patch it there; the static gate (gqa_flash.course.grader.gate)
refuses every line that could, and a patched guard changes no verdict: the
judge compares the outputs in a process of its own (gqa_flash/course/grader/executor.py).
"""

from __future__ import annotations

import functools
import sys
import threading
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _python_dispatch

from gqa_flash.course import impl, runtime
from gqa_flash.course.layout import COURSE_DIR, PACKAGE_DIR, STUDENT_FILES

PREFIX = "integrity: "

# The course's answers: files whose code a graded call may never run.
_FORBIDDEN_DIRS = (PACKAGE_DIR / "fast", PACKAGE_DIR / "course" / "lab", impl.SOLUTIONS_DIR)
_FORBIDDEN_FILES = (PACKAGE_DIR / "reference.py",)
# Public entry points of the fast kernels (in api.py, beside the graded ones): forbidden by name.
_FORBIDDEN_API = ("fast_attention_forward", "fast_attention_backward")
# PyTorch's attention, by the words in its operators' names (SDPA and its backends, FlexAttention).
_ATTENTION_WORDS = ("scaled_dot_product", "flex_attention", "_flash_attention", "_efficient_attention",
                    "cudnn_attention")


# What turns PyTorch's function and dispatch modes off under it (so the guard above would not see).
_SWITCHES = [(torch._C, "DisableTorchFunction"), (torch._C, "DisableTorchFunctionSubclass"),
             (torch._C, "_DisableTorchDispatch"), (_python_dispatch, "_disable_current_modes")]


class IntegrityViolation(AssertionError):
    """A graded call reached code that is not the student's: the course's kernels, reference or checks."""


@functools.lru_cache(maxsize=4096)
def resolved_file(filename: str) -> Path | None:
    """A code object's file, resolved once (the guard looks at every frame of every PyTorch call)."""
    try:
        return Path(filename).resolve()
    except (OSError, ValueError):
        return None


@functools.lru_cache(maxsize=4096)
def _forbidden_file(filename: str) -> bool:
    path = resolved_file(filename)
    return path is not None and (path in _FORBIDDEN_FILES or any(d in path.parents for d in _FORBIDDEN_DIRS))


def _fast_entry_point(code) -> bool:
    """Whether a code object is one of api.py's fast_* functions (api.py also holds the graded entry points)."""
    return code.co_name in _FORBIDDEN_API and Path(code.co_filename).name == "api.py"


def _forbidden_frame(frame) -> bool:
    return _fast_entry_point(frame.f_code) or _forbidden_file(frame.f_code.co_filename)


def _name_of(frame) -> str:
    """How a student would write the call: gqa_flash.fast_attention_forward, gqa_flash.reference.reference_attention."""
    code = frame.f_code
    if _fast_entry_point(code):
        return f"gqa_flash.{code.co_name}"
    module = frame.f_globals.get("__name__", Path(code.co_filename).stem)
    return f"{module}.{getattr(code, 'co_qualname', code.co_name)}"


def _where(path) -> str:
    path = Path(path).resolve()
    return path.relative_to(COURSE_DIR).as_posix() if COURSE_DIR in path.parents else str(path)


class own_work:
    """Context manager: inside, graded module ``part`` must do its own work (see the module's docstring).

    ``what`` names the call in messages ("flash_attention_forward").
    """

    def __init__(self, part: str, what: str | None = None, file=None):
        self.part = part
        self.what = what or part
        self.file = Path(file or impl.path_of(part)).resolve()  # file: the module a check loaded, if elsewhere
        # The student's code: this file and those it builds on (windows.py calls forward.py's helpers), as the
        # switch chose them (under GQA_FLASH_IMPL=solutions, completed files, which are otherwise refused).
        info = STUDENT_FILES.get(part)
        self.files = frozenset({self.file, *(impl.path_of(b).resolve() for b in (info.builds_on if info else ()))})
        self._saved: list = []
        self._modes_on: list = []
        self._entry = None  # the frame that entered: the stack above it is the caller's, not the graded call's

    # --- what the student's line was ------------------------------------------------

    def _graded_frame(self, start):
        """The innermost frame of the graded file (or one it builds on) at or above ``start`` (None: none)."""
        frame = start
        while frame is not None:
            if resolved_file(frame.f_code.co_filename) in self.files:
                return frame
            frame = frame.f_back
        return None

    def _violation(self, graded, did: str) -> IntegrityViolation:
        where = (f"{Path(graded.f_code.co_filename).name} line {graded.f_lineno}" if graded is not None
                 else self.file.name)
        return IntegrityViolation(
            f"{PREFIX}{where} {did}: the graded {self.part}.py must do its own work (torch, triton and its own "
            "code; not the course's kernels, reference or checks, nor PyTorch's attention), so this part scores 0")

    def check_stack(self) -> None:
        """Raise if the Python stack runs a forbidden file's code (called from a PyTorch call's hook)."""
        frame = sys._getframe(1)
        outermost = None
        while frame is not None and frame is not self._entry:
            if _forbidden_frame(frame) and resolved_file(frame.f_code.co_filename) not in self.files:
                outermost = frame
            frame = frame.f_back
        if outermost is not None:
            raise self._violation(self._graded_frame(outermost.f_back), f"called {_name_of(outermost)}")

    def check_kernel(self, fn, launched: bool) -> None:
        """Raise if kernel ``fn`` (launched, or called from a kernel) is not the student's to run."""
        code = getattr(getattr(fn, "__code__", None), "co_filename", None)
        if code is None:
            return
        path = resolved_file(code)
        name = getattr(fn, "__name__", "?")
        if launched and path != self.file:
            raise self._violation(self._graded_frame(sys._getframe(1)),
                                  f"launched the kernel {name} of {_where(path)}, not a kernel of its own")
        if not launched and path not in self.files and _forbidden_file(str(path)):
            raise self._violation(self._graded_frame(sys._getframe(1)),
                                  f"called the Triton function {name} of {_where(path)}")

    # --- the hooks -----------------------------------------------------------------------

    def _attention(self, name: str) -> None:
        if attention_op(name):
            raise self._violation(self._graded_frame(sys._getframe(2)), f"called PyTorch's {name}")

    def _modes(self):
        """A function mode (names SDPA where Python called it) and a dispatch mode (every ATen op: the
        attention operators by name, and the stack; it still sees what DisableTorchFunction hides)."""
        from torch.utils._python_dispatch import TorchDispatchMode

        guard = self

        class WatchCalls(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                guard._attention(getattr(func, "__name__", ""))
                return func(*args, **(kwargs or {}))

        class WatchOps(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                guard._attention(func.overloadpacket.__name__)
                guard.check_stack()
                return func(*args, **(kwargs or {}))

        return [WatchCalls(), WatchOps()]

    def _refuse(self, did: str):
        def refuse(*args, **kwargs):
            raise self._violation(self._graded_frame(sys._getframe(1)), did)
        return refuse

    def _patch(self, cls, name, wrapper):
        original = cls.__dict__[name]
        self._saved.append((cls, name, original))
        setattr(cls, name, wrapper(original))

    def __enter__(self):
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction

        guard = self
        self._entry = sys._getframe(1)

        def launch(run):
            def checked(fn_self, *args, **kwargs):
                if not kwargs.get("warmup", False):
                    guard.check_kernel(fn_self.fn, launched=True)
                return run(fn_self, *args, **kwargs)
            return checked

        def device_call(call):
            def checked(fn_self, *args, **kwargs):
                guard.check_kernel(fn_self.fn, launched=False)
                return call(fn_self, *args, **kwargs)
            return checked

        def interpreted_op(op):
            def checked(builder, *args, **kwargs):
                guard.check_stack()  # a fast kernel's helper run as plain Python (.fn) inside the student's kernel
                return op(builder, *args, **kwargs)
            return checked

        self._patch(JITFunction, "run", launch)
        self._patch(InterpretedFunction, "run", launch)
        self._patch(InterpretedFunction, "__call__", device_call)
        if runtime.INTERPRETER:
            from triton.runtime.interpreter import InterpreterBuilder

            for op in ("create_dot", "create_masked_load", "create_masked_store"):
                self._patch(InterpreterBuilder, op, interpreted_op)
            # Work done in another thread escapes the modes below (they are per thread). Graded code needs none.
            self._patch(threading.Thread, "start", lambda start: self._refuse("started a thread"))
        # Switches that turn PyTorch's hooks off for the code under them: graded code needs none of them.
        for owner, name in _SWITCHES:
            if hasattr(owner, name):
                self._saved.append((owner, name, getattr(owner, name)))
                setattr(owner, name, self._refuse(f"switched off PyTorch's hooks ({name})"))
        self._modes_on = self._modes()
        for mode in self._modes_on:
            mode.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb):
        for mode in reversed(self._modes_on):
            mode.__exit__(exc_type, exc, tb)
        self._modes_on = []
        for cls, name, original in reversed(self._saved):
            setattr(cls, name, original)
        self._saved.clear()
        self._entry = None
        found = unwrap(exc)
        if found is not None and found is not exc:
            raise found from None  # Triton's interpreter wraps what a kernel raised: give the student ours
        return False


def warm_up() -> None:
    """Enter PyTorch's dispatch-mode machinery once: the first time imports torch._dynamo (1.5 s here), which
    must not count against the first graded test's time limit. The grader's plugin and the graded tests'
    conftest call this before any test starts."""
    from torch.utils._python_dispatch import TorchDispatchMode

    with TorchDispatchMode():
        pass


def unwrap(exc):
    """The AssertionError of the course's own (an integrity or address violation) that ``exc`` wraps, if any.

    Triton's interpreter re-raises whatever a kernel raised as ``InterpreterError(repr(e))``; the course's
    messages are for the student, so the checks take them back out."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, AssertionError) and str(exc).startswith((PREFIX, "address check: ")):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def is_violation(exc) -> bool:
    """Whether a test failed because its graded call was not the student's own work."""
    found = unwrap(exc)
    return found is not None and str(found).startswith(PREFIX)


def attention_op(name: str) -> bool:
    """Whether an operator's name is PyTorch's attention (SDPA, its backends, FlexAttention)."""
    return any(word in name for word in _ATTENTION_WORDS)

