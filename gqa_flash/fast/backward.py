"""The course's fastest backward pass: the graded backward plus what a GPU rewards.

Not graded, and not for students to write: the maths is that of the graded
``gqa_flash/backward.py`` (recompute P from the saved LSE, D = rowsum(dO * O),
dS = P * (dP - D)), and one program still owns one key block of one KV head
and walks every query head of its group, so dK and dV are summed in
registers. What changes:

1. dQ in the same pass. The graded backward computes dQ in a second kernel,
   which recomputes S = QK^T and dP = dO V^T for every tile: 7 matrix
   products per tile instead of 5. Here the program that has dS^T for a
   (key block, query block) tile also forms that tile's share of dQ,
   dS @ K, and adds it into an fp32 dQ buffer with atomic adds; every key
   block of the row adds its share. The price: additions arrive in no fixed
   order, so dQ can differ in its last bits from run to run (dK and dV
   cannot: they are summed in registers in a fixed order), and the atomics
   themselves: on the H200 this wins at head_dim 64 and loses to the graded
   backward at 128 (bench/RESULTS.md).
2. Masks only where they matter. Under the causal mask, the query blocks
   that overlap this key block (the diagonal) need the mask; every later
   query block sees the whole key block. Padding rows need no mask at all:
   the TMA loads them as zeros, so they add 0 to dK, dV and dQ. Only
   a ragged last key block is masked everywhere (a zero key against a very
   negative LSE would overflow exp2).
3. Tensor descriptors built on the host (the TMA, as in
   ``gqa_flash/fast/forward.py``), and the heaviest key blocks first: under
   the causal mask key block 0 is seen by every query, the last one by the
   fewest.

D = rowsum(dO * O) comes from a small kernel of its own (``_delta_kernel``).
Inputs the TMA cannot read (a last dim with stride != 1, rows that
are not a multiple of 16 bytes, an unaligned base; an incoming gradient
expanded from a scalar is one) are copied first into a layout it can, as in
the forward. fp32 runs the same kernels with ieee products and, on a GPU, a
fixed small tile (``FP32_CONFIG``) instead of the autotuner. It runs in the
interpreter too, so the CPU tests check it against float64 autograd.

Adding each dQ tile with one bulk reduction of the TMA
(``desc.atomic_add``) instead of per-element atomics was measured and
removed: bench/RESULTS.md.
"""

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from gqa_flash import runtime
from gqa_flash.fast.forward import empty_readable, input_precision, readable


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
                    MASKED: tl.constexpr, CAUSAL: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """Add the query blocks start..end of one query head into dk, dv (registers) and DQ (atomics)."""
    for m0 in tl.range(start, end, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        m_ok = offs_m < SEQ_LEN
        q = q_desc.load([batch, q_head, m0, 0]).reshape(BLOCK_M, HEAD_DIM_PAD)
        do = do_desc.load([batch, q_head, m0, 0]).reshape(BLOCK_M, HEAD_DIM_PAD)
        lse2 = tl.load(LSE + bh * SEQ_LEN + offs_m, mask=m_ok, other=0.0) * 1.4426950408889634
        delta = tl.load(Delta + bh * SEQ_LEN + offs_m, mask=m_ok, other=0.0)
        # The tile transposed, keys down the rows: dk and dv come out one row per key.
        p_t = tl.exp2(tl.dot(k, tl.trans(q), input_precision=INPUT_PRECISION) * qk_scale - lse2[None, :])
        if MASKED:
            keep = offs_n[:, None] < SEQ_LEN
            if CAUSAL:
                keep = keep & (offs_n[:, None] <= offs_m[None, :])
            p_t = tl.where(keep, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=INPUT_PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)
        ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)
        dk = tl.dot(ds_t, q, dk, input_precision=INPUT_PRECISION)
        # This tile's share of dQ (sm_scale is applied once, on the host), one atomic add per element.
        dq = tl.dot(tl.trans(ds_t), k, input_precision=INPUT_PRECISION)
        dq_ptrs = DQ + (bh * SEQ_LEN + offs_m[:, None]) * HEAD_DIM_PAD + tl.arange(0, HEAD_DIM_PAD)[None, :]
        tl.atomic_add(dq_ptrs, dq, mask=m_ok[:, None], sem="relaxed")
    return dk, dv


@triton.jit
def _fast_backward_kernel(
    q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, DQ, LSE, Delta,
    sm_scale, SEQ_LEN, BATCH, N_Q_HEADS, N_KV_HEADS,
    HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """dK, dV of one key block of one KV head (summed over its group), and its share of dQ.

    DQ is an fp32 [B, Hq, N, HEAD_DIM_PAD] buffer of zeros; LSE and Delta are [B, Hq, N] fp32.
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

    for h in range(0, group_size):
        q_head = kv_head * group_size + h
        bh = (batch * N_Q_HEADS + q_head).to(tl.int64)  # row of LSE, Delta and DQ
        if CAUSAL:  # the diagonal: query blocks that overlap this key block, masked
            dk, dv = _key_block_step(
                dk, dv, k, v, q_desc, do_desc, DQ, LSE, Delta, batch, q_head, bh, offs_n,
                n0, tl.minimum(n0 + BLOCK_N, SEQ_LEN), qk_scale, SEQ_LEN, HEAD_DIM_PAD, BLOCK_M,
                True, CAUSAL, INPUT_PRECISION)
            start = n0 + BLOCK_N  # every later query sees every key of the block
        else:
            start = 0
        if ragged:  # the last key block, with keys past SEQ_LEN: masked everywhere
            dk, dv = _key_block_step(
                dk, dv, k, v, q_desc, do_desc, DQ, LSE, Delta, batch, q_head, bh, offs_n,
                start, SEQ_LEN, qk_scale, SEQ_LEN, HEAD_DIM_PAD, BLOCK_M, True, CAUSAL, INPUT_PRECISION)
        else:  # no mask at all
            dk, dv = _key_block_step(
                dk, dv, k, v, q_desc, do_desc, DQ, LSE, Delta, batch, q_head, bh, offs_n,
                start, SEQ_LEN, qk_scale, SEQ_LEN, HEAD_DIM_PAD, BLOCK_M, False, CAUSAL, INPUT_PRECISION)

    dk = dk * sm_scale  # S = Q K^T * sm_scale, so dK picks up the scale once
    dk_desc.store([batch, kv_head, n0, 0], dk.to(dk_desc.dtype).reshape(1, 1, BLOCK_N, HEAD_DIM_PAD))
    dv_desc.store([batch, kv_head, n0, 0], dv.to(dv_desc.dtype).reshape(1, 1, BLOCK_N, HEAD_DIM_PAD))


def _set_block_shapes(nargs):
    bm, bn, dp = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["HEAD_DIM_PAD"]
    for name, rows in (("q_desc", bm), ("do_desc", bm), ("k_desc", bn), ("v_desc", bn), ("dk_desc", bn),
                       ("dv_desc", bn)):
        nargs[name].block_shape = [1, 1, rows, dp]


# For fp16 and bf16; fp32 takes FP32_CONFIG.
CONFIGS = [
    triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn), num_warps=w, num_stages=st, pre_hook=_set_block_shapes)
    for bm, bn, w, st in [(64, 128, 8, 2), (64, 128, 8, 3), (64, 64, 4, 2), (32, 128, 8, 2), (32, 64, 4, 2),
                          (32, 32, 4, 1)]
]


def _prune(configs, named_args, **kwargs):
    """head_dim 256 needs small tiles: dk and dv live in registers."""
    args = {**named_args, **kwargs}
    fits = [c for c in configs if args["HEAD_DIM_PAD"] <= 128 or c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] <= 32 * 64]
    return fits or configs


INTERPRETER_CONFIG = dict(BLOCK_M=16, BLOCK_N=32)
# fp32 on a GPU: ieee products on the CUDA cores and 4-byte tiles; dK and dV of BLOCK_N keys live
# in registers. The smallest tile, at every head dim: of the small tiles the one that spills fewest
# registers (ptxas's report for sm_90, Triton 3.6). fp32 checks the maths, not the speed.
FP32_CONFIG = dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
DELTA_ROWS = 64  # rows of D a program computes on a GPU (16 in the interpreter)
_tuned = None


def _kernel():
    global _tuned
    if _tuned is None:
        _tuned = triton.autotune(configs=CONFIGS, key=["SEQ_LEN", "N_Q_HEADS", "N_KV_HEADS", "HEAD_DIM_PAD", "CAUSAL"],
                                 prune_configs_by={"early_config_prune": _prune},
                                 reset_to_zero=["DQ"])(_fast_backward_kernel)
    return _tuned


def _delta(o, do, head_dim_pad):
    """D = rowsum(dO * O), [B, Hq, N] fp32; ``o`` and ``do`` in layouts the TMA reads."""
    batch, n_heads, seq_len, _ = o.shape
    rows = 16 if runtime.INTERPRETER else DELTA_ROWS
    delta = torch.empty((batch, n_heads, seq_len), dtype=torch.float32, device=o.device)
    o_desc, do_desc = (TensorDescriptor.from_tensor(t, [1, 1, rows, head_dim_pad]) for t in (o, do))
    _delta_kernel[(triton.cdiv(seq_len, rows), batch * n_heads)](
        o_desc, do_desc, delta, seq_len, n_heads, ROWS=rows, HEAD_DIM_PAD=head_dim_pad)
    return delta


def fast_attention_backward(q, k, v, o, lse, do, causal=True, sm_scale=None, config=None):
    """Same contract as ``flash_attention_backward``; inputs are checked by the caller.

    Inputs the TMA cannot read are copied first into a layout it can. ``config``
    (BLOCK_M, BLOCK_N, num_warps, num_stages) skips the autotuner, for benchmarks; fp32 on a
    GPU takes ``FP32_CONFIG`` unless one is given.
    """
    batch, n_q_heads, seq_len, head_dim = q.shape
    n_kv_heads = k.shape[1]
    if sm_scale is None:
        sm_scale = head_dim ** -0.5
    q, k, v, o, do = (readable(t) for t in (q, k, v, o, do))
    head_dim_pad = max(16, triton.next_power_of_2(head_dim))
    lse = lse.float().contiguous()
    delta = _delta(o, do, head_dim_pad)
    dq = torch.zeros((batch, n_q_heads, seq_len, head_dim_pad), dtype=torch.float32, device=q.device)
    dk = empty_readable((batch, n_kv_heads, seq_len, head_dim), k.dtype, k.device)
    dv = empty_readable((batch, n_kv_heads, seq_len, head_dim), v.dtype, v.device)
    descs = {name: TensorDescriptor.from_tensor(t, [1, 1, 16, head_dim_pad]) for name, t in (
        ("q_desc", q), ("k_desc", k), ("v_desc", v), ("do_desc", do), ("dk_desc", dk), ("dv_desc", dv))}
    if config is None and runtime.INTERPRETER:
        config = INTERPRETER_CONFIG
    elif config is None and q.dtype == torch.float32:
        config = FP32_CONFIG
    if config is not None:
        kernel, config = _fast_backward_kernel, dict(config)
        _set_block_shapes({**descs, **config, "HEAD_DIM_PAD": head_dim_pad})
    else:
        kernel, config = _kernel(), {}
    grid = lambda meta: (triton.cdiv(seq_len, meta["BLOCK_N"]) * batch * n_kv_heads,)  # noqa: E731
    kernel[grid](
        *descs.values(), dq, lse, delta, sm_scale, seq_len, batch, n_q_heads, n_kv_heads,
        HEAD_DIM_PAD=head_dim_pad, CAUSAL=causal, INPUT_PRECISION=input_precision(q.dtype), **config,
    )
    dq = (dq[..., :head_dim] * sm_scale).to(q.dtype).contiguous()
    return dq, dk.contiguous(), dv.contiguous()
