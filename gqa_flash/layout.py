"""Where the course's files are, and which of them a student writes.

One place for these facts, read by the switch (``impl``), the grader, the
notebook checks and the tests::

    notebooks/          the lessons; notebooks/data/ holds measured results
    gqa_flash/          the package: the graded files below, the API, the core
    gqa_flash/fast/     the course's fastest kernels (fully written, not graded)
    gqa_flash/lab/      what the notebooks use: checks, pictures, benchmark
    gqa_flash/grader/   the grader, the Gradescope bundle and the release tool
    tests/graded/       the graded tests, one file per graded module

Only the implementation switch (``impl``) knows where the completed files
live; nothing else in the package names them.
"""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
COURSE_DIR = PACKAGE_DIR.parent
NOTEBOOKS_DIR = COURSE_DIR / "notebooks"
DATA_DIR = NOTEBOOKS_DIR / "data"
TESTS_DIR = COURSE_DIR / "tests"
GRADED_TESTS_DIR = TESTS_DIR / "graded"

# The files a student writes, in course order; each has tests/graded/test_<name>.py.
GRADED_MODULES = ("naive", "online_softmax", "tiled", "forward", "backward", "decode", "ring")
GRADED_FILES = tuple(f"{name}.py" for name in GRADED_MODULES)
# Graded beyond the 100 points of the others.
BONUS_MODULES = ("backward", "decode", "ring")
# Practice files: written like the graded ones (single-sourced in the solutions, behind the
# implementation switch, checked in a notebook) but never graded, so not in GRADED_FILES.
PRACTICE_MODULES = ("traffic",)

# How a graded file marks a part the student writes: a banner line, the part,
# then the banner's end.
BANNER = re.compile(r"#\s*--- STUDENT IMPLEMENTATION REQUIRED HERE \(Part (\d+)\) ---")
BANNER_END = "# --- END OF STUDENT IMPLEMENTATION ---"
