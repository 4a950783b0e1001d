# Student version of solutions/backward.py, written by `python -m gqa_flash.grader.release`.
# Fill in the STUDENT IMPLEMENTATION sections; leave the rest as it is.
"""Bonus: the FlashAttention backward pass in Triton, with GQA.

Given the forward's inputs Q, K, V, its output O and log-sum-exp LSE, and the
gradient dO of the loss with respect to O, compute dQ, dK and dV. With
P = softmax(S) and S = Q K^T * sm_scale, per (batch, query head):

    dV = P^T dO                      (O = P V)
    dP = dO V^T
    dS = P * (dP - D),   D = rowsum(dO * O)     (the softmax's backward)
    dQ = dS K * sm_scale
    dK = dS^T Q * sm_scale

Nothing of size N x N is stored: P is *recomputed* tile by tile from Q, K and
the LSE the forward saved, P = exp(S - LSE), exactly and with no running max,
because the LSE already is the row's normaliser. D is a single number per
row, computed once up front. That is why the forward kept the LSE.

GQA: a KV head is read by ``group_size`` query heads, so its gradient is the
*sum* of what each of them sends back. Here one program owns one block of
keys of one KV head and walks all the query heads of its group in turn,
adding into the same dK and dV registers: no atomics, no second pass, and the
K and V tiles are loaded once for the whole group. (The alternative, one
program per query head with atomic adds into dK and dV, makes the result
depend on the order of the additions and costs a read-modify-write each.)

Three kernels, each on a grid of three axes (blocks, heads, batch), so that
program_id(1) is the head and program_id(2) the batch:
    _backward_preprocess   D = rowsum(dO * O)                    grid (query blocks, Hq,  B)
    _backward_dkdv         dK, dV for one key block of a KV head grid (key blocks,   Hkv, B)
    _backward_dq           dQ for one query block of a query head grid (query blocks, Hq,  B)

All three work in the log2 domain like the forward: qk_scale = sm_scale *
log2(e), and the LSE (natural log) is turned into log2 units once.
"""

import torch
import triton
import triton.language as tl

from gqa_flash import runtime


@triton.jit
def _backward_preprocess(
    O, DO, Delta,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_dob, stride_doh, stride_don, stride_dod,
    SEQ_LEN, N_Q_HEADS,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """Delta[b, h, i] = sum_d O[b, h, i, d] * dO[b, h, i, d], in fp32. Delta is [B, Hq, N], contiguous."""
    q_block_idx = tl.program_id(0)
    head_idx = tl.program_id(1).to(tl.int64)
    batch_idx = tl.program_id(2).to(tl.int64)
    offs_m = q_block_idx * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask = (offs_m[:, None] < SEQ_LEN) & (offs_d[None, :] < HEAD_DIM)
    o = tl.load(O + batch_idx * stride_ob + head_idx * stride_oh
                + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od, mask=mask, other=0.0)
    do = tl.load(DO + batch_idx * stride_dob + head_idx * stride_doh
                 + offs_m[:, None] * stride_don + offs_d[None, :] * stride_dod, mask=mask, other=0.0)
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 1) ---
    # D, one number per query row: the sum over the head dim of dO times O.
    # Why: the softmax's backward needs, per row, the sum over keys of
    # P_ij * dP_ij, and since O = P V and dP = dO V^T that sum equals the row's
    # dot product of dO with O: computed once here, not per key tile.
    # Shapes: o and do are [BLOCK_M, HEAD_DIM_PAD] tiles (padding columns 0);
    # delta is [BLOCK_M], float32.
    # Hint: O and dO may be fp16 or bf16; accumulate in fp32.
    delta = tl.zeros([BLOCK_M], dtype=tl.float32)  # Placeholder
    # --- END OF STUDENT IMPLEMENTATION ---
    tl.store(Delta + (batch_idx * N_Q_HEADS + head_idx) * SEQ_LEN + offs_m, delta, mask=offs_m < SEQ_LEN)


@triton.jit
def _backward_dkdv(
    Q, K, V, DO, LSE, Delta, DK, DV,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    sm_scale, SEQ_LEN, N_Q_HEADS, N_KV_HEADS,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    """dK and dV of one block of BLOCK_N keys of one KV head, summed over the group's query heads.

    LSE and Delta are [B, Hq, N] fp32, contiguous; DK and DV are [B, Hkv, N, D], contiguous.
    """
    n_block_idx = tl.program_id(0)
    kv_head_idx = tl.program_id(1)
    batch_idx = tl.program_id(2).to(tl.int64)
    group_size = N_Q_HEADS // N_KV_HEADS

    offs_n = n_block_idx * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < HEAD_DIM
    kv_mask = (offs_n[:, None] < SEQ_LEN) & d_ok[None, :]
    k = tl.load(K + batch_idx * stride_kb + kv_head_idx.to(tl.int64) * stride_kh
                + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
    v = tl.load(V + batch_idx * stride_vb + kv_head_idx.to(tl.int64) * stride_vh
                + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # log2(e)

    # Under the causal mask, queries before this key block never see it.
    if CAUSAL:
        start_m = (n_block_idx * BLOCK_N // BLOCK_M) * BLOCK_M
    else:
        start_m = 0

    for h in range(0, group_size):
        # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 3) ---
        # The GQA sum. This program's KV head is read by group_size query
        # heads, consecutive ones (as in forward.py Part 1). Which
        # query head is the h-th of the group? Each of them adds its share to
        # the same dk and dv.
        q_head_idx = kv_head_idx  # Placeholder: the h-th query head of the group
        # --- END OF STUDENT IMPLEMENTATION ---
        bh = batch_idx * N_Q_HEADS + q_head_idx  # row of LSE and Delta
        q_base = Q + batch_idx * stride_qb + q_head_idx.to(tl.int64) * stride_qh
        do_base = DO + batch_idx * stride_dob + q_head_idx.to(tl.int64) * stride_doh
        for m0 in range(start_m, SEQ_LEN, BLOCK_M):
            offs_m = m0 + tl.arange(0, BLOCK_M)
            m_ok = offs_m < SEQ_LEN
            q = tl.load(q_base + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd,
                        mask=m_ok[:, None] & d_ok[None, :], other=0.0)
            do = tl.load(do_base + offs_m[:, None] * stride_don + offs_d[None, :] * stride_dod,
                         mask=m_ok[:, None] & d_ok[None, :], other=0.0)
            lse2 = tl.load(LSE + bh * SEQ_LEN + offs_m, mask=m_ok, other=0.0) * 1.4426950408889634
            delta = tl.load(Delta + bh * SEQ_LEN + offs_m, mask=m_ok, other=0.0)
            # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 2) ---
            # This tile's share of dK and dV, for one [BLOCK_N keys, BLOCK_M
            # queries] tile, kept transposed (keys down the rows) so that dk and
            # dv come out with one row per key.
            # What: recompute the probabilities P from the scores and the saved
            # LSE (lse2 is in log2 units, the scores want qk_scale), exactly as
            # the forward pass had them; P is 0 for a key a query cannot see
            # (past SEQ_LEN, or in its future under CAUSAL). Then dV gains P^T dO;
            # dP = dO V^T; the softmax's backward gives dS = P (dP - D) with D
            # per query row; and dK gains dS^T Q.
            # Invariants: dk and dv accumulate in fp32 over every query tile and
            # every query head of the group; sm_scale multiplies dk once, after
            # the loops, not here.
            # Hint: tl.dot wants both operands in one dtype (bring P and dS to
            # the inputs' dtype), and a transposed product is a tl.trans away.
            pass  # Placeholder: dk and dv stay zero
            # --- END OF STUDENT IMPLEMENTATION ---

    dk *= sm_scale  # S = Q K^T * sm_scale, so dK picks up the scale once
    out_offs = ((batch_idx * N_KV_HEADS + kv_head_idx) * SEQ_LEN + offs_n[:, None]) * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out_offs, dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + out_offs, dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _backward_dq(
    Q, K, V, DO, LSE, Delta, DQ,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    sm_scale, SEQ_LEN, N_Q_HEADS, N_KV_HEADS,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):
    """dQ of one block of BLOCK_M queries of one query head. DQ is [B, Hq, N, D], contiguous."""
    q_block_idx = tl.program_id(0)
    q_head_idx = tl.program_id(1)
    batch_idx = tl.program_id(2).to(tl.int64)
    kv_head_idx = q_head_idx // (N_Q_HEADS // N_KV_HEADS)

    offs_m = q_block_idx * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < HEAD_DIM
    m_ok = offs_m < SEQ_LEN
    q_mask = m_ok[:, None] & d_ok[None, :]
    q = tl.load(Q + batch_idx * stride_qb + q_head_idx.to(tl.int64) * stride_qh
                + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd, mask=q_mask, other=0.0)
    do = tl.load(DO + batch_idx * stride_dob + q_head_idx.to(tl.int64) * stride_doh
                 + offs_m[:, None] * stride_don + offs_d[None, :] * stride_dod, mask=q_mask, other=0.0)
    bh = batch_idx * N_Q_HEADS + q_head_idx  # row of LSE and Delta
    lse2 = tl.load(LSE + bh * SEQ_LEN + offs_m, mask=m_ok, other=0.0) * 1.4426950408889634
    delta = tl.load(Delta + bh * SEQ_LEN + offs_m, mask=m_ok, other=0.0)
    k_base = K + batch_idx * stride_kb + kv_head_idx.to(tl.int64) * stride_kh
    v_base = V + batch_idx * stride_vb + kv_head_idx.to(tl.int64) * stride_vh
    dq = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634

    if CAUSAL:
        end_n = tl.minimum((q_block_idx + 1) * BLOCK_M, SEQ_LEN)
    else:
        end_n = SEQ_LEN
    for n0 in range(0, end_n, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n[:, None] < SEQ_LEN) & d_ok[None, :]
        k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 4) ---
        # This tile's share of dQ, for one [BLOCK_M queries, BLOCK_N keys]
        # tile (queries down the rows): recompute P as in Part 2 (0 where a
        # key is invisible), dP = dO V^T, dS = P (dP - D), and dQ gains dS K.
        # Invariant: a key in a query's future contributes nothing; forgetting
        # the causal mask here leaks gradient from the future into dQ.
        # sm_scale multiplies dq once, after the loop.
        # Hint: this is Part 2's tile seen the other way round.
        pass  # Placeholder: dq stays zero
        # --- END OF STUDENT IMPLEMENTATION ---

    dq *= sm_scale
    out_offs = (bh * SEQ_LEN + offs_m[:, None]) * HEAD_DIM + offs_d[None, :]
    tl.store(DQ + out_offs, dq.to(DQ.dtype.element_ty), mask=q_mask)


INTERPRETER_CONFIG = dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1)
PREPROCESS_BLOCK_M = 64

# On a GPU the autotuner picks each kernel's tiles (BLOCK_M: queries per step,
# BLOCK_N: keys per step), once per new shape.
GPU_CONFIGS = [
    triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn), num_warps=w, num_stages=st)
    for bm, bn, w, st in [(64, 64, 4, 2), (64, 128, 8, 2), (128, 64, 8, 2), (32, 64, 4, 2), (64, 64, 8, 3),
                          (32, 32, 4, 2)]
]
_KEY = ["SEQ_LEN", "N_Q_HEADS", "N_KV_HEADS", "HEAD_DIM_PAD", "CAUSAL", "INPUT_PRECISION"]
_tuned = {}


def _prune(configs, named_args, **kwargs):
    """fp32 and head_dim 256 need small tiles to fit in registers and shared memory."""
    args = {**named_args, **kwargs}
    big = args["HEAD_DIM_PAD"] > 128 or args["INPUT_PRECISION"] == "ieee"
    fits = [c for c in configs if not big or c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] <= 32 * 64]
    return fits or configs


def _kernel(kernel):
    """``kernel`` itself in the interpreter (fixed tiles), its autotuned version on a GPU."""
    if runtime.INTERPRETER:
        return kernel, INTERPRETER_CONFIG
    if kernel not in _tuned:
        _tuned[kernel] = triton.autotune(configs=GPU_CONFIGS, key=_KEY,
                                         prune_configs_by={"early_config_prune": _prune})(kernel)
    return _tuned[kernel], {}


def flash_attention_backward(q, k, v, o, lse, do, causal=True, sm_scale=None):
    """dQ, dK, dV (in q's dtype) from the forward's inputs, its output ``o``, its ``lse``
    ([B, Hq, N] fp32, natural log) and the incoming gradient ``do``."""
    batch, n_q_heads, seq_len, head_dim = q.shape
    n_kv_heads = k.shape[1]
    if sm_scale is None:
        sm_scale = head_dim ** -0.5
    lse = lse.float().contiguous()
    delta = torch.empty_like(lse)
    # NaN in the interpreter until the kernels write them (runtime.empty_output), uninitialised on a GPU
    dq = runtime.empty_output((batch, n_q_heads, seq_len, head_dim), q.dtype, q.device)
    dk = runtime.empty_output((batch, n_kv_heads, seq_len, head_dim), k.dtype, k.device)
    dv = runtime.empty_output((batch, n_kv_heads, seq_len, head_dim), v.dtype, v.device)
    head_dim_pad = max(16, triton.next_power_of_2(head_dim))
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    consts = dict(HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad)

    block_m = INTERPRETER_CONFIG["BLOCK_M"] if runtime.INTERPRETER else PREPROCESS_BLOCK_M
    _backward_preprocess[(triton.cdiv(seq_len, block_m), n_q_heads, batch)](
        o, do, delta, *o.stride(), *do.stride(), seq_len, n_q_heads, BLOCK_M=block_m, **consts,
    )
    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride())
    dkdv, cfg = _kernel(_backward_dkdv)
    dkdv[lambda meta: (triton.cdiv(seq_len, meta["BLOCK_N"]), n_kv_heads, batch)](
        q, k, v, do, lse, delta, dk, dv, *strides, sm_scale, seq_len, n_q_heads, n_kv_heads,
        CAUSAL=causal, INPUT_PRECISION=precision, **consts, **cfg,
    )
    dq_kernel, cfg = _kernel(_backward_dq)
    dq_kernel[lambda meta: (triton.cdiv(seq_len, meta["BLOCK_M"]), n_q_heads, batch)](
        q, k, v, do, lse, delta, dq, *strides, sm_scale, seq_len, n_q_heads, n_kv_heads,
        CAUSAL=causal, INPUT_PRECISION=precision, **consts, **cfg,
    )
    return dq, dk, dv
