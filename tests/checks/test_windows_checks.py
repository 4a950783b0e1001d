"""Notebook 04b's checks name the student's mistake in windows.py, and the whole-file check the failing part.

Each test serves one mutant of tests/mutants/windows.py (a solution with one classic bug) to the checks
(catalog.serve) and reads the verdict of the check of the part the bug is in: it must fail, name that part and
give the mistake as its likely cause; the whole-file check must name the same part. The sink scaled by sm_scale
is planted in the given kernel (Part 3 has no sm_scale to scale it by), so only the whole-file check sees it.
"""

import sys
from pathlib import Path

import pytest

from gqa_flash.course import impl
from gqa_flash.course.lab.checks import common, windows

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/, where mutants/ is
from mutants.catalog import MUTANTS, serve  # noqa: E402

pytestmark = pytest.mark.skipif(not (impl.SOLUTIONS_DIR / "windows.py").is_file(),
                                reason="the student edition has no solutions/")

NAMED = {  # mutant: (its part, the start of the likely cause its part's check gives)
    "windows_window_off_by_one": (1, "the window is one key too wide: row 5 sees key 0 with W=5"),
    "windows_window_from_tile_first_row": (1, "the window is measured from the query tile's first row"),
    "windows_sink_tokens_ignored": (1, "the sink tokens are masked like any key older than the window"),
    "windows_causal_rule_dropped": (1, "the causal rule is missing"),
    "windows_sink_blocks_twice": (2, "key block 0 (keys 0-15) is visited twice"),
    "windows_no_skip": (2, "key block 0 (keys 0-15) is visited though no row of the tile sees it"),
    "windows_sink_not_in_l": (3, "the sink raises m_i but is not folded into l_i"),
    "windows_sink_natural_log": (3, "the sink is taken in log2 units"),
    "windows_max_starts_at_minus_inf": (3, "m_i starts at -inf where there is no sink"),
}


@pytest.fixture(autouse=True)
def _solutions(monkeypatch):
    # A mutant of windows.py runs on the completed forward.py (impl.load("forward") as it is imported).
    monkeypatch.setenv("GQA_FLASH_IMPL", "solutions")


def _served(name, tmp_path, monkeypatch):
    mutant = next(m for m in MUTANTS if m.name == name)
    serve(mutant.imported(tmp_path), "windows", monkeypatch)
    common._SEEN.clear()


@pytest.mark.parametrize("name", sorted(NAMED))
def test_the_parts_check_names_the_mistake_and_so_does_the_whole_file(name, tmp_path, monkeypatch):
    _served(name, tmp_path, monkeypatch)
    part, cause = NAMED[name]
    verdicts = [check.verdict() for check in windows.PART_CHECKS]
    v = verdicts[part - 1]
    assert not v.ok and v.what == common.what_of("windows", part), v
    assert v.cause and v.cause.startswith(cause), v
    assert all(other.ok for p, other in enumerate(verdicts, start=1) if p != part), verdicts
    whole = windows.check_windows.verdict(verdicts)
    assert not whole.ok and whole.what == v.what and whole.message.startswith(f"not run yet: Part {part} "), whole
    assert whole.cause == v.cause, whole


def test_a_sink_scaled_by_sm_scale_is_named_by_the_whole_file(tmp_path, monkeypatch):
    _served("windows_sink_scaled_by_sm_scale", tmp_path, monkeypatch)
    verdicts = [check.verdict() for check in windows.PART_CHECKS]
    assert all(v.ok for v in verdicts), verdicts
    whole = windows.check_windows.verdict(verdicts)
    assert not whole.ok and whole.what == common.what_of("windows", 3), whole
    assert whole.cause.startswith("the sink is multiplied by sm_scale"), whole


def test_the_solutions_pass_every_check():
    verdicts = [check.verdict() for check in windows.PART_CHECKS]
    assert all(v.ok for v in verdicts), verdicts
    assert windows.check_windows.verdict(verdicts).ok
