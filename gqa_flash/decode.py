# Your file: fill in the STUDENT IMPLEMENTATION sections; leave the rest as it is.
# (Written from the course's completed decode.py by its release tool.)
#
#   specification  gqa_flash/reference.py: reference_decode
#   notebook       notebooks/07_decoding.ipynb, checked by checks.check_decode()
#   graded by      tests/graded/test_decode.py: 15 points, a bonus on top of the 100
#   run them       make test-graded MODULE=decode
"""Bonus: flash-decoding in Triton, GQA attention of a few new tokens over a KV cache.

A language model writes its answer one token at a time. Each step runs
attention for the ``Nq`` new tokens only (1, or up to 16 when a draft model
proposes several), against every key and value the sequence has so far, kept
in a *KV cache*. The arithmetic is tiny: each K/V element read takes part in
one multiply-add per query row. So decoding is bound by memory, not by the
tensor cores: the kernel is as fast as it reads the cache, and the one goal is
to read every cache byte once, with every streaming multiprocessor (SM) busy.

Two ideas get there (FlashDecoding, Dao et al. 2023; FlashAttention's
``flash_attn_with_kvcache``):

  * **Pack the group.** Under GQA, the ``Hq / Hkv`` query heads of a group
    read the same K and V. One program owns one KV head and puts *all* of its
    query heads, times the ``Nq`` new tokens, down the rows of one tile, in
    runs of ``Nq`` rows per query head (which row holds which pair is Part 1).
    Each K/V tile is loaded once and serves the whole group in one ``tl.dot``
    (instead of ``Hq / Hkv`` programs each loading it again).
  * **Split the context** (split-K). With batch 1 and 8 KV heads, one program
    per (batch, KV head) is 8 programs for a GPU of 132 SMs. So each
    sequence's context is cut into ``num_splits`` chunks; a program walks one
    chunk and writes a *partial* softmax state (acc, m, l), exactly the state
    of the online softmax of notebook 02. A second, small kernel merges the
    partials of each row with the log-sum-exp merge (``merge_softmax_states``).

The cache comes in two layouts, and the kernel sees both the same way, as
``[pages, slots, Hkv, D]``:

    contiguous  k_cache [B, Hkv, S_max, D]: sequence b's position p is in
                page b, slot p (one page per sequence, S_max slots long);
    paged       k_cache [num_blocks, page_size, Hkv, D] (vLLM's and
                FlashAttention's layout) with block_table [B, max_pages]:
                row b of the table lists, in order, the pool pages that hold
                sequence b, page_size positions each (finding a position's
                page and slot is Part 2). Pages live anywhere in the pool, in
                any order, so sequences grow without copying.

``cache_seqlens[b]`` counts sequence b's valid positions, the Nq new tokens
included (they were written to the cache just before this call, as its last
Nq positions, in order). Each new token sees every position up to and
including its own: the causal rule, for the few rows that have a future. Positions at or past ``cache_seqlens[b]`` hold
anything (stale tokens of a finished sequence, NaN): they must never be read.

Two kernels, both in the log2 domain of forward.py (exp2, with log2(e) folded
into the score scale):

    _flash_decode_split_kernel   grid (row blocks, num_splits, B * Hkv)
        one group tile against one chunk of one sequence -> partial (acc, m, l)
    _flash_decode_merge_kernel   grid (B * Hq * Nq / BLOCK_R,)
        the partials of BLOCK_R rows -> their rows of O and their LSE
        (on a GPU launched early, programmatic dependent launch: it waits
        on the GPU, not on the host, for the split kernel's partials)

With one split (a batch that fills the GPU on its own) the split kernel
finishes its rows itself, with Part 4 on a single state, and the merge kernel
does not run.

What you write, in four ``@triton.jit`` helpers:

    Part 1  group_tile        the packed query tile of a KV group: heads x new tokens
    Part 2  page_slots        the page-table lookup: logical position -> (page, slot)
    Part 3  split_partial     one split's walk over its chunk: (acc, l, m), causal rule included
    Part 4  merge_splits      the log-sum-exp merge of the splits: one row of O and its LSE
"""

import triton
import triton.language as tl

from gqa_flash.course import runtime  # noqa: F401  (picks the interpreter before the kernels below are defined)
from gqa_flash.course import decode_launch  # the host's side: splits, tiles, launches

try:  # programmatic dependent launch, Hopper's and later GPUs' (used only with config "pdl")
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # an older Triton: never called, since PDL is then refused on the host
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def group_tile(Q, batch_idx, kv_head_idx, rows, row_ok, offs_d,
               stride_qb, stride_qh, stride_qn, stride_qd, N_Q_HEADS, N_KV_HEADS, N_Q, HEAD_DIM):
    """Load the packed query tile of KV head ``kv_head_idx``; return ``(q, q_head, token)``.

    ``rows`` are this program's tile rows (``tl.arange`` plus an offset),
    ``row_ok`` says which of them exist (rows past group_size * N_Q are
    padding), ``offs_d`` the head-dim columns, padded to a power of two.
    """
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 1) ---
    # What: the rows of the tile are every pair (query head of this KV head's
    # group, new token): group_size * N_Q rows. Return, for every row, its
    # query head (q_head, counted over all N_Q_HEADS) and its new token, and
    # the tile q[r, :] = Q[batch_idx, q_head[r], token[r], :] itself.
    # Why: the heads of a group read the same K and V. Stacked into one tile,
    # they meet each K/V tile in a single tl.dot, so every byte of the cache
    # is read once per group instead of once per query head: for decoding,
    # which does almost no arithmetic per byte, that is the whole speed.
    # Shapes: rows, row_ok, q_head, token [BLOCK_M]; q [BLOCK_M, HEAD_DIM_PAD]
    # in Q's dtype; Q is [B, N_Q_HEADS, N_Q, HEAD_DIM] with any strides.
    # Invariants: the real rows (row_ok) hold each pair exactly once; the
    # group of KV head j is the N_Q_HEADS // N_KV_HEADS *consecutive* query
    # heads that naive.py gives it; padding rows and padding columns load as
    # 0 and read no memory. (The kernel stores each row's result at the
    # q_head and token you return, so any order of the pairs will do.)
    # Hint: one row number gives two coordinates: one counts whole runs of
    # N_Q rows, the other the place within a run.
    zero = rows * 0
    q = tl.zeros((rows.shape[0], offs_d.shape[0]), dtype=Q.dtype.element_ty)
    return q, zero, zero  # Placeholder: every row is head 0, token 0, and its query is 0
    # --- END OF STUDENT IMPLEMENTATION ---


@triton.jit
def page_slots(BLOCK_TABLE, batch_idx, offs_n, key_ok, stride_tb, stride_tp,
               PAGE_SIZE: tl.constexpr, PAGED: tl.constexpr):
    """Where the keys at logical positions ``offs_n`` of sequence ``batch_idx`` live: ``(page, slot)``.

    The kernel reads the cache as ``[pages, slots, Hkv, D]``; see the module's
    docstring for the two layouts. ``key_ok`` marks the positions that exist.
    """
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 2) ---
    # What: for each logical position p (the p-th token of sequence
    # batch_idx), the page of the cache that holds it and its slot in that
    # page. Paged: the table's row batch_idx lists the sequence's pages in
    # order, PAGE_SIZE positions each: the page is found through the table,
    # the slot is where p falls inside its page. Contiguous (PAGED is False):
    # each sequence is one long page of its own, number batch_idx, and p is
    # its own slot.
    # Why: a paged cache lets sequences grow a page at a time and share a
    # pool without copying; the price is this one indirection per position.
    # Shapes: offs_n, key_ok, page, slot [BLOCK_N], integers; BLOCK_TABLE is
    # [B, max_pages] int32 with strides (stride_tb, stride_tp).
    # Invariants: read no table entry for a position with key_ok False (past
    # the sequence's last page, the table holds anything, even -1, and its
    # row may end); PAGED and PAGE_SIZE are compile-time constants, so a plain
    # `if` on PAGED costs nothing at run time.
    # Hint: integer division and remainder by PAGE_SIZE split a position in two.
    return offs_n * 0, offs_n * 0  # Placeholder: every position is slot 0 of page 0
    # --- END OF STUDENT IMPLEMENTATION ---


@triton.jit
def _load_cache_tile(X, page, slot, kv_head_idx, offs_d, stride_page, stride_slot, stride_head, stride_d,
                     key_ok, HEAD_DIM, N_PAGES):
    """The [BLOCK_N, HEAD_DIM_PAD] tile of cache X (K or V) at ``(page, slot)`` of KV head ``kv_head_idx``.

    A masked load: rows with ``key_ok`` False and columns past HEAD_DIM read
    nothing and come back as 0. Offsets in int64: a pool of pages is easily
    larger than 2^31 elements. ``N_PAGES`` is the number of pages the cache
    holds: a page index outside ``0 .. N_PAGES - 1`` (a block table a server
    got wrong; the API checks none when it is given ``max_seqlen``) is clamped
    into the pool, so it reads a wrong page, never memory outside the cache.
    """
    page = tl.minimum(tl.maximum(page, 0), N_PAGES - 1)
    row_start = page.to(tl.int64) * stride_page + slot.to(tl.int64) * stride_slot
    head_start = X + kv_head_idx.to(tl.int64) * stride_head
    in_cache = key_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    return tl.load(head_start + row_start[:, None] + offs_d[None, :] * stride_d, mask=in_cache, other=0.0)


@triton.jit
def split_partial(acc, l_i, m_i, q, token, K, V, BLOCK_TABLE, batch_idx, kv_head_idx, split_idx, seq_len,
                  offs_d, qk_scale, CHUNK,
                  stride_kp, stride_ks, stride_kh, stride_kd, stride_vp, stride_vs, stride_vh, stride_vd,
                  stride_tb, stride_tp, N_Q, HEAD_DIM, N_PAGES,
                  BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, PAGED: tl.constexpr,
                  INPUT_PRECISION: tl.constexpr):
    """Walk this split's chunk of the context; return the partial ``(acc, l_i, m_i)`` of every row.

    ``q`` is the packed tile of Part 1 and ``token`` each row's new token;
    ``acc``, ``l_i``, ``m_i`` arrive fresh (0, 0, -inf). ``seq_len`` is
    ``cache_seqlens[batch_idx]``, already clamped to the cache's capacity.
    ``N_PAGES`` (the pages the cache holds) is for ``_load_cache_tile``.
    """
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 3) ---
    # What: split split_idx owns chunk number split_idx of the context (chunks
    # of CHUNK positions, the last cut at seq_len). Walk it BLOCK_N at a time: find
    # each block's pages and slots (Part 2), load its K and V tiles
    # (_load_cache_tile), score the whole group tile against them in log2
    # units (times qk_scale), hide what a row may not see, and fold the block
    # into the online-softmax state as forward.py's Part 4 does. Leave the
    # state unnormalised: the merge (Part 4) needs acc, l and m as they are.
    # Why: a chunk is a slice of the keys, and the softmax state of a slice is
    # exactly what notebook 02 merges; splitting the context gives a GPU
    # enough programs when batch x KV heads alone would leave SMs idle.
    # The causal rule: the N_Q new tokens are the last N_Q positions of the
    # sequence, in order; each sees the positions up to its own, no later ones.
    # Shapes: q [BLOCK_M, HEAD_DIM_PAD]; token, l_i, m_i [BLOCK_M]; acc
    # [BLOCK_M, HEAD_DIM_PAD]; the state in fp32.
    # Invariants: a position at or past seq_len is never loaded (it may hold
    # NaN, and 0 * NaN is NaN); CHUNK is a multiple of BLOCK_N, so a block
    # never reaches into the next split's chunk; a row may see *no* key of a
    # block, or of a whole chunk (a chunk that starts past seq_len, or a new
    # token before the chunk's keys): its state must stay (0, 0, -inf), with
    # no NaN, where forward.py could count on every row's diagonal.
    # Hint: 2^(x - m) with m = -inf is NaN even for x = -inf; exponentiate
    # against a finite stand-in for an empty row's maximum.
    return acc, l_i, m_i  # Placeholder: the chunk is never walked
    # --- END OF STUDENT IMPLEMENTATION ---


@triton.jit
def merge_splits(acc_s, l_s, m_s):
    """Merge each row's partial states; return ``(o, lse)``: the rows of O (fp32) and their natural-log LSE.

    ``acc_s`` [BLOCK_R, SPLITS_PAD, HEAD_DIM_PAD], ``l_s`` and ``m_s``
    [BLOCK_R, SPLITS_PAD]: for each of BLOCK_R output rows, split s's
    unnormalised accumulator, sum and running max (log2 units).
    """
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 4) ---
    # What: the lesson of notebook 02, merge_softmax_states, for any number
    # of parts at once and in base 2. Each split's acc and l are sums of
    # 2^(score - m_s) against that split's own maximum m_s; rescale them all to
    # the row's common maximum, add them up, then normalise once. The LSE is
    # the natural log of the row's sum of e^(sm_scale * score): m and l carry
    # it in base 2.
    # Why: the splits ran in parallel, each blind to the others' scores; only
    # this rescaling makes their sums comparable.
    # Shapes: o [BLOCK_R, HEAD_DIM_PAD] and lse [BLOCK_R], fp32 (the caller
    # casts and stores them); axis 1 of the inputs counts the splits.
    # Invariants: an empty split (no visible key: its chunk starts past the
    # row's position, or it is padding past num_splits) arrives as (0, 0,
    # -inf) and must add nothing; the split holding position 0 is never
    # empty, so each row's common maximum is finite and its l is >= 1.
    # Hint: tl.max and tl.sum take the axis to reduce (here 1, the splits);
    # a factor per (row, split) needs a last axis of length 1 to scale acc_s.
    return tl.sum(acc_s, 1) * 0.0, tl.sum(l_s, 1) * 0.0  # Placeholder: O = 0 and LSE = 0
    # --- END OF STUDENT IMPLEMENTATION ---


@triton.jit
def _store_rows(O, LSE, o, lse, batch_idx, q_head, token, offs_d, row_ok,
                stride_ob, stride_oh, stride_on, stride_od, N_Q_HEADS, N_Q, HEAD_DIM):
    """Store finished rows (either kernel's): row r of ``o`` (fp32, [rows, HEAD_DIM_PAD]) at
    O[batch_idx, q_head[r], token[r], :] in O's dtype, its ``lse`` at LSE[batch_idx, q_head[r], token[r]]
    (LSE is [B, Hq, N_Q], contiguous). Rows with ``row_ok`` False and padding columns are not stored."""
    o_rows = O + batch_idx.to(tl.int64) * stride_ob + q_head.to(tl.int64) * stride_oh + token * stride_on
    tl.store(o_rows[:, None] + offs_d[None, :] * stride_od, o.to(O.dtype.element_ty),
             mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))
    tl.store(LSE + (batch_idx.to(tl.int64) * N_Q_HEADS + q_head) * N_Q + token, lse, mask=row_ok)


@triton.jit
def _flash_decode_split_kernel(
    Q, K, V, SEQLENS, BLOCK_TABLE, ACC, L, M, O, LSE,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_ob, stride_oh, stride_on, stride_od,
    # The caches' strides as [pages, slots, Hkv, D] (the launcher reorders a contiguous cache's)
    stride_kp, stride_ks, stride_kh, stride_kd,
    stride_vp, stride_vs, stride_vh, stride_vd,
    stride_tb, stride_tp,
    qk_scale, N_Q_HEADS, N_KV_HEADS, N_SPLITS, CHUNK, CAPACITY, N_PAGES,
    N_Q: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr, PAGED: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    DIRECT: tl.constexpr, PDL: tl.constexpr,
):
    """One group tile of one (batch, KV head) against one chunk; writes the rows' partial states,
    or with DIRECT (one split: the chunk is the whole context) their rows of O and their LSE.

    ACC [B, Hq, N_Q, N_SPLITS, HEAD_DIM], L and M [B, Hq, N_Q, N_SPLITS], all
    fp32 and contiguous: split s of row (b, h, i) at index ((b*Hq + h)*N_Q + i)*N_SPLITS + s.
    """
    if PDL:  # let the merge kernel start loading its code now; it waits for this grid's writes (gdc_wait)
        gdc_launch_dependents()
    # Axis 0, the row blocks of one group, varies fastest in launch order, so
    # the programs that read the same chunk of K and V run side by side and
    # the second finds it in L2. (One row block unless group_size * N_Q > 64.)
    row_block = tl.program_id(0)
    split_idx = tl.program_id(1)
    batch_idx = tl.program_id(2) // N_KV_HEADS
    kv_head_idx = tl.program_id(2) % N_KV_HEADS

    rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < (N_Q_HEADS // N_KV_HEADS) * N_Q
    offs_d = tl.arange(0, HEAD_DIM_PAD)

    # Part 1: the group's query heads and new tokens, packed into one tile.
    q, q_head, token = group_tile(Q, batch_idx, kv_head_idx, rows, row_ok, offs_d,
                                  stride_qb, stride_qh, stride_qn, stride_qd, N_Q_HEADS, N_KV_HEADS, N_Q, HEAD_DIM)

    # Clamped to 0 .. CAPACITY (the positions the cache or this sequence's table row can hold), so
    # that no value of cache_seqlens makes a walk read past the cache or past the table's row.
    seq_len = tl.minimum(tl.maximum(tl.load(SEQLENS + batch_idx), 0), CAPACITY)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)

    # Part 3 (Part 2 inside): this split's chunk of the sequence.
    acc, l_i, m_i = split_partial(acc, l_i, m_i, q, token, K, V, BLOCK_TABLE, batch_idx, kv_head_idx, split_idx,
                                  seq_len, offs_d, qk_scale, CHUNK,
                                  stride_kp, stride_ks, stride_kh, stride_kd, stride_vp, stride_vs, stride_vh,
                                  stride_vd, stride_tb, stride_tp, N_Q, HEAD_DIM, N_PAGES,
                                  BLOCK_N, PAGE_SIZE, PAGED, INPUT_PRECISION)

    if DIRECT:
        # One split holds the whole row: Part 4 merges a single state (normalises it) here, and no
        # merge kernel runs, which saves a launch and the partial state's trip through memory.
        o, lse = merge_splits(acc[:, None, :], l_i[:, None], m_i[:, None])
        _store_rows(O, LSE, o, lse, batch_idx, q_head, token, offs_d, row_ok,
                    stride_ob, stride_oh, stride_on, stride_od, N_Q_HEADS, N_Q, HEAD_DIM)
    else:
        # The partial state, as it is: an empty split writes (0, 0, -inf), which the merge knows to skip.
        state = ((batch_idx.to(tl.int64) * N_Q_HEADS + q_head) * N_Q + token) * N_SPLITS + split_idx
        tl.store(L + state, l_i, mask=row_ok)
        tl.store(M + state, m_i, mask=row_ok)
        tl.store(ACC + state[:, None] * HEAD_DIM + offs_d[None, :], acc,
                 mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _flash_decode_merge_kernel(
    ACC, L, M, O, LSE,
    stride_ob, stride_oh, stride_on, stride_od,
    N_ROWS, N_Q_HEADS, N_SPLITS,
    N_Q: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr, BLOCK_R: tl.constexpr, PDL: tl.constexpr,
):
    """BLOCK_R rows (b, h, i) of the output: merge their N_SPLITS partial states; store O and the LSE.

    Row r = (b * Hq + h) * N_Q + i, as in the split kernel's layout; LSE is [B, Hq, N_Q], contiguous.
    """
    if PDL:  # launched early (programmatic dependent launch): wait until the split kernel's writes land
        gdc_wait()
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < N_ROWS
    new_token = rows % N_Q
    q_head = (rows // N_Q) % N_Q_HEADS
    batch_idx = rows // (N_Q * N_Q_HEADS)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < HEAD_DIM
    # [BLOCK_R, SPLITS_PAD] states; padding splits read as empty ones: (0, 0, -inf). Padding rows
    # (past N_ROWS) read the last real row again, so that they too merge without a NaN; never stored.
    states = tl.minimum(rows, N_ROWS - 1).to(tl.int64)[:, None] * N_SPLITS + offs_s[None, :]
    split_ok = offs_s[None, :] < N_SPLITS  # a load broadcasts its mask to the pointers' shape
    l_s = tl.load(L + states, mask=split_ok, other=0.0)
    m_s = tl.load(M + states, mask=split_ok, other=float("-inf"))
    acc_s = tl.load(ACC + states[:, :, None] * HEAD_DIM + offs_d[None, None, :],
                    mask=split_ok[:, :, None] & d_ok[None, None, :], other=0.0)

    # Part 4: the log-sum-exp merge.
    o, lse = merge_splits(acc_s, l_s, m_s)
    _store_rows(O, LSE, o, lse, batch_idx, q_head, new_token, offs_d, row_ok,
                stride_ob, stride_oh, stride_on, stride_od, N_Q_HEADS, N_Q, HEAD_DIM)


# --- Launching ---------------------------------------------------------------
#
# How many splits, which tiles, the grids and the buffers of the partial
# states are the host's decisions, made from shapes, strides and dtypes alone
# (never from the lengths, which live on the GPU). gqa_flash/course/decode_launch.py
# (given code) makes them into a plan, with the heuristics and the measured
# tiles, and launches the two kernels above.


def flash_decode(q, k_cache, v_cache, cache_seqlens, block_table=None, sm_scale=None, num_splits=None,
                 return_lse=False, max_seqlen=None, config=None):
    """Attention of the new tokens ``q`` [B, Hq, Nq, D] over a KV cache, contiguous or paged.

    ``k_cache``, ``v_cache``: [B, Hkv, S_max, D] (any strides), or with
    ``block_table`` [B, max_pages] int32 the paged pool [num_blocks,
    page_size, Hkv, D]. ``cache_seqlens`` [B] int32: the valid positions of
    each sequence, the Nq new tokens included. Returns O ([B, Hq, Nq, D], q's
    dtype) and, with ``return_lse``, the natural-log LSE ([B, Hq, Nq], fp32).

    The public API (``gqa_flash.flash_decode``) checks the inputs and passes
    ``max_seqlen``, a bound on ``cache_seqlens`` (used to size the splits;
    default: the cache's capacity). A sequence longer than it is cut at the
    last split's end (a wrong row, not a wrong read). Nothing here reads
    ``cache_seqlens`` or the table on the host, and the kernels clamp the
    lengths and page indices they read, so this function can be captured in
    a CUDA graph and trusts no value in those tensors. ``config`` (BLOCK_N,
    num_warps, num_stages, and ``pdl``: launch the merge kernel early, on a
    GPU) overrides the tiles, for benchmarks.
    """
    return decode_launch.flash_decode((_flash_decode_split_kernel, _flash_decode_merge_kernel), q, k_cache,
                                      v_cache, cache_seqlens, block_table, sm_scale, num_splits, return_lse,
                                      max_seqlen, config)
