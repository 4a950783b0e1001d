"""Sliding windows and attention sinks in the fast kernels and the public API, against the float64 reference.

Every combination the options make: GQA ratios, ragged lengths, head dims 80 and 96, fp16 and fp32 (bf16 on the
device: the interpreter's tl.dot multiplies bf16's raw bits), a window longer than the sequence, W = 1, sink
tokens inside and outside the window, learned sinks with one of -inf, K and V in layouts of their own, both
tile shapes of the forward and both dQ modes and loops of the backward. Then the work: a query tile loads only
the key blocks some row of it sees. Then the gradient: dQ, dK, dV and dSinks through ``flash_attention``, and
``torch.autograd.gradcheck`` of the fast backward in float64.
"""

import pytest
import torch

import gqa_flash
from gqa_flash.course import runtime
from gqa_flash.course.testing import (GRAD_TOLERANCE, assert_lse_matches, assert_matches, fresh_seed,
                                      gradient_error, random_qkv)
from gqa_flash.fast import backward as fast_backward
from gqa_flash.fast import forward as fast_forward
from gqa_flash.reference import reference_attention, reference_gradients, visible

cpu_only = pytest.mark.skipif(not runtime.INTERPRETER, reason="counts and gradcheck run in the interpreter")


def _sinks(n_q_heads, seed, minus_inf=False):
    sinks = torch.randn(n_q_heads, generator=torch.Generator().manual_seed(seed + 1)) * 2
    if minus_inf:
        sinks[0] = float("-inf")  # a head whose sink weighs nothing: the same as no sink for that head
    return sinks.to(runtime.DEVICE)


# (seq_len, window, sink_tokens, learned sinks, Hq, Hkv, head_dim, dtype, K/V layout, forward config)
FORWARD_CASES = [
    (70, 5, 0, False, 4, 2, 32, torch.float32, "contiguous", None),
    (70, 1, 0, True, 2, 1, 32, torch.float32, "contiguous", None),  # W = 1: each row is its own V
    (100, 33, 20, True, 4, 1, 80, torch.float32, "bnhd", None),  # sink tokens inside the window at first
    (90, 16, 40, False, 2, 2, 96, torch.float16, "contiguous", None),
    (50, 200, 0, True, 2, 1, 16, torch.float32, "strided", None),  # the window longer than the sequence
    (77, 9, 3, True, 4, 2, 32, torch.float16, "contiguous", dict(BLOCK_M=32, BLOCK_N=16, SUBTILES=1)),
    (100, 9, 2, True, 4, 2, 32, torch.float32, "contiguous", dict(BLOCK_M=32, BLOCK_N=16, SUBTILES=2, HEADS=2)),
    (64, None, 0, True, 8, 2, 32, torch.float32, "contiguous", None),  # learned sinks without a window
]


@pytest.mark.parametrize("case", FORWARD_CASES, ids=lambda c: f"n{c[0]}-w{c[1]}-s{c[2]}-sinks{int(c[3])}-"
                                                             f"{c[4]}:{c[5]}-d{c[6]}-{str(c[7])[6:]}-{c[8]}")
def test_fast_forward_with_windows_and_sinks(case):
    seq_len, window, sink_tokens, learned, hq, hkv, head_dim, dtype, layout, config = case
    seed = fresh_seed()
    q, k, v = random_qkv(n_q_heads=hq, n_kv_heads=hkv, seq_len=seq_len, head_dim=head_dim, dtype=dtype,
                         layout="contiguous", seed=seed)
    _, k, _ = random_qkv(n_q_heads=hq, n_kv_heads=hkv, seq_len=seq_len, head_dim=head_dim, dtype=dtype,
                         layout=layout, seed=seed, v_layout="padded")  # K and V in layouts of their own
    sinks = _sinks(hq, seed, minus_inf=learned) if learned else None
    options = dict(window=window, sink_tokens=sink_tokens, sinks=sinks)
    if config is None:
        o, lse = gqa_flash.fast_attention_forward(q, k, v, return_lse=True, **options)
    else:
        o, lse = fast_forward.fast_attention_forward(q, k, v, return_lse=True, config=config, **options)
    ref_o, ref_lse = reference_attention(q, k, v, **options)
    where = f"seed {seed}, {case}"
    assert_matches("O", o, ref_o, dtype, where)
    assert_lse_matches(lse, ref_lse, where)


def test_a_window_as_long_as_the_sequence_is_causal_attention_and_one_key_is_v():
    q, k, v = random_qkv(seq_len=45, head_dim=32, seed=fresh_seed())
    causal = gqa_flash.fast_attention_forward(q, k, v)
    torch.testing.assert_close(gqa_flash.fast_attention_forward(q, k, v, window=45), causal, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(gqa_flash.fast_attention_forward(q, k, v, window=1000), causal, atol=1e-6, rtol=1e-6)
    own_v = v.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    torch.testing.assert_close(gqa_flash.fast_attention_forward(q, k, v, window=1), own_v, atol=1e-6, rtol=1e-6)


def test_a_sink_of_minus_infinity_is_no_sink():
    q, k, v = random_qkv(n_q_heads=2, n_kv_heads=1, seq_len=40, head_dim=32, seed=fresh_seed())
    none = torch.full((2,), float("-inf"), device=q.device)
    o, lse = gqa_flash.fast_attention_forward(q, k, v, return_lse=True, window=7, sinks=none)
    o_plain, lse_plain = gqa_flash.fast_attention_forward(q, k, v, return_lse=True, window=7)
    torch.testing.assert_close(o, o_plain, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(lse, lse_plain, atol=1e-6, rtol=1e-6)


# (seq_len, window, sink_tokens, learned sinks, Hq, Hkv, head_dim, dtype, dQ mode, dK/dV config)
BACKWARD_CASES = [
    (70, 5, 0, False, 4, 2, 32, torch.float32, None, None),
    (70, 1, 0, True, 2, 1, 32, torch.float32, None, None),
    (100, 33, 20, True, 4, 1, 80, torch.float32, None, None),
    (90, 16, 40, False, 2, 2, 32, torch.float16, None, None),
    (100, 33, 20, True, 4, 2, 32, torch.float32, "atomic", None),
    (100, 9, 2, True, 4, 2, 32, torch.float32, None, dict(BLOCK_M=16, BLOCK_N=32, FLAT=False)),
    (64, None, 0, True, 4, 2, 32, torch.float32, None, None),
]


@pytest.mark.parametrize("case", BACKWARD_CASES, ids=lambda c: f"n{c[0]}-w{c[1]}-s{c[2]}-sinks{int(c[3])}-"
                                                               f"{c[4]}:{c[5]}-d{c[6]}-{str(c[7])[6:]}-{c[8]}")
def test_fast_backward_with_windows_and_sinks(case):
    seq_len, window, sink_tokens, learned, hq, hkv, head_dim, dtype, dq_mode, config = case
    seed = fresh_seed()
    q, k, v = random_qkv(n_q_heads=hq, n_kv_heads=hkv, seq_len=seq_len, head_dim=head_dim, dtype=dtype, seed=seed)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 2)).to(q)
    sinks = _sinks(hq, seed, minus_inf=hq > 2) if learned else None
    options = dict(window=window, sink_tokens=sink_tokens, sinks=sinks)
    o, lse = gqa_flash.fast_attention_forward(q, k, v, return_lse=True, **options)
    got = fast_backward.fast_attention_backward(q, k, v, o, lse, do, config=config, dq_mode=dq_mode, **options)
    want = reference_gradients(q, k, v, do, **options)
    assert len(got) == len(want) == (4 if learned else 3)
    for name, g, w in zip(("dQ", "dK", "dV", "dSinks"), got, want):
        err, bound = gradient_error(g, w, dtype)
        assert err <= bound, f"{name}: error {err:.2e} > {bound:.2e} (seed {seed}, {case})"


@cpu_only
@pytest.mark.parametrize("window, sink_tokens", [(5, 0), (20, 0), (9, 18), (1, 1)])
def test_a_query_tile_loads_only_the_key_blocks_its_rows_see(window, sink_tokens):
    from gqa_flash.course.tile_counts import _score_tiles_recorded

    seq_len, head_dim, config = 96, 32, dict(BLOCK_M=32, BLOCK_N=16, SUBTILES=1)
    q, k, v = random_qkv(n_q_heads=1, n_kv_heads=1, seq_len=seq_len, head_dim=head_dim, seed=0)
    counts = {}

    def record(builder):
        tile = int(builder.grid_idx[0])
        counts[tile] = counts.get(tile, 0) + 1

    with _score_tiles_recorded(head_dim, config, record):
        fast_forward.fast_attention_forward(q, k, v, config=config, window=window, sink_tokens=sink_tokens)
    n_tiles = seq_len // 32
    for order in range(n_tiles):
        tile = n_tiles - 1 - order  # the launch puts the heaviest (last) query tile first
        rows = torch.arange(tile * 32, (tile + 1) * 32)
        sees = visible(rows, torch.arange(seq_len), True, window, sink_tokens).any(dim=0)
        need = int(sees.view(-1, 16).any(dim=1).sum())
        assert counts.get(order, 0) == need, (f"query tile {tile} (window {window}, {sink_tokens} sink tokens) "
                                              f"computed {counts.get(order, 0)} score tiles; its rows see {need}")
    causal = sum(2 * (tile + 1) for tile in range(n_tiles))  # two key blocks of 16 a query tile of 32, to the diagonal
    assert sum(counts.values()) < causal, "no fewer tiles than causal attention"


def test_flash_attention_learns_the_sinks():
    seed = fresh_seed()
    q, k, v = random_qkv(n_q_heads=4, n_kv_heads=2, seq_len=37, head_dim=32, seed=seed)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 2)).to(q)
    sinks = _sinks(4, seed)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, sinks)]
    # fast=True: the fast forward (fast=False runs the student's windows.py, a bonus; tests/api/ holds that one)
    out = gqa_flash.flash_attention(*leaves[:3], fast=True, window=6, sink_tokens=2, sinks=leaves[3])
    out.backward(do)
    want = reference_gradients(q, k, v, do, window=6, sink_tokens=2, sinks=sinks)
    assert_matches("O", out, reference_attention(q, k, v, window=6, sink_tokens=2, sinks=sinks)[0], q.dtype)
    for name, leaf, w in zip(("q", "k", "v", "sinks"), leaves, want):
        err, bound = gradient_error(leaf.grad, w, q.dtype)
        assert err <= bound, f"{name}.grad: error {err:.2e} > {bound:.2e} (seed {seed})"


@cpu_only
def test_the_fast_backward_with_learned_sinks_passes_gradcheck():
    # gradcheck in float64: the forward is the float64 reference, so its finite differences are exact to ~1e-10;
    # the backward is the fast kernels' (fp32 inside) with dSinks, so this checks that they are the derivative.
    class Windowed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, sinks):
            o, lse = reference_attention(q, k, v, window=5, sink_tokens=2, sinks=sinks)
            ctx.save_for_backward(q, k, v, sinks, o, lse)
            return o

        @staticmethod
        def backward(ctx, do):
            q, k, v, sinks, o, lse = (t.float() for t in ctx.saved_tensors)
            grads = gqa_flash.fast_attention_backward(q, k, v, o, lse, do.float(), window=5, sink_tokens=2,
                                                      sinks=sinks)
            return tuple(g.double() for g in grads)

    gen = torch.Generator().manual_seed(fresh_seed())
    inputs = [torch.randn(shape, generator=gen, dtype=torch.float64, requires_grad=True)
              for shape in ((1, 2, 20, 16), (1, 1, 20, 16), (1, 1, 20, 16), (2,))]
    assert torch.autograd.gradcheck(Windowed.apply, inputs, atol=1e-4, rtol=GRAD_TOLERANCE[torch.float32] * 10)


@pytest.mark.parametrize("options, error, words", [
    (dict(window=0), ValueError, "window must be a whole number of keys >= 1"),
    (dict(window=2.5), ValueError, "window must be"),
    (dict(window=True), ValueError, "window must be"),
    (dict(window=4, sink_tokens=-1), ValueError, "sink_tokens must be a whole number >= 0"),
    (dict(sink_tokens=2), ValueError, "sink_tokens=2 needs a window"),
    (dict(sinks=torch.zeros(3)), ValueError, r"sinks must have shape \[n_q_heads\] = \[4\]"),
    (dict(sinks=torch.zeros(4, dtype=torch.int32)), TypeError, "sinks must be a float tensor"),
    (dict(sinks=[0.0] * 4), TypeError, "sinks must be a float tensor"),
    (dict(window=4, causal=False), ValueError, "window and sinks need causal=True"),
])
@pytest.mark.parametrize("entry", ["fast_attention_forward", "flash_attention", "fast_attention_backward"])
def test_bad_window_options_are_named(options, error, words, entry):
    q, k, v = random_qkv(n_q_heads=4, n_kv_heads=2, seq_len=8, head_dim=16, seed=0)
    options = {k_: (t.to(q.device) if isinstance(t, torch.Tensor) else t) for k_, t in options.items()}
    causal = options.pop("causal", True)
    with pytest.raises(error, match=words):
        if entry == "fast_attention_backward":
            lse = torch.zeros(q.shape[:3], device=q.device)
            gqa_flash.fast_attention_backward(q, k, v, q, lse, q, causal, **options)
        else:
            getattr(gqa_flash, entry)(q, k, v, causal, **options)


def test_an_empty_batch_with_sinks_gives_empty_results_and_zero_gradients():
    q, k, v = random_qkv(batch=0, n_q_heads=2, n_kv_heads=1, seq_len=8, head_dim=16, seed=0)
    sinks = torch.zeros(2, device=q.device)
    assert gqa_flash.fast_attention_forward(q, k, v, window=3, sinks=sinks).shape == q.shape
    lse = torch.zeros(q.shape[:3], device=q.device)
    grads = gqa_flash.fast_attention_backward(q, k, v, q, lse, q, window=3, sinks=sinks)
    assert len(grads) == 4 and grads[3].shape == (2,) and not grads[3].any()
