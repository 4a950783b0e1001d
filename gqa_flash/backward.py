# Your file: fill in the STUDENT IMPLEMENTATION sections; leave the rest as it is.
# (Written from the course's completed backward.py by its release tool.)
#
#   specification  gqa_flash/reference.py: reference_gradients
#   notebook       notebooks/06_backward_and_training.ipynb, checked by checks.check_backward()
#   graded by      tests/graded/test_backward.py: 20 points, a bonus on top of the 100
#   run them       make test-graded MODULE=backward
"""Bonus: the FlashAttention backward pass in Triton, with GQA.

Given the forward's inputs Q, K, V, its output O and log-sum-exp LSE, and the
gradient dO of the loss with respect to O, compute dQ, dK and dV.

The maths (notebook 06 derives it). For one (batch, query head), write
S = sm_scale * Q K^T for the scores, P = softmax(S) row by row and O = P V.
Going back through each of the three:

  * O = P V is a matrix product, so the gradient reaches V as P^T dO and
    reaches P as dP = dO V^T.
  * A softmax row p has the Jacobian diag(p) - p p^T, so
    dS_ij = P_ij (dP_ij - D_i), with D_i = sum_j P_ij dP_ij one number per
    row. Since O = P V, that sum is also the dot product of row i of dO
    with row i of O: D needs neither P nor dP.
  * S = sm_scale * Q K^T: the gradient reaches Q as sm_scale dS K and K as
    sm_scale dS^T Q.

Nothing of size N x N is stored: P is *recomputed* tile by tile from Q, K and
the LSE the forward saved, P = e^(S - LSE), exactly and with no running max,
because the LSE already is the row's normaliser. That is why the forward
kept the LSE. It kept it as a natural log (forward.py Part 6), whatever
units the kernels here compute in.

GQA: a KV head is read by ``group_size`` query heads, so its gradient is the
*sum* of what each of them sends back. Here one program owns one block of
keys of one KV head and walks all the query heads of its group in turn,
adding into the same dK and dV registers: no atomics, no second pass, and the
K and V tiles are loaded once for the whole group. (The alternative, one
program per query head with atomic adds into dK and dV, makes the result
depend on the order of the additions and costs a read-modify-write each.)

Three kernels, each on a grid of three axes (blocks, heads, batch), so that
program_id(1) is the head and program_id(2) the batch:
    backward_preprocess    D, one number per query row              grid (query blocks, Hq,  B)
    backward_dkdv          dK, dV for one key block of a KV head    grid (key blocks,   Hkv, B)
    backward_dq            dQ for one query block of a query head   grid (query blocks, Hq,  B)

What you write:

    Part 1  backward_preprocess    D for a block of query rows
    Part 2  backward_dkdv          the walk over the query blocks that see a key block; dK and dV
    Part 3  group_query_head       which query head is the h-th of a KV head's group
    Part 4  backward_dq            the walk over the key blocks a query block sees; dQ

The kernels are yours from the program's place in the grid to the store:
which blocks to visit under the causal mask, every load and its mask, the
units of the exponential, and where sm_scale goes. The graded tests and
notebook 06's checks start from the float64 reference's O and LSE, so your
forward pass cannot hide or cause a bug here.

gqa_flash/fast/backward.py, the course's fast backward, ships complete in
this package and answers these parts. Finish this file before you read it,
as you would a published solution; then read it to see what a GPU rewards.
"""

import torch
import triton
import triton.language as tl

from gqa_flash.course import runtime


@triton.jit
def backward_preprocess(
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
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 1) ---
    # D, one number per query row of this block (rows offs_m of head
    # head_idx of batch batch_idx): the sum over the head dim of dO times O.
    # Why: the softmax's backward needs, per row, the sum over keys of
    # P_ij * dP_ij, and that sum equals the row's dot product of dO with O
    # (the module's docstring says why): computed once here, not per key tile.
    # Load the block's rows of O and of dO yourself, as forward.py Part 2
    # loads a tile (any strides): rows past SEQ_LEN and the padding columns
    # past HEAD_DIM (offs_d runs to HEAD_DIM_PAD) are not in the tensors, and
    # must read as 0.
    # Shapes: the O and dO tiles are [BLOCK_M, HEAD_DIM_PAD]; delta is
    # [BLOCK_M], float32.
    # Hint: O and dO may be fp16 or bf16; accumulate in fp32.
    delta = tl.zeros([BLOCK_M], dtype=tl.float32)  # Placeholder
    # --- END OF STUDENT IMPLEMENTATION ---
    tl.store(Delta + (batch_idx * N_Q_HEADS + head_idx) * SEQ_LEN + offs_m, delta, mask=offs_m < SEQ_LEN)


@triton.jit
def backward_dkdv(
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

    LSE and Delta are [B, Hq, N] fp32, contiguous (the LSE a natural log); DK and DV are [B, Hkv, N, D],
    contiguous.
    """
    n_block_idx = tl.program_id(0)
    kv_head_idx = tl.program_id(1)
    batch_idx = tl.program_id(2).to(tl.int64)
    group_size = N_Q_HEADS // N_KV_HEADS
    offs_n = n_block_idx * BLOCK_N + tl.arange(0, BLOCK_N)  # this program's keys
    offs_d = tl.arange(0, HEAD_DIM_PAD)  # the head dim, padded to a power of two
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 2) ---
    # dK and dV for this program's block of keys: load its K and V tiles
    # once, then, for each query head of the group (Part 3 names the h-th),
    # walk the blocks of BLOCK_M queries that can see these keys. For each
    # query block: load its Q and dO tiles and its rows of the LSE and of D,
    # recompute the probabilities exactly as the forward pass had them, and
    # add the block's share to dk and dv. Work on the tile transposed, keys
    # down the rows ([BLOCK_N, BLOCK_M]), so that dk and dv come out with
    # one row per key.
    # Why only some query blocks: under CAUSAL a query never sees a key
    # after it, so the query blocks wholly before this key block would add
    # nothing; skip them, never load them. Which is the first one to visit?
    # Shapes: dk and dv are [BLOCK_N, HEAD_DIM_PAD] fp32, the K, V, Q and dO
    # tiles [rows, HEAD_DIM_PAD] in the inputs' dtype, the LSE and D
    # [BLOCK_M] fp32 (rows of LSE and Delta: batch * N_Q_HEADS + query head).
    # tl.dot takes two operands of one dtype (bring a probability tile to
    # the inputs') and input_precision=INPUT_PRECISION.
    # Invariants: dk and dv sum over every query block visited and every
    # query head of the group; a probability is 0 for a key that a query
    # cannot see (past SEQ_LEN, or in its future under CAUSAL) and for a
    # query row past SEQ_LEN; the saved LSE is a natural log; every entry of
    # dK carries the softmax scale exactly once (see the maths above).
    # Hint: the exponent has two terms, the scores and the LSE, and exp2
    # wants both in log2 units: 2^(x log2(e)) = e^x.
    dk = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)  # Placeholder: dK and dV stay zero
    dv = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
    # --- END OF STUDENT IMPLEMENTATION ---
    out_offs = ((batch_idx * N_KV_HEADS + kv_head_idx) * SEQ_LEN + offs_n[:, None]) * HEAD_DIM + offs_d[None, :]
    stored = (offs_n[:, None] < SEQ_LEN) & (offs_d[None, :] < HEAD_DIM)  # this block's real keys and columns
    tl.store(DK + out_offs, dk.to(DK.dtype.element_ty), mask=stored)
    tl.store(DV + out_offs, dv.to(DV.dtype.element_ty), mask=stored)


@triton.jit
def group_query_head(kv_head_idx, h, N_Q_HEADS, N_KV_HEADS):
    """The h-th query head (0 <= h < N_Q_HEADS // N_KV_HEADS) of KV head ``kv_head_idx``'s group."""
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 3) ---
    # The GQA sum. A KV head is read by group_size = N_Q_HEADS // N_KV_HEADS
    # query heads, consecutive ones (as in forward.py Part 1), and its dK and
    # dV add up what each of them sends back: Part 2 walks h = 0 ..
    # group_size - 1 and asks here which query head the h-th is.
    # Invariants: as h runs over the group, the answers are group_size
    # different query heads, and each of them reads KV head kv_head_idx.
    # Hint: forward.py Part 1 maps a query head to its KV head; this part
    # runs that map backwards.
    return kv_head_idx  # Placeholder: the h-th query head of the group
    # --- END OF STUDENT IMPLEMENTATION ---


@triton.jit
def backward_dq(
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
    kv_head_idx = q_head_idx // (N_Q_HEADS // N_KV_HEADS)  # the KV head this query head reads
    offs_m = q_block_idx * BLOCK_M + tl.arange(0, BLOCK_M)  # this program's query rows
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 4) ---
    # dQ for this program's block of query rows: load its Q and dO tiles
    # and its rows of the LSE and of D once, then walk the blocks of BLOCK_N
    # keys of its KV head that these queries can see, adding each block's
    # share to dq. This is Part 2's tile seen the other way round: queries
    # down the rows ([BLOCK_M, BLOCK_N]), one KV head, no group to sum.
    # Why only some key blocks: under CAUSAL the last key a row sees is its
    # own; the blocks after the last row of this query block would add
    # nothing, so they are never loaded. Where does the walk stop?
    # Shapes: dq is [BLOCK_M, HEAD_DIM_PAD] fp32; the tiles and rows as in
    # Part 2.
    # Invariants: a key in a query's future, or past SEQ_LEN, contributes
    # nothing to dq (a key past the end loads as zeros, so its score is 0,
    # not -inf); the saved LSE is a natural log; every entry of dQ carries
    # the softmax scale exactly once.
    # Hint: a loop bound may depend on the program's own index, as in
    # forward.py Part 3.
    dq = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)  # Placeholder: dQ stays zero
    # --- END OF STUDENT IMPLEMENTATION ---
    out_offs = ((batch_idx * N_Q_HEADS + q_head_idx) * SEQ_LEN + offs_m[:, None]) * HEAD_DIM + offs_d[None, :]
    stored = (offs_m[:, None] < SEQ_LEN) & (offs_d[None, :] < HEAD_DIM)  # this block's real rows and columns
    tl.store(DQ + out_offs, dq.to(DQ.dtype.element_ty), mask=stored)


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
    backward_preprocess[(triton.cdiv(seq_len, block_m), n_q_heads, batch)](
        o, do, delta, *o.stride(), *do.stride(), seq_len, n_q_heads, BLOCK_M=block_m, **consts,
    )
    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride())
    dkdv, cfg = _kernel(backward_dkdv)
    dkdv[lambda meta: (triton.cdiv(seq_len, meta["BLOCK_N"]), n_kv_heads, batch)](
        q, k, v, do, lse, delta, dk, dv, *strides, sm_scale, seq_len, n_q_heads, n_kv_heads,
        CAUSAL=causal, INPUT_PRECISION=precision, **consts, **cfg,
    )
    dq_kernel, cfg = _kernel(backward_dq)
    dq_kernel[lambda meta: (triton.cdiv(seq_len, meta["BLOCK_M"]), n_q_heads, batch)](
        q, k, v, do, lse, delta, dq, *strides, sm_scale, seq_len, n_q_heads, n_kv_heads,
        CAUSAL=causal, INPUT_PRECISION=precision, **consts, **cfg,
    )
    return dq, dk, dv
