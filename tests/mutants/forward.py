"""Classic bugs of forward.py: see catalog.py for what a mutant is.

``loses``: 20 (half of forward's 40 points) for a bug that shows in O in ordinary use, which fails most of
the ordinary-use cases of tests/graded/test_forward.py (measured: 30.5 to 37.5 points); 8, the LSE's share
(test_forward_lse_natural_log), for a bug in the LSE alone, with O right (the base, the max, the rows it is
stored in: measured 8, and 8.5 where the int64 probe of the LSE's stores sees it too); a corner-case bug
loses what its one test is worth (a missing ``other`` 1, int32 offsets 0.5 each, walking past the
diagonal 2). The three that a whole-kernel run on a CPU cannot show (no ``other``, int32 offsets in
Parts 2 and 6) and V read with K's strides must also be named by notebook 04's checks:
tests/checks/test_forward_checks.py.
"""

from mutants.catalog import _m

MUTANTS = [
    # Part 1: the program's coordinates
    _m("forward_batch_and_head_swapped", "forward.py", "batch and head decoded the wrong way round from axis 1",
       ("batch_idx = batch_head_idx // N_Q_HEADS", "batch_idx = batch_head_idx % N_Q_HEADS"),
       ("q_head_idx = batch_head_idx % N_Q_HEADS", "q_head_idx = batch_head_idx // N_Q_HEADS"), loses=20),
    _m("forward_kv_head_modulo", "forward.py", "kv head q_head % N_KV_HEADS instead of q_head // group_size",
       ("kv_head_idx = q_head_idx // group_size", "kv_head_idx = q_head_idx % N_KV_HEADS"), loses=20),
    _m("forward_group_size_inverted", "forward.py", "group size from the wrong division (Hkv // Hq)",
       ("group_size = N_Q_HEADS // N_KV_HEADS", "group_size = N_KV_HEADS // N_Q_HEADS"), loses=20),
    # Part 2: pointer tiles and masked loads
    _m("forward_strides_swapped", "forward.py", "row and column strides swapped in the pointer tile",
       ("ptrs = base + rows[:, None] * stride_row + cols[None, :] * stride_col",
        "ptrs = base + rows[:, None] * stride_col + cols[None, :] * stride_row"), loses=20),
    _m("forward_head_dim_padding_unmasked", "forward.py",
       "the padded head-dim columns are loaded unmasked: they read the next row's numbers",
       ("in_bounds = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)", "in_bounds = rows[:, None] < n_rows"),
       loses=20),
    _m("forward_load_unmasked", "forward.py",
       "the tile is loaded with no mask: the ragged rows and the padded head-dim columns read past the tensor",
       ("return tl.load(ptrs, mask=in_bounds, other=0.0)", "return tl.load(ptrs)"), loses=20),
    _m("forward_load_without_other", "forward.py",
       "the masked load has no other=0.0: masked lanes read 0 in the interpreter, anything on a GPU",
       ("return tl.load(ptrs, mask=in_bounds, other=0.0)", "return tl.load(ptrs, mask=in_bounds)"), loses=1),
    _m("forward_load_offsets_int32", "forward.py",
       "the batch and head offsets of a tile stay in int32: they wrap once a tensor holds 2^31 elements",
       ("base = X + batch_idx.to(tl.int64) * stride_b + head_idx.to(tl.int64) * stride_h",
        "base = X + batch_idx * stride_b + head_idx * stride_h"), loses=0.5),
    # Part 3: the key loop and its bounds
    _m("forward_v_with_k_strides", "forward.py", "V loaded with K's strides (both phases)",
       *[("stride_vb, stride_vh, stride_vn, stride_vd,\n                      SEQ_LEN, HEAD_DIM)\n"
          "        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * qk_scale\n" + after,
          "stride_kb, stride_kh, stride_kn, stride_kd,\n                      SEQ_LEN, HEAD_DIM)\n"
          "        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * qk_scale\n" + after)
         for after in ("        acc, l_i, m_i", "        s = mask_scores")], loses=20),
    _m("forward_causal_walks_past_diagonal", "forward.py",
       "the causal masked phase runs on to SEQ_LEN: right answer, the future loaded and masked, twice the work",
       ("masked_end = tl.minimum((q_tile_idx + 1) * BLOCK_M, SEQ_LEN)", "masked_end = SEQ_LEN"), loses=2),
    _m("forward_unmasked_phase_takes_the_diagonal", "forward.py",
       "the unmasked phase runs through the diagonal block: the future leaks in",
       ("unmasked_end = q_tile_idx * BLOCK_M", "unmasked_end = tl.minimum((q_tile_idx + 1) * BLOCK_M, SEQ_LEN)"),
       loses=20),
    _m("forward_non_causal_drops_ragged_block", "forward.py",
       "without the causal mask the ragged last key block is never visited",
       ("        masked_end = SEQ_LEN\n", "        masked_end = unmasked_end\n"), loses=20),
    # Part 4: the online-softmax update
    _m("forward_no_acc_rescale", "forward.py", "acc is not rescaled when the max grows",
       ("acc = acc * alpha[:, None] + tl.dot(", "acc = acc + tl.dot("), loses=20),
    _m("forward_rescale_new_max_only", "forward.py", "alpha = exp2(-m_new): rescales with the new max only",
       ("alpha = tl.exp2(m_i - m_new)", "alpha = tl.exp2(-m_new)"), loses=20),
    _m("forward_exp_with_log2_scale", "forward.py", "exp instead of exp2, with log2(e) still folded into the scale",
       ("alpha = tl.exp2(m_i - m_new)", "alpha = tl.exp(m_i - m_new)"),
       ("p = tl.exp2(s - m_new[:, None])", "p = tl.exp(s - m_new[:, None])"), loses=20),
    # Part 5: the mask
    _m("forward_mask_off_by_one", "forward.py", "causal mask hides the diagonal (< for <=)",
       ("offs_n[None, :] <= offs_m[:, None]", "offs_n[None, :] < offs_m[:, None]"), loses=20),
    _m("forward_no_causal_mask", "forward.py", "the diagonal block is not masked: the causal mask only skips blocks",
       ("visible = visible & (offs_n[None, :] <= offs_m[:, None])", "visible = visible"), loses=20),
    _m("forward_ragged_tail_unmasked", "forward.py", "padding keys past SEQ_LEN are not masked",
       ("visible = offs_n[None, :] < SEQ_LEN", "visible = offs_n[None, :] >= 0"), loses=20),
    # Part 6: the epilogue
    _m("forward_lse_base_2", "forward.py", "LSE left in base 2 (no * ln 2)",
       ("lse = (m_i + tl.log2(l_i)) * 0.6931471805599453", "lse = m_i + tl.log2(l_i)"), loses=8),
    _m("forward_lse_without_max", "forward.py", "LSE = ln 2 * log2(l_i), forgetting the max",
       ("lse = (m_i + tl.log2(l_i)) * 0.6931471805599453", "lse = tl.log2(l_i) * 0.6931471805599453"), loses=8),
    _m("forward_divides_twice", "forward.py", "divides by l_i twice",
       ("    o = acc / l_i[:, None]\n", "    o = acc / l_i[:, None] / l_i[:, None]\n"), loses=20),
    _m("forward_store_offsets_int32", "forward.py",
       "the batch and head offsets of O and the LSE stay in int32: they wrap once a tensor holds 2^31 elements",
       ("o_base = O + batch_idx.to(tl.int64) * stride_ob + q_head_idx.to(tl.int64) * stride_oh",
        "o_base = O + batch_idx * stride_ob + q_head_idx * stride_oh"),
       ("lse_base = LSE + batch_idx.to(tl.int64) * stride_lb + q_head_idx.to(tl.int64) * stride_lh",
        "lse_base = LSE + batch_idx * stride_lb + q_head_idx * stride_lh"), loses=0.5),
    _m("forward_lse_batch_stride", "forward.py",
       "the LSE's batch offset taken with the head stride: every batch past the first writes the wrong rows",
       ("lse_base = LSE + batch_idx.to(tl.int64) * stride_lb", "lse_base = LSE + batch_idx.to(tl.int64) * stride_lh"),
       loses=8),
]
