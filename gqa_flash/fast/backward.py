"""The course's fastest backward pass: the graded backward plus what a GPU rewards.

Finish ``gqa_flash/backward.py`` (notebook 06) before you read this file.
It ships complete, and its kernels answer backward.py's parts almost line
for line: which blocks each walk visits under the causal mask, the units of
the LSE, where sm_scale goes. Read it afterwards, as you would a course's
published solution, to see what a GPU rewards.

Not graded, and not for students to write: the maths is that of the graded
``gqa_flash/backward.py`` (recompute P from the saved LSE, D = rowsum(dO * O),
dS = P * (dP - D)), and one program still owns one key block of one KV head
and walks every query head of its group, so dK and dV are summed in
registers. What changes:

1. dQ two ways, chosen per call (``dq_mode``). The graded backward computes
   dQ in a second kernel, which recomputes S = QK^T and dP = dO V^T for
   every tile: 7 matrix products per tile instead of 5.
   ``"atomic"``: one pass. The program that has dS^T for a (key block,
   query block) tile also forms that tile's share of dQ, dS @ K, and adds it
   into an fp32 dQ buffer with atomic adds; every key block of the row adds
   its share. The price: additions arrive in no fixed order, so dQ can
   differ in its last bits from run to run (dK and dV cannot: they are
   summed in registers in a fixed order), an fp32 buffer to zero, scale and
   cast, and the atomics themselves, 8192 of them a 64 x 128 tile.
   ``"separate"``: two passes, the graded design in this file's style. The
   dK/dV kernel leaves dQ out (a constexpr switch, so the compiled kernel
   holds no dQ tile in its registers or shared memory), and
   ``_fast_dq_kernel`` owns one query block of one query head: it walks the
   key blocks up to the diagonal and sums dS K in registers. Two products a
   tile more than one pass, but no atomics and no fp32 buffer, and dQ
   comes out the same bits every run.
   Measured on the H200 in one run (``notebooks/data/h200_backward_dq_modes.csv``),
   two passes won at every shape, and are the default (``default_dq_mode``):
   see that function for the numbers.
2. Masks only where they matter. Under the causal mask, the query blocks
   that overlap this key block (the diagonal) need the mask; every later
   query block sees the whole key block. Padding rows need no mask at all:
   the TMA loads them as zeros, so they add 0 to dK, dV and dQ. Keys past
   the end (a ragged last key block) load as zeros too; against a very
   negative LSE their exp2 overflows, but a key's P and dS only reach its
   own row of dK and dV, which the TMA never stores. Only in one-pass mode,
   where dS also reaches dQ, is that block masked everywhere. (The masked
   copy of the loop cost the two-pass kernel its own registers and pipeline
   buffers: at head_dim 128, 64 x 128 on 8 warps went from 193 KiB of
   shared memory and a 76-byte spill to 128 KiB and none, ptxas.) The dQ
   kernel masks only the key blocks on its diagonal, or the ragged last one.
3. Tensor descriptors built on the host (the TMA, as in
   ``gqa_flash/fast/forward.py``), and the heaviest blocks first: under
   the causal mask key block 0 is seen by every query, the last one by the
   fewest; for dQ the last query block sees the most keys.
4. One loop for the whole KV group (``FLAT``, an autotuner choice). The
   graded kernel's dK/dV program runs two loops for each query head of the
   group (its diagonal, then the rest); each loop starts Triton's software
   pipeline afresh, and the compiled kernel holds the state of all of them.
   ``_group_steps`` instead walks (head, query block) pairs in one loop:
   fewer registers (ptxas) and no restart between heads; measured, it wins
   at 4k and not everywhere at 16k, so the autotuner picks (see
   ``SEPARATE_CONFIGS``).

D = rowsum(dO * O): in two passes the dQ pass computes it for its own rows (it
holds dO already, and only needs O's tile more) and runs first, so the dK/dV
pass reads it; one pass takes it from a small kernel of its own
(``_delta_kernel``), launched first.
Inputs the TMA cannot read (a last dim with stride != 1, rows that
are not a multiple of 16 bytes, an unaligned base; an incoming gradient
expanded from a scalar is one) are copied first into a layout it can, as in
the forward. fp32 runs the same kernels with ieee products and, on a GPU, a
fixed small tile (``FP32_CONFIG``, ``DQ_FP32_CONFIG``) instead of the
autotuner. It runs in the interpreter too, so the CPU tests check both modes
against float64 autograd.

Adding each dQ tile with one bulk reduction of the TMA
(``desc.atomic_add``) instead of per-element atomics was measured and
removed: bench/RESULTS.md.
"""

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from gqa_flash.course import runtime
from gqa_flash.fast.forward import fixed_config, input_precision, remember
from gqa_flash.fast.memory import empty_readable, readable
from gqa_flash.fast.windows import kernel_window, seen, sink_gradient, window_key_blocks, window_query_blocks


@triton.jit
def _delta_kernel(o_desc, do_desc, Delta, SEQ_LEN, N_HEADS, ROWS: tl.constexpr, HEAD_DIM_PAD: tl.constexpr):
    """Delta[b, h, r] = sum over the head dim of dO * O, for ROWS rows of one (batch, head).

    The TMA loads the rows past SEQ_LEN and the columns past the head dim as zeros,
    so only the store is masked. Products and sum in fp32, whatever the input dtype.
    """
    row0 = tl.program_id(0) * ROWS
    bh = tl.program_id(1)
    batch = bh // N_HEADS
    head = bh % N_HEADS
    o = o_desc.load([batch, head, row0, 0]).reshape(ROWS, HEAD_DIM_PAD).to(tl.float32)
    do = do_desc.load([batch, head, row0, 0]).reshape(ROWS, HEAD_DIM_PAD).to(tl.float32)
    rows = row0 + tl.arange(0, ROWS)
    tl.store(Delta + bh.to(tl.int64) * SEQ_LEN + rows, tl.sum(o * do, axis=1), mask=rows < SEQ_LEN)


@triton.jit
def _key_block_step(dk, dv, k, v, q_desc, do_desc, DQ, LSE, Delta, batch, q_head, bh, offs_n,
                    start, end, qk_scale, SEQ_LEN, HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                    MASKED: tl.constexpr, CAUSAL: tl.constexpr, DQ_ATOMIC: tl.constexpr,
                    INPUT_PRECISION: tl.constexpr, WINDOWED: tl.constexpr, WINDOW, SINK_TOKENS):
    """Add the query blocks start..end of one query head into dk, dv (registers) and, with
    DQ_ATOMIC, into DQ (atomics)."""
    for m0 in tl.range(start, end, BLOCK_M):
        dk, dv = _query_block(dk, dv, k, v, q_desc, do_desc, DQ, LSE, Delta, batch, q_head, bh, offs_n, m0,
                              qk_scale, SEQ_LEN, HEAD_DIM_PAD, BLOCK_M, MASKED, CAUSAL, DQ_ATOMIC, INPUT_PRECISION,
                              WINDOWED, WINDOW, SINK_TOKENS)
    return dk, dv


@triton.jit
def _group_steps(dk, dv, k, v, q_desc, do_desc, DQ, LSE, Delta, batch, kv_head, group_size, N_Q_HEADS, offs_n,
                 start, n_steps, qk_scale, SEQ_LEN, HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                 MASKED: tl.constexpr, CAUSAL: tl.constexpr, DQ_ATOMIC: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                 WINDOWED: tl.constexpr, WINDOW, SINK_TOKENS):
    """The query blocks start, start + BLOCK_M, ... (n_steps of them) of every query head of the
    group, in one loop: head after head, so the software pipeline starts once, not once a head."""
    per_head = tl.maximum(n_steps, 1)  # the loop is empty when n_steps is 0: never divide by it
    for step in tl.range(0, group_size * n_steps):
        h = step // per_head
        m0 = start + (step - h * per_head) * BLOCK_M
        q_head = kv_head * group_size + h
        bh = (batch * N_Q_HEADS + q_head).to(tl.int64)
        dk, dv = _query_block(dk, dv, k, v, q_desc, do_desc, DQ, LSE, Delta, batch, q_head, bh, offs_n, m0,
                              qk_scale, SEQ_LEN, HEAD_DIM_PAD, BLOCK_M, MASKED, CAUSAL, DQ_ATOMIC, INPUT_PRECISION,
                              WINDOWED, WINDOW, SINK_TOKENS)
    return dk, dv


@triton.jit
def _query_block(dk, dv, k, v, q_desc, do_desc, DQ, LSE, Delta, batch, q_head, bh, offs_n, m0, qk_scale, SEQ_LEN,
                 HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                 DQ_ATOMIC: tl.constexpr, INPUT_PRECISION: tl.constexpr, WINDOWED: tl.constexpr, WINDOW, SINK_TOKENS):
    """One query block of one query head against this program's key block."""
    offs_m = m0 + tl.arange(0, BLOCK_M)
    m_ok = offs_m < SEQ_LEN
    q = q_desc.load([batch, q_head, m0, 0]).reshape(BLOCK_M, HEAD_DIM_PAD)
    do = do_desc.load([batch, q_head, m0, 0]).reshape(BLOCK_M, HEAD_DIM_PAD)
    lse2 = tl.load(LSE + bh * SEQ_LEN + offs_m, mask=m_ok, other=0.0) * 1.4426950408889634
    delta = tl.load(Delta + bh * SEQ_LEN + offs_m, mask=m_ok, other=0.0)
    # The tile transposed, keys down the rows: dk and dv come out one row per key.
    p_t = tl.exp2(tl.dot(k, tl.trans(q), input_precision=INPUT_PRECISION) * qk_scale - lse2[None, :])
    if MASKED:
        p_t = tl.where(seen(offs_m[None, :], offs_n[:, None], SEQ_LEN, CAUSAL, WINDOWED, WINDOW, SINK_TOKENS), p_t, 0.0)
    dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=INPUT_PRECISION)
    dp_t = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)
    ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)
    dk = tl.dot(ds_t, q, dk, input_precision=INPUT_PRECISION)
    if DQ_ATOMIC:  # a constexpr: in two-pass mode this code is not compiled at all
        # This tile's share of dQ (sm_scale is applied once, on the host), one atomic add per element.
        dq = tl.dot(tl.trans(ds_t), k, input_precision=INPUT_PRECISION)
        dq_ptrs = DQ + (bh * SEQ_LEN + offs_m[:, None]) * HEAD_DIM_PAD + tl.arange(0, HEAD_DIM_PAD)[None, :]
        tl.atomic_add(dq_ptrs, dq, mask=m_ok[:, None], sem="relaxed")
    return dk, dv


# Triton compiles an integer argument equal to 1 as a constant, so a batch of one (every 16k
# sequence) or one KV head (MQA) would cost a compilation of every autotuner config of its own.
# These three are only used for index arithmetic, once a program: left unspecialised.
_HEAD_COUNTS = ["BATCH", "N_Q_HEADS", "N_KV_HEADS"]


@triton.jit(do_not_specialize=_HEAD_COUNTS)
def _fast_backward_kernel(
    q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, DQ, LSE, Delta,
    sm_scale, SEQ_LEN, BATCH, N_Q_HEADS, N_KV_HEADS, WINDOW, SINK_TOKENS,
    HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    DQ_ATOMIC: tl.constexpr, INPUT_PRECISION: tl.constexpr, FLAT: tl.constexpr = False,
    WINDOWED: tl.constexpr = False,
):
    """dK, dV of one key block of one KV head (summed over its group), and with DQ_ATOMIC its share of dQ.

    DQ is an fp32 [B, Hq, N, HEAD_DIM_PAD] buffer of zeros (not touched without DQ_ATOMIC);
    LSE and Delta are [B, Hq, N] fp32.
    """
    tl.static_assert(BLOCK_N % BLOCK_M == 0, "BLOCK_N must be a multiple of BLOCK_M")
    pid = tl.program_id(0)
    batch_kv = pid % (BATCH * N_KV_HEADS)
    n_block = pid // (BATCH * N_KV_HEADS)  # key block 0, the heaviest, first
    batch = batch_kv // N_KV_HEADS
    kv_head = batch_kv % N_KV_HEADS
    group_size = N_Q_HEADS // N_KV_HEADS

    n0 = n_block * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    k = k_desc.load([batch, kv_head, n0, 0]).reshape(BLOCK_N, HEAD_DIM_PAD)
    v = v_desc.load([batch, kv_head, n0, 0]).reshape(BLOCK_N, HEAD_DIM_PAD)
    dk = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # log2(e)
    ragged = n0 + BLOCK_N > SEQ_LEN
    # The query rows after the diagonal: [start, clear_end) see every key of this block, [clear_end, edge_end)
    # only some (a window's far edge; gqa_flash/fast/windows.py). Without a window that second run is empty.
    start = n0 + BLOCK_N if CAUSAL else 0
    clear_end = SEQ_LEN
    if WINDOWED:
        clear_end, edge_end = window_query_blocks(n0, SEQ_LEN, WINDOW, SINK_TOKENS, BLOCK_M, BLOCK_N)
    else:
        edge_end = clear_end

    if FLAT:  # the group's query heads one after another in one loop (one pipeline start) a run
        if CAUSAL:
            diag_end = tl.minimum(n0 + BLOCK_N, SEQ_LEN)
            dk, dv = _group_steps(dk, dv, k, v, q_desc, do_desc, DQ, LSE, Delta, batch, kv_head, group_size,
                                  N_Q_HEADS, offs_n, n0, tl.cdiv(diag_end - n0, BLOCK_M), qk_scale, SEQ_LEN,
                                  HEAD_DIM_PAD, BLOCK_M, True, CAUSAL, DQ_ATOMIC, INPUT_PRECISION, WINDOWED, WINDOW,
                                  SINK_TOKENS)
        n_clear = tl.cdiv(tl.maximum(clear_end - start, 0), BLOCK_M)
        if DQ_ATOMIC and ragged:  # keys past SEQ_LEN would reach dQ: masked (item 2)
            dk, dv = _group_steps(dk, dv, k, v, q_desc, do_desc, DQ, LSE, Delta, batch, kv_head, group_size,
                                  N_Q_HEADS, offs_n, start, n_clear, qk_scale, SEQ_LEN, HEAD_DIM_PAD, BLOCK_M, True,
                                  CAUSAL, DQ_ATOMIC, INPUT_PRECISION, WINDOWED, WINDOW, SINK_TOKENS)
        else:
            dk, dv = _group_steps(dk, dv, k, v, q_desc, do_desc, DQ, LSE, Delta, batch, kv_head, group_size,
                                  N_Q_HEADS, offs_n, start, n_clear, qk_scale, SEQ_LEN, HEAD_DIM_PAD, BLOCK_M, False,
                                  CAUSAL, DQ_ATOMIC, INPUT_PRECISION, WINDOWED, WINDOW, SINK_TOKENS)
        if WINDOWED:
            edge_start = tl.maximum(clear_end, start)
            dk, dv = _group_steps(dk, dv, k, v, q_desc, do_desc, DQ, LSE, Delta, batch, kv_head, group_size,
                                  N_Q_HEADS, offs_n, edge_start, tl.cdiv(tl.maximum(edge_end - edge_start, 0), BLOCK_M),
                                  qk_scale, SEQ_LEN, HEAD_DIM_PAD, BLOCK_M, True, CAUSAL, DQ_ATOMIC, INPUT_PRECISION,
                                  WINDOWED, WINDOW, SINK_TOKENS)
    else:  # one loop a query head and run: its diagonal, then the rest
        for h in range(0, group_size):
            q_head = kv_head * group_size + h
            bh = (batch * N_Q_HEADS + q_head).to(tl.int64)  # row of LSE, Delta and DQ
            if CAUSAL:  # the diagonal: query blocks that overlap this key block, masked
                dk, dv = _key_block_step(
                    dk, dv, k, v, q_desc, do_desc, DQ, LSE, Delta, batch, q_head, bh, offs_n,
                    n0, tl.minimum(n0 + BLOCK_N, SEQ_LEN), qk_scale, SEQ_LEN, HEAD_DIM_PAD, BLOCK_M,
                    True, CAUSAL, DQ_ATOMIC, INPUT_PRECISION, WINDOWED, WINDOW, SINK_TOKENS)
            if DQ_ATOMIC and ragged:  # keys past SEQ_LEN would reach dQ: masked (item 2)
                dk, dv = _key_block_step(
                    dk, dv, k, v, q_desc, do_desc, DQ, LSE, Delta, batch, q_head, bh, offs_n,
                    start, clear_end, qk_scale, SEQ_LEN, HEAD_DIM_PAD, BLOCK_M, True, CAUSAL, DQ_ATOMIC,
                    INPUT_PRECISION, WINDOWED, WINDOW, SINK_TOKENS)
            else:  # no mask at all
                dk, dv = _key_block_step(
                    dk, dv, k, v, q_desc, do_desc, DQ, LSE, Delta, batch, q_head, bh, offs_n,
                    start, clear_end, qk_scale, SEQ_LEN, HEAD_DIM_PAD, BLOCK_M, False, CAUSAL, DQ_ATOMIC,
                    INPUT_PRECISION, WINDOWED, WINDOW, SINK_TOKENS)
            if WINDOWED:  # the window's far edge
                dk, dv = _key_block_step(
                    dk, dv, k, v, q_desc, do_desc, DQ, LSE, Delta, batch, q_head, bh, offs_n,
                    tl.maximum(clear_end, start), edge_end, qk_scale, SEQ_LEN, HEAD_DIM_PAD, BLOCK_M, True, CAUSAL,
                    DQ_ATOMIC, INPUT_PRECISION, WINDOWED, WINDOW, SINK_TOKENS)

    dk = dk * sm_scale  # S = Q K^T * sm_scale, so dK picks up the scale once
    dk_desc.store([batch, kv_head, n0, 0], dk.to(dk_desc.dtype).reshape(1, 1, BLOCK_N, HEAD_DIM_PAD))
    dv_desc.store([batch, kv_head, n0, 0], dv.to(dv_desc.dtype).reshape(1, 1, BLOCK_N, HEAD_DIM_PAD))


@triton.jit
def _dq_key_blocks(dq, q, do, lse2, delta, offs_m, k_desc, v_desc, batch, kv_head, start, end, qk_scale, SEQ_LEN,
                   BLOCK_N: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                   INPUT_PRECISION: tl.constexpr, WINDOWED: tl.constexpr, WINDOW, SINK_TOKENS):
    """Add the key blocks start..end (in steps of BLOCK_N) of one KV head into one query block's dq."""
    for n0 in tl.range(start, end, BLOCK_N):
        k = k_desc.load([batch, kv_head, n0, 0]).reshape(BLOCK_N, HEAD_DIM_PAD)
        v = v_desc.load([batch, kv_head, n0, 0]).reshape(BLOCK_N, HEAD_DIM_PAD)
        # The tile the other way round from _key_block_step: queries down the rows, so that dq
        # comes out one row per query. P again from the scores and the saved LSE, exactly.
        prob = tl.exp2(tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * qk_scale - lse2[:, None])
        if MASKED:  # before the product: a hidden key's exp2 may be inf
            key = n0 + tl.arange(0, BLOCK_N)
            prob = tl.where(seen(offs_m[:, None], key[None, :], SEQ_LEN, CAUSAL, WINDOWED, WINDOW, SINK_TOKENS), prob,
                            0.0)
        grad_p = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)
        grad_s = prob * (grad_p - delta[:, None])
        dq = tl.dot(grad_s.to(k.dtype), k, dq, input_precision=INPUT_PRECISION)
    return dq


@triton.jit(do_not_specialize=_HEAD_COUNTS)
def _fast_dq_kernel(
    q_desc, k_desc, v_desc, do_desc, o_desc, dq_desc, LSE, Delta,
    sm_scale, SEQ_LEN, BATCH, N_Q_HEADS, N_KV_HEADS, WINDOW, SINK_TOKENS,
    HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, WINDOWED: tl.constexpr = False,
):
    """dQ of one block of BLOCK_M queries of one query head (``dq_mode="separate"``), and D of its rows.

    Written straight into dq_desc, in the inputs' dtype: summed in fp32 registers in a fixed
    order, scaled once, stored once (the TMA clips the rows past SEQ_LEN and the padded columns).
    D = rowsum(dO * O) goes into Delta ([B, Hq, N] fp32) for the dK/dV pass, launched after this one.
    """
    # pid = query_block_order * (BATCH * N_Q_HEADS) + batch * N_Q_HEADS + q_head: a block's
    # neighbours in the launch are the other query heads of the same KV head, at the same row.
    pid = tl.program_id(0)
    bh = pid % (BATCH * N_Q_HEADS)
    order = pid // (BATCH * N_Q_HEADS)
    batch = bh // N_Q_HEADS
    q_head = bh % N_Q_HEADS
    kv_head = q_head // (N_Q_HEADS // N_KV_HEADS)
    if CAUSAL:  # the last query block sees the most keys: it goes first
        m_block = tl.cdiv(SEQ_LEN, BLOCK_M) - 1 - order
    else:
        m_block = order
    m0 = m_block * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)

    q = q_desc.load([batch, q_head, m0, 0]).reshape(BLOCK_M, HEAD_DIM_PAD)
    do = do_desc.load([batch, q_head, m0, 0]).reshape(BLOCK_M, HEAD_DIM_PAD)
    in_seq = offs_m < SEQ_LEN
    row = bh.to(tl.int64) * SEQ_LEN + offs_m  # LSE and Delta are [B, Hq, N]
    # A padding row reads LSE 0 and D 0; its dO is 0, so its dS is 0 and it adds nothing.
    lse2 = tl.load(LSE + row, mask=in_seq, other=0.0) * 1.4426950408889634  # natural log to log2
    # D of these rows, here rather than in a kernel of its own: this program holds dO already, so D
    # costs one more tile load (O) instead of a launch that reads dO and O again. In fp32.
    o = o_desc.load([batch, q_head, m0, 0]).reshape(BLOCK_M, HEAD_DIM_PAD).to(tl.float32)
    delta = tl.sum(o * do.to(tl.float32), axis=1)
    tl.store(Delta + row, delta, mask=in_seq)
    qk_scale = sm_scale * 1.4426950408889634
    if CAUSAL:
        # Key blocks that end before this query block starts are seen whole by every row; from
        # there to the diagonal's end they are masked (all of it when BLOCK_N > BLOCK_M).
        clear_end = (m0 // BLOCK_N) * BLOCK_N
        last_key = tl.minimum(m0 + BLOCK_M, SEQ_LEN)
    else:  # only a ragged last key block needs the mask
        clear_end = (SEQ_LEN // BLOCK_N) * BLOCK_N
        last_key = SEQ_LEN

    dq = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    clear_lo = 0
    if WINDOWED:  # the forward's runs (gqa_flash/fast/windows.py): sink blocks and the window's edge, masked
        sink_end, lo, clear_lo = window_key_blocks(m0, tl.minimum(m0 + BLOCK_M, SEQ_LEN), clear_end, WINDOW,
                                                   SINK_TOKENS, BLOCK_N)
        dq = _dq_key_blocks(dq, q, do, lse2, delta, offs_m, k_desc, v_desc, batch, kv_head, 0, sink_end, qk_scale,
                            SEQ_LEN, BLOCK_N, HEAD_DIM_PAD, True, CAUSAL, INPUT_PRECISION, WINDOWED, WINDOW,
                            SINK_TOKENS)
        dq = _dq_key_blocks(dq, q, do, lse2, delta, offs_m, k_desc, v_desc, batch, kv_head, lo, clear_lo, qk_scale,
                            SEQ_LEN, BLOCK_N, HEAD_DIM_PAD, True, CAUSAL, INPUT_PRECISION, WINDOWED, WINDOW,
                            SINK_TOKENS)
    dq = _dq_key_blocks(dq, q, do, lse2, delta, offs_m, k_desc, v_desc, batch, kv_head, clear_lo, clear_end, qk_scale,
                        SEQ_LEN, BLOCK_N, HEAD_DIM_PAD, False, CAUSAL, INPUT_PRECISION, WINDOWED, WINDOW, SINK_TOKENS)
    dq = _dq_key_blocks(dq, q, do, lse2, delta, offs_m, k_desc, v_desc, batch, kv_head, clear_end, last_key,
                        qk_scale, SEQ_LEN, BLOCK_N, HEAD_DIM_PAD, True, CAUSAL, INPUT_PRECISION, WINDOWED, WINDOW,
                        SINK_TOKENS)
    dq = dq * sm_scale  # S = Q K^T * sm_scale: dQ picks the scale up once, here rather than on the host
    dq_desc.store([batch, q_head, m0, 0], dq.to(dq_desc.dtype).reshape(1, 1, BLOCK_M, HEAD_DIM_PAD))


# Tiles on a GPU, chosen by the autotuner. Each config sets the descriptors' tile shapes before
# its launch (pre_hook): a descriptor's block shape is part of the compiled kernel's signature.
def _set_block_shapes(nargs):
    bm, bn, dp = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["HEAD_DIM_PAD"]
    for name, rows in (("q_desc", bm), ("do_desc", bm), ("o_desc", bm), ("k_desc", bn), ("v_desc", bn),
                       ("dk_desc", bn), ("dv_desc", bn), ("dq_desc", bm)):
        if name in nargs:  # the dK/dV kernel has no o_desc or dq_desc, the dQ kernel no dk_desc or dv_desc
            nargs[name].block_shape = [1, 1, rows, dp]


def _configs(tiles):
    """(BLOCK_M, BLOCK_N, warps, stages) or (..., "flat") or (..., maxnreg) as autotuner configs."""
    return [triton.Config(dict(BLOCK_M=t[0], BLOCK_N=t[1], **({"FLAT": True} if t[4:] == ("flat",) else {})),
                          num_warps=t[2], num_stages=t[3], pre_hook=_set_block_shapes,
                          maxnreg=t[4] if t[4:] and isinstance(t[4], int) else None)
            for t in tiles]


# The dK/dV kernel: BLOCK_M queries a step, BLOCK_N keys a program (for fp16 and bf16; fp32 takes
# FP32_CONFIG). One pass, measured (bench/RESULTS.md): 64 x 128 on 8 warps wins at head_dims 64 and 128.
CONFIGS = _configs([(64, 128, 8, 2), (64, 128, 8, 3), (64, 64, 4, 2), (32, 128, 8, 2), (32, 64, 4, 2),
                    (32, 32, 4, 1)])
# Two passes: the same kernel without the dQ tile holds fewer registers, so this mode has its own
# candidates, each tile with one loop a query head and some with one loop for the whole group
# ("flat"). Measured on the H200 at fixed tiles (h200_backward_flat_forward_merged.csv, ratio to
# cuDNN, whole backward), when the ragged last key block still had a masked copy of the loop: flat
# won at N = 4k (head_dim 128: 0.81 against 0.76 at 64 x 128; 64: 0.93 at 32 x 128 on 4 warps
# against 0.90 for the best per-head tile) and at 16k was within 0.01 or behind (64 x 64 at
# head_dim 64: 0.76 flat, 0.82 a loop a head), so both kinds are candidates. Without that copy
# (ptxas for sm_90, bench/register_report.py), the flat tiles below spill nothing at head_dim 64
# and at 128 only 64 x 128 with 3 stages (28 bytes; it now fits in shared memory there, 162 KiB)
# and 32 x 128 on 4 warps (which collapses at 128, 0.28, and leads at 64). 32 x 64 is the one
# tile left at head_dim 256.
SEPARATE_CONFIGS = _configs([(64, 128, 8, 3), (64, 128, 8, 3, "flat"), (64, 128, 8, 2), (64, 128, 8, 2, "flat"),
                             (32, 128, 8, 3), (32, 128, 4, 3, "flat"), (64, 64, 4, 2), (64, 64, 4, 2, "flat"),
                             (32, 64, 8, 3)])
# The dQ kernel: BLOCK_M queries a program, BLOCK_N keys a step. Its registers hold dq (the forward's
# accumulator), Q and dO, and the score and dP tiles (O's tile only before the loop, for D); 128 rows
# want 8 warps, as in the forward (a Hopper matrix instruction covers 64 rows per 4 warps). None of
# these spills at head_dim 64 or 128 (ptxas, as above, with D computed here too; the Triton
# tutorial's 128 x 32 on 4 warps does at 128). Picked on the H200:
# 128 x 64, 8 warps, 3 stages, but at head_dim 64, 1k (64 x 64, 4 warps).
# 128 x 32 on 8 warps is capped at 128 registers a thread (ptxas at head_dim 128: 132 uncapped, no spill
# either way; below 128 it needs fewer): 2 programs an SM instead of 1 (112 KiB of shared memory each).
# Measured on the H200 (h200_register_caps_fixed_tiles.csv, rows regs_dq; head_dim 128, the dK/dV tile
# fixed), the whole backward went from 0.93 / 0.80 / 0.77 of cuDNN to 1.05 / 0.84 / 0.80 at 1k / 4k /
# 16k; 128 x 64 ran 0.96 / 0.87 / 0.82.
DQ_CONFIGS = _configs([(128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (128, 32, 8, 3, 128), (64, 32, 8, 2),
                       (64, 64, 4, 2)])  # the last: the graded dQ kernel's pick at head_dim 128


def _prune(configs, named_args, **kwargs):
    """head_dim 256 needs small tiles: dk and dv live in registers."""
    args = {**named_args, **kwargs}
    fits = [c for c in configs if args["HEAD_DIM_PAD"] <= 128 or c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] <= 32 * 64]
    return fits or configs


def _prune_dq(configs, named_args, **kwargs):
    """head_dim 256: 64 x 32 on 8 warps (128 KB of shared memory, no spill); the 128-row tiles
    need more than the H200's 227 KB of shared memory or spill."""
    args = {**named_args, **kwargs}
    fits = [c for c in configs if args["HEAD_DIM_PAD"] <= 128 or c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] <= 64 * 32]
    return fits or configs


INTERPRETER_CONFIG = dict(BLOCK_M=16, BLOCK_N=32, FLAT=True)  # the CPU tests run the per-head loop too
DQ_INTERPRETER_CONFIG = dict(BLOCK_M=32, BLOCK_N=16)  # the diagonal spans two key blocks, one half masked away
# fp32 on a GPU: ieee products on the CUDA cores and 4-byte tiles; dK and dV of BLOCK_N keys live
# in registers. The smallest tile, at every head dim: of the small tiles the one that spills fewest
# registers (ptxas's report for sm_90, Triton 3.6). fp32 checks the maths, not the speed.
FP32_CONFIG = dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
# The dQ kernel spills at every small tile with ieee products (ptxas, sm_90, Triton 3.8); 32 x 16
# on 8 warps least at head_dims 64 and 256, and within 5% of the least at 128.
DQ_FP32_CONFIG = dict(BLOCK_M=32, BLOCK_N=16, num_warps=8, num_stages=1)
DELTA_ROWS = 64  # rows of D a program computes on a GPU (16 in the interpreter)
_KEY = ["SEQ_LEN", "N_Q_HEADS", "N_KV_HEADS", "HEAD_DIM_PAD", "CAUSAL", "WINDOW"]
autotuned_kernels = {}  # by mode, built on first use; lab/bench.py reads the tiles they picked
_picks = {}  # (mode or "dq", key) -> the autotuner's pick, launched directly from then on (forward.py's _picks)


def _kernel(name):
    """The autotuned kernel for "atomic" or "separate" (the dK/dV kernel in that mode) or "dq".

    One autotuner a mode, each with its own cache of best tiles; only the one-pass kernel adds
    into DQ, so only its trials must zero DQ again (``reset_to_zero``)."""
    if name not in autotuned_kernels:
        if name == "dq":
            tuner = triton.autotune(configs=DQ_CONFIGS, key=_KEY, prune_configs_by={"early_config_prune": _prune_dq})
            autotuned_kernels[name] = tuner(_fast_dq_kernel)
        else:
            extra = dict(reset_to_zero=["DQ"]) if name == "atomic" else {}
            tuner = triton.autotune(configs=CONFIGS if name == "atomic" else SEPARATE_CONFIGS, key=_KEY,
                                    prune_configs_by={"early_config_prune": _prune}, **extra)
            autotuned_kernels[name] = tuner(_fast_backward_kernel)
    return autotuned_kernels[name]


def _launch(kernel, name, grid, descs, config, interpreter_config, fp32_config, key, head_dim_pad, *args,
            **constexprs):
    """Run ``kernel`` on fixed tiles (``config``; the interpreter's; fp32's; the autotuner's pick for
    ``key`` once it has one) or autotuned (``_kernel(name)``). ``key`` ends with the inputs' dtype."""
    dtype = key[-1]
    config = fixed_config(config, interpreter_config, fp32_config, dtype, _picks, (name, *key), lambda: _kernel(name))
    tuning = config is None  # a key's first call on a GPU: the autotuner picks
    if not tuning:
        config = dict(config)
        _set_block_shapes({**descs, **config, "HEAD_DIM_PAD": head_dim_pad})
    else:
        kernel, config = _kernel(name), {}
    kernel[grid](*descs.values(), *args, HEAD_DIM_PAD=head_dim_pad, INPUT_PRECISION=input_precision(dtype),
                 **constexprs, **config)
    if tuning:
        remember(_picks, (name, *key), kernel)


def _delta(o, do, head_dim_pad):
    """D = rowsum(dO * O), [B, Hq, N] fp32; ``o`` and ``do`` in layouts the TMA reads."""
    batch, n_heads, seq_len, _ = o.shape
    rows = 16 if runtime.INTERPRETER else DELTA_ROWS
    delta = torch.empty((batch, n_heads, seq_len), dtype=torch.float32, device=o.device)
    o_desc, do_desc = (TensorDescriptor.from_tensor(t, [1, 1, rows, head_dim_pad]) for t in (o, do))
    _delta_kernel[(triton.cdiv(seq_len, rows), batch * n_heads)](
        o_desc, do_desc, delta, seq_len, n_heads, ROWS=rows, HEAD_DIM_PAD=head_dim_pad)
    return delta


DQ_MODES = ("atomic", "separate")


def default_dq_mode(head_dim_pad) -> str:
    """The mode ``dq_mode=None`` takes: two passes, at every head dim. Measured on the H200
    (bench/backward_dq_modes.py, ``notebooks/data/h200_backward_dq_modes.csv``; bf16, causal, 32:8
    heads, 16k tokens a launch), two passes beat one at all six shapes: ratio to cuDNN's backward
    1.05 / 0.89 / 0.84 against 0.80 / 0.77 / 0.73 at head_dim 64 (N = 1k / 4k / 16k), and 0.83 /
    0.81 / 0.77 against 0.59 / 0.66 / 0.65 at 128; the graded backward ran 0.97 / 0.74 / 0.69 and
    0.86 / 0.74 / 0.69. The prediction had been one pass at 64."""
    return "separate"


def fast_attention_backward(q, k, v, o, lse, do, causal=True, sm_scale=None, config=None, dq_mode=None,
                            dq_config=None, window=None, sink_tokens=0, sinks=None):
    """Same contract as ``flash_attention_backward``; inputs are checked by the caller.

    ``window``, ``sink_tokens`` and ``sinks`` as in the forward that made ``o`` and ``lse``
    (``gqa_flash.reference.reference_gradients``): each pass skips the blocks no row sees. With ``sinks``
    it returns dQ, dK, dV and dSinks ([Hq], ``sinks``' dtype): the LSE already counts the sinks, so dQ, dK
    and dV need nothing more, and dSinks is a sum over the rows (``windows.sink_gradient``).

    ``dq_mode``: ``"atomic"`` (one pass, dQ added with atomics), ``"separate"`` (a dQ pass, which
    also computes D, then a dK/dV pass), or None for ``default_dq_mode``. Inputs the TMA cannot read are copied
    first into a layout it can. ``config`` (BLOCK_M, BLOCK_N, num_warps, num_stages, optionally
    FLAT) fixes the dK/dV kernel's tile and ``dq_config`` the dQ kernel's, skipping the autotuner, for
    benchmarks; fp32 on a GPU takes ``FP32_CONFIG`` and ``DQ_FP32_CONFIG`` unless given.
    """
    batch, n_q_heads, seq_len, head_dim = q.shape
    n_kv_heads = k.shape[1]
    if sm_scale is None:
        sm_scale = head_dim ** -0.5
    head_dim_pad = max(16, triton.next_power_of_2(head_dim))
    dq_mode = default_dq_mode(head_dim_pad) if dq_mode is None else dq_mode
    if dq_mode not in DQ_MODES:
        raise ValueError(f"dq_mode must be one of {', '.join(DQ_MODES)} or None; got {dq_mode!r}")
    atomic = dq_mode == "atomic"
    q, k, v, o, do = (readable(t) for t in (q, k, v, o, do))
    lse = lse.float().contiguous()
    dk = empty_readable((batch, n_kv_heads, seq_len, head_dim), k.dtype, k.device)
    dv = empty_readable((batch, n_kv_heads, seq_len, head_dim), v.dtype, v.device)
    windowed, window, sink_tokens = kernel_window(window, sink_tokens)
    sizes = (sm_scale, seq_len, batch, n_q_heads, n_kv_heads, window, sink_tokens)
    key = (seq_len, n_q_heads, n_kv_heads, head_dim_pad, causal, window, q.dtype)  # what the picks depend on

    def descriptors(*named):  # placeholder tile shapes; _set_block_shapes puts the real ones in
        return {name: TensorDescriptor.from_tensor(t, [1, 1, 16, head_dim_pad]) for name, t in named}

    # Q, K, V and dO serve both passes: each launch sets their tile shapes to its own tiles first.
    shared = descriptors(("q_desc", q), ("k_desc", k), ("v_desc", v), ("do_desc", do))

    if atomic:  # D from a kernel of its own; the pass adds dQ into an fp32 buffer of zeros (HEAD_DIM_PAD wide)
        delta = _delta(o, do, head_dim_pad)
        dq_sum = torch.zeros((batch, n_q_heads, seq_len, head_dim_pad), dtype=torch.float32, device=q.device)
    else:  # the dQ pass first: it writes D, which the dK/dV pass reads. That pass neither reads nor writes
        # DQ without DQ_ATOMIC (and its autotuner zeroes DQ only in "atomic" mode): any fp32 tensor will do.
        delta = torch.empty((batch, n_q_heads, seq_len), dtype=torch.float32, device=q.device)
        dq = empty_readable((batch, n_q_heads, seq_len, head_dim), q.dtype, q.device)
        _launch(_fast_dq_kernel, "dq", lambda meta: (triton.cdiv(seq_len, meta["BLOCK_M"]) * batch * n_q_heads,),
                {**shared, **descriptors(("o_desc", o), ("dq_desc", dq))},
                dq_config, DQ_INTERPRETER_CONFIG, DQ_FP32_CONFIG, key, head_dim_pad, lse, delta, *sizes,
                CAUSAL=causal, WINDOWED=windowed)
        dq_sum = delta
    _launch(_fast_backward_kernel, dq_mode, lambda meta: (triton.cdiv(seq_len, meta["BLOCK_N"]) * batch * n_kv_heads,),
            {**shared, **descriptors(("dk_desc", dk), ("dv_desc", dv))},
            config, INTERPRETER_CONFIG, FP32_CONFIG, key, head_dim_pad, dq_sum, lse, delta, *sizes,
            CAUSAL=causal, DQ_ATOMIC=atomic, WINDOWED=windowed)
    if atomic:
        dq = (dq_sum[..., :head_dim] * sm_scale).to(q.dtype)
    grads = dq.contiguous(), dk.contiguous(), dv.contiguous()
    return grads if sinks is None else (*grads, sink_gradient(sinks, lse, delta))
