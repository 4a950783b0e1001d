"""Classic student bugs, each a small edit of a solution file: the graded tests must catch every one.

A mutant is a solution with one bug put in (a few edits of its text, each
``old`` found exactly once). ``tests/test_mutants.py`` grades each mutant on
the tests of the module it touches and asserts that it loses points there.

Every mutant costs one run of its module's tests (about 4 s for naive.py, 9 s
for forward.py here), so the catalog keeps one mutant per kind of bug and
module, not every variant.

A mutant that keeps all its points is a hole in the graded tests. It stays
here with ``survives`` saying why, and its test is an expected failure, until
a graded test catches it; then delete ``survives`` (the strict xfail turns
into a failure to remind you).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # the solution file it edits (solutions/<file>)
    edits: tuple[tuple[str, str], ...]  # (old, new), each old exactly once in the file
    bug: str  # the student's mistake, in words
    survives: str = ""  # why the graded tests miss it: a known hole

    @property
    def module(self) -> str:
        return self.file.removesuffix(".py")

    def apply(self, text: str) -> str:
        for old, new in self.edits:
            count = text.count(old)
            if count != 1:
                raise ValueError(f"mutant {self.name}: {old!r} occurs {count} times in {self.file}, not once")
            text = text.replace(old, new)
        return text


def _m(name, file, bug, *edits, survives=""):
    return Mutant(name=name, file=file, edits=tuple(edits), bug=bug, survives=survives)


MUTANTS = [
    # --- naive.py ---------------------------------------------------------------
    _m("naive_kv_head_modulo", "naive.py", "kv head h % n_kv_heads instead of h // group_size",
       ("torch.arange(n_q_heads, device=q.device) // group_size",
        "torch.arange(n_q_heads, device=q.device) % n_kv_heads")),
    _m("naive_mask_off_by_one", "naive.py", "causal mask hides the diagonal too (triu(0))",
       (".triu(diagonal=1)", ".triu(diagonal=0)")),
    _m("naive_no_sm_scale", "naive.py", "forgets to multiply the scores by sm_scale",
       ("(q32 @ k32.transpose(-1, -2)) * sm_scale", "(q32 @ k32.transpose(-1, -2))")),
    # --- online_softmax.py --------------------------------------------------------
    _m("softmax_max_never_updated", "online_softmax.py", "online softmax that never updates the running max",
       ("m = torch.maximum(m_a, m_b)", "m = m_a")),
    _m("softmax_no_rescale", "online_softmax.py", "merges the sums without rescaling them to the new max",
       ("l = l_a * torch.exp(m_a - m_finite) + l_b * torch.exp(m_b - m_finite)", "l = l_a + l_b")),
    _m("softmax_masked_block_nan", "online_softmax.py", "all -inf block: exp(-inf - -inf) = NaN",
       ("l = torch.exp(x_block - m_finite[..., None]).sum(dim=-1)",
        "l = torch.exp(x_block - m[..., None]).sum(dim=-1)")),
    _m("softmax_drops_ragged_tail", "online_softmax.py", "the loop skips the last, shorter block",
       ("for start in range(0, n, block_size):", "for start in range(0, n - block_size + 1, block_size):")),
    # --- tiled.py -----------------------------------------------------------------
    _m("tiled_group_size_inverted", "tiled.py", "group size from the wrong division (Hkv // Hq)",
       ("device=q.device) // (n_q_heads // n_kv_heads)", "device=q.device) // (n_kv_heads // n_q_heads)")),
    _m("tiled_no_acc_rescale", "tiled.py", "acc is not rescaled when the max grows",
       ("acc = alpha[..., None] * acc + p @ v_tile", "acc = acc + p @ v_tile")),
    _m("tiled_no_l_rescale", "tiled.py", "l_i is not rescaled when the max grows",
       ("l_i = alpha * l_i + p.sum(dim=-1)", "l_i = l_i + p.sum(dim=-1)")),
    _m("tiled_mask_off_by_one", "tiled.py", "causal mask hides the diagonal (>= for >)",
       ("future = k_idx[None, :] > q_idx[:, None]", "future = k_idx[None, :] >= q_idx[:, None]")),
    _m("tiled_no_causal_mask", "tiled.py", "mask never applied: only the skipped tiles are causal",
       ('return s.masked_fill(future, float("-inf"))', "return s")),
    _m("tiled_lse_without_max", "tiled.py", "LSE = log(l_i), forgetting the max",
       ("lse_rows = m_i + torch.log(l_i)", "lse_rows = torch.log(l_i)")),
    _m("tiled_running_max_forgotten", "tiled.py",
       "m_new is the tile's max, not max(m_i, tile max): NaN on a fully masked row, overflow when scores fall",
       ("m_new = torch.maximum(m_i, s.amax(dim=-1))", "m_new = s.amax(dim=-1)")),
    _m("tiled_causal_visits_every_key_tile", "tiled.py",
       "the causal key loop walks every key tile and masks the future instead of skipping it: right answer, "
       "twice the work",
       ("kv_end = q_end if causal else seq_len", "kv_end = seq_len")),
    # --- forward.py ---------------------------------------------------------------
    # Part 1: the program's coordinates
    _m("forward_batch_and_head_swapped", "forward.py", "batch and head decoded the wrong way round from axis 1",
       ("batch_idx = batch_head_idx // N_Q_HEADS", "batch_idx = batch_head_idx % N_Q_HEADS"),
       ("q_head_idx = batch_head_idx % N_Q_HEADS", "q_head_idx = batch_head_idx // N_Q_HEADS")),
    _m("forward_kv_head_modulo", "forward.py", "kv head q_head % N_KV_HEADS instead of q_head // group_size",
       ("kv_head_idx = q_head_idx // group_size", "kv_head_idx = q_head_idx % N_KV_HEADS")),
    _m("forward_group_size_inverted", "forward.py", "group size from the wrong division (Hkv // Hq)",
       ("group_size = N_Q_HEADS // N_KV_HEADS", "group_size = N_KV_HEADS // N_Q_HEADS")),
    # Part 2: pointer tiles and masked loads
    _m("forward_strides_swapped", "forward.py", "row and column strides swapped in the pointer tile",
       ("ptrs = base + rows[:, None] * stride_row + cols[None, :] * stride_col",
        "ptrs = base + rows[:, None] * stride_col + cols[None, :] * stride_row")),
    _m("forward_head_dim_padding_unmasked", "forward.py",
       "the padded head-dim columns are loaded unmasked: they read the next row's numbers",
       ("in_bounds = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)", "in_bounds = rows[:, None] < n_rows")),
    # Part 3: the key loop and its bounds
    _m("forward_causal_walks_past_diagonal", "forward.py",
       "the causal masked phase runs on to SEQ_LEN: right answer, the future loaded and masked, twice the work",
       ("masked_end = tl.minimum((q_tile_idx + 1) * BLOCK_M, SEQ_LEN)", "masked_end = SEQ_LEN")),
    _m("forward_unmasked_phase_takes_the_diagonal", "forward.py",
       "the unmasked phase runs through the diagonal block: the future leaks in",
       ("unmasked_end = q_tile_idx * BLOCK_M", "unmasked_end = tl.minimum((q_tile_idx + 1) * BLOCK_M, SEQ_LEN)")),
    _m("forward_non_causal_drops_ragged_block", "forward.py",
       "without the causal mask the ragged last key block is never visited",
       ("        masked_end = SEQ_LEN\n", "        masked_end = unmasked_end\n")),
    # Part 4: the online-softmax update
    _m("forward_no_acc_rescale", "forward.py", "acc is not rescaled when the max grows",
       ("acc = acc * alpha[:, None] + tl.dot(", "acc = acc + tl.dot(")),
    _m("forward_rescale_new_max_only", "forward.py", "alpha = exp2(-m_new): rescales with the new max only",
       ("alpha = tl.exp2(m_i - m_new)", "alpha = tl.exp2(-m_new)")),
    _m("forward_exp_with_log2_scale", "forward.py", "exp instead of exp2, with log2(e) still folded into the scale",
       ("alpha = tl.exp2(m_i - m_new)", "alpha = tl.exp(m_i - m_new)"),
       ("p = tl.exp2(s - m_new[:, None])", "p = tl.exp(s - m_new[:, None])")),
    # Part 5: the mask
    _m("forward_mask_off_by_one", "forward.py", "causal mask hides the diagonal (< for <=)",
       ("offs_n[None, :] <= offs_m[:, None]", "offs_n[None, :] < offs_m[:, None]")),
    _m("forward_no_causal_mask", "forward.py", "the diagonal block is not masked: the causal mask only skips blocks",
       ("visible = visible & (offs_n[None, :] <= offs_m[:, None])", "visible = visible")),
    _m("forward_ragged_tail_unmasked", "forward.py", "padding keys past SEQ_LEN are not masked",
       ("visible = offs_n[None, :] < SEQ_LEN", "visible = offs_n[None, :] >= 0")),
    # Part 6: the epilogue
    _m("forward_lse_base_2", "forward.py", "LSE left in base 2 (no * ln 2)",
       ("lse = (m_i + tl.log2(l_i)) * 0.6931471805599453", "lse = m_i + tl.log2(l_i)")),
    _m("forward_divides_twice", "forward.py", "divides by l_i twice",
       ("    o = acc / l_i[:, None]\n", "    o = acc / l_i[:, None] / l_i[:, None]\n")),
    # --- backward.py (bonus) ---------------------------------------------------------
    _m("backward_no_group_sum", "backward.py",
       "dK/dV from the group's first query head only, not summed over the group",
       ("q_head_idx = kv_head_idx * group_size + h", "q_head_idx = kv_head_idx * group_size")),
    _m("backward_lse_natural_base", "backward.py", "the saved LSE (natural log) used as if it were in log2 units",
       ("lse2 = tl.load(LSE + bh * SEQ_LEN + offs_m, mask=m_ok, other=0.0) * 1.4426950408889634\n"
        "            delta", "lse2 = tl.load(LSE + bh * SEQ_LEN + offs_m, mask=m_ok, other=0.0)\n            delta")),
    _m("backward_dq_no_causal_mask", "backward.py", "no causal mask in dQ: gradient leaks from the future",
       ("            visible = visible & (offs_n[None, :] <= offs_m[:, None])\n        p = tl.where",
        "            visible = visible\n        p = tl.where")),
    _m("backward_delta_zero", "backward.py", "D left out of dS (dS = P * dP)",
       ("dsT = pT * (dpT - delta[None, :])\n            dk +=", "dsT = pT * dpT\n            dk +=")),
    # --- decode.py (bonus) -----------------------------------------------------------
    # Part 1: the packed group tile
    _m("decode_kv_head_modulo", "decode.py",
       "the group's query heads taken as kv_head + h * N_KV_HEADS (q_head % N_KV_HEADS), not kv_head * group + h",
       ("q_head = kv_head_idx * group_size + rows // N_Q", "q_head = kv_head_idx + (rows // N_Q) * N_KV_HEADS")),
    # Part 2: the page table
    _m("decode_page_and_slot_swapped", "decode.py", "page from position % page_size, slot from position // page_size",
       ("(offs_n // PAGE_SIZE) * stride_tp", "(offs_n % PAGE_SIZE) * stride_tp"),
       ("slot = offs_n % PAGE_SIZE", "slot = offs_n // PAGE_SIZE")),
    # Part 3: one split's partial
    _m("decode_new_tokens_see_the_future", "decode.py",
       "every new token sees the whole cache: the causal rule forgotten among the new tokens",
       ("pos = seq_len - N_Q + token", "pos = seq_len - 1 + token * 0")),
    _m("decode_causal_off_by_one", "decode.py", "a new token does not see its own position (< for <=)",
       ("offs_n[None, :] <= pos[:, None]", "offs_n[None, :] < pos[:, None]")),
    _m("decode_past_seqlen_loaded", "decode.py",
       "the loads are masked at the chunk's end, not at seq_len: the NaN past it is multiplied by 0",
       ("key_ok = offs_n < end", "key_ok = offs_n < start + CHUNK")),
    _m("decode_empty_row_nan", "decode.py",
       "exp2 against m_new even when a row sees no key of the block: -inf - -inf = NaN",
       ("m_finite = tl.where(m_new == float(\"-inf\"), 0.0, m_new)", "m_finite = m_new")),
    # Part 4: the merge
    _m("decode_merge_no_rescale", "decode.py", "the splits' sums added without rescaling by exp2(m_s - m)",
       ("l = tl.sum(l_s * alpha, 1)", "l = tl.sum(l_s, 1)"),
       ("o = tl.sum(acc_s * alpha[:, :, None], 1) / l[:, None]", "o = tl.sum(acc_s, 1) / l[:, None]")),
    _m("decode_lse_base_2", "decode.py", "the merged LSE left in base 2 (no * ln 2)",
       ("lse = (m + tl.log2(l)) * 0.6931471805599453", "lse = m + tl.log2(l)")),
]
