"""The executor's audit hook (PEP 578): what a graded call may not do, refused as it is tried.

Installed once, before any graded module is imported (an audit hook cannot be
removed), and strict only while a graded call runs (:func:`graded_call`). It
refuses:

* starting a thread or a process (``_thread.start_new_thread``, ``os.fork``,
  ``os.system``, ``os.exec*``, ``os.posix_spawn``, ``subprocess.Popen``):
  the guards watch one thread of one process; on a GPU, Triton's own compiler
  runs (``ptxas`` from its package; the C compiler, ``ldconfig`` and ``file``
  of :func:`gqa_flash.course.grader.isolation.triton_programs`, by real path);
* ``ctypes`` (a way to write any memory, the guards' included);
* opening a file to write outside the private temporary folder, or to read
  outside the executor's folder, the Python it runs on and ``/usr``;
* importing, for the first time, a module graded code has no use for
  (``ctypes``, ``subprocess``, ``socket``, ``importlib``...);
* code in a graded file that sets an attribute of a class it did not define
  (patching a guard, PyTorch's or Triton's classes).

A refused event raises an ``IntegrityViolation`` where it was tried, and is
remembered: the call's reply is that violation even if the student's code
caught it. The sandbox (:mod:`gqa_flash.course.grader.isolation`) is the wall; this is
the wall's second layer, for machines where the sandbox is thin.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from gqa_flash.course import impl, layout

PROCESS_EVENTS = ("os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.startfile",
                  "subprocess.Popen", "_thread.start_new_thread", "os.kill", "os.killpg", "signal.pthread_kill")
DENIED_MODULES = ("ctypes", "_ctypes", "subprocess", "multiprocessing", "socket", "_socket", "importlib",
                  "inspect", "gc", "_thread", "threading", "signal", "pickle", "marshal", "code", "pty", "mmap",
                  "resource", "shutil", "asyncio", "concurrent", "ssl", "http", "urllib")


# The course's answers, as modules: a graded file importing one (not yet loaded) is refused here, before any
# of its code runs (the own-work guard sees only what reaches PyTorch or Triton).
ANSWERS = ("gqa_flash.fast", "gqa_flash.course.lab", "gqa_flash.reference", impl.COMPLETED_PACKAGE,
           "gqa_flash.course.grader")
SPAWN_EVENTS = ("subprocess.Popen", "os.posix_spawn", "os.exec")  # (program, arguments, ...)


def _a_tool(program) -> bool:
    """A program Triton starts to compile for a GPU: one inside Triton's package (ptxas), or one of
    isolation.triton_programs (the C compiler, ldconfig, file), found by its real path when the hook was
    installed (so a program of the same name elsewhere on PATH is not one)."""
    program = os.fsdecode(program) if isinstance(program, (str, bytes, os.PathLike)) else ""
    path = program if "/" in program else shutil.which(program) or ""
    real = os.path.realpath(path) if path else ""
    return bool(real) and (_inside(real, _State.tools) or real in _State.programs)


class _State:
    active = False  # a graded call is running
    refused: list[str] = []  # what this call tried and was refused
    readable: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()  # where the programs a graded call may start live: Triton's package on a GPU
    programs: frozenset[str] = frozenset()  # and the system's programs Triton starts (its C compiler...)
    # The module names a graded file's classes have (gqa_flash.naive, and under the switch's completed files).
    graded_modules = frozenset(f"{p}.{m}" for p in ("gqa_flash", impl.COMPLETED_PACKAGE) for m in layout.GRADED_MODULES)


def is_students(filename: str) -> bool:
    """Whether code from this file is the student's: a graded file, or code with no file of its own (made
    from a string at run time, "<string>": the gate never read it, so it counts as the student's too; the
    import machinery's frozen frames aside)."""
    if filename.startswith("<"):
        return not filename.startswith("<frozen")
    return os.path.basename(filename) in layout.GRADED_FILES and os.path.basename(
        os.path.dirname(filename)) in ("gqa_flash", impl.SOLUTIONS_DIR.name)


def _graded_frame():
    """The innermost frame of a graded file on the stack, or None."""
    frame = sys._getframe(2)
    while frame is not None:
        if is_students(frame.f_code.co_filename) and not frame.f_code.co_filename.startswith("<"):
            return frame
        frame = frame.f_back
    return None


def _caller_is_graded() -> bool:
    """Whether the code that caused the event is the student's own line (the import machinery skipped)."""
    frame = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename.startswith("<frozen importlib")
                                 or f"{os.sep}ctypes{os.sep}" in frame.f_code.co_filename):
        frame = frame.f_back
    return frame is not None and is_students(frame.f_code.co_filename)


def _refuse(what: str) -> None:
    from gqa_flash.course.integrity import PREFIX, IntegrityViolation

    graded = _graded_frame()
    where = f"{os.path.basename(graded.f_code.co_filename)} line {graded.f_lineno}" if graded else "the graded call"
    message = (f"{PREFIX}{where} {what}: graded code may not start threads or processes, use ctypes, read or write "
               "files outside its folder, import the course's answers or modules it has no use for, or patch "
               "classes, so this part scores 0")
    _State.refused.append(message)
    raise IntegrityViolation(message)


def _inside(path: str, roots: tuple[str, ...]) -> bool:
    path = os.path.realpath(path)
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _hook(event: str, args) -> None:
    if not _State.active:
        return
    if event.startswith(PROCESS_EVENTS):
        program = args[0] if event in SPAWN_EVENTS and args else None
        if program is not None and _State.tools and _a_tool(program):
            return  # Triton compiling for a GPU: its ptxas, the system's C compiler
        shown = os.path.basename(os.fsdecode(program)) if isinstance(program, (str, bytes, os.PathLike)) else ""
        _refuse(f"tried {event}" + (f" ({shown})" if shown else ""))
    elif event.startswith("ctypes.") and _caller_is_graded():
        _refuse(f"used ctypes ({event})")
    elif event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        mode = str(args[1]) if len(args) > 1 and args[1] is not None else "r"
        flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
        writing = any(c in mode for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
        if writing and (not _inside(path, _State.writable) or _inside(path, _State.readable)):
            _refuse(f"opened {path} to write")
        if not writing and not _inside(path, _State.readable + _State.writable):
            _refuse(f"opened {path}")
    elif event == "import" and args and _caller_is_graded():
        name = str(args[0])
        if name.split(".")[0] in DENIED_MODULES or name.startswith(ANSWERS):
            _refuse(f"imported {name}")
    elif event == "object.__setattr__" and isinstance(args[0], type) and _caller_is_graded():
        if str(getattr(args[0], "__module__", "")) not in _State.graded_modules:
            _refuse(f"set {getattr(args[0], '__name__', '?')}.{args[1]}")


SWITCH = "GQA_FLASH_AUDIT"  # "0": no hook (the grader's own tests of the layers beneath it)


def install(tree: Path) -> None:
    """Install the hook (once per process): reads allowed in tree, Python's folders and /usr; writes in the
    temporary folder. Not with GQA_FLASH_AUDIT=0, which only the grader's environment can set."""
    import triton

    if os.environ.get(SWITCH) == "0":
        return
    python = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.dirname(os.path.realpath(
        sys.executable)))}
    python.update(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    # Readable, never writable (the executor's folder may lie inside the temporary one); /dev/null is both.
    from gqa_flash.course.grader.isolation import ETC_FILES

    etc = [f"/etc/{name}" for name in ETC_FILES]  # what the sandbox shows of /etc, and no more
    _State.readable = tuple(sorted({os.path.realpath(p) for p in (*python, str(tree), "/usr", "/proc/self",
                                                                     "/dev/urandom", *etc)}))
    _State.writable = (os.path.realpath(tempfile.gettempdir()), "/dev/null")
    from gqa_flash.course import runtime

    # Triton's compiler runs only for a GPU: in the interpreter no process at all may start.
    _State.tools = () if runtime.INTERPRETER else (os.path.realpath(os.path.dirname(triton.__file__)),)
    from gqa_flash.course.grader.isolation import triton_programs

    _State.programs = frozenset() if runtime.INTERPRETER else triton_programs()
    _guard_threads()
    sys.addaudithook(_hook)


def _guard_threads() -> None:
    """Python raises no audit event when a thread starts: refuse at the source, during a graded call."""
    import _thread
    import threading

    def refusing(start):
        def guarded(*args, **kwargs):
            if _State.active:
                _refuse("started a thread")
            return start(*args, **kwargs)
        return guarded

    for name in ("start_new_thread", "start_new", "start_joinable_thread"):
        if hasattr(_thread, name):
            setattr(_thread, name, refusing(getattr(_thread, name)))
    for name in ("_start_new_thread", "_start_joinable_thread"):
        if hasattr(threading, name):
            setattr(threading, name, refusing(getattr(threading, name)))


class graded_call:
    """Context manager: the hook is strict inside; on the way out, a refusal the code swallowed is raised."""

    def __enter__(self):
        _State.refused = []
        _State.active = True
        return self

    def __exit__(self, exc_type, exc, tb):
        _State.active = False
        if _State.refused:
            from gqa_flash.course.integrity import IntegrityViolation

            if not isinstance(exc, IntegrityViolation):
                raise IntegrityViolation(_State.refused[0]) from None
        return False
