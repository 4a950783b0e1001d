"""Bonus: backward.py, the backward kernels with GQA (20 bonus points, beyond the 100).

Gradients of sum(O * dO) from gqa_flash.flash_attention_backward (the backward
kernels) against float64 autograd of the reference. O and the LSE they start from
come from the float64 reference, not from your forward.py: a wrong forward costs
the forward's points, not these too.
"""

import pytest
import torch

import gqa_flash
from gqa_flash.reference import reference_attention, reference_gradients
from gqa_flash.testing import GRAD_TOLERANCE, gradient_error, random_qkv



def check(seed, causal=True, dtype=torch.float32, **shape):
    q, k, v = random_qkv(dtype=dtype, seed=seed, **shape)
    gen = torch.Generator().manual_seed(seed + 1)
    do = torch.randn(q.shape, generator=gen).to(device=q.device, dtype=dtype)
    o, lse = reference_attention(q, k, v, causal=causal)
    grads = gqa_flash.flash_attention_backward(q, k, v, o.to(device=q.device, dtype=dtype),
                                               lse.to(device=q.device, dtype=torch.float32), do, causal=causal)
    ref = reference_gradients(q, k, v, do, causal=causal)
    ctx = f"seed {seed}, shape {list(q.shape)} with {k.shape[1]} KV heads, causal={causal}, {str(dtype)[6:]}"
    assert isinstance(grads, (tuple, list)) and len(grads) == 3, f"expected (dQ, dK, dV), got {type(grads)}; {ctx}"
    for name, g, t, r in zip(("dQ", "dK", "dV"), grads, (q, k, v), ref):
        assert isinstance(g, torch.Tensor) and g.shape == t.shape, f"{name} missing or of the wrong shape; {ctx}"
        err, bound = gradient_error(g, r, dtype)
        scale = max(r.norm().item(), 1e-12)
        assert err <= bound, (
            f"{name}: relative error {err / scale:.2e} (tolerance {GRAD_TOLERANCE[dtype]:.0e}); "
            f"first wrong at {_first_wrong(g, r, dtype)}; {ctx}"
        )


def _first_wrong(got, ref, dtype):
    err = (got.double().cpu() - ref).abs()
    bad = ~(err <= GRAD_TOLERANCE[dtype] * (ref.abs() + ref.abs().mean()))
    if not bad.any():
        return "no single entry (the error is spread out)"
    b, h, n, d = (int(i) for i in bad.nonzero()[0])
    got, expected = float(got[b, h, n, d]), float(ref[b, h, n, d])
    return f"batch {b}, head {h}, row {n}, col {d} (got {got:.4g}, expected {expected:.4g})"


@pytest.mark.points(4)
@pytest.mark.timeout(180)
def test_backward_causal_mha(seed):
    check(seed, causal=True, batch=1, n_q_heads=2, n_kv_heads=2, seq_len=48, head_dim=16)


@pytest.mark.points(5)
@pytest.mark.timeout(180)
@pytest.mark.parametrize("n_q_heads,n_kv_heads", [(4, 2), (4, 1)])
def test_backward_gqa_sums_over_the_group(seed, n_q_heads, n_kv_heads):
    # dK and dV of a KV head are the sum over every query head that reads it.
    check(seed, causal=True, batch=1, n_q_heads=n_q_heads, n_kv_heads=n_kv_heads, seq_len=32, head_dim=16)


@pytest.mark.points(3)
@pytest.mark.timeout(180)
def test_backward_non_causal(seed):
    check(seed, causal=False, batch=2, n_q_heads=2, n_kv_heads=1, seq_len=40, head_dim=16)


@pytest.mark.points(4)
@pytest.mark.timeout(180)
@pytest.mark.parametrize("seq_len,causal", [(1, True), (21, True), (45, False)])
def test_backward_ragged_seq_len(seed, seq_len, causal):
    check(seed, causal=causal, batch=1, n_q_heads=2, n_kv_heads=1, seq_len=seq_len, head_dim=16)


@pytest.mark.points(4)
@pytest.mark.timeout(180)
@pytest.mark.parametrize("head_dim,layout", [(32, "contiguous"), (80, "contiguous")])
def test_backward_fp16_and_head_dims(seed, head_dim, layout):
    check(seed, causal=True, dtype=torch.float16, batch=1, n_q_heads=4, n_kv_heads=2, seq_len=33,
          head_dim=head_dim)
