"""Notebook 07's checks name the mistakes the graded decode tests catch: each of these classic decode.py
bugs of tests/mutants/decode.py (Q's head-dim mask, the table's column stride, a table read past the
sequence's last page, an empty split's NaN) fails the check of its part, and the verdict says what is
wrong and how to fix it.

The check of a part runs a probe (gqa_flash/lab/checks/probes.py) on the mutated file's helper; the
solutions pass every check.
"""

import sys
from pathlib import Path

import pytest

from gqa_flash import impl
from gqa_flash.lab.checks import decode_parts

sys.path.insert(0, str(Path(__file__).parent))
from mutants.catalog import MUTANTS, serve  # noqa: E402

# mutant -> (the check that must fail, words its verdict must hold: what is wrong, and the fix)
EXPECTED = {
    "decode_q_head_dim_unmasked": (decode_parts.check_decode_group_tile,
                                   ["padding column", "columns past HEAD_DIM load as 0",
                                    "mask the load with offs_d < HEAD_DIM"]),
    "decode_table_column_stride_ignored": (decode_parts.check_decode_pages,
                                           ["stored transposed", "column stride was ignored", "j * stride_tp"]),
    "decode_table_read_unmasked": (decode_parts.check_decode_pages,
                                   ["read past the sequence's last page", "entry 8 of row 1",
                                    "load with mask=key_ok"]),
    "decode_empty_split_nan": (decode_parts.check_decode_split,
                               ["got nan", "it is empty", "NaN in a row that sees no key of the chunk",
                                "finite stand-in"]),
}
BY_NAME = {m.name: m for m in MUTANTS}


def test_every_expected_mutant_exists():
    assert set(EXPECTED) <= set(BY_NAME), "a decode mutant named here was renamed or removed"


def test_the_solutions_pass_the_part_checks(monkeypatch):
    solution = impl.load("decode", "solutions")
    serve(solution, "decode", monkeypatch)
    for check in {check for check, _ in EXPECTED.values()}:
        verdict = check.verdict()
        assert verdict.ok, verdict


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_part_check_names_the_mistake(name, tmp_path, monkeypatch, capsys):
    mutant = BY_NAME[name]
    serve(mutant.imported(tmp_path), "decode", monkeypatch)
    check, words = EXPECTED[name]
    verdict = check.verdict()
    capsys.readouterr()
    assert not verdict.ok, f"{name} ({mutant.bug}) passes {check.__name__}"
    text = str(verdict)
    missing = [w for w in words if w not in text]
    assert not missing, f"{name} ({mutant.bug}): the verdict does not say {missing}: {text}"
