"""Bonus: sliding windows and attention sinks, added to your forward kernel.

Today's long-context models do not let every query see every earlier key.
GPT-OSS, Mistral and Gemma's local layers use a *sliding window*: query i
sees only the last W keys, i-W+1 .. i (itself included). StreamingLLM keeps
the first S keys, the *sink tokens*, in sight as well, whatever the window;
and GPT-OSS gives each query head a *learned sink*: one raw logit (not
multiplied by sm_scale) that joins every row's softmax as one more column,
takes its share of the weight, and is dropped before P @ V. The LSE counts
it. ``gqa_flash/reference.py`` (``reference_attention`` and ``visible``)
states all three in float64.

This file adds them to *your* kernel of forward.py: it reuses your helpers
(``forward.program_ids``, ``load_tile``, ``online_softmax_update``,
``mask_scores``, ``epilogue``) and replaces the key loop and the start of the
online softmax. A window is the causal skip with one more bound: the rows of
a query tile that starts at row q_start see, at most,

    [0, sink_end)                    the key blocks holding sink tokens
    (skipped)                        keys no row of the tile sees: never loaded
    [window_start, diagonal end)     the window: the first row's oldest key,
                                     rounded down to a block, to the tile's end

so a query tile reads about W + BLOCK_M keys (and the sink blocks) however
long the sequence: O(N W) work, where causal attention does O(N^2 / 2). Here
every block visited is masked, for simplicity (a faster kernel masks only the
blocks at the window's edges and the diagonal).

The key loop meets something forward.py never met: a row may see *none* of
the keys of the first block it visits (a sink block, or the window's first
block, seen by the tile's first rows only). Part 3 starts the online softmax
so that such a block leaves the row's state as it was.

The launch grid is forward.py's: (query tiles, batch * query heads).

What you write, in three ``@triton.jit`` helpers:

    Part 1  window_mask       which keys each row sees: causal, ragged tail, window, sink tokens
    Part 2  window_key_loop   the key blocks some row of the tile sees, each once; no other
    Part 3  sink_state        the online-softmax state before the first key, the sink folded in
"""

import torch
import triton
import triton.language as tl

from gqa_flash.course import impl, runtime  # runtime: picks the interpreter before the kernels below are defined

# Your forward.py (or the completed one, as GQA_FLASH_IMPL says): this file calls its helpers as
# forward.load_tile(...) and so on, inside the kernels below.
forward = impl.load("forward")


@triton.jit
def window_mask(s, offs_m, offs_n, SEQ_LEN, WINDOW, SINK_TOKENS):
    """Return ``s`` with -inf for the keys that row ``offs_m[i]`` must not see.

    ``s`` is a [BLOCK_M, BLOCK_N] tile of scores of query rows ``offs_m`` against keys ``offs_n``. Without a
    window the launcher passes WINDOW = SEQ_LEN (every earlier key is in it) and SINK_TOKENS = 0.
    """
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 1) ---
    # Four reasons hide key j from row i; the first two are forward.py's
    # Part 5 (with the causal mask on: a window looks back from each row), so
    # call your mask_scores for them rather than writing them again:
    #   * j is past SEQ_LEN (loaded as 0, a real score unless hidden);
    #   * j is in i's future (j > i);
    #   * j is older than i's window: the window holds the W keys
    #     i-W+1 .. i, the row's own key included;
    #   * unless j is a sink token (j < SINK_TOKENS): those stay in sight of
    #     every row that comes after them, however old.
    # Each row has a window of its own: row i and row i+1 of one tile see
    # different keys.
    # Invariants: W = 1 leaves each row its own key alone; W >= SEQ_LEN is
    # causal attention; a sink token is never seen from before its position.
    # Hint: one comparison of the key index with the row index (broadcast
    # as in Part 5) and one with SINK_TOKENS make the window's rule; your
    # mask_scores makes the rest.
    ### BEGIN SOLUTION
    s = forward.mask_scores(s, offs_m, offs_n, SEQ_LEN, True)
    in_window = offs_n[None, :] > offs_m[:, None] - WINDOW
    sink_token = offs_n[None, :] < SINK_TOKENS
    return tl.where(in_window | sink_token, s, float("-inf"))
    ### STUB
    # return s  # Placeholder: nothing is masked
    ### END SOLUTION
    # --- END OF STUDENT IMPLEMENTATION ---


@triton.jit
def window_key_loop(acc, l_i, m_i, q, K, V, batch_idx, kv_head_idx,
                    stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn, stride_vd,
                    q_tile_idx, offs_m, offs_d, qk_scale, SEQ_LEN, HEAD_DIM, WINDOW, SINK_TOKENS,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """Stream the key blocks some row of this query tile sees past it; return the new ``(acc, l_i, m_i)``.

    As forward.py's key_loop: ``q`` is the [BLOCK_M, HEAD_DIM_PAD] query tile (rows ``offs_m``, columns
    ``offs_d``), already loaded; ``acc``, ``l_i``, ``m_i`` hold the state Part 3 started.
    """
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 2) ---
    # forward.py's key loop walked every block from key 0 to the diagonal.
    # A window makes most of them dead weight: a key older than the first
    # row's window is older than every row's, so no row of the tile sees it.
    # Walk two runs of key blocks (the module's docstring draws them):
    #   * the sink blocks, from key 0: the blocks that hold sink tokens;
    #   * the window's blocks: from the block holding the tile's first row's
    #     oldest key to the diagonal, as far as forward.py's causal loop went.
    # Skip every other block: never loaded. Where the window reaches back
    # into the sink blocks, visit such a block once, not twice: a key
    # counted twice weighs double.
    # Each block: load its K and V tiles with your forward.load_tile, its
    # scores [BLOCK_M, BLOCK_N] in log2 units (q times the K tile
    # transposed, times qk_scale), Part 1's mask, then your
    # forward.online_softmax_update. Masking every block you visit is fine
    # here (forward.py left the off-diagonal blocks unmasked, for speed).
    # Invariants: every key block that some row < SEQ_LEN of the tile sees is
    # visited exactly once, and no other block is; both runs start on a
    # multiple of BLOCK_N; blocks past SEQ_LEN are never visited.
    # Hint: a Python range may start, as well as end, at a bound computed
    # from q_tile_idx; the oldest key row i sees is i - WINDOW + 1 (or 0).
    ### BEGIN SOLUTION
    q_start = q_tile_idx * BLOCK_M
    diagonal_end = tl.minimum(q_start + BLOCK_M, SEQ_LEN)
    window_start = tl.maximum(q_start - WINDOW + 1, 0) // BLOCK_N * BLOCK_N
    sink_end = tl.minimum(tl.cdiv(SINK_TOKENS, BLOCK_N) * BLOCK_N, window_start)
    for start_n in range(0, sink_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = forward.load_tile(K, batch_idx, kv_head_idx, offs_n, offs_d, stride_kb, stride_kh, stride_kn,
                              stride_kd, SEQ_LEN, HEAD_DIM)
        v = forward.load_tile(V, batch_idx, kv_head_idx, offs_n, offs_d, stride_vb, stride_vh, stride_vn,
                              stride_vd, SEQ_LEN, HEAD_DIM)
        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * qk_scale
        s = window_mask(s, offs_m, offs_n, SEQ_LEN, WINDOW, SINK_TOKENS)
        acc, l_i, m_i = forward.online_softmax_update(acc, l_i, m_i, s, v, INPUT_PRECISION)
    for start_n in range(window_start, diagonal_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = forward.load_tile(K, batch_idx, kv_head_idx, offs_n, offs_d, stride_kb, stride_kh, stride_kn,
                              stride_kd, SEQ_LEN, HEAD_DIM)
        v = forward.load_tile(V, batch_idx, kv_head_idx, offs_n, offs_d, stride_vb, stride_vh, stride_vn,
                              stride_vd, SEQ_LEN, HEAD_DIM)
        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * qk_scale
        s = window_mask(s, offs_m, offs_n, SEQ_LEN, WINDOW, SINK_TOKENS)
        acc, l_i, m_i = forward.online_softmax_update(acc, l_i, m_i, s, v, INPUT_PRECISION)
    return acc, l_i, m_i
    ### STUB
    # return acc, l_i, m_i  # Placeholder: no key is ever visited
    ### END SOLUTION
    # --- END OF STUDENT IMPLEMENTATION ---


@triton.jit
def sink_state(SINKS, q_head_idx, HAS_SINKS: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM_PAD: tl.constexpr):
    """The online-softmax state ``(acc, l_i, m_i)`` of each row before its first key, in log2 units.

    ``SINKS`` points to the learned sinks, [N_Q_HEADS] float32 raw logits (read only with HAS_SINKS);
    acc is [BLOCK_M, HEAD_DIM_PAD], l_i and m_i [BLOCK_M], all fp32.
    """
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 3) ---
    # forward.py started every row at m_i = -inf, l_i = 0, acc = 0: no key
    # yet. Two things change here.
    # The learned sink is one more column of the row's softmax, with a value
    # of zero: fold it in before the first key, as if it were a key block of
    # one score. It weighs in l_i (and so in the LSE) and adds nothing to acc.
    # It is a raw logit, in natural-log units and not scaled by sm_scale,
    # where the kernel's scores are in log2 units: convert it as qk_scale
    # converts the scores, without sm_scale. One sink per query head.
    # Then the start of the running max. A window makes rows meet blocks
    # they see none of, and a row may meet such a block before any key it
    # sees. forward.py's update, with m_i = -inf and a block of -inf scores,
    # computes 2^(-inf - (-inf)): NaN, and the row is lost. Start m_i at a
    # finite floor instead, far below any real score (-1e30, say), and raised
    # to the sink where there is one: then a fully masked block changes
    # nothing (its scores weigh 2^(-inf) = 0 against a finite max), and the
    # first real score replaces the floor (the rescale factor
    # 2^(floor - score) wipes the empty state). l_i starts as the sink's
    # weight measured against that m_i: 1 for a real sink, 0 for none.
    # Without sinks (HAS_SINKS false: SINKS must not be read), the sink is
    # -inf, a column of weight 0; a sink of -inf is the same as none.
    # Invariants: m_i finite; l_i * 2^m_i = e^sink (0 without one); acc = 0.
    # Hint: HAS_SINKS is a compile-time constant, like forward.py's CAUSAL.
    ### BEGIN SOLUTION
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    if HAS_SINKS:
        logit = tl.load(SINKS + q_head_idx).to(tl.float32)
        sink = tl.zeros([BLOCK_M], dtype=tl.float32) + logit * 1.4426950408889634  # log2(e), and no sm_scale
    else:
        sink = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    m_i = tl.maximum(sink, -1e30)
    l_i = tl.exp2(sink - m_i)
    return acc, l_i, m_i
    ### STUB
    # acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    # l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    # m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    # return acc, l_i, m_i  # Placeholder: forward.py's start, no sink
    ### END SOLUTION
    # --- END OF STUDENT IMPLEMENTATION ---


@triton.jit
def _windowed_attention_kernel(
    # Pointers to the tensors, and the learned sinks ([N_Q_HEADS] float32; unread without HAS_SINKS)
    Q, K, V, O, LSE, SINKS,
    # Strides, in elements, of every dimension: [batch, heads, seq, head_dim]
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_lb, stride_lh, stride_ln,
    # Sizes, the softmax scale and the window (WINDOW = SEQ_LEN without one)
    sm_scale,
    SEQ_LEN,
    N_Q_HEADS,
    N_KV_HEADS,
    WINDOW,
    SINK_TOKENS,
    # Compile-time constants, as in forward.py
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    tl.static_assert(BLOCK_M % BLOCK_N == 0, "BLOCK_M must be a multiple of BLOCK_N")

    # forward.py's Part 1: which query tile, batch and heads are this program's.
    q_tile_idx, batch_idx, q_head_idx, kv_head_idx = forward.program_ids(N_Q_HEADS, N_KV_HEADS)
    offs_m = q_tile_idx * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)

    # forward.py's Part 2: the Q tile, loaded once.
    q = forward.load_tile(Q, batch_idx, q_head_idx, offs_m, offs_d, stride_qb, stride_qh, stride_qn, stride_qd,
                          SEQ_LEN, HEAD_DIM)

    # Part 3: the state before the first key, the learned sink already in it.
    acc, l_i, m_i = sink_state(SINKS, q_head_idx, HAS_SINKS, BLOCK_M, HEAD_DIM_PAD)
    qk_scale = sm_scale * 1.4426950408889634  # log2(e): scores come out in log2 units

    # Part 2 (with Part 1 and forward.py's Part 4 inside): the key blocks some row of the tile sees.
    acc, l_i, m_i = window_key_loop(acc, l_i, m_i, q, K, V, batch_idx, kv_head_idx,
                                    stride_kb, stride_kh, stride_kn, stride_kd,
                                    stride_vb, stride_vh, stride_vn, stride_vd,
                                    q_tile_idx, offs_m, offs_d, qk_scale, SEQ_LEN, HEAD_DIM, WINDOW, SINK_TOKENS,
                                    BLOCK_M, BLOCK_N, INPUT_PRECISION)

    # forward.py's Part 6: normalise, store O and the LSE (which counts the sink: it is in l_i). A row past
    # SEQ_LEN (never stored) may see no key at all: l_i = 1 there spares the epilogue a division by 0.
    l_i = tl.where(offs_m < SEQ_LEN, l_i, 1.0)
    forward.epilogue(acc, l_i, m_i, O, LSE, batch_idx, q_head_idx, offs_m, offs_d,
                     stride_ob, stride_oh, stride_on, stride_od, stride_lb, stride_lh, stride_ln, SEQ_LEN, HEAD_DIM)


# --- Choosing tiles --------------------------------------------------------
#
# In the interpreter, forward.py's tile: BLOCK_M = 2 * BLOCK_N. On a GPU one fixed tile, forward.py's
# autotuner's most frequent winner, smaller where big tiles run out of registers (head_dim > 128, fp32):
# this kernel masks every block it visits, so it is for learning, not for speed (gqa_flash/fast/ is).
INTERPRETER_CONFIG = dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1)
GPU_CONFIG = dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
GPU_CONFIG_BIG = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)


def windowed_attention_forward(q, k, v, window=None, sink_tokens=0, sinks=None, sm_scale=None, return_lse=False,
                               config=None):
    """Causal attention with a sliding ``window``, ``sink_tokens`` and learned ``sinks``: launch the kernel.

    ``q``: [B, Hq, N, D]; ``k``, ``v``: [B, Hkv, N, D], any strides; ``window``: W >= 1 keys or None (no
    window); ``sink_tokens``: S >= 0 (with a window); ``sinks``: [Hq] raw logits or None. As
    ``gqa_flash.reference.reference_attention(q, k, v, True, sm_scale, window=..., sink_tokens=...,
    sinks=...)``. Returns O ([B, Hq, N, D], q's dtype) and, with ``return_lse``, the natural-log LSE
    ([B, Hq, N], float32), which counts the sinks. The public API (``gqa_flash.flash_attention_forward(...,
    window=..., sink_tokens=..., sinks=...)``) checks the inputs before it calls this. ``config`` (a dict of
    BLOCK_M, BLOCK_N, num_warps, num_stages) replaces the fixed tile, for benchmarks.
    """
    batch, n_q_heads, seq_len, head_dim = q.shape
    n_kv_heads = k.shape[1]
    if sm_scale is None:
        sm_scale = head_dim ** -0.5
    head_dim_pad = max(16, triton.next_power_of_2(head_dim))
    # NaN in the interpreter until the kernel writes them (runtime.empty_output), uninitialised on a GPU
    o = runtime.empty_output((batch, n_q_heads, seq_len, head_dim), q.dtype, q.device)
    lse = runtime.empty_output((batch, n_q_heads, seq_len), torch.float32, q.device)
    if sinks is None:  # a stand-in the kernel never reads (HAS_SINKS=False)
        sinks, has_sinks = torch.zeros(1, dtype=torch.float32, device=q.device), False
    else:
        sinks, has_sinks = sinks.detach().to(torch.float32).contiguous(), True

    if config is None and (runtime.INTERPRETER or not q.is_cuda):
        config = INTERPRETER_CONFIG
    elif config is None:
        config = GPU_CONFIG_BIG if head_dim_pad > 128 or q.dtype == torch.float32 else GPU_CONFIG
    # One program per query tile (axis 0) and per (batch, query head) (axis 1), as in forward.py.
    grid = (triton.cdiv(seq_len, config["BLOCK_M"]), batch * n_q_heads)
    _windowed_attention_kernel[grid](
        q, k, v, o, lse, sinks,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(), *lse.stride(),
        sm_scale, seq_len, n_q_heads, n_kv_heads,
        seq_len if window is None else int(window),  # no window: every earlier key is within SEQ_LEN of a row
        0 if window is None else int(sink_tokens),
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=head_dim_pad,
        HAS_SINKS=has_sinks,
        INPUT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        **config,
    )
    return (o, lse) if return_lse else o
