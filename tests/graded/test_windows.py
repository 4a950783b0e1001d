"""Bonus: windows.py, sliding windows and attention sinks in the forward kernel (15 bonus points, beyond the 100).

windows.py runs on the student's own forward.py (its helpers: the tile loads, the update, the mask, the
epilogue), so these tests pass once both are right. Every call goes through the public API
(``flash_attention_forward(..., window=, sink_tokens=, sinks=)``), under ``kernel_only`` held to windows.py's own
work, and is compared with the float64 reference (``reference_attention`` with the same options).

Points follow harm (README, "How the points are shared"). 11 of the 15 are ordinary use: every case there runs
twice, with a window and sink tokens (inside a row's window and far outside it), and with the window alone, as
Mistral's and Gemma's are (there a query tile's later rows meet a first key block they see none of); and it mixes
grouped-query heads (1:1, 2:1, 4:1), a length that is not a multiple of the tiles, fp32 or fp16, head dims 32, 80
and 96, K and V in layouts of their own, and windows shorter than a key block, as long as one or as a query tile,
and longer. Learned sinks come in 7.5 of those points (one head's sink -inf in each case: a head with no sink). 7.5
judge O alone, and the LSE's 3.5 judge O and then the LSE (which counts the sinks). So a wrong window edge, sink
tokens ignored or seen from their past, a sink left out of l_i or in the wrong units, or a running max that starts
at -inf, loses at least half of the 15. The other 4 are corner cases: W = 1 (each row its own value) and a window as
long as the sequence (causal attention), every sink -inf (no sink), and the skip: a query tile loads only the key
blocks some row of it sees (2.5 points, counted in the interpreter, as forward.py's causal skip is; a loop from key
0 is right, but does the O(N^2) work of causal attention where a window needs O(N W)).
"""

import pytest
import torch

from gqa_flash.course.grader.calls import kernel_only, student
from gqa_flash.course.testing import assert_lse_matches, assert_matches, case_context, random_qkv

F16, F32 = torch.float16, torch.float32


def learned_sinks(n_q_heads, seed, minus_inf=False):
    """[Hq] raw logits, about as large as the scores; with ``minus_inf`` head 0's is -inf (a sink of no weight)."""
    sinks = torch.randn(n_q_heads, generator=torch.Generator().manual_seed(seed + 1)) * 2
    if minus_inf:
        sinks[0] = float("-inf")
    return sinks


def check_both(seed, window, sink_tokens, *args, **kwargs):
    """``check`` with the case's sink tokens, then with its window alone (Mistral's and Gemma's windows have no
    sink tokens; there a query tile's later rows meet a first key block they see none of)."""
    check(seed, window, sink_tokens, *args, **kwargs)
    check(seed, window, 0, *args, **kwargs)


def check(seed, window, sink_tokens=0, sinks=None, lse=False, sm_scale=None, dtype=F32, layout="contiguous",
          v_layout=None, qkv=None, reference=None, **shape):
    """windows.py through the public API on one input; compare O, and with ``lse`` the LSE too, with float64
    (``reference``: the reference's keywords, when they are not the call's own)."""
    from gqa_flash.reference import reference_attention

    q, k, v = qkv if qkv is not None else random_qkv(dtype=dtype, layout=layout, v_layout=v_layout, seed=seed,
                                                     **shape)
    options = dict(window=window, sink_tokens=sink_tokens, sinks=None if sinks is None else sinks.to(q.device))
    reply = student().call("flash_attention_forward", q, k, v, causal=True, sm_scale=sm_scale, return_lse=True,
                           watch=kernel_only("flash_attention_forward", part="windows"), **options)
    assert reply.seen.get("launches", 0) > 0, "flash_attention_forward with a window must launch the Triton kernel"
    result = reply.value
    assert isinstance(result, tuple) and len(result) == 2, "with return_lse=True, return (O, LSE)"
    out, got_lse = result
    assert isinstance(out, torch.Tensor) and out.dtype == q.dtype, f"O must be a tensor of q's dtype {q.dtype}"
    ref, ref_lse = reference_attention(q, k, v, True, sm_scale, **(options if reference is None else reference))
    sinks_said = "no learned sinks" if sinks is None else (
        "learned sinks " + ", ".join(f"{s:.3g}" for s in sinks.tolist()))
    layouts = f"layout {layout}" + (f", V layout {v_layout}" if v_layout and v_layout != layout else "")
    context = case_context(seed, q, k, True, f"window {window}", f"{sink_tokens} sink tokens", sinks_said, layouts,
                           *([f"sm_scale {sm_scale}"] if sm_scale is not None else []))
    try:
        assert_matches("O", out, ref, q.dtype, context)
        if lse:
            assert_lse_matches(got_lse, ref_lse, context)
    except AssertionError as failure:
        raise AssertionError(f"{_forward_first()}{failure}") from None


def _forward_first() -> str:
    """After a failure: a word first when the student's forward.py, whose helpers windows.py runs, is wrong on
    plain causal attention (the report keeps a failure's first line)."""
    from gqa_flash.course import testing
    from gqa_flash.reference import reference_attention

    q, k, v = random_qkv(n_q_heads=4, n_kv_heads=2, seq_len=40, head_dim=32, seed=0)
    try:
        out = student().call("flash_attention_forward", q, k, v, causal=True, watch=kernel_only()).value
        if testing.mismatch("O", out, reference_attention(q, k, v)[0], **testing.TOLERANCES[q.dtype]) is None:
            return ""
    except Exception:  # forward.py raises: it is not right either
        pass
    return ("forward.py is wrong on plain causal attention (tests/graded/test_forward.py), and windows.py runs on "
            "its helpers: make forward.py right first. ")


# --- ordinary use: 11 points (7.5 on O, 3.5 on the LSE) ---------------------------------------------------


GQA_CASES = [  # (Hq, Hkv, batch, N, D, dtype, W, S, K's layout, V's layout)
    (4, 4, 1, 45, 32, F32, 7, 2, "contiguous", "bnhd"),  # a window shorter than a key block
    (4, 2, 2, 70, 80, F16, 20, 5, "bnhd", "strided"),  # between a key block and a query tile
    (8, 2, 1, 77, 96, F32, 40, 20, "strided", "padded"),  # longer than a query tile; sink tokens inside it at first
    (4, 1, 1, 50, 32, F16, 3, 17, "contiguous", "padded"),  # sink tokens over two key blocks, far outside
]


@pytest.mark.points(4)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", GQA_CASES, ids=[f"{c[0]}:{c[1]}-d{c[4]}-w{c[6]}-s{c[7]}" for c in GQA_CASES])
def test_windows_gqa_heads_and_head_dims(seed, case):
    # GQA 1:1, 2:1 and 4:1, head dims 32, 80 and 96, fp32 and fp16; each case with a window, sink tokens and
    # learned sinks (head 0's -inf: that head has none).
    n_q_heads, n_kv_heads, batch, seq_len, head_dim, dtype, window, sink_tokens, layout, v_layout = case
    check_both(seed, window, sink_tokens, learned_sinks(n_q_heads, seed, minus_inf=True), dtype=dtype,
               layout=layout, v_layout=v_layout, batch=batch, n_q_heads=n_q_heads, n_kv_heads=n_kv_heads,
          seq_len=seq_len, head_dim=head_dim)


RAGGED_CASES = [  # (N, W, S, D, dtype, K's layout, V's layout): Hq 4 on Hkv 2
    (33, 16, 1, 32, F32, "contiguous", "strided"),  # the window one key block long
    (61, 32, 4, 80, F16, "bnhd", "contiguous"),  # one query tile long
    (100, 9, 40, 96, F32, "contiguous", "bnhd"),  # sink tokens over three key blocks
    (17, 5, 16, 32, F16, "strided", "padded"),  # one query tile, ragged; a whole key block of sink tokens
]


@pytest.mark.points(3.5)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", RAGGED_CASES, ids=[f"n{c[0]}-w{c[1]}-s{c[2]}" for c in RAGGED_CASES])
def test_windows_ragged_lengths_and_layouts(seed, case):
    # Lengths that are not a multiple of the tiles (the last query tile and key block partly padding), windows
    # as long as a key block and as a query tile, K and V in layouts of their own; no learned sinks.
    seq_len, window, sink_tokens, head_dim, dtype, layout, v_layout = case
    check_both(seed, window, sink_tokens, dtype=dtype, layout=layout, v_layout=v_layout,
               batch=2, n_q_heads=4, n_kv_heads=2, seq_len=seq_len, head_dim=head_dim)


LSE_CASES = [  # (Hq, Hkv, N, D, dtype, W, S, sm_scale)
    (4, 2, 45, 32, F32, 6, 3, 0.3),
    (8, 2, 70, 80, F16, 25, 10, None),
]


@pytest.mark.points(3.5)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", LSE_CASES, ids=[f"{c[0]}:{c[1]}-n{c[2]}-w{c[5]}" for c in LSE_CASES])
def test_windows_lse_counts_the_sinks(seed, case):
    # O, then the LSE: the natural log of the row's sum over the keys it sees, plus e^sink (a raw logit: no
    # sm_scale), float32 [B, Hq, N]. A chosen sm_scale, and one head whose sink is -inf.
    n_q_heads, n_kv_heads, seq_len, head_dim, dtype, window, sink_tokens, sm_scale = case
    check_both(seed, window, sink_tokens, learned_sinks(n_q_heads, seed, minus_inf=True), lse=True,
               sm_scale=sm_scale, dtype=dtype, batch=2, n_q_heads=n_q_heads, n_kv_heads=n_kv_heads,
               seq_len=seq_len, head_dim=head_dim)


# --- corner cases: 4 points ---------------------------------------------------------------------------------


@pytest.mark.points(1)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("window", [1, None], ids=["w1", "w-as-long-as-the-sequence"])
def test_windows_one_key_and_the_whole_sequence(seed, window):
    # W = 1: each row sees its own key alone, so its output is its own value. A window as long as the sequence
    # (and one longer) is causal attention, compared with the reference without a window.
    if window == 1:
        check(seed, 1, batch=1, n_q_heads=4, n_kv_heads=2, seq_len=40, head_dim=32)
        return
    qkv = random_qkv(seed=seed, batch=1, n_q_heads=4, n_kv_heads=2, seq_len=40, head_dim=32)
    for w in (40, 1000):
        check(seed, w, qkv=qkv, reference=dict(window=None))


@pytest.mark.points(0.5)
@pytest.mark.timeout(120)
def test_windows_a_sink_of_minus_infinity_is_no_sink(seed):
    # Every head's sink -inf: a column of weight 0, so O and the LSE are those of no sink at all.
    check(seed, 6, 2, torch.full((4,), float("-inf")), lse=True, reference=dict(window=6, sink_tokens=2),
          batch=1, n_q_heads=4, n_kv_heads=2, seq_len=45, head_dim=32)


@pytest.mark.points(2.5)
@pytest.mark.timeout(180)
@pytest.mark.parametrize("window, sink_tokens", [(5, 0), (20, 0), (9, 18), (1, 1)],
                         ids=["w5", "w20", "w9-s18", "w1-s1"])
def test_windows_skip_the_key_blocks_no_row_sees(seed, window, sink_tokens):
    # The point of a window: a query tile loads only the key blocks some row of it sees (the sink blocks and the
    # window's), about W + BLOCK_M keys however long the sequence. The interpreter counts each program's score
    # tiles (tl.dot of Q with a K tile); a loop from key 0 is right but does the work of causal attention.
    from gqa_flash.reference import visible

    seq_len = 100
    counts, config = student().score_tiles(kernel="windows", seq_len=seq_len, head_dim=32, window=window,
                                           sink_tokens=sink_tokens, seed=seed)
    block_m, block_n = config["BLOCK_M"], config["BLOCK_N"]
    n_tiles = -(-seq_len // block_m)
    assert counts, ("no score tile was seen: compute each key block's scores with tl.dot of the Q tile and "
                    f"the K tile (a [{block_m}, {block_n}] tile)")
    for program, got in counts.items():
        tile = int(program.split(",")[0])
        rows = torch.arange(tile * block_m, min((tile + 1) * block_m, seq_len))
        sees = visible(rows, torch.arange(seq_len), True, window, sink_tokens).any(dim=0)
        blocks = [b for b in range(-(-seq_len // block_n)) if sees[b * block_n:(b + 1) * block_n].any()]
        assert got <= len(blocks), (
            f"query tile {tile} (rows {rows[0]}..{rows[-1]}, window {window}, {sink_tokens} sink tokens, "
            f"SEQ_LEN {seq_len}, BLOCK_M {block_m}, BLOCK_N {block_n}) computed {got} score tiles where its rows "
            f"see keys of {len(blocks)} key blocks ({', '.join(map(str, blocks))}): a block no row of the tile "
            "sees must be skipped, never loaded")
    assert len(counts) == n_tiles * 2, f"programs that computed no score tile: {counts}"
