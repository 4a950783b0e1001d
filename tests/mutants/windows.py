"""Classic bugs of windows.py: see catalog.py for what a mutant is.

``loses``: 7.5, half of windows.py's 15, for a bug that shows in ordinary use. Every ordinary-use case of
tests/graded/test_windows.py has a window, most of them sink tokens too, so a bug in the window's edge, the sink
tokens or the causal rule fails most of those 11 points; learned sinks come in 7.5 of them (one head's sink -inf
in each case), so a sink in the wrong units, left out of l_i, or a running max with no finite floor (NaN on the
head whose sink is -inf) fails those 7.5; and a window alone (no sink tokens, as Mistral's and Gemma's) gives NaN
rows to a running max that starts at -inf whatever the sinks. A key loop from key 0 is right, only slow: it loses
the skip's count, 2.5 (README, "How the points are shared": a kernel that is right but does more work is a
corner case).
"""

from mutants.catalog import _m

MUTANTS = [
    # Part 1: the mask
    _m("windows_window_off_by_one", "windows.py", "the window is one key too wide: k >= i - W instead of k > i - W",
       ("in_window = offs_n[None, :] > offs_m[:, None] - WINDOW",
        "in_window = offs_n[None, :] >= offs_m[:, None] - WINDOW"), loses=7.5),
    _m("windows_window_from_tile_first_row", "windows.py",
       "the window measured from the query tile's first row, not from each row",
       ("in_window = offs_n[None, :] > offs_m[:, None] - WINDOW",
        "in_window = offs_n[None, :] > tl.min(offs_m, 0) - WINDOW"), loses=7.5),
    _m("windows_sink_tokens_ignored", "windows.py", "the sink tokens are masked like any key older than the window",
       ('return tl.where(in_window | sink_token, s, float("-inf"))', 'return tl.where(in_window, s, float("-inf"))'),
       loses=7.5),
    _m("windows_causal_rule_dropped", "windows.py",
       "forward's mask called without the causal rule: a row sees the future keys of its window and the sink tokens",
       ("s = forward.mask_scores(s, offs_m, offs_n, SEQ_LEN, True)",
        "s = forward.mask_scores(s, offs_m, offs_n, SEQ_LEN, False)"), loses=7.5),
    # Part 2: the key loop
    _m("windows_sink_blocks_twice", "windows.py",
       "the sink blocks are not capped at the window's first block: where the window reaches them they count twice",
       ("sink_end = tl.minimum(tl.cdiv(SINK_TOKENS, BLOCK_N) * BLOCK_N, window_start)",
        "sink_end = tl.cdiv(SINK_TOKENS, BLOCK_N) * BLOCK_N"),
       loses=7.5),
    _m("windows_no_skip", "windows.py",
       "every key block from key 0 is visited (the mask hides the rest): right, but the work of causal attention",
       ("window_start = tl.maximum(q_start - WINDOW + 1, 0) // BLOCK_N * BLOCK_N", "window_start = q_start * 0"),
       loses=2.5),
    # Part 3: the state before the first key
    _m("windows_sink_not_in_l", "windows.py", "the sink raises the running max but is not folded into l_i (l_i = 0)",
       ("l_i = tl.exp2(sink - m_i)", "l_i = tl.zeros([BLOCK_M], dtype=tl.float32)"), loses=7.5),
    _m("windows_sink_natural_log", "windows.py", "the sink's logit taken as log2 units: no log2(e)",
       ("sink = tl.zeros([BLOCK_M], dtype=tl.float32) + logit * 1.4426950408889634",
        "sink = tl.zeros([BLOCK_M], dtype=tl.float32) + logit"), loses=7.5),
    _m("windows_sink_scaled_by_sm_scale", "windows.py", "the sink's logit multiplied by sm_scale, as a score is",
       ("    acc, l_i, m_i = sink_state(SINKS, q_head_idx, HAS_SINKS, BLOCK_M, HEAD_DIM_PAD)\n",
        "    acc, l_i, m_i = sink_state(SINKS, q_head_idx, HAS_SINKS, BLOCK_M, HEAD_DIM_PAD)\n"
        "    m_i = m_i * sm_scale  # l_i = 1 at m_i: a column of weight e^(sm_scale * sink)\n"), loses=7.5),
    _m("windows_max_starts_at_minus_inf", "windows.py",
       "m_i starts at the sink with no finite floor: -inf without one, and a fully masked block gives NaN",
       ("m_i = tl.maximum(sink, -1e30)", "m_i = sink"), loses=7.5),
    _m("windows_max_starts_at_minus_inf_without_sinks", "windows.py",
       "forward.py's start where there is no sink (m_i = -inf, l_i = 0), the sink folded in where there is one: a "
       "window's first block, hidden from a tile's later rows, gives them NaN",
       ("m_i = tl.maximum(sink, -1e30)\n    l_i = tl.exp2(sink - m_i)",
        "m_i = sink\n    l_i = tl.where(sink > float(\"-inf\"), 1.0, 0.0)"), loses=7.5),
]
