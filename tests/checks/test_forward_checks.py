"""Notebook 04's checks name the planted bugs of forward.py: FAIL on the part's check, with the mistake in words.

Each mutant of tests/mutants/forward.py listed here is one usual mistake; with it in place of the
solution, its part's check must fail and its verdict must say what is wrong (the words below), while
the checks of the parts it does not touch still pass. Three of them give right answers in every small
test (a missing ``other``, int32 offsets) or in every test whose K and V share a layout (V read with K's
strides): the probes of probes.py must show them anyway. The checks run here on a module loaded from a
temporary file, in place of impl.load.
"""

import sys
from pathlib import Path

import pytest

from gqa_flash.course import impl, runtime
from gqa_flash.course.lab.checks import kernel_parts, kernel_walk, probes

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/, where mutants/ is
from mutants.catalog import MUTANTS, _m  # noqa: E402

SOLUTION = impl.SOLUTIONS_DIR / "forward.py"
pytestmark = [
    pytest.mark.skipif(not SOLUTION.is_file(), reason="the student edition has no solutions/"),
    pytest.mark.skipif(not runtime.INTERPRETER, reason="the checks are compared here in the interpreter"),
]

CHECKS = {2: kernel_walk.check_load_tile, 3: kernel_walk.check_key_loop, 6: kernel_parts.check_epilogue}

# mutant -> (the part whose check must fail, words its verdict must hold)
NAMED = {
    "forward_load_without_other": (2, ["no `other`", "other=0.0"]),
    "forward_load_offsets_int32": (2, ["32-bit integers", "batch_idx.to(tl.int64)"]),
    "forward_v_with_k_strides": (3, ["V is loaded with K's strides"]),
    "forward_store_offsets_int32": (6, ["32-bit integers", "O", "to(tl.int64)"]),
    "forward_strides_swapped": (2, ["wrong addresses"]),
    "forward_head_dim_padding_unmasked": (2, ["columns past n_cols are loaded"]),
    "forward_load_unmasked": (2, ["the load has no mask at all"]),
    "forward_causal_walks_past_diagonal": (3, ["blocks after the diagonal"]),
    "forward_unmasked_phase_takes_the_diagonal": (3, ["without the mask"]),
    "forward_non_causal_drops_ragged_block": (3, ["never visited"]),
}


@pytest.mark.parametrize("name", list(NAMED))
def test_the_check_names_the_planted_bug(monkeypatch, tmp_path, name):
    mutant = next(m for m in MUTANTS if m.name == name)
    module = mutant.imported(tmp_path)
    monkeypatch.setattr(probes, "load", lambda _: module)
    part, words = NAMED[name]
    verdict = CHECKS[part].verdict()
    text = str(verdict)
    assert not verdict.ok, f"{name}: the check of Part {part} passes:\n{text}"
    assert f"Part {part} " in verdict.what, text
    for word in words:
        assert word in text, f"{name}: {word!r} is not in the verdict:\n{text}"
    for other, check in CHECKS.items():
        if other != part and other != 3:  # Part 3 loads its tiles with Part 2: a Part 2 bug may show there too
            assert check.verdict().ok, f"{name}: the check of Part {other} fails too:\n{check.verdict()}"


def test_every_forward_mutant_with_a_probe_only_bug_is_named_here():
    """The bugs no whole-kernel run on a CPU shows must each be named by a check."""
    for name in ("forward_load_without_other", "forward_load_offsets_int32", "forward_store_offsets_int32",
                 "forward_v_with_k_strides"):
        assert any(m.name == name for m in MUTANTS) and name in NAMED, name


def test_the_checks_pass_on_the_solution(monkeypatch):
    monkeypatch.setenv("GQA_FLASH_IMPL", "solutions")
    for check in CHECKS.values():
        verdict = check.verdict()
        assert verdict.ok, str(verdict)


# A load with no mask (or none for the padded columns) reads lanes past the tile. Every whole-kernel run's address
# check says so, in points; the grader's two probes of Part 2 must say the same, or nothing. The int64 probe judges
# the tile's own 64-bit addresses (it said "0 of 100 elements read at the wrong address", and failed); the
# masked-lanes probe names the missing mask (it said "the masked entries do not read 0").
UNMASKED = ("forward_load_unmasked", "forward_head_dim_padding_unmasked")


@pytest.mark.parametrize("name", UNMASKED)
def test_the_int64_probe_judges_the_tiles_own_addresses(monkeypatch, tmp_path, name):
    module = next(m for m in MUTANTS if m.name == name).imported(tmp_path)
    monkeypatch.setattr(probes, "load", lambda _: module)
    assert kernel_walk.load_tile_offsets_problem() is None  # its offsets are the 64-bit ones


@pytest.mark.parametrize("name", UNMASKED)
def test_the_masked_lanes_probe_names_a_missing_mask(monkeypatch, tmp_path, name):
    module = next(m for m in MUTANTS if m.name == name).imported(tmp_path)
    monkeypatch.setattr(probes, "load", lambda _: module)
    problem = kernel_walk.load_tile_masked_lanes_problem()
    assert problem is not None and "not masked" in problem["message"], problem
    assert "mask the load" in problem["hint"], problem


# A load with no mask at all said "likely cause: rows past n_rows are loaded: rows 21.. ..." while its "where"
# pointed at column 20: which of the two masks is missing is told apart, and "where" shows the entries it means.
_ROWS_ONLY = _m("forward_load_rows_unmasked", "forward.py", "the columns are masked, the rows are not",
                ("in_bounds = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)",
                 "in_bounds = cols[None, :] < n_cols"))
MISSING_MASKS = {  # mutant -> (the cause's start, words of its hint, the entries "where" shows)
    "forward_load_unmasked": (
        "the load has no mask at all: neither the rows nor the columns are masked, so rows 21.. (the ragged last "
        "tile) and columns 20..", "rows < n_rows and columns < n_cols",
        ["tile row 5 (sequence row 21), column 0: got 777", "tile row 0 (sequence row 16), column 20: got 777"]),
    "forward_head_dim_padding_unmasked": (
        "columns past n_cols are loaded: the rows are masked but the columns are not, so columns 20..",
        "mask the columns too", ["tile row 0 (sequence row 16), column 20: got 777"]),
    "forward_load_rows_unmasked": (
        "rows past n_rows are loaded: the columns are masked but the rows are not, so rows 21..",
        "mask the rows too", ["tile row 5 (sequence row 21), column 0: got 777"]),
}


@pytest.mark.parametrize("name", list(MISSING_MASKS))
def test_the_missing_mask_is_named_rows_columns_or_both(monkeypatch, tmp_path, name):
    mutant = _ROWS_ONLY if name == _ROWS_ONLY.name else next(m for m in MUTANTS if m.name == name)
    module = mutant.imported(tmp_path)
    monkeypatch.setattr(probes, "load", lambda _: module)
    cause, hint, entries = MISSING_MASKS[name]
    verdict = kernel_walk.check_load_tile.verdict()
    assert not verdict.ok and verdict.cause.startswith(cause) and hint in verdict.hint, verdict
    assert verdict.where.split(": ", 1)[1] == "; ".join(f"{e}, expected 0" for e in entries), verdict
