"""Where the course's files are, and which of them a student writes.

One place for these facts, read by the switch (``impl``), the grader, the
notebook checks and the tests::

    notebooks/          the lessons; notebooks/data/ holds measured results
    gqa_flash/          the package: the graded files below, the API, the core
    gqa_flash/fast/     the course's fastest kernels (fully written, not graded)
    gqa_flash/course/lab/      what the notebooks use: checks, pictures, benchmark
    gqa_flash/course/grader/   the grader, the Gradescope bundle and the release tool
    tests/graded/       the graded tests, one file per graded module

Only the implementation switch (``impl``) knows where the completed files
live; nothing else in the package names them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # gqa_flash/, above this course/ folder
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


@dataclass(frozen=True)
class StudentFile:
    """What a student's file is measured against: its specification, its notebook and that notebook's
    whole-file check, and (graded files) its points. The stubs' signposts and gqa_flash/README.md say it;
    the course's tests hold them to the notebooks, the checks and the graded tests' marks."""

    spec: str  # the executable specification
    notebook: str  # the notebook that teaches it, by file stem
    check: str  # the notebook's whole-file check, in gqa_flash.course.lab.checks
    points: int = 0  # the graded tests' points (0: practice, never graded)


STUDENT_FILES = {
    "naive": StudentFile("reference.reference_attention", "01_naive_attention", "check_naive", 20),
    "online_softmax": StudentFile("reference.reference_softmax", "02_online_softmax", "check_online_softmax", 15),
    "tiled": StudentFile("reference.reference_attention (O and the LSE)", "03_tiled_attention", "check_tiled", 25),
    "forward": StudentFile("reference.reference_attention (O and the LSE)", "04_triton_kernel", "check_forward", 40),
    "backward": StudentFile("reference.reference_gradients", "06_backward_and_training", "check_backward", 20),
    "decode": StudentFile("reference.reference_decode", "07_decoding", "check_decode", 15),
    "ring": StudentFile("reference.reference_attention (O and the LSE)", "08_context_parallel",
                        "check_ring_attention", 10),
    "traffic": StudentFile("its notebook's measured L2 model", "05_performance", "check_traffic_model"),
}

# How a graded file marks a part the student writes: a banner line, the part,
# then the banner's end.
BANNER = re.compile(r"#\s*--- STUDENT IMPLEMENTATION REQUIRED HERE \(Part (\d+)\) ---")
BANNER_END = "# --- END OF STUDENT IMPLEMENTATION ---"
