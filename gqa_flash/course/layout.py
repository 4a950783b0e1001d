"""Where the course's files are, and which of them a student writes.

One place for these facts, read by the switch (``impl``), the grader, the
notebook checks and the tests::

    notebooks/               the lessons; notebooks/data/ holds measured results
    gqa_flash/               the student's files, the public API, the spec (reference.py)
    gqa_flash/fast/          the course's fastest kernels (fully written, not graded)
    gqa_flash/course/        the machinery: this registry, the switch, the API's host side
    gqa_flash/course/lab/    what the notebooks use: checks, pictures, benchmark
    gqa_flash/course/grader/ the grader, the Gradescope bundle, the stubs
    tests/graded/            the graded tests, one file per graded module

Only the implementation switch (``impl``) knows where the completed files
live; nothing else in the package names them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # gqa_flash/, above this course/ folder
COURSE_DIR = PACKAGE_DIR.parent  # the repository's top (notebooks/, tests/, ...), not gqa_flash/course/
NOTEBOOKS_DIR = COURSE_DIR / "notebooks"
DATA_DIR = NOTEBOOKS_DIR / "data"
TESTS_DIR = COURSE_DIR / "tests"
GRADED_TESTS_DIR = TESTS_DIR / "graded"

@dataclass(frozen=True)
class StudentFile:
    """A student's file: what it is measured against (its specification, its notebook and that notebook's
    whole-file check), its parts as its banners number them, and (graded files) its points. The stubs'
    signposts, the checks' part names, the grader's lists and gqa_flash/README.md come from here; the course's
    tests hold them to the notebooks, the checks, the banners and the graded tests' marks."""

    spec: str  # the executable specification
    notebook: str  # the notebook that teaches it, by file stem
    check: str  # the notebook's whole-file check, in gqa_flash.course.lab.checks
    parts: dict[int, str]  # Part N -> its name, as the checks and the grader's messages call it
    points: int = 0  # the graded tests' points (0: practice, never graded)
    bonus: bool = False  # graded beyond the 100 points of the required files
    builds_on: tuple[str, ...] = ()  # the student files whose helpers it calls (through impl.load): its own work too


# THE REGISTRY: the files a student writes, in course order. Adding or renaming a file or a part starts here;
# the instructor's guide ("Adding or renaming a part", "Adding a student file") lists what cannot be derived
# from it.
STUDENT_FILES = {
    "naive": StudentFile(
        "reference.reference_attention", "01_naive_attention", "check_naive",
        {1: "GQA head mapping", 2: "scores and causal mask", 3: "softmax and P @ V"}, 20),
    "online_softmax": StudentFile(
        "reference.reference_softmax", "02_online_softmax", "check_online_softmax",
        {1: "block_state", 2: "merge_states", 3: "online_softmax"}, 15),
    "tiled": StudentFile(
        "reference.reference_attention (O and the LSE)", "03_tiled_attention", "check_tiled",
        {1: "GQA head mapping", 2: "the tile walk and where the causal loop stops",
         3: "causal mask on the diagonal tiles", 4: "online-softmax update", 5: "epilogue: O and LSE"}, 25),
    "forward": StudentFile(
        "reference.reference_attention (O and the LSE)", "04_triton_kernel", "check_forward",
        {1: "program_ids", 2: "load_tile", 3: "key_loop", 4: "online_softmax_update", 5: "mask_scores",
         6: "epilogue"}, 40),
    "windows": StudentFile(
        "reference.reference_attention (window, sink_tokens, sinks)", "04b_windows_and_sinks", "check_windows",
        {1: "window_mask", 2: "window_key_loop", 3: "sink_state"}, 15, bonus=True, builds_on=("forward",)),
    "backward": StudentFile(
        "reference.reference_gradients", "06_backward_and_training", "check_backward",
        {1: "D = rowsum(dO * O)", 2: "dK and dV", 3: "the GQA sum", 4: "dQ"}, 20, bonus=True),
    "decode": StudentFile(
        "reference.reference_decode", "07_decoding", "check_decode",
        {1: "group_tile", 2: "page_slots", 3: "split_partial", 4: "merge_splits"}, 15, bonus=True),
    "ring": StudentFile(
        "reference.reference_attention (O and the LSE)", "08_context_parallel", "check_ring_attention",
        {1: "ring_source", 2: "block_pairs", 3: "merge_blocks"}, 10, bonus=True),
    # Practice: written like the graded ones (single-sourced in the completed files, behind the implementation
    # switch, checked in a notebook) but never graded.
    "traffic": StudentFile(
        "its notebook's measured L2 model", "05_performance", "check_traffic_model",
        {1: "launch_order", 2: "dram_bytes: the L2 model"}),
}

# Derived from the registry: the graded files (each has tests/graded/test_<name>.py), the bonus ones, and the
# practice ones (not in GRADED_FILES).
GRADED_MODULES = tuple(name for name, f in STUDENT_FILES.items() if f.points)
GRADED_FILES = tuple(f"{name}.py" for name in GRADED_MODULES)
BONUS_MODULES = tuple(name for name, f in STUDENT_FILES.items() if f.bonus)
PRACTICE_MODULES = tuple(name for name, f in STUDENT_FILES.items() if not f.points)
PARTS = {name: f.parts for name, f in STUDENT_FILES.items()}  # every student file's parts, by banner number

# How a graded file marks a part the student writes: a banner line, the part,
# then the banner's end.
BANNER = re.compile(r"#\s*--- STUDENT IMPLEMENTATION REQUIRED HERE \(Part (\d+)\) ---")
BANNER_END = "# --- END OF STUDENT IMPLEMENTATION ---"
