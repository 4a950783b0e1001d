"""Classic bugs of decode.py: see catalog.py for what a mutant is."""

from mutants.catalog import _m

MUTANTS = [
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
