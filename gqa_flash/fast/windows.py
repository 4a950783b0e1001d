"""Sliding windows and attention sinks in the fast kernels: which keys a query sees, and which blocks to walk.

Finish ``gqa_flash/windows.py`` (notebook 04b, a bonus) before you read this file: it walks the same key blocks,
and its start_state is that file's Part 3.

A sliding ``window`` W (causal only) lets query i see keys i-W+1 .. i, itself included; ``sink_tokens`` S
keeps keys 0 .. S-1 in sight too, whatever the window (StreamingLLM); learned ``sinks`` (GPT-OSS), one raw
logit a query head, are one more column in every row's softmax, counted in the LSE and dropped before
P @ V. ``gqa_flash.reference`` states all three in float64.

The window is the causal skip with a third bound. A query tile's keys fall into four runs of key blocks,
and the kernels walk each run with the mask it needs and no more:

    [0, sink_end)         blocks holding sink tokens and nothing else in sight: masked
    (skipped)             keys no row of the tile sees: never loaded
    [lo, clear_lo)        the window's lower edge, seen by some rows only: masked
    [clear_lo, diagonal)  seen whole by every row: no mask
    the diagonal          the causal edge, as without a window: masked

so a query tile reads about W + BLOCK_M keys however long the sequence: O(N W) work, not O(N^2 / 2).
The backward's dK/dV pass walks the same picture from a key block's side (``window_query_blocks``).
"""

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def seen(q_pos, k_pos, SEQ_LEN, CAUSAL: tl.constexpr, WINDOWED: tl.constexpr, WINDOW, SINK_TOKENS):
    """Which keys each query sees: ``q_pos`` and ``k_pos`` broadcast to the tile's shape (rows or columns)."""
    keep = k_pos < SEQ_LEN
    if CAUSAL:
        keep = keep & (k_pos <= q_pos)
    if WINDOWED:
        keep = keep & ((k_pos > q_pos - WINDOW) | (k_pos < SINK_TOKENS))
    return keep


@triton.jit
def window_key_blocks(first_row, end_row, diagonal, WINDOW, SINK_TOKENS, BLOCK_N: tl.constexpr):
    """The key runs of the query rows first_row .. end_row - 1, whose causal diagonal starts at key block
    ``diagonal`` (a multiple of BLOCK_N, at most first_row): ``(sink_end, lo, clear_lo)``, the masked sink
    blocks [0, sink_end), the masked lower edge [lo, clear_lo) and the clear run [clear_lo, diagonal)."""
    lo = tl.minimum(tl.maximum(first_row - WINDOW + 1, 0) // BLOCK_N * BLOCK_N, diagonal)
    # A key k is seen by every row once k > (end_row - 1) - WINDOW, so from the block holding end_row - WINDOW.
    clear_lo = tl.cdiv(tl.maximum(end_row - WINDOW, 0), BLOCK_N) * BLOCK_N
    clear_lo = tl.maximum(tl.minimum(clear_lo, diagonal), lo)
    sink_end = tl.minimum(tl.cdiv(SINK_TOKENS, BLOCK_N) * BLOCK_N, lo)
    return sink_end, lo, clear_lo


@triton.jit
def window_query_blocks(n0, SEQ_LEN, WINDOW, SINK_TOKENS, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The query runs after the diagonal that see key block n0 .. n0 + BLOCK_N - 1: ``(clear_end, edge_end)``,
    rows [n0 + BLOCK_N, clear_end) see every key of it (no mask), rows [clear_end, edge_end) some (masked).
    A block of sink tokens only is seen whole to the end; one holding some sink tokens, in part."""
    start = n0 + BLOCK_N
    clear_end = tl.maximum((n0 + WINDOW) // BLOCK_M * BLOCK_M, start)  # row i sees all once i < n0 + WINDOW
    clear_end = tl.where(n0 + BLOCK_N <= SINK_TOKENS, SEQ_LEN, tl.minimum(clear_end, SEQ_LEN))
    edge_end = tl.where(n0 < SINK_TOKENS, SEQ_LEN, tl.minimum(n0 + BLOCK_N - 1 + WINDOW, SEQ_LEN))
    return clear_end, tl.maximum(edge_end, clear_end)


@triton.jit
def start_state(ROWS: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, SINKS, head, HAS_SINKS: tl.constexpr):
    """The online softmax's state before the first key, in log2 units: no key yet (m = -inf, l = 0), or with a
    learned sink the sink's own column already folded in (m = sink, l = exp2(sink - m) = 1, nothing in acc)."""
    acc = tl.zeros([ROWS, HEAD_DIM_PAD], dtype=tl.float32)
    if HAS_SINKS:
        sink = tl.load(SINKS + head).to(tl.float32) * 1.4426950408889634  # a raw logit: no sm_scale
        return acc, tl.full([ROWS], 1.0, dtype=tl.float32), tl.full([ROWS], 0.0, dtype=tl.float32) + sink
    return acc, tl.zeros([ROWS], dtype=tl.float32), tl.full([ROWS], float("-inf"), dtype=tl.float32)


def kernel_window(window, sink_tokens):
    """(WINDOWED, WINDOW, SINK_TOKENS) for a launch: no window is WINDOWED=False, and then no sink tokens."""
    return (window is not None), (0 if window is None else int(window)), (0 if window is None else int(sink_tokens))


def kernel_sinks(sinks, stand_in):
    """The sinks a kernel reads (fp32, contiguous) and HAS_SINKS. Without sinks the kernel never reads SINKS, so
    ``stand_in`` (an fp32 tensor the call has already, such as its LSE) fills the argument: nothing is allocated."""
    if sinks is None:
        return stand_in, False
    return sinks.detach().to(torch.float32).contiguous(), True


def sink_gradient(sinks, lse, delta):
    """dL/dsink[h] = -sum over the rows of head h of P_sink * D, where P_sink = exp(sink - LSE) is the weight
    the row gave its sink and D = rowsum(dO * O): the sink's column of dS = P (dP - D) has dP = 0 (its value is
    zero). ``lse`` and ``delta`` are [B, Hq, N] fp32. In ``sinks``' dtype."""
    p_sink = torch.exp(sinks.float()[None, :, None] - lse)
    return (-(p_sink * delta).sum(dim=(0, 2))).to(sinks.dtype)
