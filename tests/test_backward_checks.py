"""Notebook 06's checks name each classic backward.py bug of tests/mutants/backward.py.

Each mutant (solutions/backward.py with one bug put in) is loaded in place of the graded file; the check of
the part the bug is in must FAIL and give the cause written for that mistake, so that a student who makes it
reads what is wrong and where, then why, not only that something is.
"""

import sys
from pathlib import Path

import pytest

from gqa_flash.lab.checks import backward
from gqa_flash.lab.checks.cases import LOG2E

sys.path.insert(0, str(Path(__file__).parent))
from mutants.catalog import MUTANTS, serve  # noqa: E402


def _cause(part, bug, name):
    """The cause the check gives for ``bug`` in ``part``, found in ``name`` (dQ, dK or dV)."""
    return backward._mistake_text(dict((b, c) for b, c, _ in backward._MISTAKES[part])[bug], name, part)


# Each classic backward.py bug: the check that must catch it, and the cause it must give.
EXPECTED = {
    "backward_no_group_sum": ("check_gqa_sum", _cause(3, "group_first", "dV")),
    "backward_gqa_heads_interleaved": ("check_gqa_sum", _cause(3, "group_mod", "dV")),
    "backward_lse_natural_base": ("check_dkdv", _cause(2, "lse_base", "dV")),
    "backward_dq_no_log2e": ("check_dq", _cause(4, "qk_no_log2e", "dQ")),
    "backward_dq_no_causal_mask": ("check_dq", _cause(4, "no_mask", "dQ")),
    "backward_dkdv_no_causal_mask": ("check_dkdv", _cause(2, "no_mask", "dV")),
    "backward_dkdv_starts_late": ("check_dkdv", backward.DKDV_LATE),
    "backward_dq_stops_early": ("check_dq", backward.DQ_EARLY),
    "backward_dq_no_scale": ("check_dq", backward._factor_cause("dQ", 4.0, 0.25)[0]),
    "backward_dk_no_scale": ("check_dkdv", backward._factor_cause("dK", 4.0, 0.25)[0]),
    "backward_dk_qk_scale": ("check_dkdv", backward._factor_cause("dK", LOG2E, 0.25)[0]),
    "backward_dv_assigned": ("check_dkdv", _cause(2, "assign", "dV")),
    "backward_no_key_mask": ("check_dq", backward.NO_KEY_MASK),
    "backward_delta_zero": ("check_dkdv", _cause(2, "no_delta", "dK")),
    "backward_delta_fp16": ("check_delta", backward.DELTA_FP16),
}
BACKWARD_MUTANTS = [m for m in MUTANTS if m.file == "backward.py"]


def test_every_backward_mutant_has_its_expected_cause():
    assert {m.name for m in BACKWARD_MUTANTS} == set(EXPECTED), "a backward.py mutant was added or renamed: say " \
                                                                 "which check names it, with which cause"


def test_the_scale_causes_name_the_scale():
    # A gradient off by exactly one factor is a scale mistake, and the check says which (head dim 16: sm_scale 1/4).
    assert backward._factor_cause("dQ", 4.0, 0.25)[0] == backward.SCALE_MISSING.format(name="dQ", operand="Q")
    assert backward._factor_cause("dK", 0.25, 0.25)[0] == backward.SCALE_TWICE.format(name="dK", acc="dk")
    assert backward._factor_cause("dV", 0.25, 0.25)[0] == backward.SCALE_ON_DV
    assert backward._factor_cause("dK", 3.0, 0.25)[0] is None


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mutant", BACKWARD_MUTANTS, ids=lambda m: m.name)
def test_the_check_names_the_mistake(mutant, tmp_path, monkeypatch, capsys):
    serve(mutant.imported(tmp_path), "backward", monkeypatch)
    check_name, cause = EXPECTED[mutant.name]
    verdict = getattr(backward, check_name).verdict()
    printed = capsys.readouterr().out
    assert not verdict.ok, f"{check_name} passes {mutant.name} ({mutant.bug}): {printed}"
    assert verdict.cause == cause, f"{mutant.name} ({mutant.bug}): {check_name} gave {verdict}"
    # Step one says what is wrong and where, in words: no code, and not the cause.
    assert "tl." not in verdict.message + (verdict.where or "") and verdict.cause not in (verdict.where or "")
