"""The forward kernel on a GPU: bf16, long sequences, every head dim, against float64 and SDPA.

Skipped without a CUDA device (conftest.py). Run on the device with
GQA_FLASH_IMPL=solutions. Each case prints its max error, so a run's log
records what it gave (pytest -s).
"""

import pytest
import torch
import triton
from triton.runtime.errors import OutOfResources
import torch.nn.functional as F

import gqa_flash
from gqa_flash.fast import forward as fast_forward
from gqa_flash.reference import reference_attention
from gqa_flash.course.testing import assert_lse_matches, assert_matches, random_qkv

pytestmark = pytest.mark.gpu

CASES = [
    # (batch, Hq, Hkv, N, D, dtype, causal)
    (2, 32, 8, 1024, 128, torch.bfloat16, True),
    (1, 32, 8, 4096, 128, torch.bfloat16, True),
    (1, 8, 2, 4093, 64, torch.bfloat16, True),
    (2, 16, 16, 1000, 64, torch.bfloat16, False),
    (1, 8, 1, 2048, 256, torch.bfloat16, True),
    (1, 8, 2, 1537, 96, torch.bfloat16, True),
    (1, 8, 2, 1537, 80, torch.float16, False),
    (2, 32, 8, 1024, 128, torch.float16, True),
    (1, 4, 2, 777, 64, torch.float32, True),
    (1, 4, 1, 512, 256, torch.float32, False),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", CASES, ids=[
    f"b{c[0]}-h{c[1]}:{c[2]}-n{c[3]}-d{c[4]}-{str(c[5])[6:]}-{'causal' if c[6] else 'full'}" for c in CASES])
@pytest.mark.parametrize("kernel", ["graded", "fast"])
def test_forward_matches_float64_on_gpu(case, kernel, seed):
    b, hq, hkv, n, d, dtype, causal = case
    q, k, v = random_qkv(b, hq, hkv, n, d, dtype=dtype, seed=seed, device="cuda")
    fn = gqa_flash.flash_attention_forward if kernel == "graded" else gqa_flash.fast_attention_forward
    o, lse = fn(q, k, v, causal=causal, return_lse=True)
    torch.cuda.synchronize()
    # The float64 reference one batch at a time keeps its N x N scores small.
    for i in range(b):
        ref, ref_lse = reference_attention(q[i:i + 1], k[i:i + 1], v[i:i + 1], causal=causal)
        err = (o[i:i + 1].double().cpu() - ref).abs().max().item()
        print(f"\n{kernel} {case}: batch {i} max |O - ref| = {err:.3e}")
        assert_matches("O", o[i:i + 1], ref, dtype, f"seed {seed}")
        assert_lse_matches(lse[i:i + 1], ref_lse, f"seed {seed}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("layout", ["bnhd", "strided"])
@pytest.mark.parametrize("kernel", ["graded", "fast"])
def test_forward_strides_on_gpu(layout, kernel, seed):
    q, k, v = random_qkv(2, 8, 2, 1000, 128, dtype=torch.bfloat16, layout=layout, seed=seed, device="cuda")
    fn = gqa_flash.flash_attention_forward if kernel == "graded" else gqa_flash.fast_attention_forward
    o = fn(q, k, v)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    rel = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
    print(f"\n{kernel} {layout}: relative error vs SDPA {rel:.3e}")
    assert rel < 1e-2


UNREADABLE_CASES = [  # (layout, dtype, D): inputs the TMA cannot read, which the fast kernel copies first
    ("strided", torch.bfloat16, 128),  # last-dim stride 2
    ("contiguous", torch.float16, 20),  # 40-byte rows, not a multiple of 16 bytes
    ("strided", torch.float32, 64),
    ("bnhd", torch.float32, 256),  # readable as it is: fp32 at the largest head dim, FP32_CONFIG
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", UNREADABLE_CASES, ids=[f"{c[0]}-{str(c[1])[6:]}-d{c[2]}" for c in UNREADABLE_CASES])
def test_fast_forward_layouts_and_fp32_on_gpu(case, seed):
    layout, dtype, d = case
    q, k, v = random_qkv(1, 8, 2, 1000, d, dtype=dtype, layout=layout, seed=seed, device="cuda")
    o, lse = gqa_flash.fast_attention_forward(q, k, v, causal=True, return_lse=True)
    ref, ref_lse = reference_attention(q, k, v, causal=True)
    print(f"\nfast {case}: max |O - ref| = {(o.double().cpu() - ref).abs().max().item():.3e}")
    assert o.is_contiguous()
    assert_matches("O", o, ref, dtype, f"seed {seed}")
    assert_lse_matches(lse, ref_lse, f"seed {seed}")


FAST_CASES = [  # (batch, Hq, Hkv, N, D, dtype, causal)
    (1, 4, 1, 4093, 128, torch.bfloat16, True),  # ragged: ends in the second half of a 128- and a 256-row tile
    (1, 4, 2, 1537, 96, torch.bfloat16, True),  # ends in the first half of both
    (1, 4, 2, 100, 128, torch.bfloat16, True),  # shorter than one tile
    (1, 4, 1, 1000, 64, torch.float16, False),
    (1, 8, 2, 2049, 64, torch.bfloat16, True),  # the register-capped config's head dim, causal and ragged
    (2, 4, 4, 300, 128, torch.bfloat16, False),  # MHA
    (1, 4, 2, 777, 256, torch.bfloat16, True),  # the configs the autotuner keeps past head_dim 128
]


# The autotuner's candidates, then each sub-tiled one with two query heads a program (HEADS=2, an
# option of config= that bench/explore_fast.py's part "heads" times).
TESTED_CONFIGS = fast_forward.CONFIGS + fast_forward.head_pair_twins(fast_forward.CONFIGS)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("index", range(len(TESTED_CONFIGS)))
def test_every_fast_config_on_gpu(index, seed):
    """The autotuner picks one config per shape, so each is checked here on every case, against
    float64 (O and LSE of every head), on every case at a head dim where ``fits()`` admits it: a
    config it admits that does not fit the GPU after all fails here (``fits()`` would have to learn why).
    Two query heads a program skip the cases whose KV groups are odd (MHA). (That HEADS reaches the
    kernel is checked on the CPU:
    tests/given/test_fast_kernels.py fails when a program pairs the wrong heads.)"""
    c = TESTED_CONFIGS[index]
    config = c.all_kwargs()  # the tile, warps, stages and a register cap if it has one
    checked = []
    for case in FAST_CASES:
        b, hq, hkv, n, d, dtype, causal = case
        head_dim_pad = max(16, triton.next_power_of_2(d))
        pairs_odd_group = config.get("HEADS", 1) == 2 and (hq // hkv) % 2
        if not fast_forward.fits(c, head_dim_pad, fast_forward.shared_memory()) or pairs_odd_group:
            continue
        q, k, v = random_qkv(b, hq, hkv, n, d, dtype=dtype, seed=seed, device="cuda")
        try:
            o, lse = fast_forward.fast_attention_forward(q, k, v, causal=causal, return_lse=True, config=config)
        except OutOfResources as e:
            pytest.fail(f"config {config} does not fit the GPU at {case}, though fits() admits it: {e}")
        ref, ref_lse = reference_attention(q, k, v, causal=causal)
        ctx = f"config {config}, case {case}, seed {seed}"
        assert_matches("O", o, ref, dtype, ctx)
        assert_lse_matches(lse, ref_lse, ctx)
        checked.append(f"N={n} D={d}")
    print(f"\nconfig {config}: matches float64 at {', '.join(checked)}")
    assert checked, "no case ran"


# Past 2^31 elements: Q and O of this shape hold 2^32 elements each (8.6 GB apiece in bf16), so batch 1
# starts 2^31 elements in, and its offset wraps if the kernel computes it in int32 (forward.py Parts 2
# and 6 ask for int64). The length stays short, so the run takes seconds; many heads make the size.
HUGE = (2, 4096, 512, 4096, 128)  # (batch, Hq, Hkv, N, D)


@pytest.mark.timeout(600)
def test_forward_past_2_31_elements_on_gpu(seed):
    b, hq, hkv, n, d = HUGE
    assert b * hq * n * d > 2**31 and hq * n * d >= 2**31, "batch 1 must start past 2^31 elements"
    elements = 2 * b * hq * n * d + 2 * b * hkv * n * d  # Q and O, K and V
    need = 2 * elements + 4 * b * hq * n + 2**30  # bf16, the float32 LSE, and a margin
    free, _ = torch.cuda.mem_get_info()
    if free < need:
        pytest.skip(f"needs {need / 2**30:.0f} GiB of free GPU memory, {free / 2**30:.0f} GiB free")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, hq, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    o, lse = gqa_flash.flash_attention_forward(q, k, v, causal=True, return_lse=True)
    torch.cuda.synchronize()
    group = hq // hkv
    # The first and last heads of each batch: batch 1's start 2^31 and 2^31 + (Hq - 1) * N * D elements in.
    for i, h in ((0, 0), (0, hq - 1), (1, 0), (1, hq - 1)):
        kv = h // group
        ref, ref_lse = reference_attention(q[i:i + 1, h:h + 1], k[i:i + 1, kv:kv + 1], v[i:i + 1, kv:kv + 1])
        ctx = f"seed {seed}, batch {i}, head {h} of a [{b}, {hq}, {n}, {d}] bf16 Q (2^32 elements)"
        print(f"\nbatch {i} head {h}: max |O - ref| = {(o[i:i + 1, h:h + 1].double().cpu() - ref).abs().max():.3e}")
        assert_matches("O", o[i:i + 1, h:h + 1], ref, torch.bfloat16, ctx)
        assert_lse_matches(lse[i:i + 1, h:h + 1], ref_lse, ctx)
