"""Notebook 06's checks name each classic backward.py bug of tests/mutants/backward.py.

Each mutant (solutions/backward.py with one bug put in) is loaded in place of the graded file; the check of
the part the bug is in must FAIL and give the cause written for that mistake, so that a student who makes it
reads what is wrong and where, not only that something is.
"""

import sys
from pathlib import Path

import pytest

from gqa_flash.lab.checks import backward

sys.path.insert(0, str(Path(__file__).parent))
from mutants.catalog import MUTANTS, serve  # noqa: E402

_TEXT = {**{bug: text for part in backward._MISTAKES.values() for bug, text in part}}  # the mistakes' causes

# Each classic backward.py bug: the check that must catch it, and the cause it must give.
EXPECTED = {
    "backward_no_group_sum": ("check_gqa_sum", _TEXT["group_first"]),
    "backward_gqa_heads_interleaved": ("check_gqa_sum", _TEXT["group_mod"]),
    "backward_lse_natural_base": ("check_dkdv", backward._LSE_BASE),
    "backward_dq_no_causal_mask": ("check_dq", dict(backward._MISTAKES[4])["no_mask"]),
    "backward_no_key_mask": ("check_dq", backward.NO_KEY_MASK),
    "backward_delta_zero": ("check_dkdv", dict(backward._MISTAKES[2])["no_delta"]),
    "backward_delta_fp16": ("check_delta", backward.DELTA_FP16),
}
BACKWARD_MUTANTS = [m for m in MUTANTS if m.file == "backward.py"]


def test_every_backward_mutant_has_its_expected_cause():
    assert {m.name for m in BACKWARD_MUTANTS} == set(EXPECTED), "a backward.py mutant was added or renamed: say " \
                                                                 "which check names it, with which cause"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mutant", BACKWARD_MUTANTS, ids=lambda m: m.name)
def test_the_check_names_the_mistake(mutant, tmp_path, monkeypatch, capsys):
    serve(mutant.imported(tmp_path), "backward", monkeypatch)
    check_name, cause = EXPECTED[mutant.name]
    verdict = getattr(backward, check_name).verdict()
    printed = capsys.readouterr().out
    assert not verdict.ok, f"{check_name} passes {mutant.name} ({mutant.bug}): {printed}"
    assert verdict.cause == cause, f"{mutant.name} ({mutant.bug}): {check_name} gave {verdict}"
