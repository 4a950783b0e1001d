"""Sliding windows and attention sinks on a GPU: the fast kernels through the public API, bf16 and fp16.

FlashAttention's own windowed tests (tests/test_flash_attn.py, ``local=True``: random left windows, right 0
under the causal mask, ragged lengths), ported onto ``gqa_flash.flash_attention`` (its forward the fast
kernel's or the graded windows.py's, its backward the fast one's) with FlashAttention's
acceptance rule: the kernel's error against a float32 reference is at most twice that of PyTorch's own
attention in the input's dtype (plus a small floor), for O and for each gradient. Learned sinks and sink tokens
join them, and dSinks is held to the float64 reference.
"""

import math

import pytest
import torch

import gqa_flash
from gqa_flash.course.testing import random_qkv
from gqa_flash.reference import visible

pytestmark = pytest.mark.gpu


def attention_in(dtype, q, k, v, window, sink_tokens, sinks):
    """Attention written in PyTorch with every product in ``dtype`` (FlashAttention's ``attention_ref`` with
    ``upcast=False``): the error a plain PyTorch model of that dtype makes. Softmax in fp32, as torch does."""
    q, k, v = (t.to(dtype) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    n = q.shape[2]
    scores = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(q.shape[-1]))
    pos = torch.arange(n, device=q.device)
    hidden = ~visible(pos, pos, True, window, sink_tokens)
    scores = scores.float().masked_fill(hidden, float("-inf"))
    if sinks is not None:
        column = sinks.float()[None, :, None, None].expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    else:
        weights = torch.softmax(scores, dim=-1)
    return weights.to(dtype) @ v


CASES = [  # (N, Hq, Hkv, D, dtype, window, sink_tokens, learned sinks): FlashAttention's lengths and head dims
    (113, 4, 1, 64, torch.bfloat16, 17, 0, False),
    (203, 8, 2, 128, torch.bfloat16, 64, 0, True),
    (217, 6, 3, 96, torch.float16, 1, 0, False),
    (799, 8, 2, 80, torch.bfloat16, 256, 4, True),
    (1023, 8, 8, 128, torch.float16, 300, 16, False),
    (2048, 32, 8, 128, torch.bfloat16, 512, 0, True),
    (1000, 8, 2, 64, torch.bfloat16, 5000, 0, True),  # the window longer than the sequence
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "windows.py"])
@pytest.mark.parametrize("case", CASES, ids=[f"n{c[0]}-h{c[1]}:{c[2]}-d{c[3]}-{str(c[4])[6:]}-w{c[5]}-s{c[6]}"
                                             f"-sinks{int(c[7])}" for c in CASES])
def test_windowed_attention_on_gpu(case, fast, seed):
    n, hq, hkv, d, dtype, window, sink_tokens, learned = case
    q, k, v = random_qkv(1, hq, hkv, n, d, dtype=dtype, seed=seed, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    sinks = (torch.randn(hq, device="cuda", generator=gen) * 2).requires_grad_(True) if learned else None
    do = torch.randn(q.shape, device="cuda", dtype=dtype, generator=gen)
    options = dict(window=window, sink_tokens=sink_tokens, sinks=sinks)

    def grads(fn, *inputs):
        leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
        out = fn(*leaves)
        return (out, *torch.autograd.grad(out, leaves, do.to(out.dtype)))

    wanted = (q, k, v) + ((sinks,) if learned else ())
    ref = grads(lambda q_, k_, v_, *s: attention_in(torch.float32, q_, k_, v_, window, sink_tokens,
                                                       s[0] if s else None), *wanted)
    plain = grads(lambda q_, k_, v_, *s: attention_in(dtype, q_, k_, v_, window, sink_tokens, s[0] if s else None),
                  *wanted)
    ours = grads(lambda q_, k_, v_, *s: gqa_flash.flash_attention(q_, k_, v_, window=window, fast=fast,
                                                                  sink_tokens=sink_tokens, sinks=s[0] if s else None),
                 *wanted)
    for name, got, pt, r in zip(("O", "dQ", "dK", "dV", "dSinks"), ours, plain, ref):
        err = (got.float() - r.float()).abs().max().item()
        pt_err = (pt.float() - r.float()).abs().max().item()
        print(f"\n{case} {name}: error {err:.2e}, PyTorch in {str(dtype)[6:]} {pt_err:.2e}")
        assert err <= 2 * pt_err + 1e-4, f"{name}: {err:.2e} > 2 x PyTorch's {pt_err:.2e} ({options})"
    if learned:  # and dSinks against float64
        _, _, _, _, dsinks = gqa_flash.reference_gradients(q, k, v, do, **options)
        rel = ((ours[4].double().cpu() - dsinks).norm() / dsinks.norm()).item()
        print(f"{case} dSinks relative to float64: {rel:.2e}")
        assert rel <= 3e-2
