"""Notebook 07's checks name the student's real mistake, in two steps.

Each planted bug is a mutated copy of solutions/decode.py: the classic bugs of tests/mutants/decode.py, and
here the mistakes students made in Part 3's walk (its bounds, its positions, its scale) and in Part 2's table
index. Each must fail the check of its part, and its verdict must say

* first, in ``message`` and ``where``, what is wrong and where (case, row, token, position, split), in words:
  no code, no fix;
* then, in ``cause``, the mistake itself, and in ``hint``, the fix.

The check of a part runs a probe (gqa_flash/course/lab/checks/probes.py) on the mutated file's helper; the
solutions pass every check.
"""

import re
import sys
from pathlib import Path

import pytest

from gqa_flash.course import impl
from gqa_flash.course.lab.checks import decode_parts

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/, where mutants/ is
from mutants.catalog import MUTANTS, Mutant, serve  # noqa: E402

GROUP, PAGES, SPLIT, MERGE = decode_parts.PART_CHECKS


def _planted(name, bug, *edits):
    return Mutant(name=name, file="decode.py", edits=tuple(edits), bug=bug)


# Student mistakes of Parts 2 and 3 that the graded tests' mutants do not hold (the catalog keeps one a kind).
PLANTED = [
    _planted("causal_offset_reversed", "new token i put at position seq_len - 1 - i: the tokens counted backwards",
             ("pos = seq_len - N_Q + token", "pos = seq_len - 1 - token")),
    _planted("last_partial_block_dropped", "the walk takes whole blocks only: a chunk's ragged end is skipped",
             ("for start_n in range(start, end, BLOCK_N):",
              "for start_n in range(start, end - BLOCK_N + 1, BLOCK_N):")),
    _planted("last_position_dropped", "the chunk cut at seq_len - 1: the sequence's last position is never walked",
             ("end = tl.minimum(start + CHUNK, seq_len)", "end = tl.minimum(start + CHUNK, seq_len - 1)")),
    _planted("qk_scale_forgotten", "the scores never multiplied by qk_scale",
             ("s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * qk_scale",
              "s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)")),
    _planted("split_start_shifted", "every split starts one position late",
             ("start = split_idx * CHUNK\n", "start = split_idx * CHUNK + 1\n")),
    _planted("split_start_next_chunk", "split s starts at (s + 1) * CHUNK: it walks the next split's chunk",
             ("start = split_idx * CHUNK\n", "start = (split_idx + 1) * CHUNK\n")),
    _planted("table_indexed_by_slot", "the table's column is position % PAGE_SIZE (the slot is right)",
             ("(offs_n // PAGE_SIZE) * stride_tp", "(offs_n % PAGE_SIZE) * stride_tp")),
    _planted("table_indexed_by_position", "the table's column is the position itself",
             ("(offs_n // PAGE_SIZE) * stride_tp", "offs_n * stride_tp")),
]

# bug -> (the check that must fail, words its where must hold, words its cause must hold, words its hint must hold)
EXPECTED = {
    # Part 1
    "decode_kv_head_modulo": (GROUP, ["row 0 is (query head 1, token 0)"], ["dealt out in turn"],
                              ["j * group_size"]),
    "decode_q_head_dim_unmasked": (GROUP, ["padding column 24"], ["columns past HEAD_DIM"],
                                   ["offs_d < HEAD_DIM"]),
    # Part 2
    "decode_table_column_stride_ignored": (PAGES, ["stored transposed"], ["column stride was ignored"],
                                           ["j * stride_tp"]),
    "decode_table_read_unmasked": (PAGES, ["entry 8 of row 1", "past the sequence's end"], ["not masked"],
                                   ["mask=key_ok"]),
    "decode_page_and_slot_swapped": (PAGES, ["position 1"], ["page and slot are swapped", "indexed by the slot"],
                                     ["position // PAGE_SIZE", "position % PAGE_SIZE"]),
    "table_indexed_by_slot": (PAGES, ["position 1"], ["indexed by the slot"], ["position // PAGE_SIZE"]),
    "table_indexed_by_position": (PAGES, ["position 1"], ["indexed by the position itself"],
                                  ["position // PAGE_SIZE"]),
    # Part 3
    "decode_new_tokens_see_the_future": (SPLIT, ["token 0, at position 29"], ["sees the whole cache"],
                                         ["cache_seqlens - N_Q + i"]),
    "decode_causal_off_by_one": (SPLIT, ["at position 44"], ["does not see its own position"], ["<="]),
    "decode_past_seqlen_loaded": (SPLIT, ["got nan"], ["at or past seq_len was read"], ["cut at seq_len"]),
    "decode_empty_row_nan": (SPLIT, ["got nan", "token 0, at position 29"], ["NaN in a row that sees no key"],
                             ["finite stand-in"]),
    "decode_empty_split_nan": (SPLIT, ["got nan", "it is empty"], ["NaN in a row that sees no key of the chunk"],
                               ["finite stand-in"]),
    "causal_offset_reversed": (SPLIT, ["token 15, at position 44"], ["positions run backwards"],
                               ["cache_seqlens - N_Q + i", "token 0 is the earliest"]),
    "last_partial_block_dropped": (SPLIT, ["split 1 holds positions 32..44"],
                                   ["last, partial block is never walked"], ["mask its keys past the end"]),
    "last_position_dropped": (SPLIT, ["at position 44"], ["last position is never walked"],
                              ["cut the chunk at seq_len itself"]),
    "qk_scale_forgotten": (SPLIT, ["split 0, row 0"], ["not scaled", "qk_scale", "left out"],
                           ["multiply the scores by qk_scale"]),
    "split_start_shifted": (SPLIT, ["split 0 holds positions 0..31"], ["starts one position late"],
                            ["[s * CHUNK, (s + 1) * CHUNK)"]),
    "split_start_next_chunk": (SPLIT, ["split 0 holds positions 0..31"], ["walks the next split's chunk"],
                               ["[s * CHUNK, (s + 1) * CHUNK)"]),
    # Part 4
    "decode_merge_no_rescale": (MERGE, ["O, row 0"], ["added as they are"], ["2^(m_s - m)"]),
    "decode_lse_base_2": (MERGE, ["LSE, row 0"], ["log2 units"], ["* ln 2"]),
}
BY_NAME = {m.name: m for m in MUTANTS} | {m.name: m for m in PLANTED}

# What step one (message and where) must not hold: code, or the fix.
CODE = re.compile(r"//|%|\btl\.|stride_|offs_|_ok\b|mask=|\bN_Q\b|BLOCK_N|CHUNK|HEAD_DIM|PAGE_SIZE|\w\(|"
                  r"(^|[:;]\s)(add|use|mask|load|replace|multiply|divide|look)\b", re.MULTILINE)


def test_every_expected_bug_exists():
    assert set(EXPECTED) <= set(BY_NAME), "a decode mutant named here was renamed or removed"
    assert {m.name for m in PLANTED} <= set(EXPECTED), "a planted bug has no expectation"


def test_the_solutions_pass_the_part_checks(monkeypatch):
    serve(impl.load("decode", "solutions"), "decode", monkeypatch)
    for check in decode_parts.PART_CHECKS:
        verdict = check.verdict()
        assert verdict.ok, verdict


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_part_check_names_the_mistake(name, tmp_path, monkeypatch, capsys):
    mutant = BY_NAME[name]
    serve(mutant.imported(tmp_path), "decode", monkeypatch)
    check, where, cause, hint = EXPECTED[name]
    verdict = check.verdict()
    capsys.readouterr()
    assert not verdict.ok, f"{name} ({mutant.bug}) passes {check.__name__}"
    for field, words in (("where", where), ("cause", cause), ("hint", hint)):
        text = getattr(verdict, field) or ""
        missing = [w for w in words if w not in text]
        assert not missing, f"{name} ({mutant.bug}): its {field} does not say {missing}: {verdict}"
    step_one = f"{verdict.message}\n{verdict.where}"
    assert not CODE.search(step_one), f"{name}: step one holds code or a fix ({CODE.search(step_one)[0]!r}): {verdict}"


def test_a_check_shows_the_cause_only_when_run_again(tmp_path, monkeypatch, capsys):
    from gqa_flash.course.lab.checks import common

    monkeypatch.setattr(common, "_SEEN", {})
    serve(BY_NAME["qk_scale_forgotten"].imported(tmp_path), "decode", monkeypatch)
    SPLIT()
    first = capsys.readouterr().out
    SPLIT()
    second = capsys.readouterr().out
    assert "where:" in first and "not scaled" not in first and "hint:" not in first, first
    assert "likely cause: the scores are not scaled" in second and "hint:" in second, second


def test_flash_decode_waits_for_the_parts_that_make_addresses(tmp_path, monkeypatch):
    from gqa_flash.course.lab.checks.decode import check_decode

    serve(BY_NAME["decode_page_and_slot_swapped"].imported(tmp_path), "decode", monkeypatch)
    verdict = check_decode.verdict()
    assert not verdict.ok and verdict.message == "not run yet: decode.py Part 2 (page_slots) fails its own check above"
    assert verdict.cause is None and "Parts 1 to 3" in verdict.hint, verdict  # shown at once: nothing to find out
