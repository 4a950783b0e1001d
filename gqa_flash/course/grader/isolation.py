"""How the executor is shut away from everything but its own folder: bubblewrap, another user, or nothing.

The executor runs the student's code (:mod:`gqa_flash.course.grader.executor`). It
must not reach the judge's records, the course's completed files, another
submission, the network or another process. Three ways, the first the machine
allows (``GQA_FLASH_ISOLATION`` picks one by name):

``bwrap``
    bubblewrap (Debian's ``bubblewrap``): new user, PID, network, IPC and mount
    namespaces, all capabilities dropped, user id 65534. The file system holds
    only ``/usr`` (and its links ``/bin``, ``/lib``...), a few files of ``/etc``,
    the Python the grader runs (its prefixes and ``site-packages``), the
    executor's folder read-only, and a private ``/tmp``; ``/proc`` shows its
    own processes only. Works as root in a container and, where the kernel
    lets users make namespaces, as a normal user on a laptop.
``user``
    where bubblewrap cannot run (Gradescope's containers forbid namespaces)
    and the grader runs as root: the executor runs as the user named by
    ``GQA_FLASH_EXECUTOR_USER`` (default ``gqa-flash-executor``, which the
    Gradescope bundle's ``setup.sh`` creates), who cannot read what root keeps
    to itself (the results, the course's own copy).
``none``
    neither: the executor is still a process of its own (its code cannot
    rewrite a verdict in memory), but it runs as the grader's user and can read
    and write what that user can. Every output of the grader says so.

Resource limits apply in every case: CPU time, file size, no core dumps, and
address space where no GPU is used.
"""

from __future__ import annotations

import functools
import os
import pwd
import resource
import shutil
import subprocess
import sys
from pathlib import Path

KINDS = ("bwrap", "user", "none")
VARIABLE = "GQA_FLASH_ISOLATION"  # auto (the default), bwrap, user or none
USER_VARIABLE = "GQA_FLASH_EXECUTOR_USER"
DEFAULT_USER = "gqa-flash-executor"
SANDBOX_UID = 65534  # nobody
# The executor's temporary folder in the sandbox: a folder of the private /tmp, so that the audit hook's one
# writable place holds neither the executor's own folder nor the paths of the grader's (bound or not).
PRIVATE_TMP = "/tmp/executor"
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "nsswitch.conf", "localtime",
             "alternatives")


def requested() -> str:
    choice = os.environ.get(VARIABLE, "auto").strip().lower() or "auto"
    if choice not in (*KINDS, "auto"):
        raise ValueError(f"{VARIABLE} must be auto, {', '.join(KINDS)}; got {choice!r}")
    return choice


def choose(choice: str | None = None) -> str:
    """The isolation the executor gets here: the one asked for (an error if it cannot run), or the best."""
    choice = choice or requested()
    if choice == "auto":
        return "bwrap" if bwrap_works() else "user" if user_works() else "none"
    if choice == "bwrap" and not bwrap_works():
        raise RuntimeError(f"{VARIABLE}=bwrap, but bubblewrap does not run here ({bwrap_problem()})")
    if choice == "user" and not user_works():
        raise RuntimeError(f"{VARIABLE}=user needs root and a user {executor_user()!r}")
    return choice


def describe(kind: str) -> str:
    """A line for the table, the CSV and the summary."""
    return {"bwrap": "sandboxed (bubblewrap: namespaces, no network, its own folder only)",
            "user": f"run as the user {executor_user()} (no bubblewrap here)",
            "none": "NOT ISOLATED: the student's code ran as the grader's user, able to read and write what it "
                    "can (install bubblewrap, or grade as root with the user gqa-flash-executor)"}[kind]


def executor_user() -> str:
    return os.environ.get(USER_VARIABLE, DEFAULT_USER)


@functools.lru_cache(maxsize=1)
def bwrap_problem() -> str | None:
    """None when bubblewrap starts a Python in the sandbox here, else why not."""
    if shutil.which("bwrap") is None:
        return "no bwrap on PATH (apt-get install bubblewrap)"
    try:
        done = subprocess.run([*bwrap_prefix(Path(sys.prefix)), sys.executable, "-c", "pass"], capture_output=True,
                              timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None if done.returncode == 0 else done.stderr.decode(errors="replace").strip()[-300:] or "it failed"


def bwrap_works() -> bool:
    return bwrap_problem() is None


def user_works() -> bool:
    if os.geteuid() != 0:
        return False
    try:
        pwd.getpwnam(executor_user())
    except KeyError:
        return False
    return True


def _python_dirs() -> list[Path]:
    """Where the running Python lives: its prefixes and every site-packages on its path."""
    dirs = {Path(sys.base_prefix), Path(sys.prefix), Path(os.path.realpath(sys.executable)).parent.parent}
    dirs.update(Path(p) for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages")))
    dirs = sorted(d.resolve() for d in dirs if d.is_dir())
    return [d for d in dirs if not any(o != d and o in d.parents for o in dirs) and d != Path("/")]


# What Triton starts to compile for a GPU (never in the interpreter): its own ptxas (inside its package), the C
# compiler it builds its launchers with ($CC, else the first of cc, gcc, clang on PATH), /sbin/ldconfig (to
# find libcuda) and file (Python's platform.architecture()). Measured on an H100: bench/probe_executor_gpu.py.
TRITON_PROGRAMS = ("cc", "gcc", "clang", "file", "/sbin/ldconfig", "/sbin/ldconfig.real")


@functools.lru_cache(maxsize=1)
def triton_programs() -> frozenset[str]:
    """The real paths of the programs Triton may start (TRITON_PROGRAMS), as this machine has them."""
    found = set()
    for name in (os.environ.get("CC"), *TRITON_PROGRAMS):
        path = shutil.which(name) if name and "/" not in name else name
        if path and os.path.isfile(path):
            found.add(os.path.realpath(path))
    return frozenset(found)


def _program_dirs() -> list[str]:
    """The installations the programs of triton_programs live in, outside /usr (a GCC under /opt/gcc, its
    bin/ and libexec/): the sandbox shows them read-only."""
    dirs = set()
    for real in triton_programs():
        if not real.startswith("/usr/"):
            bin_dir = os.path.dirname(real)
            top = os.path.dirname(bin_dir) if os.path.basename(bin_dir) == "bin" else bin_dir
            if top not in ("/", "/tmp") and not top.startswith("/tmp/"):
                dirs.add(top)
    return sorted(dirs)


def _python_links() -> list[tuple[str, str]]:
    """(path, real path) of the running Python's prefixes where the path goes through a link: the executor is
    started as sys.executable, so that path must lead to the Python in the sandbox too."""
    links = {}
    for prefix in {sys.prefix, sys.exec_prefix, os.path.dirname(os.path.dirname(os.path.abspath(sys.executable)))}:
        path, real = os.path.abspath(prefix), os.path.realpath(prefix)
        if path != real and not path.startswith("/usr/"):
            links[path] = real
    return sorted(links.items())


def bwrap_prefix(tree: Path) -> list[str]:
    """bubblewrap's command line up to the program: the namespaces and the file system (see the docstring)."""
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--ro-bind", "/usr", "/usr"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / top
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    for name in ETC_FILES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    # The private /tmp first: what is bound after it may lie inside it (a venv under /tmp, the executor's folder)
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", PRIVATE_TMP]
    for d in _python_dirs():
        if not str(d).startswith("/usr/"):
            args += ["--ro-bind", str(d), str(d)]
    for link, real in _python_links():  # a venv reached through a link (.venv -> /elsewhere/venv): the same link
        args += ["--symlink", real, link]
    for dev in sorted(Path("/dev").glob("nvidia*")):  # a GPU, where there is one
        args += ["--dev-bind", str(dev), str(dev)]
    if any(Path("/dev").glob("nvidia*")):  # Triton's compiler, where it is not under /usr
        for top in _program_dirs():
            args += ["--ro-bind", top, top]
    for lib in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):  # a driver outside /usr (/usr/local/nvidia)
        if lib and Path(lib).is_dir() and not lib.startswith(("/usr/", "/tmp")):
            args += ["--ro-bind", lib, lib]
    tree = Path(tree).resolve()
    return [*args, "--ro-bind", str(tree), str(tree), "--chdir", str(tree)]


def command(kind: str, tree: Path) -> list[str]:
    """The command line that starts the executor on ``tree`` (the folder holding its ``gqa_flash``)."""
    python = [sys.executable, "-m", "gqa_flash.course.grader.executor"]
    return [*bwrap_prefix(tree), *python] if kind == "bwrap" else python


def environment(tree: Path, kind: str, base: dict[str, str]) -> dict[str, str]:
    """The executor's environment: a few variables, none that leads to the course or the judge."""
    keep = ("PATH", "LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES", "TRITON_INTERPRET", "GQA_FLASH_IMPL",
            # what a GPU machine needs to find its driver, its toolkit and Triton's compiler
            "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH",
            "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
            "GQA_FLASH_GRADE_RUN",  # the grader's mark: it finds and kills whatever a run left behind
            "GQA_FLASH_AUDIT",  # "0" only in the grader's own tests of what lies beneath the audit hook
            "GQA_FLASH_SEED", "OMP_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
    env = {k: base[k] for k in keep if k in base}
    private = PRIVATE_TMP if kind == "bwrap" else base.get("TMPDIR", "/tmp")
    env.update(PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1", HOME=private, TMPDIR=private,
               PYTHONNOUSERSITE="1", PATH=base.get("PATH", "/usr/bin:/bin"))
    return env


def limits(kind: str, *, cpu_s: int, file_mb: float, memory_gb: float | None):
    """A preexec_fn: the executor's resource limits, and (``user``) its user."""
    def apply() -> None:
        os.setsid()
        for which, value in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_CPU, cpu_s),
                             (resource.RLIMIT_FSIZE, int(file_mb * 2**20)),
                             (resource.RLIMIT_AS, int(memory_gb * 2**30) if memory_gb else None)):
            if value is not None:
                set_limit(which, value)
        if kind == "user":
            entry = pwd.getpwnam(executor_user())
            os.setgroups([])
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)

    return apply


def set_limit(which, value: int) -> None:
    """Lower a resource limit to value (never above its hard limit); where the container forbids it, go on."""
    soft, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    try:
        resource.setrlimit(which, (value, value))
    except (ValueError, OSError):  # a container that forbids it: run anyway
        pass
