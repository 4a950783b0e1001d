# Student version of solutions/forward.py, written by `python -m gqa_flash.grader.release`.
# Fill in the STUDENT IMPLEMENTATION sections; leave the rest as it is.
"""The FlashAttention forward pass in Triton: causal, grouped-query attention.

This is ``tiled.py`` turned into a GPU kernel. One *program* (a Triton
instance of the kernel, run by one streaming multiprocessor) owns one query
tile of ``BLOCK_M`` rows of one (batch, query head). It loads its Q tile once,
then streams K and V past it ``BLOCK_N`` keys at a time, keeping the online
softmax state (``m_i``, ``l_i``, ``acc``) in registers, and writes each output
row once. The launch grid is

    axis 0: cdiv(N, BLOCK_M) query tiles
    axis 1: batch * n_q_heads (batch b, head h is program b * n_q_heads + h)

The key loop has two phases, so that the mask costs nothing where it is not
needed:

    Phase 1, the off-diagonal key blocks: for a causal query tile starting at
      row q_start, every key before q_start is visible to every row of the
      tile. No mask at all. (Without the causal mask: every full key block.)
    Phase 2, the diagonal key blocks: keys q_start .. q_start + BLOCK_M - 1,
      where key j is visible to row i only if j <= i; and, without the causal
      mask, the last, ragged key block. Here the scores are masked.
    Key blocks after the diagonal are never loaded: causal attention does
    half the work of the full matrix.

Two tricks from FlashAttention-2 and Triton's tutorial:
  * exp2 instead of exp. The GPU computes 2^x in one instruction (``ex2``);
    e^x costs a multiply more. We fold log2(e) into the score scale once,
    ``qk_scale = sm_scale * log2(e)``, so that exp2(s * qk_scale) =
    exp(s * sm_scale). The running max ``m_i`` is then in log2 units too, and
    the LSE must be converted back to natural log at the end.
  * No epsilon in ``acc / l_i``. Every row has at least one visible key (its
    own diagonal under the causal mask; all keys without), and the row's
    maximum contributes exp2(0) = 1 to ``l_i``, so ``l_i >= 1``.

GQA costs nothing extra: the program of query head h simply reads KV head
h // (n_q_heads // n_kv_heads). The K and V tiles of one KV head are read by
``group_size`` programs, which the GPU's L2 cache serves.

What you write: four small ``@triton.jit`` helpers, one idea each, which the
kernel calls (Triton inlines them, so they cost nothing). Each can be checked
on its own in notebook 04.

    Part 1  _kv_head_index          query head -> KV head
    Part 2  _online_softmax_update  fold one tile of scores into (acc, l_i, m_i)
    Part 3  _mask_scores            the causal mask and the ragged tail
    Part 4  _epilogue               normalise; store O and the LSE
"""

import torch
import triton
import triton.language as tl

from gqa_flash import runtime  # picks the interpreter before the kernels below are defined


@triton.jit
def _kv_head_index(q_head_idx, N_Q_HEADS, N_KV_HEADS):
    """The key/value head that query head ``q_head_idx`` reads."""
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 1) ---
    # Map a query head to the key/value head it shares.
    #   1. group_size: how many query heads share one KV head.
    #   2. The KV head of q_head_idx. Consecutive query heads form a group
    #      (heads 0 .. group_size-1 read KV head 0): integer division, not
    #      the remainder.
    return q_head_idx * 0  # Placeholder: replace with your calculation
    # --- END OF STUDENT IMPLEMENTATION ---


@triton.jit
def _online_softmax_update(acc, l_i, m_i, s, v, INPUT_PRECISION: tl.constexpr):
    """Fold one [BLOCK_M, BLOCK_N] tile of scores ``s`` (already scaled by
    ``qk_scale``, so in log2 units) and its [BLOCK_N, HEAD_DIM] values ``v``
    into the running state. Returns the new ``(acc, l_i, m_i)``."""
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 2) ---
    # The online-softmax update, as in tiled.py, but with exp2:
    #   1. m_new = the larger of m_i and the row maxima of s (tl.max(s, 1)).
    #   2. alpha = exp2(m_i - m_new): the factor that rescales the old l_i
    #      and acc to the new maximum.
    #   3. p = exp2(s - m_new[:, None]): this tile's unnormalised probabilities.
    #   4. l_i = l_i * alpha + the row sums of p.
    #   5. acc = acc * alpha[:, None] + p @ v. tl.dot needs both operands in
    #      one dtype: cast p to v's dtype (p.to(v.dtype)), not to a fixed one,
    #      so fp16, bf16 and fp32 inputs all work. Pass
    #      input_precision=INPUT_PRECISION to tl.dot.
    #   6. Return acc, l_i, m_new.
    return acc, l_i, m_i  # Placeholder: the state is never updated
    # --- END OF STUDENT IMPLEMENTATION ---

@triton.jit
def _mask_scores(s, offs_m, offs_n, SEQ_LEN, CAUSAL: tl.constexpr):
    """Set to -inf the scores of keys that row ``offs_m[i]`` must not see.

    ``s`` is a [BLOCK_M, BLOCK_N] tile of scores of query rows ``offs_m``
    against keys ``offs_n``; only the blocks of Phase 2 come here.
    """
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 3) ---
    # A key is visible to a row when
    #   * it exists: offs_n < SEQ_LEN (the padding keys of a ragged last
    #     block were loaded as 0, so their score is 0, not -inf: a real
    #     weight unless you mask it), and
    #   * under the causal mask only (CAUSAL is a compile-time constant: use
    #     a plain `if CAUSAL:`), it is not in the row's future:
    #     offs_n <= offs_m (the diagonal itself is visible).
    # Build that [BLOCK_M, BLOCK_N] boolean with broadcasting
    # (offs_m[:, None], offs_n[None, :]) and return
    # tl.where(visible, s, float("-inf")): exp2(-inf) = 0.
    return s  # Placeholder: nothing is masked
    # --- END OF STUDENT IMPLEMENTATION ---


@triton.jit
def _epilogue(acc, l_i, m_i, o_ptrs, lse_ptrs, row_ok, col_ok):
    """Normalise the accumulator and store the tile's O rows and their LSE.

    ``o_ptrs`` is the [BLOCK_M, HEAD_DIM_PAD] tile of pointers into O,
    ``lse_ptrs`` the [BLOCK_M] pointers into LSE; ``row_ok`` marks the rows
    that exist (< SEQ_LEN), ``col_ok`` the real head-dim columns.
    """
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 4) ---
    # The epilogue.
    #   1. Normalise once: o = acc / l_i[:, None]. No epsilon: l_i >= 1.
    #   2. The log-sum-exp of each row, in natural log. m_i and log2(l_i) are
    #      in log2 units: lse = (m_i + tl.log2(l_i)) * ln(2).
    #   3. Store o, cast to O's dtype (o_ptrs.dtype.element_ty), and lse.
    #      Mask both stores: rows past SEQ_LEN (row_ok) and, for o, the
    #      padding columns (col_ok) must not be written; they are not there.
    pass  # Placeholder: nothing is stored yet
    # --- END OF STUDENT IMPLEMENTATION ---


@triton.jit
def _flash_attention_forward_gqa_kernel(
    # Pointers to the tensors
    Q, K, V, O, LSE,
    # Strides, in elements, of every dimension: [batch, heads, seq, head_dim]
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_lb, stride_lh, stride_ln,
    # Sizes and the softmax scale
    sm_scale,
    SEQ_LEN,
    N_Q_HEADS,
    N_KV_HEADS,
    # Compile-time constants: Triton builds one kernel per combination
    HEAD_DIM: tl.constexpr,  # the real head dim, any value 1..256
    HEAD_DIM_PAD: tl.constexpr,  # the next power of two (>= 16): tl.arange and tl.dot need one
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs, "tf32" otherwise (unused for fp16/bf16)
):
    # The diagonal phase walks BLOCK_M keys in steps of BLOCK_N.
    tl.static_assert(BLOCK_M % BLOCK_N == 0, "BLOCK_M must be a multiple of BLOCK_N")

    # Which query tile and which (batch, query head) this program owns.
    q_block_idx = tl.program_id(0)
    batch_head_idx = tl.program_id(1)
    batch_idx = batch_head_idx // N_Q_HEADS
    q_head_idx = batch_head_idx % N_Q_HEADS

    # Part 1: the KV head this query head reads.
    kv_head_idx = _kv_head_index(q_head_idx, N_Q_HEADS, N_KV_HEADS)

    # Base pointers of this (batch, head). Offsets in int64: batch_idx *
    # stride_qb overflows 32 bits once a tensor holds more than 2^31 elements.
    batch_idx = batch_idx.to(tl.int64)
    q_base = Q + batch_idx * stride_qb + q_head_idx.to(tl.int64) * stride_qh
    k_base = K + batch_idx * stride_kb + kv_head_idx.to(tl.int64) * stride_kh
    v_base = V + batch_idx * stride_vb + kv_head_idx.to(tl.int64) * stride_vh

    # Rows of this query tile, and the head-dim columns. Columns at or past
    # HEAD_DIM (when it is not a power of two) are padding: loaded as 0, they
    # add 0 to every dot product, and they are never stored.
    offs_m = q_block_idx * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < HEAD_DIM

    # Load the Q tile once; rows past SEQ_LEN (the ragged last tile) read 0.
    q = tl.load(
        q_base + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd,
        mask=(offs_m[:, None] < SEQ_LEN) & d_ok[None, :],
        other=0.0,
    )

    # The online-softmax state of each row, in fp32 whatever the input dtype.
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)

    qk_scale = sm_scale * 1.4426950408889634  # log2(e): scores come out in log2 units

    # --- Phase 1: key blocks that need no mask ---
    if CAUSAL:
        phase1_end = q_block_idx * BLOCK_M  # every key before this tile's first row
    else:
        phase1_end = (SEQ_LEN // BLOCK_N) * BLOCK_N  # every full key block
    for start_n in range(0, phase1_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        # K is loaded transposed, [HEAD_DIM, BLOCK_N], so that q @ k is the
        # [BLOCK_M, BLOCK_N] tile of scores.
        k = tl.load(
            k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd,
            mask=d_ok[:, None],
            other=0.0,
        )
        v = tl.load(
            v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
            mask=d_ok[None, :],
            other=0.0,
        )
        s = tl.dot(q, k, input_precision=INPUT_PRECISION) * qk_scale
        acc, l_i, m_i = _online_softmax_update(acc, l_i, m_i, s, v, INPUT_PRECISION)

    # --- Phase 2: key blocks that need a mask ---
    if CAUSAL:
        phase2_end = tl.minimum((q_block_idx + 1) * BLOCK_M, SEQ_LEN)  # the diagonal
    else:
        phase2_end = SEQ_LEN  # the ragged last key block, if there is one
    for start_n in range(phase1_end, phase2_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        # Keys past SEQ_LEN do not exist: their loads must be masked.
        k = tl.load(
            k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd,
            mask=(offs_n[None, :] < SEQ_LEN) & d_ok[:, None],
            other=0.0,
        )
        v = tl.load(
            v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
            mask=(offs_n[:, None] < SEQ_LEN) & d_ok[None, :],
            other=0.0,
        )
        s = tl.dot(q, k, input_precision=INPUT_PRECISION) * qk_scale

        # Part 3: hide the keys a row must not see, then fold the tile in as before.
        s = _mask_scores(s, offs_m, offs_n, SEQ_LEN, CAUSAL)
        acc, l_i, m_i = _online_softmax_update(acc, l_i, m_i, s, v, INPUT_PRECISION)

    # Part 4: normalise, and store this tile's rows of O and LSE.
    o_ptrs = (O + batch_idx * stride_ob + q_head_idx.to(tl.int64) * stride_oh
              + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od)
    lse_ptrs = LSE + batch_idx * stride_lb + q_head_idx.to(tl.int64) * stride_lh + offs_m * stride_ln
    _epilogue(acc, l_i, m_i, o_ptrs, lse_ptrs, offs_m < SEQ_LEN, d_ok)


# --- Choosing tiles --------------------------------------------------------
#
# In the interpreter every program runs one after the other in NumPy: a fixed,
# small tile. BLOCK_M = 2 * BLOCK_N, so the diagonal phase walks two key
# blocks, one of them with rows that see none of its keys.
INTERPRETER_CONFIG = dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1)

# On a GPU the best tile depends on the head dim, the dtype and the length:
# Triton's autotuner times each candidate once per new key and keeps the
# fastest. (Measured on an H200, bf16, causal GQA 32:8: 128x64 with 8 warps
# wins at head_dim 64, 128x128 at head_dim 128 and long sequences, 64x64 at
# head_dim 128 and N = 1024; notebooks/data/ holds the numbers.)
GPU_CONFIGS = [
    triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn), num_warps=w, num_stages=st)
    for bm, bn, w, st in [
        (128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3), (64, 64, 4, 2),
        (128, 64, 8, 4), (64, 32, 4, 2), (32, 32, 4, 2),
    ]
]


def _prune_configs(configs, named_args, **kwargs):
    """Keep the candidates that fit: big tiles run out of registers and shared
    memory at head_dim 256 or with fp32 inputs."""
    args = {**named_args, **kwargs}  # constexprs arrive in kwargs on some Triton versions
    big = args["HEAD_DIM_PAD"] > 128 or args["Q"].dtype == torch.float32
    fits = [c for c in configs if not big or c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] <= 64 * 64]
    return fits or configs


_autotuned_kernel = None


def _gpu_kernel():
    """The autotuned kernel, built on first use (the interpreter has no autotuner)."""
    global _autotuned_kernel
    if _autotuned_kernel is None:
        _autotuned_kernel = triton.autotune(
            configs=GPU_CONFIGS,
            key=["SEQ_LEN", "N_Q_HEADS", "N_KV_HEADS", "HEAD_DIM_PAD", "CAUSAL"],
            prune_configs_by={"early_config_prune": _prune_configs},
        )(_flash_attention_forward_gqa_kernel)
    return _autotuned_kernel


def flash_attention_forward(q, k, v, causal=True, sm_scale=None, return_lse=False, config=None):
    """Launch the kernel. ``q``: [B, Hq, N, D]; ``k``, ``v``: [B, Hkv, N, D].

    Any strides are fine (a [B, N, H, D] tensor transposed to [B, H, N, D]
    included): the kernel takes all of them. Returns O ([B, Hq, N, D], q's
    dtype, contiguous) and, with ``return_lse``, the natural-log LSE
    ([B, Hq, N], float32). The public API (``gqa_flash.flash_attention_forward``)
    checks the inputs before it calls this. ``config`` (a dict of BLOCK_M,
    BLOCK_N, num_warps, num_stages) skips the autotuner, for benchmarks.
    """
    batch, n_q_heads, seq_len, head_dim = q.shape
    n_kv_heads = k.shape[1]
    if sm_scale is None:
        sm_scale = head_dim ** -0.5
    o = torch.empty((batch, n_q_heads, seq_len, head_dim), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, n_q_heads, seq_len), dtype=torch.float32, device=q.device)

    if runtime.INTERPRETER or not q.is_cuda:
        kernel, config = _flash_attention_forward_gqa_kernel, config or INTERPRETER_CONFIG
    elif config is not None:
        kernel = _flash_attention_forward_gqa_kernel
    else:
        kernel, config = _gpu_kernel(), {}  # the autotuner supplies the tile
    # One program per query tile (axis 0) and per (batch, query head) (axis 1).
    grid = lambda meta: (triton.cdiv(seq_len, meta["BLOCK_M"]), batch * n_q_heads)  # noqa: E731
    kernel[grid](
        q, k, v, o, lse,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(), *lse.stride(),
        sm_scale, seq_len, n_q_heads, n_kv_heads,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        CAUSAL=causal,
        # fp32 in means fp32 products (Triton would use tf32 by default)
        INPUT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        **config,
    )
    return (o, lse) if return_lse else o
