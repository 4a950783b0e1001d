"""The stored answers of the usual mistakes (gqa_flash/course/lab/checks/replays.pt) that let the notebooks' checks
name a failure's likely cause without shipping a working copy of the exercise.

They must be what tools/make_check_replays.py writes now (a changed case or mistake needs the file
rewritten), every case must have its inputs and answers stored, the model they come from must be right
when no mistake is switched on, and with them the check of tiled.py must name the right cause of every
classic tiled.py bug of tests/mutants/catalog.py.
"""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from gqa_flash.course.lab.checks import kernel, replays, tiled
from gqa_flash.reference import reference_attention

COURSE = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/, where mutants/ is
from mutants.catalog import MUTANTS, serve  # noqa: E402


def _tool():
    spec = importlib.util.spec_from_file_location("make_check_replays", COURSE / "tools" / "make_check_replays.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_stored_answers_are_what_the_tool_writes():
    """The stored inputs are the cases' (within an fp16 rounding: another CPU's torch.randn draws other
    last bits), and the stored answers are the tool's on those inputs: a case or a mistake changed
    without running the tool fails here."""
    stored, tool = torch.load(replays.PATH, weights_only=True), _tool()
    drawn = tool.all_answers()  # the cases as they are now, freshly drawn
    inputs = {check: {case: entry["inputs"] for case, entry in cases.items()} for check, cases in stored.items()}
    fresh = tool.all_answers(inputs)  # the answers on the stored inputs
    assert stored.keys() == drawn.keys()
    for check in drawn:
        assert stored[check].keys() == drawn[check].keys(), f"{check}: cases changed: run tools/make_check_replays.py"
        for case, entry in drawn[check].items():
            old = stored[check][case]
            for a, b in zip(old["inputs"], entry["inputs"], strict=True):
                torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-3, msg=f"{check} / {case}: inputs changed")
            assert old["answers"].keys() == fresh[check][case]["answers"].keys(), f"{check} / {case}: mistakes changed"
            for name, answer in fresh[check][case]["answers"].items():
                torch.testing.assert_close(old["answers"][name], answer, rtol=1e-5, atol=1e-6, equal_nan=True,
                                           msg=f"{check} / {case} / {name}: run tools/make_check_replays.py")


def test_every_case_has_its_inputs_and_answers_stored():
    for case in tiled.TILED_CASES:
        (q, k, v), answers = replays.stored("tiled", case.name, case.dtype)
        assert q.dtype == case.dtype and q.shape == (case.batch, case.n_q_heads, case.seq_len, case.head_dim)
        assert answers, case.name
    case = kernel.gallery_case()
    (q, k, v), answers = replays.stored("kernel", case.name, case.dtype)
    assert set(answers) == {f"{bug} {what}" for bug in kernel.KERNEL_BUGS if bug for what in ("O", "LSE")}
    assert replays.stored("tiled", "no such case", torch.float32) is None


def test_the_model_with_no_mistake_is_the_reference():
    tool = _tool()
    for case in tiled.TILED_CASES:
        q, k, v = case.qkv()
        out, lse = tool.tiled64(q, k, v, case.causal, case.scale, case.block_m, case.block_n)
        ref, ref_lse = reference_attention(q, k, v, causal=case.causal)
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(lse, ref_lse, rtol=1e-10, atol=1e-10)


# The mistake of check_tiled's lists that each classic tiled.py bug of the catalog is (None: the bug raises,
# and the exception is the diagnosis).
EXPECTED_CAUSE = {
    "tiled_group_size_inverted": None,
    "tiled_no_acc_rescale": "no_rescale_acc",
    "tiled_no_l_rescale": "no_rescale_l",
    "tiled_mask_off_by_one": "mask_diag",
    "tiled_no_causal_mask": "mask_none",
    "tiled_lse_without_max": "lse_log_l",
    "tiled_lse_base_2": "lse_log2_l",
    "tiled_running_max_forgotten": "tile_max",
}
TILED_MUTANTS = [m for m in MUTANTS if m.name in EXPECTED_CAUSE]


def test_every_classic_answer_bug_of_tiled_has_an_expected_cause():
    answer_bugs = {m.name for m in MUTANTS if m.file == "tiled.py"} - {"tiled_causal_visits_every_key_tile"}
    assert answer_bugs == set(EXPECTED_CAUSE), "a tiled.py mutant was added or renamed: say which cause it gets"


@pytest.mark.parametrize("mutant", TILED_MUTANTS, ids=lambda m: m.name)
def test_check_tiled_names_the_cause_of_each_classic_bug(mutant, tmp_path, monkeypatch, capsys):
    serve(mutant.imported(tmp_path), "tiled", monkeypatch)
    verdict = tiled.check_tiled.verdict()
    printed = capsys.readouterr().out
    assert not verdict.ok, printed
    expected = EXPECTED_CAUSE[mutant.name]
    if expected is None:
        assert "raised" in verdict.message, verdict
        return
    text = {m.bug: m.cause for m in tiled.TILED_MISTAKES + tiled.TILED_LSE_MISTAKES}[expected]
    assert verdict.cause == text, f"{mutant.name} ({mutant.bug}): expected the cause {expected!r}, got {verdict}"
