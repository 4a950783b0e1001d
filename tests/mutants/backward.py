"""Classic bugs of backward.py: see catalog.py for what a mutant is.

``loses`` is the fewest of backward's 20 points each must lose (the rule's floor, below what the grader measured)
(tests/graded/test_backward.py: 15 points of ordinary use in eight cases of 1.875, five of them causal; 5 of
corner cases: one token 1, scores near -100 2, head_dim 256 1, the causal skip 1). A bug that shows in ordinary
use loses at least 10 (docs/instructors.md, "Grading"); a bug of the causal mask alone shows in the five causal
cases and the two causal corner cases, 11.375 points at most, so its floor is 10 too. backward_no_key_mask and
backward_delta_fp16 are corner-case bugs: a key past the end left in P gives NaN only where every score is very
negative, and D summed in fp16 shows only where D is large next to dP - D (head_dim 256, V and dO offset). The
walks over every block (backward_dkdv_walks_every_block, backward_dq_walks_every_block) give right gradients at
about twice the work: they lose the causal skip's 1 point and nothing else.
"""

from mutants.catalog import _m

_DKDV_START = "start_m = (n_block_idx * BLOCK_N // BLOCK_M) * BLOCK_M"
_DQ_END = "end_n = tl.minimum((q_block_idx + 1) * BLOCK_M, SEQ_LEN)"

MUTANTS = [
    _m("backward_no_group_sum", "backward.py",
       "dK/dV from the group's first query head only, not summed over the group",
       ("return kv_head_idx * group_size + h", "return kv_head_idx * group_size"), loses=10),
    _m("backward_gqa_heads_interleaved", "backward.py",
       "the query heads of a KV head's group dealt out in turn (kv_head + h * n_kv_heads), not consecutive",
       ("return kv_head_idx * group_size + h", "return kv_head_idx + h * N_KV_HEADS"), loses=10),
    _m("backward_lse_natural_base", "backward.py", "the saved LSE (natural log) used as if it were in log2 units",
       ("lse2 = tl.load(LSE + bh * SEQ_LEN + offs_m, mask=m_ok, other=0.0) * 1.4426950408889634\n"
        "            delta", "lse2 = tl.load(LSE + bh * SEQ_LEN + offs_m, mask=m_ok, other=0.0)\n"
        "            delta"), loses=10),
    _m("backward_dq_no_log2e", "backward.py",
       "dQ's scores scaled by sm_scale alone, without log2(e), though exp2 takes them (the LSE converted)",
       ("qk_scale = sm_scale * 1.4426950408889634  # log2(e): the scores in log2 units, for exp2\n    if CAUSAL:\n"
        "        end_n", "qk_scale = sm_scale\n    if CAUSAL:\n        end_n"), loses=10),
    _m("backward_dq_no_causal_mask", "backward.py", "no causal mask in dQ: gradient leaks from the future",
       ("            visible = visible & (offs_n[None, :] <= offs_m[:, None])\n        p = tl.where",
        "            visible = visible\n        p = tl.where"), loses=10),
    _m("backward_dkdv_no_causal_mask", "backward.py", "no causal mask in dK and dV: gradient leaks from the future",
       ("                visible = visible & (offs_n[:, None] <= offs_m[None, :])\n",
        "                visible = visible\n"), loses=10),
    _m("backward_dkdv_starts_late", "backward.py",
       "under the causal mask the walk over query blocks starts one block late, past the key block's diagonal",
       (_DKDV_START, _DKDV_START + " + BLOCK_M"), loses=10),
    _m("backward_dkdv_walks_every_block", "backward.py",
       "under the causal mask the walk over query blocks starts at query block 0, not at the key block's diagonal: "
       "right (the mask zeroes the queries before it) but it loads and computes blocks that add nothing",
       (_DKDV_START, "start_m = 0"), loses=1),
    _m("backward_dq_walks_every_block", "backward.py",
       "under the causal mask the walk over key blocks runs to SEQ_LEN, past the query block's diagonal: right "
       "(the mask zeroes the future keys) but it loads and computes blocks that add nothing",
       (_DQ_END, "end_n = SEQ_LEN"), loses=1),
    _m("backward_dq_stops_early", "backward.py",
       "under the causal mask the walk over key blocks stops one block early, short of the query block's last row",
       (_DQ_END, _DQ_END + " - BLOCK_N"), loses=10),
    _m("backward_dq_no_scale", "backward.py", "dQ without sm_scale (dQ = dS K)",
       ("    dq *= sm_scale\n", "\n"), loses=10),
    _m("backward_dk_no_scale", "backward.py", "dK without sm_scale (dK = dS^T Q)",
       ("    dk *= sm_scale  # S = Q K^T * sm_scale, so dK picks up the scale once\n", "\n"), loses=10),
    _m("backward_dk_qk_scale", "backward.py", "dK scaled by qk_scale (sm_scale * log2(e)) where sm_scale belongs",
       ("dk *= sm_scale  # S", "dk *= qk_scale  # S"), loses=10),
    _m("backward_dv_assigned", "backward.py",
       "dv = ... in place of dv += ...: each query block overwrites dV instead of adding to it",
       ("dv += tl.dot(pT.to(do.dtype)", "dv = tl.dot(pT.to(do.dtype)"), loses=10),
    _m("backward_no_key_mask", "backward.py",
       "keys past SEQ_LEN not masked out of the recomputed P (only the query rows are): NaN in dQ when "
       "every score is very negative",
       ("visible = (offs_n[:, None] < SEQ_LEN) & m_ok[None, :]", "visible = m_ok[None, :]"),
       ("visible = (offs_n[None, :] < SEQ_LEN) & m_ok[:, None]", "visible = m_ok[:, None]"), loses=2),
    _m("backward_delta_zero", "backward.py", "D left out of dS (dS = P * dP)",
       ("dsT = pT * (dpT - delta[None, :])\n            dk +=", "dsT = pT * dpT\n            dk +="), loses=10),
    _m("backward_delta_fp16", "backward.py", "D = rowsum(dO * O) summed in fp16 (no cast to fp32 first)",
       ("delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)", "delta = tl.sum(o * do, axis=1)"), loses=1),
]
