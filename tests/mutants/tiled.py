"""Classic bugs of tiled.py: see catalog.py for what a mutant is.

``loses``: 12.5 (half of tiled's 25 points) for a bug that shows in O in ordinary use; 5, the LSE's share
(test_tiled_lse_natural_log), for a bug in the LSE alone; 4 for a walk that is right but does twice the work.
"""

from mutants.catalog import _m

MUTANTS = [
    _m("tiled_group_size_inverted", "tiled.py", "group size from the wrong division (Hkv // Hq)",
       ("device=q.device) // (n_q_heads // n_kv_heads)", "device=q.device) // (n_kv_heads // n_q_heads)"),
       loses=12.5),
    _m("tiled_no_acc_rescale", "tiled.py", "acc is not rescaled when the max grows",
       ("acc = alpha[..., None] * acc + p @ v_tile", "acc = acc + p @ v_tile"), loses=12.5),
    _m("tiled_no_l_rescale", "tiled.py", "l_i is not rescaled when the max grows",
       ("l_i = alpha * l_i + p.sum(dim=-1)", "l_i = l_i + p.sum(dim=-1)"), loses=12.5),
    _m("tiled_mask_off_by_one", "tiled.py", "causal mask hides the diagonal (>= for >)",
       ("future = k_idx[None, :] > q_idx[:, None]", "future = k_idx[None, :] >= q_idx[:, None]"), loses=12.5),
    _m("tiled_no_causal_mask", "tiled.py", "mask never applied: only the skipped tiles are causal",
       ('return s.masked_fill(future, float("-inf"))', "return s"), loses=12.5),
    # The LSE alone, with O right: they lose the LSE's test, 5 of the 25 points, and keep O's 20.
    _m("tiled_lse_without_max", "tiled.py", "LSE = log(l_i), forgetting the max",
       ("lse_rows = m_i + torch.log(l_i)", "lse_rows = torch.log(l_i)"), loses=5),
    _m("tiled_lse_base_2", "tiled.py", "LSE with log2 where the natural log belongs (the kernel's base carried over)",
       ("lse_rows = m_i + torch.log(l_i)", "lse_rows = m_i + torch.log2(l_i)"), loses=5),
    _m("tiled_running_max_forgotten", "tiled.py",
       "m_new is the tile's max, not max(m_i, tile max): NaN on a fully masked row, overflow when scores fall",
       ("m_new = torch.maximum(m_i, s.amax(dim=-1))", "m_new = s.amax(dim=-1)"), loses=12.5),
    _m("tiled_causal_visits_every_key_tile", "tiled.py",
       "the causal key loop walks every key tile and masks the future instead of skipping it: right answer, "
       "twice the work",
       ("kv_end = q_end if causal else seq_len", "kv_end = seq_len"), loses=4),
]
