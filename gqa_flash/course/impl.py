"""The implementation switch: whose graded files stand behind the public API.

``GQA_FLASH_IMPL=student`` (the default) uses the graded files in ``gqa_flash/``,
the ones a student edits. ``GQA_FLASH_IMPL=solutions`` uses ``solutions/`` at the
top of the course. Notebooks, tests and the grader all go through :func:`load`,
so one variable decides for all of them. The practice files
(``layout.PRACTICE_MODULES``: written like the graded ones, checked in a notebook,
never graded) go through it too.

:func:`load` re-imports a graded file when it changed on disk, so a student who
edits ``gqa_flash/forward.py`` and re-runs a notebook cell gets the new code
without restarting the kernel.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from gqa_flash.course import runtime  # noqa: F401  (sets TRITON_INTERPRET before any kernel is defined)

from gqa_flash.course.layout import COURSE_DIR, GRADED_MODULES, PACKAGE_DIR, PRACTICE_MODULES

CHOICES = ("student", "solutions")
# The completed graded files: the one place in the package that names them.
SOLUTIONS_DIR = COURSE_DIR / "solutions"
COMPLETED_PACKAGE = "gqa_flash._solutions"  # the package they are imported under

_cache: dict[Path, tuple[int, ModuleType]] = {}


def current() -> str:
    """The value of ``GQA_FLASH_IMPL``, checked."""
    choice = os.environ.get("GQA_FLASH_IMPL", "student").strip().lower() or "student"
    if choice not in CHOICES:
        raise ValueError(
            f"GQA_FLASH_IMPL must be one of {', '.join(CHOICES)}; got {os.environ['GQA_FLASH_IMPL']!r}"
        )
    return choice


def completed_dir(course_dir: Path = COURSE_DIR) -> Path:
    """Where the completed graded files are in the course at ``course_dir`` (a copy of this one, say): the one
    place outside this module's constants that knows. The student edition has no such folder."""
    return course_dir / SOLUTIONS_DIR.relative_to(COURSE_DIR)


def source_dir(choice: str | None = None) -> Path:
    choice = choice or current()
    if choice == "solutions":
        if not SOLUTIONS_DIR.is_dir():
            raise FileNotFoundError(
                f"GQA_FLASH_IMPL=solutions but there is no solutions folder at {SOLUTIONS_DIR} "
                "(the student edition of the course does not ship it)"
            )
        return SOLUTIONS_DIR
    return PACKAGE_DIR


def path_of(name: str, choice: str | None = None) -> Path:
    if name not in GRADED_MODULES + PRACTICE_MODULES:
        raise ValueError(f"unknown graded module {name!r}; expected one of {', '.join(GRADED_MODULES)} "
                         f"(or a practice module: {', '.join(PRACTICE_MODULES)})")
    return source_dir(choice) / f"{name}.py"


_paths: dict[tuple[str, str, Path], tuple[Path, str]] = {}


def load(name: str, choice: str | None = None) -> ModuleType:
    """The graded (or practice) module ``name`` from the chosen implementation, fresh if it changed.

    Called on every call of the public API, so its usual case (the file has not changed) costs one
    ``stat`` of the file and two dictionary lookups."""
    choice = choice or current()
    key = (name, choice, SOLUTIONS_DIR)  # (a test may point SOLUTIONS_DIR elsewhere)
    where = _paths.get(key)
    if where is None:
        path = path_of(name, choice)
        where = _paths[key] = (path, str(path))
    path = where[0]
    mtime = os.stat(where[1]).st_mtime_ns
    cached = _cache.get(path)
    if cached is not None and cached[0] == mtime:
        return cached[1]
    if choice == "student":
        # The real package module, so that `gqa_flash.forward` and what the API
        # calls are one and the same object.
        qualname = f"gqa_flash.{name}"
        package = sys.modules["gqa_flash"]
        public = package.__dict__.get(name)  # gqa_flash.online_softmax is also a public function
        module = sys.modules.get(qualname)
        module = importlib.reload(module) if module is not None else importlib.import_module(qualname)
        # Importing a submodule binds it as the package's attribute of the same
        # name, over the public function: put the function back.
        if callable(public) and not isinstance(public, ModuleType):
            setattr(package, name, public)
    else:
        # One module object per file, re-executed in place when the file
        # changes, as importlib.reload does for the student's modules: code
        # that holds the module (a notebook check) sees the new functions.
        qualname = f"{COMPLETED_PACKAGE}.{name}"
        module = sys.modules.get(qualname)
        if module is None or getattr(module, "__file__", None) != str(path):
            spec = importlib.util.spec_from_file_location(qualname, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[qualname] = module  # Triton's JIT looks kernels' globals up through the module
        module.__spec__.loader.exec_module(module)
    _cache[path] = (mtime, module)
    return module
