"""Classic bugs of online_softmax.py: see catalog.py for what a mutant is."""

from mutants.catalog import _m

MUTANTS = [
    _m("softmax_max_never_updated", "online_softmax.py", "online softmax that never updates the running max",
       ("m = torch.maximum(m_a, m_b)", "m = m_a"), loses=7.5),
    _m("softmax_no_rescale", "online_softmax.py", "merges the sums without rescaling them to the new max",
       ("l = l_a * torch.exp(m_a - m_finite) + l_b * torch.exp(m_b - m_finite)", "l = l_a + l_b"), loses=7.5),
    _m("softmax_masked_block_nan", "online_softmax.py", "all -inf block: exp(-inf - -inf) = NaN",
       ("l = torch.exp(x_block - m_finite[..., None]).sum(dim=-1)",
        "l = torch.exp(x_block - m[..., None]).sum(dim=-1)"), loses=7.5),
    _m("softmax_drops_ragged_tail", "online_softmax.py", "the loop skips the last, shorter block",
       ("for start in range(0, n, block_size):", "for start in range(0, n - block_size + 1, block_size):"), loses=7.5),
    _m("softmax_returns_float32", "online_softmax.py",
       "returns the float32 probabilities for an fp16 x: right values, not the dtype the docstring promises",
       ("    return probs.to(x.dtype)", "    return probs"), loses=2),
]
