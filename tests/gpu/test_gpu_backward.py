"""The backward kernels on a GPU: bf16, fp16, fp32, long sequences, against float64 autograd."""

import pytest
import torch
from triton.runtime.errors import OutOfResources

import gqa_flash
from gqa_flash.fast import backward as fast_backward
from gqa_flash.course.testing import random_qkv

pytestmark = pytest.mark.gpu

CASES = [
    # (batch, Hq, Hkv, N, D, dtype, causal, relative tolerance)
    (1, 8, 2, 1024, 128, torch.bfloat16, True, 3e-2),
    (1, 8, 2, 1023, 64, torch.float16, True, 1e-2),
    (1, 4, 1, 777, 96, torch.float16, False, 1e-2),
    (1, 4, 2, 512, 64, torch.float32, True, 1e-4),
]


def check_gradients(q, k, v, causal, fast, tol, label):
    """Backpropagate a random dO through flash_attention; each gradient's relative error must be <= tol."""
    do = torch.randn(q.shape, device="cuda", dtype=q.dtype)
    gqa_flash.flash_attention(q, k, v, causal=causal, fast=fast).backward(do)
    for name, t, ref in zip("QKV", (q, k, v), gqa_flash.reference_gradients(q, k, v, do, causal=causal)):
        rel = ((t.grad.double().cpu() - ref).norm() / ref.norm()).item()
        print(f"\n{label} d{name}: relative error {rel:.2e}")
        assert rel <= tol


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fast", [False, True], ids=["graded", "fast"])
@pytest.mark.parametrize("case", CASES, ids=[f"h{c[1]}:{c[2]}-n{c[3]}-d{c[4]}-{str(c[5])[6:]}" for c in CASES])
def test_gradients_on_gpu(case, fast, seed):
    b, hq, hkv, n, d, dtype, causal, tol = case
    q, k, v = (t.requires_grad_(True) for t in random_qkv(b, hq, hkv, n, d, dtype=dtype, seed=seed, device="cuda"))
    check_gradients(q, k, v, causal, fast, tol, label=f"{'fast' if fast else 'graded'} {case[:7]}")


FAST_CASES = [
    # (layout, dtype, D, relative tolerance): what the fast backward copies first, and fp32 (FP32_CONFIG)
    ("strided", torch.bfloat16, 128, 3e-2),  # last-dim stride 2
    ("contiguous", torch.float16, 20, 1e-2),  # 40-byte rows, not a multiple of 16 bytes
    ("bnhd", torch.float32, 128, 1e-4),
    ("contiguous", torch.float32, 256, 1e-4),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", FAST_CASES, ids=[f"{c[0]}-{str(c[1])[6:]}-d{c[2]}" for c in FAST_CASES])
def test_fast_backward_layouts_and_fp32_on_gpu(case, seed):
    layout, dtype, d, tol = case
    q, k, v = (t.requires_grad_(True)
               for t in random_qkv(1, 8, 2, 777, d, dtype=dtype, layout=layout, seed=seed, device="cuda"))
    check_gradients(q, k, v, True, True, tol, label=f"fast {case[:3]}")


TILE_CASES = [  # (batch, Hq, Hkv, N, D, dtype, causal, relative tolerance)
    (1, 8, 2, 1023, 128, torch.bfloat16, True, 3e-2),  # ragged: the last key block is masked everywhere
    (1, 4, 1, 777, 64, torch.float16, False, 1e-2),
]
TILES = ([("dkdv", i) for i in range(len(fast_backward.SEPARATE_CONFIGS))]
         + [("dq", i) for i in range(len(fast_backward.DQ_CONFIGS))])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kernel,index", TILES, ids=[f"{k}{i}" for k, i in TILES])
def test_every_fast_backward_config_on_gpu(kernel, index, seed):
    """The autotuner picks one tile per shape, so each two-pass candidate (dK/dV, and dQ) is checked
    here at fixed tiles, the other kernel left to its autotuner. A tile that does not fit the GPU's
    shared memory at a head dim is skipped there, as the autotuner skips it."""
    c = (fast_backward.SEPARATE_CONFIGS if kernel == "dkdv" else fast_backward.DQ_CONFIGS)[index]
    tile = c.all_kwargs()  # the tile, warps, stages and a register cap if it has one
    checked = []
    for case in TILE_CASES:
        b, hq, hkv, n, d, dtype, causal, tol = case
        q, k, v = random_qkv(b, hq, hkv, n, d, dtype=dtype, seed=seed, device="cuda")
        do = torch.randn(q.shape, device="cuda", dtype=dtype)
        o, lse = gqa_flash.fast_attention_forward(q, k, v, causal=causal, return_lse=True)
        fixed = {"config": tile} if kernel == "dkdv" else {"dq_config": tile}
        try:
            grads = fast_backward.fast_attention_backward(q, k, v, o, lse, do, causal=causal, dq_mode="separate",
                                                          **fixed)
        except OutOfResources:
            continue
        for name, g, ref in zip("QKV", grads, gqa_flash.reference_gradients(q, k, v, do, causal=causal)):
            rel = ((g.double().cpu() - ref).norm() / ref.norm()).item()
            assert rel <= tol, f"{kernel} tile {tile}, case {case[:7]}, seed {seed}: d{name} relative error {rel:.2e}"
        checked.append(f"N={n} D={d}")
    print(f"\n{kernel} tile {tile}: matches float64 at {', '.join(checked)}")
    assert checked, "no case ran"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("d", [64, 128])
def test_fast_kernels_second_call_launches_the_pick_on_gpu(d, seed):
    """From a key's second call the fast kernels launch the autotuner's pick directly (``_picks``,
    gqa_flash/fast/forward.py and backward.py): those launches must give the bits of the autotuned first
    call, forward and backward (both deterministic: two passes, no atomics). That they carry the pick's
    warps, stages and register cap is checked on the CPU (tests/given/test_fast_kernels.py)."""
    from gqa_flash.fast import forward as fast_forward

    # A length no other test used (the first call is the autotuner's), below GLUON_MIN_SEQ_LEN: on an H100
    # a causal call at head_dim 128 from 1k runs the Gluon kernel, which has no autotuner and no pick.
    n = fast_forward.GLUON_MIN_SEQ_LEN - 100 + d // 4 + seed % 7
    q, k, v = random_qkv(1, 8, 2, n, d, dtype=torch.bfloat16, seed=seed, device="cuda")
    do = torch.randn(q.shape, device="cuda", dtype=q.dtype)
    key = ("forward", n, 8, 2, d, True, torch.bfloat16)
    runs = []
    for _ in range(2):
        o, lse = fast_forward.fast_attention_forward(q, k, v, return_lse=True)
        assert fast_forward.last_path["kernel"] == "triton", "the Gluon route took this call: pick a shorter length"
        runs.append((o, lse, *fast_backward.fast_attention_backward(q, k, v, o, lse, do)))
        assert key in fast_forward._picks, "the forward's pick was not kept"
    for name, a, b in zip(["O", "LSE", "dQ", "dK", "dV"], *runs):
        assert torch.equal(a, b), f"{name}: the direct launch differs from the autotuned one"


def _graded_test_module():
    """tests/graded/test_backward.py, for its check() (inputs, kernel_only, float64 verdict)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "graded" / "test_backward.py"
    spec = importlib.util.spec_from_file_location("graded_test_backward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CORNER_CASES = [
    # (scores, Hq, Hkv, N, D, dtype, causal, offset of V and dO): the graded corner cases at GPU sizes and tiles
    ("very negative", 8, 2, 1000, 64, torch.float32, False, 0.0),  # a padding key not masked out of P: NaN in dQ
    ("very negative", 8, 2, 777, 128, torch.float16, False, 0.0),
    ("random", 4, 2, 500, 256, torch.float16, True, 6.0),  # D summed in fp16 shows
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", CORNER_CASES, ids=[
    f"{c[0].replace(' ', '-')}-h{c[1]}:{c[2]}-n{c[3]}-d{c[4]}-{str(c[5])[6:]}" for c in CORNER_CASES])
def test_graded_backward_corner_cases_on_gpu(case, seed):
    scores, hq, hkv, n, d, dtype, causal, offset = case
    _graded_test_module().check(seed, causal=causal, dtype=dtype, scores=scores, offset=offset, n_q_heads=hq,
                                n_kv_heads=hkv, seq_len=n, head_dim=d)
