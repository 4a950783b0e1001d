"""Notebook 08's checks name the student's mistake in ring.py, and the whole-ring check names the failing part
(issue 47: an unweighted merge and "ranks compared instead of chunk numbers" got no likely cause, and the
whole ring said only that its output differed).

Each test plants one bug in a copy of solutions/ring.py (a text replace), serves the copy to the checks
(tests/mutants/catalog.py's ``serve``) and reads the verdict. The whole-ring check runs its parts' checks
first, in this process, so a planted part is found without starting the gloo processes.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

from gqa_flash.course import impl
from gqa_flash.course.lab.checks import ring

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/, where mutants/ is
from mutants.catalog import serve  # noqa: E402

SOLUTION = impl.SOLUTIONS_DIR / "ring.py"
pytestmark = pytest.mark.skipif(not SOLUTION.is_file(), reason="the student edition has no solutions/")

MERGE = "    o = torch.nan_to_num(o) * w[..., None] + torch.nan_to_num(o_blk) * w_blk[..., None]\n"
UNWEIGHTED = (MERGE, "    o = torch.nan_to_num(o) + torch.nan_to_num(o_blk)\n")
RANKS = [("if not causal or kv_chunk < q_chunk:", "if not causal or source < rank:"),
         ("elif kv_chunk == q_chunk:", "elif source == rank:")]


def plant(tmp_path, monkeypatch, *edits):
    text = SOLUTION.read_text()
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path = tmp_path / "planted_ring.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("planted_ring", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    serve(module, "ring", monkeypatch)


def test_an_unweighted_merge_is_named(tmp_path, monkeypatch):
    plant(tmp_path, monkeypatch, UNWEIGHTED)
    v = ring.check_merge_blocks.verdict()
    assert not v.ok and v.what.startswith("ring.py Part 3 "), v
    assert v.cause and v.cause.startswith("the outputs are added without weights"), v


def test_a_merged_lse_kept_from_the_running_part_is_named(tmp_path, monkeypatch):
    plant(tmp_path, monkeypatch, ("return o, total", "return o, lse"))
    v = ring.check_merge_blocks.verdict()
    assert v.cause and v.cause.startswith("the running lse is kept"), v


def test_ranks_compared_instead_of_chunk_numbers_is_named(tmp_path, monkeypatch):
    plant(tmp_path, monkeypatch, *RANKS)
    v = ring.check_block_pairs.verdict()
    assert not v.ok and v.what.startswith("ring.py Part 2 "), v
    assert v.cause and v.cause.startswith("ranks are compared, not chunk numbers"), v


@pytest.mark.parametrize("edits, part, cause", [
    ([UNWEIGHTED], 3, "the outputs are added without weights"),
    (RANKS, 2, "ranks are compared, not chunk numbers"),
], ids=["unweighted merge", "ranks compared"])
def test_the_whole_ring_names_the_failing_part(edits, part, cause, tmp_path, monkeypatch):
    plant(tmp_path, monkeypatch, *edits)
    v = ring.check_ring_attention.verdict()
    assert not v.ok and v.what.startswith(f"ring.py Part {part} "), v
    assert v.message.startswith(f"not run yet: Part {part} fails its own check"), v
    assert v.cause and v.cause.startswith(cause), v


def test_the_whole_ring_takes_the_part_verdicts_it_is_given(tmp_path, monkeypatch):
    plant(tmp_path, monkeypatch, UNWEIGHTED)
    parts = [check.verdict() for check in ring.PART_CHECKS]
    assert [p.ok for p in parts] == [True, True, False]
    v = ring.check_ring_attention.verdict(parts)
    assert v.what.startswith("ring.py Part 3 "), v
