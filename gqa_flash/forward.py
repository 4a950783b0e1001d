# Your file: fill in the STUDENT IMPLEMENTATION sections; leave the rest as it is.
# (Written from the course's completed forward.py by its release tool.)
#
#   specification  gqa_flash/reference.py: reference_attention (O and the LSE)
#   notebook       notebooks/04_triton_kernel.ipynb, checked by checks.check_forward()
#   graded by      tests/graded/test_forward.py: 40 points
#   run them       make test-graded MODULE=forward
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

GQA costs nothing extra: the program of a query head simply reads the K and V
of its group's KV head. The K and V tiles of one KV head are read by
``group_size`` programs, which the GPU's L2 cache serves.

What you write: the kernel, in six ``@triton.jit`` helpers, one idea each.
The kernel at the bottom only calls them in order (Triton inlines helpers, so
they cost nothing), and notebook 04 checks each on its own.

    Part 1  program_ids             which tile, batch and heads this program owns
    Part 2  load_tile               a masked [rows, columns] tile, any strides
    Part 3  key_loop                both phases of the key loop, with their bounds
    Part 4  online_softmax_update   fold one tile of scores into (acc, l_i, m_i)
    Part 5  mask_scores             the causal mask and the ragged tail
    Part 6  epilogue                normalise; store O and the LSE
"""

import torch
import triton
import triton.language as tl

from gqa_flash.course import runtime  # picks the interpreter before the kernels below are defined


@triton.jit
def program_ids(N_Q_HEADS, N_KV_HEADS):
    """Returns ``(q_tile_idx, batch_idx, q_head_idx, kv_head_idx)`` for this program."""
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 1) ---
    # Every program computes the same code; only its place in the launch grid
    # tells it which work is its own. The grid (see flash_attention_forward)
    # is (query tiles, batch * N_Q_HEADS): axis 0 counts query tiles, axis 1
    # counts (batch, query head) pairs with the head varying fastest.
    # Return, in this order: the query tile, the batch, the query head, and
    # the KV head that query head reads.
    # Invariants: 0 <= q_head_idx < N_Q_HEADS, 0 <= kv_head_idx < N_KV_HEADS,
    # and a group of N_Q_HEADS // N_KV_HEADS *consecutive* query heads shares
    # one KV head (as in naive.py).
    # Hint: tl.program_id(axis) is this program's index along an axis.
    zero = tl.program_id(0) * 0
    return zero, zero, zero, zero  # Placeholder: every program does the first tile of head 0
    # --- END OF STUDENT IMPLEMENTATION ---


@triton.jit
def load_tile(X, batch_idx, head_idx, rows, cols, stride_b, stride_h, stride_row, stride_col, n_rows, n_cols):
    """Load the [len(rows), len(cols)] tile ``X[batch_idx, head_idx, rows, cols]``.

    ``rows`` and ``cols`` are 1-D index ranges (``tl.arange`` plus an offset);
    entries with ``rows >= n_rows`` or ``cols >= n_cols`` do not exist and
    come back as 0.
    """
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 2) ---
    # A Triton load takes a *tile of pointers*: one address per element. The
    # element [b, h, r, c] lives b·stride_b + h·stride_h + r·stride_row +
    # c·stride_col elements past X, whatever the layout of X (a transposed
    # [B, N, H, D] tensor and a strided head dim included).
    # Two things make it safe:
    #   * Rows past n_rows (the ragged last tile of a sequence) and columns
    #     past n_cols (the head dim padded to a power of two) are outside the
    #     tensor: a load there reads someone else's memory or faults. Mask
    #     them, and let them read 0, which adds nothing to any dot product.
    #   * The batch and head offsets overflow 32-bit integers once a tensor
    #     holds 2^31 elements: do that part of the arithmetic in int64.
    # Hint: broadcasting a column of row offsets against a row of column
    # offsets gives the 2-D tile, for the pointers and for the mask alike.
    return tl.zeros((rows.shape[0], cols.shape[0]), dtype=X.dtype.element_ty)  # Placeholder: all zeros
    # --- END OF STUDENT IMPLEMENTATION ---


@triton.jit
def key_loop(acc, l_i, m_i, q, K, V, batch_idx, kv_head_idx,
             stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn, stride_vd,
             q_tile_idx, offs_m, offs_d, qk_scale, SEQ_LEN, HEAD_DIM,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
             INPUT_PRECISION: tl.constexpr):
    """Stream every key block this query tile needs past it; return the new ``(acc, l_i, m_i)``.

    ``q`` is the [BLOCK_M, HEAD_DIM_PAD] query tile (rows ``offs_m``,
    columns ``offs_d``), already loaded; ``acc``, ``l_i``, ``m_i`` hold the
    online-softmax state, fresh.
    """
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 3) ---
    # The heart of the kernel: the walk over key blocks of BLOCK_N keys, in
    # two phases (the module's docstring draws them).
    #   Phase 1 needs no mask. Causal: the keys before this query tile's first
    #   row, which every row of the tile sees. Not causal: every *full* block.
    #   Phase 2 goes through mask_scores. Causal: the diagonal, the blocks
    #   holding this tile's own rows (and no further: a block past the
    #   diagonal holds only future keys, so it is skipped, never loaded;
    #   that is half of causal attention's work saved). Not causal: the
    #   ragged last block, if there is one.
    # For each block: load its K and V tiles (Part 2), compute the scores
    # [BLOCK_M, BLOCK_N] in log2 units (the dot product of the query rows
    # with the key rows, times qk_scale), and fold them in (Part 4).
    # Invariants: each key < SEQ_LEN that the tile may see goes through
    # exactly one phase, once; both phases start on a multiple of BLOCK_N
    # (BLOCK_M is a multiple of BLOCK_N); the tile's rows past SEQ_LEN may
    # see anything, they are never stored.
    # Hint: a loop bound may depend on the program's own index (q_tile_idx);
    # and tl.dot wants [M, K] @ [K, N]: your K tile is [BLOCK_N, HEAD_DIM_PAD].
    return acc, l_i, m_i  # Placeholder: no key is ever visited
    # --- END OF STUDENT IMPLEMENTATION ---


@triton.jit
def online_softmax_update(acc, l_i, m_i, s, v, INPUT_PRECISION: tl.constexpr):
    """Fold one [BLOCK_M, BLOCK_N] tile of scores ``s`` (already scaled by
    ``qk_scale``, so in log2 units) and its [BLOCK_N, HEAD_DIM_PAD] values
    ``v`` into the running state. Returns the new ``(acc, l_i, m_i)``."""
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 4) ---
    # The update of tiled.py, row by row, with one change: the scores are in
    # log2 units, so every exponential is a power of 2 (tl.exp2), never e^x.
    # Shapes: acc [BLOCK_M, HEAD_DIM_PAD] and l_i, m_i [BLOCK_M], all fp32;
    # v in the input's dtype (fp16, bf16 or fp32).
    # Invariants: the running max never goes down; after the update, l_i and
    # acc are both sums of 2^(score - m_i) with the *new* m_i, over every key
    # seen so far (the old terms rescaled, this tile's added). A row whose
    # scores in this tile are all -inf (masked) must come out unchanged,
    # and the very first tile arrives with m_i = -inf, l_i = 0, acc = 0.
    # Hint: tl.dot needs both operands in one dtype, and fp16/bf16 inputs
    # want their products on the tensor cores: bring the probabilities to
    # v's dtype, and pass input_precision=INPUT_PRECISION to tl.dot.
    return acc, l_i, m_i  # Placeholder: the state is never updated
    # --- END OF STUDENT IMPLEMENTATION ---


@triton.jit
def mask_scores(s, offs_m, offs_n, SEQ_LEN, CAUSAL: tl.constexpr):
    """Return ``s`` with -inf for the keys that row ``offs_m[i]`` must not see.

    ``s`` is a [BLOCK_M, BLOCK_N] tile of scores of query rows ``offs_m``
    against keys ``offs_n``; only the blocks of phase 2 come here.
    """
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 5) ---
    # Two reasons hide a key from a row:
    #   * it does not exist: it is past SEQ_LEN. Its K row was loaded as 0,
    #     so its score is 0, not -inf: a real weight unless you hide it;
    #   * under the causal mask only, it is in the row's future. The diagonal
    #     itself (a row's own key) is visible.
    # CAUSAL is a compile-time constant: a plain Python `if` on it is
    # resolved when Triton compiles the kernel and costs nothing at run time.
    # Why -inf: 2^-inf = 0, so a hidden key gets no weight and no share of l_i.
    # Hint: compare the key indices with the row indices by broadcasting, as
    # for the mask of Part 2.
    return s  # Placeholder: nothing is masked
    # --- END OF STUDENT IMPLEMENTATION ---


@triton.jit
def epilogue(acc, l_i, m_i, O, LSE, batch_idx, q_head_idx, offs_m, offs_d,
             stride_ob, stride_oh, stride_on, stride_od, stride_lb, stride_lh, stride_ln, SEQ_LEN, HEAD_DIM):
    """Normalise the accumulator; store the tile's rows of O and their LSE.

    O is [B, Hq, SEQ_LEN, HEAD_DIM] in the input's dtype, LSE is
    [B, Hq, SEQ_LEN] float32; this tile's rows are ``offs_m``, its columns
    ``offs_d`` (padded to a power of two).
    """
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 6) ---
    # After the last key block, acc holds the sum of 2^(score - m_i) * v and
    # l_i the sum of 2^(score - m_i): divide once, here, not in every step.
    # The LSE the backward pass needs is the natural log of the sum of
    # e^(sm_scale * score) over the row's visible keys. m_i and l_i carry it
    # in base 2: convert (log2(x) = ln(x) / ln(2)).
    # Store O in O's own dtype and the LSE as float32, each through a tile
    # of pointers as in Part 2, and write nothing outside the tensors: rows
    # past SEQ_LEN belong to the next head (or to no tensor), columns past
    # HEAD_DIM to the next row.
    # Invariant: l_i >= 1 for every real row, so no epsilon is needed.
    # Hint: a pointer's element type is ptr.dtype.element_ty.
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

    # Part 1: which query tile, batch and heads are this program's.
    q_tile_idx, batch_idx, q_head_idx, kv_head_idx = program_ids(N_Q_HEADS, N_KV_HEADS)

    # The rows of this query tile and the head-dim columns (HEAD_DIM_PAD of
    # them: the ones at or past HEAD_DIM are padding).
    offs_m = q_tile_idx * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)

    # Part 2: the Q tile, loaded once and kept for the whole key loop.
    q = load_tile(Q, batch_idx, q_head_idx, offs_m, offs_d, stride_qb, stride_qh, stride_qn, stride_qd,
                  SEQ_LEN, HEAD_DIM)

    # The online-softmax state of each row, in fp32 whatever the input dtype.
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # log2(e): scores come out in log2 units

    # Part 3 (with Parts 4 and 5 inside): every key block this tile needs.
    acc, l_i, m_i = key_loop(acc, l_i, m_i, q, K, V, batch_idx, kv_head_idx,
                             stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn, stride_vd,
                             q_tile_idx, offs_m, offs_d, qk_scale, SEQ_LEN, HEAD_DIM,
                             BLOCK_M, BLOCK_N, CAUSAL, INPUT_PRECISION)

    # Part 6: normalise, and store this tile's rows of O and LSE.
    epilogue(acc, l_i, m_i, O, LSE, batch_idx, q_head_idx, offs_m, offs_d,
             stride_ob, stride_oh, stride_on, stride_od, stride_lb, stride_lh, stride_ln, SEQ_LEN, HEAD_DIM)


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
    # NaN in the interpreter until the kernel writes them (runtime.empty_output), uninitialised on a GPU
    o = runtime.empty_output((batch, n_q_heads, seq_len, head_dim), q.dtype, q.device)
    lse = runtime.empty_output((batch, n_q_heads, seq_len), torch.float32, q.device)

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
