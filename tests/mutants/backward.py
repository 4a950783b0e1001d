"""Classic bugs of backward.py: see catalog.py for what a mutant is."""

from mutants.catalog import _m

MUTANTS = [
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
]
