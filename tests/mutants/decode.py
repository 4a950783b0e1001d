"""Classic bugs of decode.py: see catalog.py for what a mutant is.

``loses`` is the rule's floor, not the last measurement (fresh seeds move a case or two; of decode's 15
points, tests/graded/test_decode.py says how they are shared): a bug that shows in ordinary decoding
fails most of the six ordinary batches (12 points) and loses at least 8. The head-dim mask of Q shows
only past a head dim that is not a power of two, so it costs less;
the unmasked table read reaches past a row's end in ordinary batches too (the solution looks the pages up
one block ahead), which the address check of gqa_flash.course.testing.kernel_only fails.
"""

from mutants.catalog import _m

MUTANTS = [
    # Part 1: the packed group tile
    _m("decode_kv_head_modulo", "decode.py",
       "the group's query heads taken as kv_head + h * N_KV_HEADS (q_head % N_KV_HEADS), not kv_head * group + h",
       ("q_head = kv_head_idx * group_size + rows // N_Q", "q_head = kv_head_idx + (rows // N_Q) * N_KV_HEADS"),
       loses=8),
    _m("decode_q_head_dim_unmasked", "decode.py",
       "Q loaded without the head-dim mask: columns past HEAD_DIM (up to the power of two) read what lies beyond",
       ("tile_ok = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)",
        "tile_ok = row_ok[:, None] & (offs_d[None, :] >= 0)"),
       loses=4),
    # Part 2: the page table
    _m("decode_table_column_stride_ignored", "decode.py",
       "the block table's column stride ignored: a row's entries taken as adjacent (a transposed or strided table)",
       ("(offs_n // PAGE_SIZE) * stride_tp", "(offs_n // PAGE_SIZE)"),
       loses=8),
    _m("decode_table_read_unmasked", "decode.py",
       "the block table read for every position of a key block, even past the sequence's last page",
       ("page = tl.load(page_ptrs, mask=key_ok, other=0)", "page = tl.load(page_ptrs)"),
       loses=8),
    _m("decode_page_and_slot_swapped", "decode.py", "page from position % page_size, slot from position // page_size",
       ("(offs_n // PAGE_SIZE) * stride_tp", "(offs_n % PAGE_SIZE) * stride_tp"),
       ("slot = offs_n % PAGE_SIZE", "slot = offs_n // PAGE_SIZE"),
       loses=8),
    # Part 3: one split's partial
    _m("decode_new_tokens_see_the_future", "decode.py",
       "every new token sees the whole cache: the causal rule forgotten among the new tokens",
       ("pos = seq_len - N_Q + token", "pos = seq_len - 1 + token * 0"),
       loses=8),
    _m("decode_causal_off_by_one", "decode.py", "a new token does not see its own position (< for <=)",
       ("offs_n[None, :] <= pos[:, None]", "offs_n[None, :] < pos[:, None]"),
       loses=8),
    _m("decode_past_seqlen_loaded", "decode.py",
       "the loads are masked at the chunk's end, not at seq_len: the NaN past it is multiplied by 0",
       ("key_ok = offs_n < end", "key_ok = offs_n < start + CHUNK"),
       loses=8),
    _m("decode_empty_row_nan", "decode.py",
       "exp2 against m_new even when a row sees no key of the block: -inf - -inf = NaN (new tokens before a "
       "chunk's first key)",
       ("m_finite = tl.where(m_new == float(\"-inf\"), 0.0, m_new)", "m_finite = m_new"),
       loses=8),
    _m("decode_empty_split_nan", "decode.py",
       "every block of the chunk walked, even past seq_len, and exp2 against m_new: the rows of an empty split "
       "(a short sequence's later splits) come out NaN",
       ("for start_n in range(start, end, BLOCK_N):", "for start_n in range(start, start + CHUNK, BLOCK_N):"),
       ("m_finite = tl.where(m_new == float(\"-inf\"), 0.0, m_new)", "m_finite = m_new"),
       loses=8),
    # Part 4: the merge
    _m("decode_merge_no_rescale", "decode.py", "the splits' sums added without rescaling by exp2(m_s - m)",
       ("l = tl.sum(l_s * alpha, 1)", "l = tl.sum(l_s, 1)"),
       ("o = tl.sum(acc_s * alpha[:, :, None], 1) / l[:, None]", "o = tl.sum(acc_s, 1) / l[:, None]"),
       loses=8),
    _m("decode_lse_base_2", "decode.py", "the merged LSE left in base 2 (no * ln 2)",
       ("lse = (m + tl.log2(l)) * 0.6931471805599453", "lse = m + tl.log2(l)"),
       loses=8),
]
