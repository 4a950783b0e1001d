"""The whole shape matrix, for every implementation behind the public API (and the fast kernels).

Not graded: this checks the course's own solutions (run with
GQA_FLASH_IMPL=solutions) across GQA ratios, ragged lengths, head dims, dtypes,
layouts and the causal flag. The combinations are a fixed sample of the full
product, so that every value of every axis appears several times; the inputs
are fresh on every run. Each test runs once for the graded implementations and
once for the fast kernels (``gqa_flash/fast/``), which need no solutions:
``-k fast`` selects the fast kernels' cases alone.
"""

import itertools
import random

import pytest
import torch

import gqa_flash
from gqa_flash.fast import backward as fast_backward, forward as fast_forward
from gqa_flash.reference import reference_attention
from gqa_flash.course.testing import LAYOUTS, assert_lse_matches, assert_matches, gradient_error, peaked_qkv, random_qkv

HEADS = [(4, 4), (4, 2), (4, 1), (6, 2)]
SEQ_LENS = [1, 2, 15, 16, 17, 33, 64, 100]
HEAD_DIMS = [16, 24, 32, 64, 80, 96, 128, 256]
DTYPES = [torch.float16, torch.float32]
CAUSAL = [True, False]
BATCHES = [1, 2]

_ALL = list(itertools.product(HEADS, SEQ_LENS, HEAD_DIMS, DTYPES, LAYOUTS, CAUSAL, BATCHES))
CASES = random.Random(2026).sample(_ALL, 48)
ONE_TILE = dict(BLOCK_M=32, BLOCK_N=16, SUBTILES=1)  # the fast kernel's other path (the default has two sub-tiles)


def _id(case):
    (hq, hkv), n, d, dtype, layout, causal, b = case
    return f"b{b}-h{hq}:{hkv}-n{n}-d{d}-{str(dtype)[6:]}-{layout}-{'causal' if causal else 'full'}"


KERNELS = ["graded", "fast"]  # the implementations behind the switch, then the fast kernels


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_every_implementation_matches_reference(case, kernels, seed):
    (hq, hkv), n, d, dtype, layout, causal, b = case
    q, k, v = random_qkv(b, hq, hkv, n, d, dtype=dtype, layout=layout, seed=seed)
    ref, ref_lse = reference_attention(q, k, v, causal=causal)
    ctx = f"seed {seed}"
    if kernels == "fast":
        o, lse = gqa_flash.fast_attention_forward(q, k, v, causal=causal, return_lse=True)  # two query sub-tiles
        assert_matches("fast forward O", o, ref, dtype, ctx)
        assert_lse_matches(lse, ref_lse, ctx)
        o, lse = fast_forward.fast_attention_forward(q, k, v, causal=causal, return_lse=True, config=ONE_TILE)
        assert_matches("fast forward O, one query tile", o, ref, dtype, ctx)
        assert_lse_matches(lse, ref_lse, ctx)
        return
    o, lse = gqa_flash.flash_attention_forward(q, k, v, causal=causal, return_lse=True)
    assert_matches("forward O", o, ref, dtype, ctx)
    assert_lse_matches(lse, ref_lse, ctx)
    o, lse = gqa_flash.tiled_attention(q.cpu(), k.cpu(), v.cpu(), causal=causal, block_m=16, block_n=32,
                                       return_lse=True)
    assert_matches("tiled O", o, ref, dtype, ctx)
    assert_lse_matches(lse, ref_lse, ctx)
    assert_matches("naive O", gqa_flash.naive_attention(q.cpu(), k.cpu(), v.cpu(), causal=causal), ref, dtype, ctx)


# The backward kernels: a smaller sample (they are slower in the interpreter).
GRAD_CASES = random.Random(2027).sample(
    [c for c in _ALL if c[1] <= 64 and c[2] <= 96 and c[6] == 1], 12
)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("case", GRAD_CASES, ids=[_id(c) for c in GRAD_CASES])
def test_gradients_match_float64_autograd(case, kernels, seed):
    (hq, hkv), n, d, dtype, layout, causal, b = case
    q, k, v = (t.requires_grad_(True) for t in random_qkv(b, hq, hkv, n, d, dtype=dtype, layout=layout, seed=seed))
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed)).to(q.device, dtype)
    refs = gqa_flash.reference_gradients(q, k, v, do, causal=causal)
    gqa_flash.flash_attention(q, k, v, causal=causal, fast=kernels == "fast").backward(do)
    for name, t, ref in zip("QKV", (q, k, v), refs):
        err, bound = gradient_error(t.grad, ref, dtype)
        assert err <= bound, f"{kernels} d{name}: error {err:.3e} > {bound:.3e}; seed {seed}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["float16", "float32"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gradients_with_very_negative_scores(causal, dtype, kernels, seed):
    # Every score near -100, so every LSE is too: a padding key (all zeros, score 0) left unmasked
    # would weigh exp(0 - LSE) = e^100, which overflows float32. Both backward kernels must stay
    # finite and right, ragged last key block included (N = 40 is not a multiple of any tile).
    # block 0: all keys score about -100.
    q, k, v = (t.to(dtype).requires_grad_(True) for t in peaked_qkv(seed=seed, block=0, seq_len=40))
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed)).to(q.device, dtype)
    refs = gqa_flash.reference_gradients(q, k, v, do, causal=causal)
    gqa_flash.flash_attention(q, k, v, causal=causal, fast=kernels == "fast").backward(do)
    for name, t, ref in zip("QKV", (q, k, v), refs):
        err, bound = gradient_error(t.grad, ref, dtype)
        if name == "Q" and dtype == torch.float16:
            # dQ = sum_j dS_ij K_j with every key along one large shared direction, whose parts cancel
            # (sum_j dS_ij = 0): fp16's rounding of dS leaves up to ~2x the usual error (both kernels,
            # 1 seed in 20). An unmasked padding key gives inf or NaN, which no bound lets through.
            bound *= 4
        assert err <= bound, f"{kernels} d{name}: error {err:.3e} > {bound:.3e}; seed {seed}"


# The fast backward's two ways to compute dQ (gqa_flash/fast/backward.py), each forced whatever the head
# dim would pick: one pass with atomic adds, or a dK/dV pass then a dQ pass. GQA 6:2, N = 45 (ragged for
# every tile), head_dim 40 (padded to 64). O and LSE come from the float64 reference, so that only the
# backward is under test.
DQ_MODE_CASES = [  # (dQ mode, dtype, causal, q's layout, dQ kernel's tile (None: the interpreter's 32 x 16))
    ("atomic", torch.float16, True, "contiguous", None),
    ("atomic", torch.float32, False, "contiguous", None),
    ("separate", torch.float16, True, "contiguous", None),
    ("separate", torch.float16, False, "bnhd", None),
    ("separate", torch.float32, True, "contiguous", None),
    ("separate", torch.float32, False, "strided", None),
    # More keys a step than query rows: the diagonal starts inside a key block, whose front is masked too.
    ("separate", torch.float16, True, "contiguous", dict(BLOCK_M=16, BLOCK_N=32)),
]


def _dq_mode_id(case):
    mode, dtype, causal, layout, tile = case
    return f"{mode}-{str(dtype)[6:]}-{'causal' if causal else 'full'}-{layout}" + ("-dq16x32" if tile else "")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", DQ_MODE_CASES, ids=[_dq_mode_id(c) for c in DQ_MODE_CASES])
def test_fast_backward_dq_modes_match_float64_autograd(case, seed):
    dq_mode, dtype, causal, layout, dq_config = case
    q, k, v = random_qkv(1, 6, 2, 45, 40, dtype=dtype, layout=layout, seed=seed)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed)).to(q.device, dtype)
    ref, ref_lse = reference_attention(q, k, v, causal=causal)
    grads = fast_backward.fast_attention_backward(q, k, v, ref.to(dtype), ref_lse.float(), do, causal=causal,
                                                  dq_mode=dq_mode, dq_config=dq_config)
    for name, g, r in zip("QKV", grads, gqa_flash.reference_gradients(q, k, v, do, causal=causal)):
        assert g.dtype == dtype and g.shape == r.shape, f"{dq_mode} d{name}: {g.dtype} {list(g.shape)}"
        err, bound = gradient_error(g, r, dtype)
        assert err <= bound, f"{dq_mode} d{name}: error {err:.3e} > {bound:.3e}; seed {seed}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_fast_backward_separate_dq_with_very_negative_scores(causal, seed):
    # As test_gradients_with_very_negative_scores, for the dQ kernel: every LSE near -100, so a padding key
    # left unmasked in its ragged last key block (N = 40) would weigh e^100 and overflow.
    q, k, v = peaked_qkv(seed=seed, block=0, seq_len=40)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed)).to(q.device, q.dtype)
    ref, ref_lse = reference_attention(q, k, v, causal=causal)
    grads = fast_backward.fast_attention_backward(q, k, v, ref.float(), ref_lse.float(), do, causal=causal,
                                                  dq_mode="separate")
    for name, g, r in zip("QKV", grads, gqa_flash.reference_gradients(q, k, v, do, causal=causal)):
        err, bound = gradient_error(g, r, q.dtype)
        assert err <= bound, f"separate d{name}: error {err:.3e} > {bound:.3e}; seed {seed}"


def test_bf16_works_in_the_pure_pytorch_modules():
    # The interpreter refuses bf16 in kernels (test_validation.py); naive and tiled attention are PyTorch only.
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 16, 8, generator=gen).bfloat16()
    k, v = (torch.randn(1, 2, 16, 8, generator=gen).bfloat16() for _ in range(2))
    assert gqa_flash.naive_attention(q, k, v).dtype == torch.bfloat16
    assert gqa_flash.tiled_attention(q, k, v).dtype == torch.bfloat16
