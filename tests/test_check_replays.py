"""The stored answers of the usual mistakes (gqa_flash/lab/checks/replays.pt) that let the notebooks' checks
name a failure's likely cause without shipping a working copy of the exercise.

They must be what tools/make_check_replays.py writes now (a changed case or mistake needs the file
rewritten), they must be usable on this machine (the inputs they were made from are the ones the checks
make here), the model they come from must be right when no mistake is switched on, and with them the
check of tiled.py must name the part of every classic tiled.py bug of tests/mutants/catalog.py.
"""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from gqa_flash import impl
from gqa_flash.lab.checks import kernel, replays, tiled
from gqa_flash.reference import reference_attention

COURSE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from mutants.catalog import MUTANTS  # noqa: E402


def _tool():
    spec = importlib.util.spec_from_file_location("make_check_replays", COURSE / "tools" / "make_check_replays.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_stored_answers_are_what_the_tool_writes():
    stored, fresh = torch.load(replays.PATH, weights_only=True), _tool().all_answers()
    assert stored.keys() == fresh.keys()
    for check in fresh:
        assert stored[check].keys() == fresh[check].keys(), f"{check}: cases changed: run tools/make_check_replays.py"
        for case, entry in fresh[check].items():
            old = stored[check][case]
            assert torch.equal(old["fingerprint"], entry["fingerprint"]), f"{check} / {case}: inputs changed"
            assert old["answers"].keys() == entry["answers"].keys(), f"{check} / {case}: mistakes changed"
            for name, answer in entry["answers"].items():
                torch.testing.assert_close(old["answers"][name], answer, rtol=0, atol=0, equal_nan=True,
                                           msg=f"{check} / {case} / {name}: run tools/make_check_replays.py")


def test_every_case_finds_its_answers_on_this_machine():
    for case in tiled._TILED_CASES:
        assert replays.replays("tiled", case.name, *case.qkv()), case.name
    case = kernel.gallery_case()
    assert replays.replays("kernel", case.name, *kernel._indicator_qkv(case)[:3])
    q, k, v = tiled._TILED_CASES[0].qkv()
    assert replays.replays("tiled", tiled._TILED_CASES[0].name, q, k, v + 1e-3) == {}, "other inputs: no answers"


def test_the_model_with_no_mistake_is_the_reference():
    tool = _tool()
    for case in tiled._TILED_CASES:
        q, k, v = case.qkv()
        out, lse = tool.tiled64(q, k, v, case.causal, case.scale, case.block_m, case.block_n)
        ref, ref_lse = reference_attention(q, k, v, causal=case.causal)
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(lse, ref_lse, rtol=1e-10, atol=1e-10)


TILED_MUTANTS = [m for m in MUTANTS if m.file == "tiled.py" and m.name != "tiled_causal_visits_every_key_tile"]


@pytest.mark.parametrize("mutant", TILED_MUTANTS, ids=lambda m: m.name)
def test_check_tiled_names_a_cause_for_each_classic_bug(mutant, tmp_path, monkeypatch, capsys):
    path = tmp_path / "tiled.py"
    path.write_text(mutant.apply((impl.SOLUTIONS_DIR / "tiled.py").read_text()))
    spec = importlib.util.spec_from_file_location("mutant_tiled", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    real_load = impl.load
    monkeypatch.setattr(impl, "load", lambda name, choice=None: module if name == "tiled" else real_load(name, choice))
    verdict = tiled.check_tiled.verdict()
    printed = capsys.readouterr().out
    assert not verdict.ok, printed
    if "raised" in verdict.message:  # the exception is the diagnosis (a group size of 0, say)
        return
    assert verdict.cause, f"{mutant.name} ({mutant.bug}): no likely cause named:\n{printed}"
