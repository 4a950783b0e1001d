"""Notebooks 01-03: each bug a novice's trial planted gets a verdict that names the mistake (issues 36, 47).

Each test plants one bug in a copy of solutions/<module>.py (a text replace), serves the copy to the
checks (tests/mutants/catalog.py's ``serve``), and asserts the part blamed and the cause named; a bug that
none of the usual mistakes explains gets a plain "none known" and what to compare next.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

from gqa_flash.course import impl
from gqa_flash.course.lab.checks import naive, softmax, tiled

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/, where mutants/ is
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


_NAIVE_INDEXING = ("kv_head_of = torch.arange(n_q_heads, device=q.device) // group_size\n"
                   "    k32 = k32[:, kv_head_of]\n    v32 = v32[:, kv_head_of]")
_SOFTMAX_FOLD = "        m, l = merge_states(m, l, m_block, l_block)\n"

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
    # issue 47: the mask that hides the diagonal was told "the diagonal stays visible"
    ("naive_mask_hides_diagonal", "naive", ".triu(diagonal=1)", ".triu(diagonal=0)",
     naive.check_naive, "naive.py Part 2 ", "the diagonal (key j == query i) is hidden too"),
    # issue 47: the head mapping is read off the output, and an operator is blamed only where Part 1 holds it
    ("naive_kv_head_modulo", "naive", "torch.arange(n_q_heads, device=q.device) // group_size",
     "torch.arange(n_q_heads, device=q.device) % n_kv_heads", naive.check_naive, "naive.py Part 1 ",
     "% instead of //: query heads 0-7 read KV heads 0, 1, 0, 1, 0, 1, 0, 1"),
    ("naive_repeat_for_repeat_interleave", "naive", _NAIVE_INDEXING,
     "k32 = k32.repeat(1, group_size, 1, 1)\n    v32 = v32.repeat(1, group_size, 1, 1)", naive.check_naive,
     "naive.py Part 1 ", ".repeat copies the whole stack of KV heads, one stack after another"),
    ("naive_group_size_one_too_many", "naive", "group_size = n_q_heads // n_kv_heads",
     "group_size = n_q_heads // n_kv_heads + 1", naive.check_naive, "naive.py Part 1 ",
     "the group size is 5, not n_q_heads // n_kv_heads = 4"),
    ("naive_repeated_by_one_too_many", "naive", _NAIVE_INDEXING,
     "k32 = k32.repeat_interleave(group_size + 1, dim=1)\n    v32 = v32.repeat_interleave(group_size + 1, dim=1)",
     naive.check_naive, "naive.py Part 1 ", "the output has 2 heads for 1 query head: K and V leave Part 1 with 2"),
    ("naive_repeated_by_n_kv_heads", "naive", _NAIVE_INDEXING,
     "k32 = k32.repeat_interleave(n_kv_heads, dim=1)\n    v32 = v32.repeat_interleave(n_kv_heads, dim=1)",
     naive.check_naive, "naive.py Part 1 ", "K and V leave Part 1 with 4 heads, not one per query head (8)"),
    ("naive_group_size_inverted", "naive", "group_size = n_q_heads // n_kv_heads",
     "group_size = n_kv_heads // n_q_heads", naive.check_naive, "naive.py Part 1 ", "the group size is 0"),
    # issue 47: merges without the rescale, and pass 2 with the wrong max
    ("softmax_merge_rescales_only_a", "online_softmax",
     "l = l_a * torch.exp(m_a - m_finite) + l_b * torch.exp(m_b - m_finite)",
     "l = l_a * torch.exp(m_a - m_finite) + l_b", softmax.check_merge_states, "online_softmax.py Part 2 ",
     "only l_a is rescaled"),
    ("softmax_loop_merges_without_rescale", "online_softmax", _SOFTMAX_FOLD,
     "        m, l = torch.maximum(m, m_block), l + l_block\n", softmax.check_online_softmax,
     "online_softmax.py Part 3 ", "the blocks' states are merged without the rescale"),
    ("softmax_pass_2_with_last_block_max", "online_softmax", "probs = torch.exp(x32 - m[..., None])",
     "probs = torch.exp(x32 - m_block[..., None])", softmax.check_online_softmax, "online_softmax.py Part 3 ",
     "pass 2 normalises with the last block's max, not the row's"),
    # issue 47: a per-row vector broadcast along head_dim, and K/V heads copied with .repeat
    ("tiled_acc_times_alpha_broadcast", "tiled", "acc = alpha[..., None] * acc", "acc = alpha * acc",
     tiled.check_tiled, "tiled.py Part 4 ", "alpha (one number per row, [B, Hq, rows]) meets acc"),
    ("tiled_divides_acc_by_l_broadcast", "tiled", "o_rows = acc / l_i[..., None]", "o_rows = acc / l_i",
     tiled.check_tiled, "tiled.py Part 5 ", "l_i (one number per row, [B, Hq, rows]) meets acc"),
    ("tiled_repeat_for_repeat_interleave", "tiled", "k32, v32 = k32[:, kv_head_of], v32[:, kv_head_of]",
     "g = n_q_heads // n_kv_heads\n    k32, v32 = k32.repeat(1, g, 1, 1), v32.repeat(1, g, 1, 1)", tiled.check_tiled,
     "tiled.py Part 1 ", ".repeat copies the whole stack of KV heads"),
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


@pytest.mark.parametrize("bug", [b for b in BUGS if "repeat_for_repeat_interleave" in b[0]], ids=lambda b: b[0])
def test_a_repeat_is_not_blamed_on_an_operator_the_part_does_not_hold(bug, tmp_path, monkeypatch):
    _, module, old, new, check, _, _ = bug
    _planted(module, old, new, tmp_path, monkeypatch)
    verdict = check.verdict()
    assert "%" not in verdict.cause and "%" not in verdict.hint, verdict


# A bug that is none of the usual mistakes: each check says so plainly, and what to compare next.
UNKNOWN = [
    ("naive", "probs = torch.softmax(scores, dim=-1)", "probs = torch.softmax(scores * 1.1, dim=-1)",
     naive.check_naive, "your scores (after the mask) and your probabilities"),
    ("online_softmax", "l = l_a * torch.exp(m_a - m_finite) + l_b * torch.exp(m_b - m_finite)",
     "l = l_a * torch.exp(m_a - m_finite) + 1.1 * l_b * torch.exp(m_b - m_finite)", softmax.check_merge_states,
     "each sum brought to the common max by hand"),
    ("online_softmax", "probs = torch.exp(x32 - m[..., None]) / l[..., None]",
     "probs = torch.exp(x32 - m[..., None]) / (l[..., None] + 0.1)", softmax.check_online_softmax,
     "the (m, l) your first pass ends with"),
    ("tiled", "o_rows = acc / l_i[..., None]", "o_rows = acc / (l_i[..., None] + 0.5)", tiled.check_tiled,
     "your running state after each key tile"),
]


@pytest.mark.parametrize("bug", UNKNOWN, ids=[f"{b[0]}-{b[3].__name__}" for b in UNKNOWN])
def test_a_mistake_no_replay_explains_says_so_and_what_to_compare(bug, tmp_path, monkeypatch):
    module, old, new, check, words = bug
    _planted(module, old, new, tmp_path, monkeypatch)
    verdict = check.verdict()
    assert verdict.unexplained and words in verdict.compare, verdict
    assert "likely cause: none known" in str(verdict) and f"compare next: {verdict.compare}" in str(verdict)
