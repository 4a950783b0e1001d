"""Bonus: backward.py, the backward kernels with GQA (20 bonus points, beyond the 100).

Gradients of sum(O * dO) from gqa_flash.flash_attention_backward (the backward
kernels) against float64 autograd of the reference. O and the LSE they start from
come from the float64 reference, not from your forward.py: a wrong forward costs
the forward's points, not these too. The kernels must do the work: inside the call
PyTorch's attention, softmax and matrix products are off limits, and at least one
Triton kernel must be launched.

Points follow harm (README.md, "How the points are shared"). Ordinary use carries 15 of the 20 points:
eight cases, each mixing GQA (Hq > Hkv; MHA and MQA once each), a length that is
not a multiple of the tiles, causal or not, fp32 or fp16, and a contiguous or
non-contiguous layout (q, k, v, O and dO alike). Corner cases share the other 5:
one token, scores near -100, head_dim 256, and skipping the blocks past the
diagonal (right gradients from a walk over every block cost about twice the work,
as the forward's unskipped key blocks do: 1 point, as the forward's 2 of 40).

D = rowsum(dO * O) summed in fp16 (not fp32) shows only where D is large against
dP - D: at head_dim 256 with a shared offset of 6 in V and in dO (a bias, as a
real model's V and dO often carry), D's fp16 rounding makes dQ and dK 13x as
wrong as the rounding the fp16 O already brings (relative errors 2.9e-2 and more
against 2.2e-3 and less, tolerance 1e-2). With plain standard-normal inputs it
hides well below the fp16 tolerance (5e-4 at head dims 32 to 256, in Triton's
interpreter, which sums fp16 in fp32 and rounds once). So the head_dim 256 case
carries such an offset.
"""

import pytest
import torch

from gqa_flash.course import runtime, tile_counts
from gqa_flash.course.grader.calls import kernel_only, student
from gqa_flash.reference import reference_attention, reference_gradients
from gqa_flash.course.testing import GRAD_TOLERANCE, gradient_error, random_qkv


def in_layout(t, layout):
    """``t``'s values in a fresh tensor of ``layout`` (testing.LAYOUTS); the strided layout's gaps hold NaN."""
    if layout == "bnhd":
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "strided":
        storage = t.new_full([2 * s for s in t.shape], float("nan"))
        view = storage[::2, ::2, ::2, ::2]
        view.copy_(t)
        return view
    return t.contiguous()


def very_negative_qkv(seed, batch, n_q_heads, n_kv_heads, seq_len, head_dim):
    """q, k, v (fp32), standard normal but for column 0: 100 in q and -sqrt(head_dim) in k, so every
    score (scaled by the default sm_scale) is -100 plus noise of about 1 and every row's LSE is near
    -96. (The offset sits in a column of its own so that dQ, where K's common part cancels, keeps
    its precision.) KV head j's V is shifted by j, as random_qkv's."""
    q, k, v = random_qkv(batch, n_q_heads, n_kv_heads, seq_len, head_dim, seed=seed, device="cpu")
    q[..., 0], k[..., 0] = 100.0, -(head_dim**0.5)
    return q, k, v


def check(seed, causal=True, dtype=torch.float32, layout="contiguous", scores="random", offset=0.0,
          batch=1, n_q_heads=4, n_kv_heads=2, seq_len=33, head_dim=16):
    """One case: ``scores`` "random" (random_qkv) or "very negative"; ``offset`` added to V and to dO."""
    shape = dict(batch=batch, n_q_heads=n_q_heads, n_kv_heads=n_kv_heads, seq_len=seq_len, head_dim=head_dim)
    if scores == "very negative":
        q, k, v = very_negative_qkv(seed, **shape)
    else:
        q, k, v = random_qkv(dtype=torch.float32, seed=seed, device="cpu", **shape)
    gen = torch.Generator().manual_seed(seed + 1)
    do = torch.randn(q.shape, generator=gen) + offset
    q, k, v, do = (in_layout(t.to(runtime.DEVICE, dtype), layout) for t in (q, k, v + offset, do))
    o, lse = reference_attention(q, k, v, causal=causal)
    o = in_layout(o.to(q.device, dtype), layout)
    lse = lse.to(q.device, torch.float32)
    reply = student().call("flash_attention_backward", q, k, v, o, lse, do, causal=causal,
                           watch=kernel_only("flash_attention_backward", part="backward"))
    grads = reply.value
    assert reply.seen.get("launches", 0) > 0, "flash_attention_backward must launch the Triton kernels"
    ref = reference_gradients(q, k, v, do, causal=causal)
    ctx = (f"seed {seed}, shape {list(q.shape)} with {n_kv_heads} KV heads, causal={causal}, "
           f"{str(dtype)[6:]}, {layout} layout" + (", scores near -100" if scores != "random" else "")
           + (f", V and dO offset by {offset:g}" if offset else ""))
    assert isinstance(grads, (tuple, list)) and len(grads) == 3, f"expected (dQ, dK, dV), got {type(grads)}; {ctx}"
    for name, g, t, r in zip(("dQ", "dK", "dV"), grads, (q, k, v), ref):
        # A plain tensor: a subclass could compute its values later, outside the graded call.
        assert type(g) is torch.Tensor and g.shape == t.shape, (
            f"{name} must be a torch.Tensor of shape {list(t.shape)}, got "
            f"{list(g.shape) if type(g) is torch.Tensor else type(g).__name__}; {ctx}")
        assert g.dtype == t.dtype, f"{name} must have {name[1].lower()}'s dtype {t.dtype}, got {g.dtype}; {ctx}"
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


F32, F16 = torch.float32, torch.float16
ORDINARY = [
    # (batch, Hq, Hkv, N, head_dim, causal, dtype, layout): no length is a multiple of every tile
    # Most head dims are not powers of two (padded inside the kernels): their padding columns must be masked
    # in every load and store, as they are in ordinary models (head_dim 80, 96).
    (1, 4, 2, 40, 24, True, F32, "contiguous"),
    (2, 6, 2, 27, 48, False, F32, "bnhd"),
    (1, 6, 3, 37, 40, True, F16, "strided"),
    (1, 4, 2, 33, 80, True, F16, "contiguous"),
    (2, 4, 1, 30, 24, False, F32, "strided"),  # MQA
    (1, 2, 2, 21, 16, True, F32, "bnhd"),  # MHA
    (1, 8, 2, 26, 48, False, F16, "bnhd"),
    (2, 4, 2, 29, 24, True, F32, "strided"),
]


@pytest.mark.points(15)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ORDINARY, ids=[
    f"h{c[1]}:{c[2]}-b{c[0]}-n{c[3]}-d{c[4]}-{'causal' if c[5] else 'full'}-{str(c[6])[6:]}-{c[7]}" for c in ORDINARY])
def test_backward(seed, case):
    # dK and dV of a KV head are the sum over every query head that reads it.
    batch, n_q_heads, n_kv_heads, seq_len, head_dim, causal, dtype, layout = case
    check(seed, causal=causal, dtype=dtype, layout=layout, batch=batch, n_q_heads=n_q_heads, n_kv_heads=n_kv_heads,
          seq_len=seq_len, head_dim=head_dim)


@pytest.mark.points(1)
@pytest.mark.timeout(120)
def test_backward_one_token(seed):
    # One key: P = 1, so dQ = dK = 0 and dV = dO.
    check(seed, causal=True, n_q_heads=4, n_kv_heads=2, seq_len=1, head_dim=32)


@pytest.mark.points(2)
@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:overflow encountered in exp2")  # the interpreter's numpy, on masked-out keys
@pytest.mark.parametrize("dtype,layout", [(F32, "contiguous"), (F16, "bnhd")], ids=["fp32", "fp16-bnhd"])
def test_backward_very_negative_scores(seed, dtype, layout):
    # Every score near -100, so the LSE is near -96: a padding key past the length (loaded as zeros,
    # score 0) that is not masked out of P gets P = exp(96), inf in fp32, and inf * 0 = NaN in dQ.
    check(seed, causal=False, dtype=dtype, layout=layout, scores="very negative", n_q_heads=4, n_kv_heads=2,
          seq_len=24, head_dim=16)


@pytest.mark.points(1)
@pytest.mark.timeout(180)
def test_backward_head_dim_256(seed):
    # fp16 with V and dO offset by a shared bias: D = rowsum(dO * O) is then large next to dP - D,
    # and D rounded to fp16 (summed without a cast to fp32) shows.
    check(seed, causal=True, dtype=F16, offset=6.0, n_q_heads=4, n_kv_heads=2, seq_len=20, head_dim=256)


@pytest.mark.points(1)
@pytest.mark.timeout(180)
def test_backward_causal_skips_blocks_past_the_diagonal(seed):
    # The causal walks of Parts 2 and 4: a key block's dK/dV program visits the query blocks from its
    # diagonal on, a query block's dQ program the key blocks up to its diagonal; the others are never
    # loaded. The interpreter counts each program's score tiles (S and dP, tl.dot over the head dim); a
    # walk over every block that lets the mask zero the rest is right but does about twice the work.
    seq_len, n_q_heads, n_kv_heads = 100, 2, 1
    counts, config = student().score_tiles(kernel="backward", seq_len=seq_len, head_dim=64, causal=True, seed=seed,
                                           n_q_heads=n_q_heads, n_kv_heads=n_kv_heads)
    problem = tile_counts.backward_walk_problem(counts, config, seq_len, n_q_heads, n_kv_heads)
    assert problem is None, f"Part {problem['part']}: {problem['where']}: {problem['fix']}"
