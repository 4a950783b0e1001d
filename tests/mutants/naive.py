"""Classic bugs of naive.py: see catalog.py for what a mutant is."""

from mutants.catalog import _m

MUTANTS = [
    _m("naive_kv_head_modulo", "naive.py", "kv head h % n_kv_heads instead of h // group_size",
       ("torch.arange(n_q_heads, device=q.device) // group_size",
        "torch.arange(n_q_heads, device=q.device) % n_kv_heads"), loses=10),
    _m("naive_mask_off_by_one", "naive.py", "causal mask hides the diagonal too (triu(0))",
       (".triu(diagonal=1)", ".triu(diagonal=0)"), loses=10),
    _m("naive_no_sm_scale", "naive.py", "forgets to multiply the scores by sm_scale",
       ("(q32 @ k32.transpose(-1, -2)) * sm_scale", "(q32 @ k32.transpose(-1, -2))"), loses=10),
]
