"""The Gluon forward for Hopper (gqa_flash/fast/hopper_forward.py) on a GPU, against float64.

Skipped without a CUDA device (conftest.py), and where the fast forward would not take the
Gluon kernel (a GPU other than Hopper, a Triton other than the one measured). Every variant
the kernel has is checked, not only the one the fast forward routes to: persistent or one
program a tile, 128- or 64-key tiles, the consumers' turns (PINGPONG) on or off.
"""

import pytest
import torch
import triton

import gqa_flash
from gqa_flash.fast import forward as fast_forward
from gqa_flash.reference import reference_attention
from gqa_flash.course.testing import assert_lse_matches, assert_matches, random_qkv

pytestmark = pytest.mark.gpu


def _hopper_and_measured_triton():
    return (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
            and triton.__version__.startswith(fast_forward.GLUON_TRITON))


needs_gluon = pytest.mark.skipif(not _hopper_and_measured_triton(), reason="the Gluon kernel runs on Hopper, "
                                 f"Triton {fast_forward.GLUON_TRITON}x only")

VARIANTS = {
    "routed": fast_forward.GLUON_CONFIG,
    "n64": {"BLOCK_N": 64, "K_STAGES": 3, "V_STAGES": 3},
    "n64_pingpong": {"BLOCK_N": 64, "K_STAGES": 3, "V_STAGES": 3, "PINGPONG": True},
    "n128_one_tile": {"BLOCK_N": 128, "K_STAGES": 2, "V_STAGES": 2, "PERSISTENT": False},
}

CASES = [
    # (batch, Hq, Hkv, N, D, dtype, causal, layout): even and odd groups (two heads a program, or
    # 128 rows of one), ragged N, one row, padded head dims, not causal, strided inputs
    (2, 8, 2, 1024, 128, torch.bfloat16, True, "contiguous"),
    (1, 32, 8, 4096, 128, torch.bfloat16, True, "contiguous"),
    (2, 8, 2, 1000, 128, torch.bfloat16, True, "contiguous"),
    (1, 4, 4, 777, 128, torch.float16, True, "contiguous"),
    (1, 6, 2, 300, 64, torch.bfloat16, True, "contiguous"),
    (2, 4, 1, 1, 64, torch.bfloat16, True, "contiguous"),
    (1, 8, 2, 513, 96, torch.bfloat16, True, "bnhd"),
    (1, 8, 2, 200, 80, torch.float16, False, "contiguous"),
    (1, 4, 2, 333, 128, torch.bfloat16, False, "strided"),
]


@needs_gluon
@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("case", CASES, ids=[
    f"b{c[0]}-h{c[1]}:{c[2]}-n{c[3]}-d{c[4]}-{str(c[5])[6:]}-{'causal' if c[6] else 'full'}-{c[7]}" for c in CASES])
def test_gluon_forward_matches_float64(case, variant, seed):
    b, hq, hkv, n, d, dtype, causal, layout = case
    q, k, v = random_qkv(b, hq, hkv, n, d, dtype=dtype, layout=layout, seed=seed, device="cuda")
    from gqa_flash.fast import hopper_forward

    o, lse = hopper_forward.attention(q, k, v, causal, config=VARIANTS[variant])
    torch.cuda.synchronize()
    ref, ref_lse = reference_attention(q, k, v, causal=causal)
    print(f"\ngluon {variant} {case}: max |O - ref| = {(o.double().cpu() - ref).abs().max().item():.3e}")
    assert_matches("O", o, ref, dtype, f"seed {seed}, variant {variant}")
    assert_lse_matches(lse, ref_lse, f"seed {seed}, variant {variant}")


@needs_gluon
@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", ["routed", "n64_pingpong"])
@pytest.mark.parametrize("case", CASES, ids=[
    f"b{c[0]}-h{c[1]}:{c[2]}-n{c[3]}-d{c[4]}-{str(c[5])[6:]}-{'causal' if c[6] else 'full'}-{c[7]}" for c in CASES])
def test_gluon_forward_across_tiles(case, variant, seed, monkeypatch):
    """Five programs, so that every program takes several tiles (and not the same number): the barriers' phases,
    Q's next load and O's slot carried from tile to tile, in every mode of the tile decode."""
    from gqa_flash.fast import hopper_forward

    monkeypatch.setattr(hopper_forward, "sm_count", lambda device: 5)
    test_gluon_forward_matches_float64(case, variant, seed)


def _routed(monkeypatch):
    from gqa_flash.fast import hopper_forward

    calls = []
    launch = hopper_forward.hopper_attention_forward

    def counted(*args, **kwargs):
        out = launch(*args, **kwargs)
        calls.append(1)  # after the launch returned: a launch that raised is not counted
        return out

    monkeypatch.setattr(hopper_forward, "hopper_attention_forward", counted)
    return calls


@needs_gluon
@pytest.mark.skipif(not torch.cuda.is_available()
                    or not fast_forward.gluon_wanted(9, torch.cuda.get_device_name(), triton.__version__,
                                                     torch.bfloat16, 128, 1024, True),
                    reason=f"the route takes the Gluon kernel on {', '.join(fast_forward.GLUON_CARDS)} only")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [1024, 8192])
def test_fast_forward_takes_the_gluon_kernel_where_it_wins(n, seed, monkeypatch):
    calls = _routed(monkeypatch)
    q, k, v = random_qkv(1, 8, 2, n, 128, dtype=torch.bfloat16, seed=seed, device="cuda")
    o, lse = gqa_flash.fast_attention_forward(q, k, v, causal=True, return_lse=True)
    assert calls and fast_forward.last_path["kernel"] == "gluon", \
        f"the fast forward did not take the Gluon kernel at N={n}: {fast_forward._gluon_failed}"
    ref, ref_lse = reference_attention(q, k, v, causal=True)
    assert_matches("O", o, ref, torch.bfloat16, f"seed {seed}")
    assert_lse_matches(lse, ref_lse, f"seed {seed}")


@needs_gluon
@pytest.mark.timeout(300)
@pytest.mark.parametrize("why, n, d, causal, kwargs", [
    ("head_dim 64", 1024, 64, True, {}),
    ("N below 1k", 512, 128, True, {}),
    ("not causal", 1024, 128, False, {}),
    ("a config", 1024, 128, True, {"config": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}}),
    ("the graded kernel's launch order", 1024, 128, True, {"group_major": False}),
])
def test_fast_forward_keeps_the_triton_kernel_elsewhere(why, n, d, causal, kwargs, seed, monkeypatch):
    calls = _routed(monkeypatch)
    q, k, v = random_qkv(1, 8, 2, n, d, dtype=torch.bfloat16, seed=seed, device="cuda")
    o = fast_forward.fast_attention_forward(q, k, v, causal=causal, **kwargs)
    assert not calls and fast_forward.last_path["kernel"] == "triton", f"{why}: the Gluon kernel ran"
    assert_matches("O", o, reference_attention(q, k, v, causal=causal)[0], torch.bfloat16, f"seed {seed}, {why}")
