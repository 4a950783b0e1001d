"""The course's fastest forward kernel: the graded kernel plus what a GPU rewards.

Finish ``gqa_flash/forward.py`` (notebook 04) before you read this file.
It ships complete, and its kernel answers forward.py's parts: the two
phases' bounds, the online-softmax update, the mask, the LSE. Read it
afterwards, as you would a course's published solution.

Not graded, and not for students to write: it is the graded kernel of
``gqa_flash/forward.py`` (same maths, same two phases, same exp2 and LSE) with
the changes that the performance notebook measures one by one:

1. Tensor descriptors, built once on the host (``TensorDescriptor``) and
   passed to the kernel. On Hopper the Tensor Memory Accelerator (TMA), a
   unit on each SM, moves whole tiles from global to shared memory by
   itself, asynchronously, instead of every thread computing addresses and
   issuing its own loads. It also pads out-of-bounds rows and columns with
   zeros, so ragged sequence tails and head dims such as 80 or 96 need no
   masks on loads, and it clips stores.
   Each descriptor covers the whole [B, H, N, D] tensor with its real
   strides, and a tile is addressed by (batch, head, row, 0). (Descriptors
   made inside the kernel, ``tl.make_tensor_descriptor``, cost every program
   a write and a fence before its first load: measurable at short N.)
2. A grid ordered for balance. Under the causal mask the last query tiles do
   the most work (they see the most keys); they are launched first, so the
   short ones fill the gaps at the end instead of leaving SMs idle. The
   ``group_size`` query heads of one KV head are neighbours in the launch
   order (KV-group-major), meant to share K/V tiles through L2. Measured on
   the H200 (``notebooks/data/h200_launch_order_traffic.csv``, ncu, one 16k
   sequence, 32:8 heads), that order reads more DRAM, not less: 234 MB
   against 101 MB at head_dim 64, 653 MB against 202 MB at 128, than the
   graded kernel's order (every query tile of one head, then the next head,
   ``group_major=False``), whose running programs all share one KV head that
   fits in L2 while this order's span every KV head. Both ran in the same
   time (within 1%): 650 MB in 4.2 ms is under a twentieth of the bandwidth, so the
   kernel is bound by its arithmetic either way.
3. One fused multiply-add per score. ``p = exp2(s * qk_scale - m)`` folds the
   scale into the subtraction the online softmax needs anyway, and
   ``tl.dot(p, v, acc)`` accumulates into ``acc`` in place.
4. Two query sub-tiles a program, a software ping-pong. A program owns
   BLOCK_M query rows as two halves that share every K and V tile it loads.
   Each step issues both halves' score products (``_attend_pair``) before
   either softmax. On Hopper a matrix product is an asynchronous instruction,
   so while the exp2 units work through one half's scores the tensor cores
   can already work on the other's: the overlap that FlashAttention-3's
   ping-pong scheduling arranges by hand, here left to the hardware and to
   Triton's instruction order. (What the compiled loop does, read in its
   SASS (local Triton 3.8): Triton waits for each score product first, but the
   assembler moves half 0's row maximum and scaling under half 1's score
   product, and half 1's exponentials run under half 0's P V product;
   bench/RESULTS.md, Open.) On the diagonal, the first half stops at its
   own last row (BLOCK_M / 2 keys early) and the second finishes alone; only
   the first half is masked on the steps they share (the second's rows all
   come after those keys), and the first half is stored as soon as it stops.
   Measured on the H200, the two together
   (``bench/record/h200_fast_forward_diagonal.csv``): +1 to +4% on the
   256 x 64 tile at N = 1k-8k (the autotuner's pick from 4k), -0.8% at 16k;
   -1 to +2% on the 128-row tiles. The early store was meant to overlap the
   second half's last keys, but the compiled code waits for the TMA's store
   at once (``async_tma_store_wait`` right after the copy in local Triton
   3.8's TTGIR; the H200 runs 3.6), so it does not; alone it measured -0.7
   to +2.4% on the 256 x 64 tile, for a reason not known.
5. Autotuned tiles: the sub-tiled 256 x 64 (8 warps) and 128 x 64 (4 warps),
   which the graded kernel's masked loads make too costly, next to plain ones,
   and at head dims up to 64 a 128 x 64 capped at 168 registers a thread, so
   that three programs share an SM instead of two, in place of its uncapped
   twin at head_dim 64 (``CONFIGS``, ``_prune``). The
   autotuner times the candidates at a shape's first call; later calls of
   that shape launch its pick directly (``_picks``), which saves host time.
6. Two query heads a program (``HEADS=2``, an option of ``config``). The two
   sub-tiles are the same rows of two query heads of one KV group, which read
   the same K and V tiles: a program does the matrix work of BLOCK_M rows for
   each K/V tile it loads while owning only BLOCK_M / 2 positions, so the
   causal diagonal, masked and half wasted, is half as long, and both
   sub-tiles cross it together instead of the second finishing it alone.
   Measured on the H200 (``bench/record/h200_fast_forward_head_pairs.csv``):
   +3-9% over one head at the same tile at N = 1k, but only +0.01 to +0.02
   over the autotuner's pick at 1k-2k (within the noise of a ratio) and
   -0.06 to +0.01 for the best tile from 4k, so it is not among the
   autotuner's candidates.
7. On Hopper, the Gluon kernel of ``hopper_forward.py`` (a loader warp, two
   consumer warpgroups, a persistent grid) where it was measured ahead of this
   file's kernel: causal, N from 1k, timed at head_dim 128 (65-96 take it
   too, checked but not timed) (``gluon_wanted``;
   bench/RESULTS.md, "The Gluon forward"). Everywhere else, and where it
   cannot compile, this file's kernel runs.

The TMA reads a last dimension of stride 1 with 16-byte aligned
rows. An input in another layout (a strided view, a head dim whose rows are
not a multiple of 16 bytes, an unaligned base) is first copied into one it
can read (``readable``): a copy of that input, the price of the layout; the
fast path for tensors it can read copies nothing. fp32 inputs run the same
kernel with ieee products (``INPUT_PRECISION="ieee"``, so fp32 matches
float64 as tightly as the graded kernel; fp16 and bf16 pass Triton's default,
"tf32", which only fp32 operands read, so their compiled kernel is unchanged)
and, on a GPU, one fixed tile that fits in shared memory at every head dim
(``FP32_CONFIG``) instead of the autotuner, whose candidates are sized for
2-byte inputs. It runs in the interpreter too (descriptors work there), so
the CPU tests cover it.

A warp-specialized key loop (``tl.range(..., warp_specialize=True)``) was
measured and removed: bench/RESULTS.md.
"""

import warnings

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from gqa_flash.course import runtime
from gqa_flash.fast.memory import SHARED_MEMORY, empty_readable, readable, shared_memory, tma_can_read  # noqa: F401
from gqa_flash.fast.windows import kernel_sinks, kernel_window, seen, start_state, window_key_blocks


@triton.jit
def _scores(q, k_tile, start_n, offs_m, SEQ_LEN, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
            INPUT_PRECISION: tl.constexpr, WINDOWED: tl.constexpr, WINDOW, SINK_TOKENS):
    """Raw scores of one query tile against one key tile; -inf where a key is hidden (windows.seen)."""
    s = tl.dot(q, tl.trans(k_tile), input_precision=INPUT_PRECISION)
    if MASKED:
        cols = start_n + tl.arange(0, BLOCK_N)
        s = tl.where(seen(offs_m[:, None], cols[None, :], SEQ_LEN, CAUSAL, WINDOWED, WINDOW, SINK_TOKENS), s,
                     float("-inf"))
    return s


@triton.jit
def _fold(acc, row_sum, row_max, s, v, qk_scale, INPUT_PRECISION: tl.constexpr, WINDOWED: tl.constexpr = False):
    """The online-softmax update: fold one tile of scores (and its values) into the state."""
    m_new = tl.maximum(row_max, tl.max(s, 1) * qk_scale)
    if WINDOWED:  # a row may meet a key tile it sees none of before any it sees: exp2(-inf - -inf) would be NaN
        m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s * qk_scale - m_new[:, None])  # one FMA per score
    rescale = tl.exp2(row_max - m_new)
    row_sum = row_sum * rescale + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * rescale[:, None], input_precision=INPUT_PRECISION)
    return acc, row_sum, m_new


@triton.jit
def _attend(acc, row_sum, row_max, q, k_desc, v_desc, batch, kv_head, start, end, offs_m, qk_scale, SEQ_LEN,
            BLOCK_N: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
            INPUT_PRECISION: tl.constexpr, WINDOWED: tl.constexpr = False, WINDOW=0, SINK_TOKENS=0):
    """Fold key blocks start..end (exclusive, in steps of BLOCK_N) into the state."""
    for start_n in tl.range(start, end, BLOCK_N):
        # [BLOCK_N, HEAD_DIM_PAD] tiles; rows past SEQ_LEN and columns past HEAD_DIM come back as 0.
        k = k_desc.load([batch, kv_head, start_n, 0]).reshape(BLOCK_N, HEAD_DIM_PAD)
        v = v_desc.load([batch, kv_head, start_n, 0]).reshape(BLOCK_N, HEAD_DIM_PAD)
        s = _scores(q, k, start_n, offs_m, SEQ_LEN, BLOCK_N, MASKED, CAUSAL, INPUT_PRECISION, WINDOWED, WINDOW,
                    SINK_TOKENS)
        acc, row_sum, row_max = _fold(acc, row_sum, row_max, s, v, qk_scale, INPUT_PRECISION, WINDOWED)
    return acc, row_sum, row_max


@triton.jit
def _attend_pair(acc0, l0, m0, q0, offs_m0, acc1, l1, m1, q1, offs_m1, k_desc, v_desc, batch, kv_head, start,
                 end, qk_scale, SEQ_LEN, BLOCK_N: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, MASKED0: tl.constexpr,
                 MASKED1: tl.constexpr, CAUSAL: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                 WINDOWED: tl.constexpr = False, WINDOW=0, SINK_TOKENS=0):
    """``_attend`` for two query sub-tiles that share each key tile (the software ping-pong):
    both score products are issued before either softmax, so the tensor cores can work on
    one sub-tile while the exp2 units work on the other. Each sub-tile has its own mask switch."""
    for start_n in tl.range(start, end, BLOCK_N):
        k = k_desc.load([batch, kv_head, start_n, 0]).reshape(BLOCK_N, HEAD_DIM_PAD)
        v = v_desc.load([batch, kv_head, start_n, 0]).reshape(BLOCK_N, HEAD_DIM_PAD)
        s0 = _scores(q0, k, start_n, offs_m0, SEQ_LEN, BLOCK_N, MASKED0, CAUSAL, INPUT_PRECISION, WINDOWED, WINDOW,
                     SINK_TOKENS)
        s1 = _scores(q1, k, start_n, offs_m1, SEQ_LEN, BLOCK_N, MASKED1, CAUSAL, INPUT_PRECISION, WINDOWED, WINDOW,
                     SINK_TOKENS)
        acc0, l0, m0 = _fold(acc0, l0, m0, s0, v, qk_scale, INPUT_PRECISION, WINDOWED)
        acc1, l1, m1 = _fold(acc1, l1, m1, s1, v, qk_scale, INPUT_PRECISION, WINDOWED)
    return acc0, l0, m0, acc1, l1, m1


@triton.jit
def _fast_forward_kernel(
    q_desc, k_desc, v_desc, o_desc, LSE, stride_lb, stride_lh,
    sm_scale, SEQ_LEN, BATCH, N_Q_HEADS, N_KV_HEADS, WINDOW, SINK_TOKENS, SINKS,
    HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    SUBTILES: tl.constexpr, INPUT_PRECISION: tl.constexpr, GROUP_MAJOR: tl.constexpr = True,
    HEADS: tl.constexpr = 1, WINDOWED: tl.constexpr = False, HAS_SINKS: tl.constexpr = False,
):
    tl.static_assert(BLOCK_M % BLOCK_N == 0, "BLOCK_M must be a multiple of BLOCK_N")
    tl.static_assert(HEADS == 1 or SUBTILES == 2, "HEADS=2 takes one query head a sub-tile: SUBTILES=2")
    tl.static_assert(CAUSAL or not WINDOWED, "a sliding window is causal")
    ROWS: tl.constexpr = BLOCK_M // HEADS  # the query positions a program owns
    group_size = N_Q_HEADS // N_KV_HEADS
    programs_per_group = group_size // HEADS
    pid = tl.program_id(0)
    if GROUP_MAJOR:
        # One flat grid, decoded so that neighbours share a KV head:
        #   pid = (tile_order * (BATCH * N_KV_HEADS) + batch_kv) * programs_per_group + head_in_group / HEADS
        head_in_group = (pid % programs_per_group) * HEADS
        rest = pid // programs_per_group
        batch_kv = rest % (BATCH * N_KV_HEADS)
        tile_order = rest // (BATCH * N_KV_HEADS)
        batch = batch_kv // N_KV_HEADS
        kv_head = batch_kv % N_KV_HEADS
        q_head = kv_head * group_size + head_in_group
    else:
        # The graded kernel's order, kept to measure the difference (bench/dram_traffic.py): every
        # query tile of one (batch, query head) back to back, then the next head.
        n_tiles = tl.cdiv(SEQ_LEN, ROWS)
        tile_order = pid % n_tiles
        batch = (pid // n_tiles) // (N_Q_HEADS // HEADS)
        q_head = ((pid // n_tiles) % (N_Q_HEADS // HEADS)) * HEADS
        kv_head = q_head // group_size
    if CAUSAL:  # the heaviest query tiles first
        q_block = tl.cdiv(SEQ_LEN, ROWS) - 1 - tile_order
    else:
        q_block = tile_order

    q_start = q_block * ROWS
    qk_scale = sm_scale * 1.4426950408889634  # log2(e)
    if CAUSAL:
        phase1_end = q_start
        phase2_end = tl.minimum(q_start + ROWS, SEQ_LEN)
    else:
        phase1_end = (SEQ_LEN // BLOCK_N) * BLOCK_N
        phase2_end = SEQ_LEN
    lse_base = LSE + batch.to(tl.int64) * stride_lb + q_head.to(tl.int64) * stride_lh
    clear_lo = 0  # without a window every key block before the diagonal is seen whole
    if WINDOWED:  # the runs of gqa_flash/fast/windows.py: sink blocks and the window's edge masked, then clear
        sink_end, lo, clear_lo = window_key_blocks(q_start, tl.minimum(q_start + ROWS, SEQ_LEN), phase1_end, WINDOW,
                                                   SINK_TOKENS, BLOCK_N)

    if SUBTILES == 1:
        offs_m = q_start + tl.arange(0, BLOCK_M)
        q = q_desc.load([batch, q_head, q_start, 0]).reshape(BLOCK_M, HEAD_DIM_PAD)
        acc, row_sum, row_max = start_state(BLOCK_M, HEAD_DIM_PAD, SINKS, q_head, HAS_SINKS)
        if WINDOWED:  # the sink blocks, then the window's lower edge: both masked
            acc, row_sum, row_max = _attend(acc, row_sum, row_max, q, k_desc, v_desc, batch, kv_head, 0, sink_end,
                                            offs_m, qk_scale, SEQ_LEN, BLOCK_N, HEAD_DIM_PAD, True, CAUSAL,
                                            INPUT_PRECISION, WINDOWED, WINDOW, SINK_TOKENS)
            acc, row_sum, row_max = _attend(acc, row_sum, row_max, q, k_desc, v_desc, batch, kv_head, lo, clear_lo,
                                            offs_m, qk_scale, SEQ_LEN, BLOCK_N, HEAD_DIM_PAD, True, CAUSAL,
                                            INPUT_PRECISION, WINDOWED, WINDOW, SINK_TOKENS)
        acc, row_sum, row_max = _attend(acc, row_sum, row_max, q, k_desc, v_desc, batch, kv_head, clear_lo,
                                        phase1_end, offs_m, qk_scale, SEQ_LEN, BLOCK_N, HEAD_DIM_PAD, False, CAUSAL,
                                        INPUT_PRECISION, WINDOWED, WINDOW, SINK_TOKENS)
        acc, row_sum, row_max = _attend(acc, row_sum, row_max, q, k_desc, v_desc, batch, kv_head, phase1_end,
                                        phase2_end, offs_m, qk_scale, SEQ_LEN, BLOCK_N, HEAD_DIM_PAD, True, CAUSAL,
                                        INPUT_PRECISION, WINDOWED, WINDOW, SINK_TOKENS)
        _store(acc, row_sum, row_max, o_desc, lse_base, batch, q_head, q_start, SEQ_LEN, BLOCK_M, HEAD_DIM_PAD)
    else:
        tl.static_assert(SUBTILES == 2, "SUBTILES is 1 or 2")
        SUB: tl.constexpr = BLOCK_M // 2
        # Sub-tile 1: the next SUB rows of the same head, or (HEADS=2) the same rows of the next head.
        q_head1 = q_head + (HEADS - 1)
        row1 = q_start + SUB * (2 - HEADS)
        offs_m0 = q_start + tl.arange(0, SUB)
        offs_m1 = row1 + tl.arange(0, SUB)
        q0 = q_desc.load([batch, q_head, q_start, 0]).reshape(SUB, HEAD_DIM_PAD)
        q1 = q_desc.load([batch, q_head1, row1, 0]).reshape(SUB, HEAD_DIM_PAD)
        acc0, l0, m0 = start_state(SUB, HEAD_DIM_PAD, SINKS, q_head, HAS_SINKS)
        acc1, l1, m1 = start_state(SUB, HEAD_DIM_PAD, SINKS, q_head1, HAS_SINKS)
        if WINDOWED:  # the sink blocks, then the window's lower edge: both masked
            acc0, l0, m0, acc1, l1, m1 = _attend_pair(
                acc0, l0, m0, q0, offs_m0, acc1, l1, m1, q1, offs_m1, k_desc, v_desc, batch, kv_head, 0, sink_end,
                qk_scale, SEQ_LEN, BLOCK_N, HEAD_DIM_PAD, True, True, CAUSAL, INPUT_PRECISION, WINDOWED, WINDOW,
                SINK_TOKENS)
            acc0, l0, m0, acc1, l1, m1 = _attend_pair(
                acc0, l0, m0, q0, offs_m0, acc1, l1, m1, q1, offs_m1, k_desc, v_desc, batch, kv_head, lo, clear_lo,
                qk_scale, SEQ_LEN, BLOCK_N, HEAD_DIM_PAD, True, True, CAUSAL, INPUT_PRECISION, WINDOWED, WINDOW,
                SINK_TOKENS)
        acc0, l0, m0, acc1, l1, m1 = _attend_pair(
            acc0, l0, m0, q0, offs_m0, acc1, l1, m1, q1, offs_m1, k_desc, v_desc, batch, kv_head, clear_lo,
            phase1_end, qk_scale, SEQ_LEN, BLOCK_N, HEAD_DIM_PAD, False, False, CAUSAL, INPUT_PRECISION,
            WINDOWED, WINDOW, SINK_TOKENS)
        if CAUSAL:
            # The diagonal: the first sub-tile sees no key past its own last row, so the
            # second sub-tile finishes the diagonal alone (with HEADS=2 there is nothing left:
            # both sub-tiles end at the same row).
            tl.static_assert(SUB % BLOCK_N == 0, "with SUBTILES=2, BLOCK_M // 2 must be a multiple of BLOCK_N")
            pair_end = tl.minimum(q_start + SUB, SEQ_LEN)
        else:
            pair_end = phase2_end
        # Under the causal mask with one head a program, sub-tile 1's rows all come after these keys:
        # only sub-tile 0 needs the mask. (Such a tile can hold keys past SEQ_LEN, zeros from the TMA,
        # only when every row of sub-tile 1 is past SEQ_LEN too, and those rows are never stored.)
        # A window's lower edge can hide some of them, though.
        MASK1: tl.constexpr = not (CAUSAL and HEADS == 1) or WINDOWED
        acc0, l0, m0, acc1, l1, m1 = _attend_pair(
            acc0, l0, m0, q0, offs_m0, acc1, l1, m1, q1, offs_m1, k_desc, v_desc, batch, kv_head, phase1_end,
            pair_end, qk_scale, SEQ_LEN, BLOCK_N, HEAD_DIM_PAD, True, MASK1, CAUSAL, INPUT_PRECISION, WINDOWED, WINDOW,
            SINK_TOKENS)
        # Sub-tile 0 has seen all its keys: stored now (item 4 of the docstring: measured with the mask
        # change above; the compiled code waits for this store before going on).
        _store(acc0, l0, m0, o_desc, lse_base, batch, q_head, q_start, SEQ_LEN, SUB, HEAD_DIM_PAD)
        if HEADS == 1:  # a constexpr: with HEADS=2 this loop is not compiled at all
            acc1, l1, m1 = _attend(acc1, l1, m1, q1, k_desc, v_desc, batch, kv_head, pair_end, phase2_end, offs_m1,
                                   qk_scale, SEQ_LEN, BLOCK_N, HEAD_DIM_PAD, True, CAUSAL, INPUT_PRECISION, WINDOWED,
                                   WINDOW, SINK_TOKENS)
        lse_base1 = lse_base + (HEADS - 1) * stride_lh
        _store(acc1, l1, m1, o_desc, lse_base1, batch, q_head1, row1, SEQ_LEN, SUB, HEAD_DIM_PAD)


@triton.jit
def _store(acc, row_sum, row_max, o_desc, lse_base, batch, q_head, row0, SEQ_LEN, ROWS: tl.constexpr,
           HEAD_DIM_PAD: tl.constexpr):
    """Normalise and write one query tile's output and log-sum-exp."""
    out = acc / row_sum[:, None]
    o_desc.store([batch, q_head, row0, 0], out.to(o_desc.dtype).reshape(1, 1, ROWS, HEAD_DIM_PAD))  # clipped at SEQ_LEN
    offs_m = row0 + tl.arange(0, ROWS)
    lse = (row_max + tl.log2(row_sum)) * 0.6931471805599453  # log2 to natural log
    tl.store(lse_base + offs_m, lse, mask=offs_m < SEQ_LEN)


# Tiles and warps per head dim, chosen by the autotuner on a GPU. Each config
# sets the descriptors' tile shapes before its launch (pre_hook), because a
# descriptor's block shape is part of the compiled kernel's signature.
def _set_block_shapes(nargs):
    bm, bn, dp = nargs["BLOCK_M"] // nargs["SUBTILES"], nargs["BLOCK_N"], nargs["HEAD_DIM_PAD"]
    for name, rows in (("q_desc", bm), ("o_desc", bm), ("k_desc", bn), ("v_desc", bn)):
        nargs[name].block_shape = [1, 1, rows, dp]


def _config(bm, bn, warps, stages, subtiles, maxnreg=None):
    return triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn, SUBTILES=subtiles),
                         num_warps=warps, num_stages=stages, maxnreg=maxnreg, pre_hook=_set_block_shapes)


# Measured on the H200 (bench/explore_fast.py, notebooks/data/): two 128-row
# sub-tiles (256 x 64, 8 warps) win at head_dim 128 from N = 8k (a tie at 4k,
# where the autotuner picks them: LONG_TILES_FROM), two 64-row sub-tiles on 4 warps (128 x 64) at head_dim
# 64 from 2k (capped, below) and, with 2 stages, at 128 for short sequences; 64 x 64 at 1k for head_dim 64
# before the cap. 128 x 64 and
# 64 x 32 without sub-tiles are there for head dims above 128, where the
# sub-tiled tiles do not fit in shared memory or spill registers. Fewer
# candidates also means fewer chances for the autotuner's own timing noise
# to pick a worse one. These are for fp16 and bf16; fp32 takes FP32_CONFIG.
#
# The last candidate caps 128 x 64 on 4 warps at 168 registers a thread (``maxnreg``), for head dims up
# to 64 (CAPPED_UP_TO). Uncapped, ptxas gives it 178 at head_dim 64: 178 x 128 threads leave room in an
# SM's 65,536 registers for 2 programs, 168 for 3 (65 KiB of shared memory each; no spill either way).
# A third program hides the others' waits. Measured on the H200 (h200_register_caps_fixed_tiles.csv,
# head_dim 64, ratio to cuDNN): 0.96 / 1.00 / 1.00 at 1k / 4k / 16k against 0.85 / 0.97 / 0.99
# uncapped. At head_dim 128 the same tile needs 255 and a cap would spill. At head_dim 64 the capped
# tile replaces its uncapped twin among the candidates (``_prune``).
CONFIGS = [
    _config(bm, bn, w, st, sub, cap) for bm, bn, w, st, sub, cap in [
        (256, 64, 8, 3, 2, None), (128, 64, 4, 3, 2, None), (128, 64, 4, 2, 2, None), (64, 64, 4, 3, 1, None),
        (128, 64, 8, 3, 1, None), (64, 32, 4, 2, 1, None), (128, 64, 4, 3, 2, 168),
    ]
]
CAPPED_UP_TO = 64  # head_dim_pad


def fits(config, head_dim_pad, shared_bytes=SHARED_MEMORY) -> bool:
    """Whether ``config`` can run at ``head_dim_pad`` (2-byte inputs) on a GPU whose programs may hold
    ``shared_bytes`` of shared memory: past 64 a register cap spills, and its Q rows and ``num_stages``
    K and V tiles must fit in shared memory. That estimate matches the H200 at head_dim 256
    (bench/record/h200_gpu_tests_fast_configs_and_second_call.log): 128 x 64 with 2 stages (192 KiB) and 64 x 64 with 3
    (224 KiB) run there, 128 x 64 with 3 stages (256 KiB) does not compile."""
    if config.maxnreg is not None and head_dim_pad > CAPPED_UP_TO:
        return False
    rows = config.kwargs["BLOCK_M"] + 2 * config.num_stages * config.kwargs["BLOCK_N"]
    return rows * head_dim_pad * 2 <= shared_bytes


# Below this length the 256-row tiles are not candidates. Measured at fixed tiles (ratio to cuDNN):
# at 1k they lose everywhere (head_dim 128: 0.74 against 0.84 for 128 x 64 on 4 warps, 2 stages; 64:
# 0.68 against 0.92 for 64 x 64; h200_backward_flat_forward_merged.csv, rows without "merged"), and at
# 2k at head_dim 128 (0.79 against 0.80, h200_fast_forward_persistent.csv, rows persm0). At 4k, head_dim
# 128, they lost once, led three times by 0.005-0.03 and tied once (0.91 against 0.97 in the first file;
# 0.95 against 0.945 in h200_fast_forward_subtile_shapes.csv, 0.81 against 0.80 in
# h200_forward_pick_probe.csv, 0.92 against 0.90 in h200_fast_forward_persistent.csv; 0.896 against
# 0.898 in h200_fast_forward_two_tiles.log), so from 4k they are candidates and the autotuner decides
# (prediction 21: it picked them there). At head_dim 64 they lose (0.84 against 0.99) and are passed
# over. From 8k on the 256-row tile wins at head_dim 128 (bench/RESULTS.md).
LONG_TILES_FROM = 4096


def _tile(config):
    """A config without its register cap: what a capped config and its uncapped twin share."""
    return tuple(sorted(config.kwargs.items())), config.num_warps, config.num_stages


def _prune(configs, named_args, **kwargs):
    """The candidates at one shape. At head_dim 64 a capped config's uncapped twin is not a candidate: there
    the cap won at every length in three runs (13 of 13 pairs, 0.96-1.05 against 0.85-1.03:
    h200_register_caps_fixed_tiles.csv, h200_fast_forward_persistent.csv rows persm0 and
    h200_fast_forward_two_tiles.log rows tiles1), yet the autotuner's own timing picked the twin at 8k in
    two sweeps (0.997 and 0.993 of cuDNN). Prediction 23."""
    args = {**named_args, **kwargs}  # constexprs arrive in kwargs on some Triton versions
    base = getattr(args.get("q_desc"), "base", None)  # the tensor this launch reads: its device
    shared = shared_memory(None if base is None else base.device)
    kept = [c for c in configs if fits(c, args["HEAD_DIM_PAD"], shared)
            and (c.kwargs["BLOCK_M"] < 256 or args["SEQ_LEN"] >= LONG_TILES_FROM)]
    if args["HEAD_DIM_PAD"] == CAPPED_UP_TO:  # where the cap was measured (below 64 it buys no third program)
        capped = {_tile(c) for c in kept if c.maxnreg is not None}
        kept = [c for c in kept if c.maxnreg is not None or _tile(c) not in capped]
    return kept or configs


INTERPRETER_CONFIG = dict(BLOCK_M=32, BLOCK_N=16, SUBTILES=2)  # the ping-pong path, which the H200 runs most
# fp32 on a GPU: ieee products run on the CUDA cores, not the tensor cores, and every tile is twice
# the bytes of a 2-byte one. One small tile at every head dim: 64 KB of shared memory at head_dim 256,
# and of the small tiles the one that spills fewest registers there (ptxas's report for sm_90,
# Triton 3.6: none at head_dim 64). fp32 is there to check the maths, not for speed.
FP32_CONFIG = dict(BLOCK_M=32, BLOCK_N=32, SUBTILES=1, num_warps=8, num_stages=1)
autotuned_kernel = None  # built on first use; lab/bench.py reads the tile it picked
# The autotuner's pick for each key, as the launch arguments it stands for. Triton's autotuner looks
# its pick up again at every call (a dict of every argument, the key, the config's pre-hook): host
# time, which a short call's GPU waits for. Under Python's profiler on the H200 (head_dim 64, 1k,
# bench/probe_host_overhead.py --profile) the look-up took a tenth of the fast backward's host time; with
# it skipped and four descriptors fewer (gqa_flash/fast/backward.py), the profiled time a call fell from
# 0.96 to 0.71 ms. So from a key's second call on, the kernel launches its pick directly. (The
# backward keeps its own picks, beside its own autotuners.)
_picks = {}


def fixed_config(config, interpreter_config, fp32_config, dtype, picks, key, tuner):
    """The fixed launch arguments (tile, warps, stages, a register cap) a call runs with, or None when
    the autotuner must pick: ``config`` if given; else the interpreter's; else fp32's; else the pick kept
    in ``picks`` for ``key``, None before the autotuner has picked. A kept pick also becomes
    ``tuner().best_config``, as the autotuner's own call would make it: it says what the last call ran
    (the bench's tiles column reads it). ``tuner`` returns the ``triton.autotune`` kernel."""
    if config is not None:
        return config
    if runtime.INTERPRETER:
        return interpreter_config
    if dtype == torch.float32:
        return fp32_config
    pick = picks.get(key)
    if pick is None:
        return None
    tuner().best_config = pick
    return pick.all_kwargs()


def remember(picks, key, tuner):
    """Keep in ``picks`` the config ``tuner`` (a ``triton.autotune`` kernel) picked in the call just made."""
    picks[key] = tuner.best_config


def _kernel():
    global autotuned_kernel
    if autotuned_kernel is None:
        autotuned_kernel = triton.autotune(
            configs=CONFIGS, key=["SEQ_LEN", "N_Q_HEADS", "N_KV_HEADS", "HEAD_DIM_PAD", "CAUSAL", "WINDOW"],
            prune_configs_by={"early_config_prune": _prune},
        )(_fast_forward_kernel)
    return autotuned_kernel


def input_precision(dtype) -> str:
    """ieee (exact fp32) products for fp32 inputs; for fp16 and bf16, Triton's default, which
    only fp32 operands would use."""
    return "ieee" if dtype == torch.float32 else "tf32"


def head_pair_twins(configs):
    """Each sub-tiled config of ``configs`` again with two query heads a program (``HEADS=2``, item 6),
    its warps, stages and register cap unchanged: what tests/gpu checks and bench/register_report.py
    compiles beside the autotuner's candidates."""
    return [triton.Config({**c.kwargs, "HEADS": 2}, num_warps=c.num_warps, num_stages=c.num_stages,
                          maxnreg=c.maxnreg) for c in configs if c.kwargs["SUBTILES"] == 2]


def _check_head_pairs(config, group_size):
    """HEADS=2 puts two query heads of one KV group in a program, one a sub-tile."""
    if config.get("HEADS") != 2 or config.get("SUBTILES") != 2 or group_size % 2:
        raise ValueError(f"config: HEADS must be 1, or 2 with SUBTILES=2 and an even number of query heads a KV "
                         f"head; got HEADS={config.get('HEADS')!r}, SUBTILES={config.get('SUBTILES')!r} and "
                         f"{group_size} query heads a KV head")


# Hopper's Gluon kernel (hopper_forward.py) where it was measured ahead of this file's kernel on an
# H100 (notebooks/data/h100_hopper_forward_split_release.csv, h100_forward_main_gluon_route.csv):
# causal, N from 1k (timed to 16k), 128-key tiles with K in 3 slots and V in 2; timed at head_dim
# 128, and head dims 65-96 take it too (both kernels pad them to 128 columns; checked against float64,
# not timed). Gluon's API moves between Triton versions: only the version measured takes it; and only
# the cards it was timed and tested on (tests/gpu/test_gpu_hopper_forward.py, bench/explore_hopper.py
# --route-only) take it: an H200 is the same chip, but neither ran there yet, so it keeps this file's kernel.
GLUON_MIN_SEQ_LEN = 1024
GLUON_CARDS = ("H100",)  # a substring of the GPU's name
GLUON_CONFIG = {"BLOCK_N": 128, "K_STAGES": 3, "V_STAGES": 2}
GLUON_TRITON = "3.6."
_gluon_failed = {}  # key -> why the Gluon kernel could not compile there (then this file's kernel runs)
last_path = {"kernel": None}  # which kernel the last call ran ("gluon" or "triton"): the benchmarks' tiles column


def gluon_wanted(major, card, triton_version, dtype, head_dim, seq_len, causal) -> bool:
    """Whether a call takes the Gluon kernel: the rule above, on a Hopper GPU (compute capability 9.x,
    ``major`` 9) named in GLUON_CARDS."""
    return (major == 9 and any(name in card for name in GLUON_CARDS)
            and triton_version.startswith(GLUON_TRITON) and causal
            and dtype in (torch.float16, torch.bfloat16) and 64 < head_dim <= 128
            and seq_len >= GLUON_MIN_SEQ_LEN)


def _cuda_gpu(q):
    """``runtime.on_gpu`` of q's device (cached) for a compiled CUDA launch; None in the interpreter, on the CPU
    and on ROCm (whose MI200/MI300 also report a 9.x capability)."""
    return None if torch.version.hip is not None else runtime.on_gpu(q.device)


def _try_gluon(q, k, v, o, lse, causal, sm_scale, key) -> bool:
    """Run the Gluon kernel into o and lse; False (and a warning, once a key) where it cannot compile."""
    if key in _gluon_failed:
        return False
    try:
        from gqa_flash.fast import hopper_forward

        hopper_forward.hopper_attention_forward(q, k, v, o, lse, causal, sm_scale, GLUON_CONFIG)
        return True
    except Exception as e:  # an import or compile error of the experimental API: fall back, and say so once
        _gluon_failed[key] = f"{type(e).__name__}: {e}"
        warnings.warn(f"gqa_flash: the Gluon forward did not run ({_gluon_failed[key][:200]}); "
                      f"using the Triton kernel", RuntimeWarning, stacklevel=3)
        return False


def fast_attention_forward(q, k, v, causal=True, sm_scale=None, return_lse=False, config=None, group_major=True,
                           window=None, sink_tokens=0, sinks=None):
    """Same contract as ``flash_attention_forward``; inputs are checked by the caller.

    ``window``, ``sink_tokens`` and ``sinks`` as in ``gqa_flash.reference.reference_attention`` (causal only):
    the key blocks outside every row's window are never loaded (gqa_flash/fast/windows.py), and the LSE
    counts the sinks.

    Inputs the TMA cannot read are copied first into a layout it can (``readable``).
    ``config`` (BLOCK_M, BLOCK_N, num_warps, num_stages and optionally SUBTILES and HEADS) skips
    the autotuner, for benchmarks; fp32 on a GPU takes ``FP32_CONFIG`` unless one is given.
    ``HEADS=2`` (with ``SUBTILES=2``, GQA groups of an even size): a program owns the same
    BLOCK_M // 2 rows of two query heads of one KV group, one a sub-tile, instead of BLOCK_M rows
    of one head (item 6 of the module's docstring).
    ``group_major=False`` launches the programs in the graded kernel's order instead of the
    KV-group-major one (to measure what the order is worth; same results either way).
    On Hopper a call the rule picks (``gluon_wanted``) runs hopper_forward.py's Gluon kernel instead
    (``last_path`` says which ran); a ``config`` or ``group_major=False`` always runs this file's kernel.
    """
    batch, n_q_heads, seq_len, head_dim = q.shape
    n_kv_heads = k.shape[1]
    if sm_scale is None:
        sm_scale = head_dim ** -0.5
    q, k, v = readable(q), readable(k), readable(v)
    o = empty_readable((batch, n_q_heads, seq_len, head_dim), q.dtype, q.device)
    lse = torch.empty((batch, n_q_heads, seq_len), dtype=torch.float32, device=q.device)
    head_dim_pad = max(16, triton.next_power_of_2(head_dim))
    windowed, window, sink_tokens = kernel_window(window, sink_tokens)
    sinks, has_sinks = kernel_sinks(sinks, lse)
    key = ("forward", seq_len, n_q_heads, n_kv_heads, head_dim_pad, causal, window, q.dtype)
    plain = config is None and group_major and not windowed and not has_sinks  # what the Gluon kernel takes
    gpu = _cuda_gpu(q) if plain else None
    if (gpu is not None and gluon_wanted(gpu[1], gpu[3], triton.__version__, q.dtype, head_dim, seq_len,
                                         causal)
            and _try_gluon(q, k, v, o, lse, causal, sm_scale, key)):
        last_path["kernel"] = "gluon"
        return _finish(o, lse, return_lse)
    # Placeholder tile shapes; _set_block_shapes puts the real ones in before the launch.
    descs = {name: TensorDescriptor.from_tensor(t, [1, 1, 16, head_dim_pad])
             for name, t in (("q_desc", q), ("k_desc", k), ("v_desc", v), ("o_desc", o))}
    last_path["kernel"] = "triton"
    config = fixed_config(config, INTERPRETER_CONFIG, FP32_CONFIG, q.dtype, _picks, key, _kernel)
    tuning = config is None  # a key's first call on a GPU: the autotuner picks
    if not tuning:
        kernel, config = _fast_forward_kernel, {"SUBTILES": 1, **config}
        _set_block_shapes({**descs, **config, "HEAD_DIM_PAD": head_dim_pad})
    else:
        kernel, config = _kernel(), {}
    if config.get("HEADS", 1) != 1:
        _check_head_pairs(config, n_q_heads // n_kv_heads)

    def grid(meta):  # a program owns BLOCK_M // HEADS query rows of HEADS query heads
        heads = meta.get("HEADS", 1)
        return (triton.cdiv(seq_len, meta["BLOCK_M"] // heads) * batch * (n_q_heads // heads),)

    kernel[grid](
        descs["q_desc"], descs["k_desc"], descs["v_desc"], descs["o_desc"], lse, *lse.stride()[:2],
        sm_scale, seq_len, batch, n_q_heads, n_kv_heads, window, sink_tokens, sinks,
        HEAD_DIM_PAD=head_dim_pad, CAUSAL=causal, INPUT_PRECISION=input_precision(q.dtype), GROUP_MAJOR=group_major,
        WINDOWED=windowed, HAS_SINKS=has_sinks, **config,
    )
    if tuning:
        remember(_picks, key, kernel)
    return _finish(o, lse, return_lse)


def _finish(o, lse, return_lse):
    if not o.is_contiguous():  # rows were padded to 16 bytes: hand back a plain tensor
        o = o.contiguous()
    return (o, lse) if return_lse else o
