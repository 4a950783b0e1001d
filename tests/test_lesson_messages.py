"""Notebooks 01-03: each bug a novice's trial planted gets a verdict that names the mistake (issue 36).

Each test plants one bug in a copy of solutions/<module>.py (a text replace), serves the copy to the
checks (tests/mutants/catalog.py's ``serve``), and asserts the part blamed and the cause named.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

from gqa_flash import impl
from gqa_flash.lab.checks import naive, softmax, tiled

sys.path.insert(0, str(Path(__file__).parent))
from mutants.catalog import serve  # noqa: E402


def _planted(module, old, new, tmp_path, monkeypatch):
    text = (impl.SOLUTIONS_DIR / f"{module}.py").read_text()
    assert text.count(old) == 1, f"{old!r} is not once in solutions/{module}.py"
    path = tmp_path / f"planted_{module}.py"
    path.write_text(text.replace(old, new))
    spec = importlib.util.spec_from_file_location(f"planted_{module}", path)
    planted = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(planted)
    serve(planted, module, monkeypatch)


# (id, module, old, new, the check, the part blamed (what starts so), words of the cause)
BUGS = [
    ("tiled_key_tile_not_clipped", "tiled", "k_end = min(k_start + block_n, kv_end)", "k_end = k_start + block_n",
     tiled.check_tiled, "tiled.py Part 2 ", "the last key tile is not cut at the sequence's end"),
    ("tiled_query_tile_not_clipped", "tiled", "q_end = min(q_start + block_m, seq_len)", "q_end = q_start + block_m",
     tiled.check_tiled, "tiled.py Part 2 ", "the last query tile is not cut at the sequence's end"),
    ("tiled_no_sm_scale", "tiled", ".transpose(-1, -2)) * sm_scale", ".transpose(-1, -2))",
     tiled.check_tiled, "tiled.py Part 2 ", "not scaled by sm_scale"),
    ("tiled_python_max", "tiled", "m_new = torch.maximum(m_i, s.amax(dim=-1))", "m_new = max(m_i, s.amax(dim=-1))",
     tiled.check_tiled, "tiled.py Part 4 ", "Python's built-in max on tensors"),
    ("tiled_mask_transposed", "tiled", "future = k_idx[None, :] > q_idx[:, None]",
     "future = k_idx[:, None] > q_idx[None, :]", tiled.check_tiled, "tiled.py Part 3 ", "the mask is [keys, queries]"),
    ("tiled_key_loop_one_short", "tiled", "kv_end = q_end if causal else seq_len",
     "kv_end = q_end - 1 if causal else seq_len", tiled.check_tiled, "tiled.py Part 2 ", "stops one key short"),
    ("tiled_early_return_on_first_key", "tiled", "if k_idx[-1] <= q_idx[0]:", "if k_idx[0] <= q_idx[0]:",
     tiled.check_tiled, "tiled.py Part 3 ", "its FIRST key is at or before the first query"),
    ("softmax_merge_no_rescale", "online_softmax",
     "l = l_a * torch.exp(m_a - m_finite) + l_b * torch.exp(m_b - m_finite)", "l = l_a + l_b",
     softmax.check_merge_states, "online_softmax.py Part 2 ", "added without rescaling: l equals l_a + l_b"),
    ("softmax_loop_stops_short", "online_softmax", "range(0, n, block_size)", "range(0, n - 1, block_size)",
     softmax.check_online_softmax, "online_softmax.py Part 3 ", "the last column (36) of the row is never read"),
    ("softmax_block_slice_one_short", "online_softmax", "x32[..., start:start + block_size]",
     "x32[..., start:start + block_size - 1]", softmax.check_online_softmax, "online_softmax.py Part 3 ",
     "each block misses its last column"),
    ("softmax_python_max", "online_softmax", "m = torch.maximum(m_a, m_b)", "m = max(m_a, m_b)",
     softmax.check_merge_states, "online_softmax.py Part 2 ", "Python's built-in max on tensors"),
    ("naive_tril_mask", "naive", ".triu(diagonal=1)", ".tril(diagonal=1)",
     naive.check_naive, "naive.py Part 2 ", "the mask is the lower triangle (tril)"),
]


@pytest.mark.parametrize("bug", BUGS, ids=[b[0] for b in BUGS])
def test_the_verdict_names_the_planted_mistake(bug, tmp_path, monkeypatch):
    _, module, old, new, check, part, words = bug
    _planted(module, old, new, tmp_path, monkeypatch)
    verdict = check.verdict()
    assert not verdict.ok, verdict
    assert verdict.what.startswith(part), verdict
    assert verdict.cause and words in verdict.cause, verdict
    assert verdict.hint, verdict


def test_merge_without_rescale_is_named_from_part_3_too(tmp_path, monkeypatch):
    """Part 3's check blames Part 2 when Part 2 fails its own check, with Part 2's cause."""
    _planted("online_softmax", "l = l_a * torch.exp(m_a - m_finite) + l_b * torch.exp(m_b - m_finite)",
             "l = l_a + l_b", tmp_path, monkeypatch)
    verdict = softmax.check_online_softmax.verdict()
    assert verdict.what.startswith("online_softmax.py Part 2 "), verdict
    assert "added without rescaling" in verdict.cause and "exp(m_x - m)" in verdict.hint, verdict
