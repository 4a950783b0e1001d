"""The fast forward on Hopper, written in Gluon: warp specialisation as FlashAttention-3 arranges it.

Read ``gqa_flash/fast/forward.py`` first: same maths (exp2 with the scale folded
into one multiply-add, the online softmax, the LSE), same launch order (the
heaviest causal tiles first, the query heads of one KV group side by side).
What changes is who does what. Triton's compiler decides that for forward.py;
here the kernel says it (``triton.experimental.gluon``: explicit layouts,
shared memory, TMA copies, mbarriers, ``warpgroup_mma`` and
``warp_specialize``):

- A **loader** warp does nothing but issue TMA copies: each K tile and each V
  tile of the program's keys into rings of shared-memory slots (``K_STAGES``
  for K, ``V_STAGES`` for V). It fills a slot as soon as both consumers have
  released it (``k_empty``: after the score product; ``v_empty``: after P V) and
  announces each tile on its own barrier (``k_ready``, ``v_ready``), so a
  score product can start before its V tile has arrived.
- Two **consumer** warpgroups (4 warps each) own 64 query rows each: the same
  rows of two query heads of one KV group (GQA: both read every K/V tile the
  loader brings), or, with one query head a KV head, two blocks of 64 rows of
  one head. Each consumer keeps its accumulator, row maxima and row sums in
  registers for the whole key loop.
- Inside a consumer the loop is software-pipelined by hand: step j issues the
  score product of key block j+1 and the P V product of block j, both
  asynchronous, then waits only for the first (``warpgroup_mma_wait(1)``) and
  runs block j+1's softmax while the tensor cores still work on block j's
  P V. Only then does it wait for P V, rescale the accumulator and release V's
  slot. K's slot is released as soon as its scores are waited for: released
  after P V instead, block j+2's K could only start loading when the consumer
  already wanted it; releasing it early gained 11-18% at head_dim 128 on an
  H100, up to 22% with K's third slot (bench/RESULTS.md, "The Gluon
  forward"). Between the two consumers the hardware does the rest: while one
  warpgroup's exponentials run, the other's products keep the tensor cores
  busy (FlashAttention-3's ping-pong). Ordering their turns by hand
  (``PINGPONG``, an option) measured no better.
- The grid is persistent: one program an SM, taking tiles in turn, heaviest
  first; a consumer loads its next tile's Q as soon as its last score product
  is done, under the last P V and the store.

For CUDA devices of compute capability 9.x (wgmma, TMA, setmaxnreg), fp16 or
bf16, head dims up to 128 (padded to 64 or 128: the TMA fills the columns past
head_dim with zeros and clips the stores). ``fast_attention_forward`` takes
this kernel only where it was measured ahead (``forward.gluon_wanted``) and
runs forward.py's Triton kernel everywhere else: the CPU interpreter, other
GPUs, other Triton versions (Gluon's API moves), head_dim 64, short sequences.
"""
import torch
import triton

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from gqa_flash.course import runtime
from gqa_flash.fast import memory  # the layouts the TMA reads and the shared-memory limit, as forward.py's

ROWS = gl.constexpr(64)  # query rows a consumer warpgroup owns: one wgmma M of 64 across its 4 warps
CONSUMERS = gl.constexpr(2)


@gluon.jit
def _tile(tile, SEQ_LEN, BATCH, N_Q_HEADS, N_KV_HEADS, CAUSAL: gl.constexpr, PAIR_HEADS: gl.constexpr,
          BLOCK_N: gl.constexpr, CONSUMER: gl.constexpr):
    """Where tile number ``tile`` lies, for one consumer: (batch, kv_head, q_head, first row, key
    blocks, first masked block). Tiles are numbered heaviest first, the query heads of a KV group
    side by side; a tile is 64 rows of two query heads (PAIR_HEADS) or 128 rows of one."""
    SPAN: gl.constexpr = ROWS if PAIR_HEADS else ROWS * CONSUMERS
    HEADS: gl.constexpr = CONSUMERS if PAIR_HEADS else 1
    group_size = N_Q_HEADS // N_KV_HEADS
    tiles_per_group = group_size // HEADS
    rest = tile // tiles_per_group
    batch_kv = rest % (BATCH * N_KV_HEADS)
    tile_order = rest // (BATCH * N_KV_HEADS)
    batch = batch_kv // N_KV_HEADS
    kv_head = batch_kv % N_KV_HEADS
    q_head = kv_head * group_size + (tile % tiles_per_group) * HEADS
    if CAUSAL:
        q_start = (gl.cdiv(SEQ_LEN, SPAN) - 1 - tile_order) * SPAN
        n_blocks = gl.cdiv(gl.minimum(q_start + SPAN, SEQ_LEN), BLOCK_N)
        first_masked = q_start // BLOCK_N  # blocks before it lie wholly below every row's diagonal
    else:
        q_start = tile_order * SPAN
        n_blocks = gl.cdiv(SEQ_LEN, BLOCK_N)
        first_masked = SEQ_LEN // BLOCK_N
    if PAIR_HEADS:
        q_head = q_head + CONSUMER
    else:
        q_start = q_start + CONSUMER * ROWS
    return batch, kv_head, q_head, q_start, n_blocks, first_masked


@gluon.jit
def _load_kv(k_desc, v_desc, ring, n_tiles, SEQ_LEN, BATCH, N_Q_HEADS, N_KV_HEADS, CAUSAL: gl.constexpr,
             PAIR_HEADS: gl.constexpr, BLOCK_N: gl.constexpr, K_STAGES: gl.constexpr, V_STAGES: gl.constexpr):
    """The loader warp: for each of the program's tiles, the K and V tiles of its key blocks, into the
    rings of slots. ``it`` counts key blocks over all tiles: K's slot ``it % K_STAGES`` on its pass
    ``it // K_STAGES``, V's likewise."""
    k_smem, v_smem, k_ready, v_ready, k_empty, v_empty = ring
    it = 0
    for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        batch, kv_head, _, _, n_blocks, _ = _tile(tile, SEQ_LEN, BATCH, N_Q_HEADS, N_KV_HEADS, CAUSAL, PAIR_HEADS,
                                                  BLOCK_N, 0)
        for j in range(n_blocks):
            # A slot's first fill waits on nothing: phase 1 of a fresh barrier counts as complete.
            slot = it % K_STAGES
            mbarrier.wait(k_empty.index(slot), ((it // K_STAGES) & 1) ^ 1)
            mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [batch, kv_head, j * BLOCK_N, 0], k_ready.index(slot),
                                            k_smem.index(slot))
            slot = it % V_STAGES
            mbarrier.wait(v_empty.index(slot), ((it // V_STAGES) & 1) ^ 1)
            mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(v_desc, [batch, kv_head, j * BLOCK_N, 0], v_ready.index(slot),
                                            v_smem.index(slot))
            it += 1


@gluon.jit
def _masked(s, start_n, row0, SEQ_LEN, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr,
            s_layout: gl.constexpr):
    cols = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    keep = cols[None, :] < SEQ_LEN
    if CAUSAL:
        rows = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
        keep = keep & (cols[None, :] <= rows[:, None])
    return gl.where(keep, s, float("-inf"))


@gluon.jit
def _load_q(q_desc, q_smem, q_bar, tile, n_tiles, SEQ_LEN, BATCH, N_Q_HEADS, N_KV_HEADS, CAUSAL: gl.constexpr,
            PAIR_HEADS: gl.constexpr, BLOCK_N: gl.constexpr, CONSUMER: gl.constexpr):
    if tile < n_tiles:
        batch, _, q_head, row0, _, _ = _tile(tile, SEQ_LEN, BATCH, N_Q_HEADS, N_KV_HEADS, CAUSAL, PAIR_HEADS,
                                             BLOCK_N, CONSUMER)
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [batch, q_head, row0, 0], q_bar, q_smem)


@gluon.jit
def _consume(q_desc, o_desc, q_smem, o_smem, q_bar, ring, turn, LSE, stride_lb, stride_lh, qk_scale, n_tiles, SEQ_LEN,
             BATCH, N_Q_HEADS, N_KV_HEADS, CAUSAL: gl.constexpr, PAIR_HEADS: gl.constexpr, BLOCK_N: gl.constexpr,
             HEAD_DIM: gl.constexpr, K_STAGES: gl.constexpr, V_STAGES: gl.constexpr, CONSUMER: gl.constexpr,
             PINGPONG: gl.constexpr):
    """One consumer warpgroup: for each of the program's tiles, its 64 query rows against every key
    block the loader brings. With PINGPONG the two consumers take turns to issue a step's two
    products (``turn``), so that one's softmax runs while the other's products run."""
    k_smem, v_smem, k_ready, v_ready, k_empty, v_empty = ring
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    q = q_smem.reshape([ROWS, HEAD_DIM])
    zeros_s = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)

    first = gl.program_id(0)
    step = gl.num_programs(0)
    _load_q(q_desc, q_smem, q_bar, first, n_tiles, SEQ_LEN, BATCH, N_Q_HEADS, N_KV_HEADS, CAUSAL, PAIR_HEADS,
            BLOCK_N, CONSUMER)
    it = 0  # key blocks consumed so far, over all tiles: the loader's count
    steps = 0  # loop steps so far, over all tiles: both consumers take the same number
    done = 0  # tiles finished
    for tile in range(first, n_tiles, step):
        batch, _, q_head, row0, n_blocks, first_masked = _tile(tile, SEQ_LEN, BATCH, N_Q_HEADS, N_KV_HEADS,
                                                                CAUSAL, PAIR_HEADS, BLOCK_N, CONSUMER)
        mbarrier.wait(q_bar, done & 1)

        # Key block 0: its scores and softmax before the loop.
        slot = it % K_STAGES
        mbarrier.wait(k_ready.index(slot), (it // K_STAGES) & 1)
        s = warpgroup_mma(q, k_smem.index(slot).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)), zeros_s,
                          use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s,))
        mbarrier.arrive(k_empty.index(slot), count=1)
        if first_masked == 0:
            s = _masked(s, 0, row0, SEQ_LEN, CAUSAL, BLOCK_N, s_layout)
        m = gl.max(s, 1) * qk_scale
        p = gl.exp2(s * qk_scale - m[:, None])
        l_sum = gl.sum(p, 1)
        acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=o_layout)

        for j in range(n_blocks - 1):
            slot = (it + j) % V_STAGES
            nslot = (it + j + 1) % K_STAGES
            # Issue block j+1's scores, then block j's P V; wait for the scores only.
            if PINGPONG:  # consumer 0's first turn passes at once (phase 1 of a fresh barrier)
                mbarrier.wait(turn.index(CONSUMER), ((steps + j) & 1) ^ (1 - CONSUMER))
            mbarrier.wait(k_ready.index(nslot), ((it + j + 1) // K_STAGES) & 1)
            s_tok = warpgroup_mma(q, k_smem.index(nslot).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)), zeros_s,
                                  use_acc=False, is_async=True)
            mbarrier.wait(v_ready.index(slot), ((it + j) // V_STAGES) & 1)
            p_op = gl.convert_layout(p.to(q_desc.dtype), p_layout)
            acc_tok = warpgroup_mma(p_op, v_smem.index(slot).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
            if PINGPONG:
                mbarrier.arrive(turn.index(1 - CONSUMER), count=1)
            s = warpgroup_mma_wait(1, deps=(s_tok,))
            mbarrier.arrive(k_empty.index(nslot), count=1)  # K's slot is free once its scores are
            # Block j+1's softmax, under block j's P V.
            if j + 1 >= first_masked:
                s = _masked(s, (j + 1) * BLOCK_N, row0, SEQ_LEN, CAUSAL, BLOCK_N, s_layout)
            m_new = gl.maximum(m, gl.max(s, 1) * qk_scale)
            p = gl.exp2(s * qk_scale - m_new[:, None])
            alpha = gl.exp2(m - m_new)
            l_sum = l_sum * alpha + gl.sum(p, 1)
            m = m_new
            acc = warpgroup_mma_wait(0, deps=(acc_tok,))
            mbarrier.arrive(v_empty.index(slot), count=1)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]

        # Every score product of this tile is done: Q's slot can take the next tile's rows already.
        _load_q(q_desc, q_smem, q_bar, tile + step, n_tiles, SEQ_LEN, BATCH, N_Q_HEADS, N_KV_HEADS, CAUSAL,
                PAIR_HEADS, BLOCK_N, CONSUMER)
        last = it + n_blocks - 1
        slot = last % V_STAGES
        mbarrier.wait(v_ready.index(slot), (last // V_STAGES) & 1)
        p_op = gl.convert_layout(p.to(q_desc.dtype), p_layout)
        acc = warpgroup_mma(p_op, v_smem.index(slot).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(v_empty.index(slot), count=1)

        # Normalise; O through shared memory and the TMA (clipped at SEQ_LEN), the LSE by plain stores.
        out = acc / gl.convert_layout(l_sum, gl.SliceLayout(1, o_layout))[:, None]
        tma.store_wait(0)  # the previous tile's O has left o_smem
        o_smem.reshape([ROWS, HEAD_DIM]).store(out.to(o_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [batch, q_head, row0, 0], o_smem)
        rows = row0 + gl.arange(0, ROWS, layout=row_layout)
        lse = (m + gl.log2(l_sum)) * 0.6931471805599453  # log2 to natural log
        lse_ptr = LSE + batch.to(gl.int64) * stride_lb + q_head.to(gl.int64) * stride_lh
        gl.store(lse_ptr + rows, lse, mask=rows < SEQ_LEN)
        it += n_blocks
        steps += n_blocks - 1
        done += 1
    tma.store_wait(0)


@gluon.jit
def _hopper_forward_kernel(q_desc, k_desc, v_desc, o_desc, LSE, stride_lb, stride_lh, sm_scale, SEQ_LEN, BATCH,
                           N_Q_HEADS, N_KV_HEADS, n_tiles, CAUSAL: gl.constexpr, PAIR_HEADS: gl.constexpr,
                           BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, K_STAGES: gl.constexpr,
                           V_STAGES: gl.constexpr, PINGPONG: gl.constexpr):
    """A persistent program: tiles pid, pid + programs, ... (``_tile``), one loader warp and two consumers."""
    qk_scale = sm_scale * 1.4426950408889634  # log2(e)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS, 1, 1, ROWS, HEAD_DIM], q_desc.layout)
    o_smem = gl.allocate_shared_memory(o_desc.dtype, [CONSUMERS, 1, 1, ROWS, HEAD_DIM], o_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [K_STAGES, 1, 1, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [V_STAGES, 1, 1, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [K_STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [K_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(CONSUMERS):
        mbarrier.init(q_bar.index(i), count=1)
        mbarrier.init(turn.index(i), count=1)
    for i in gl.static_range(K_STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=CONSUMERS)
    for i in gl.static_range(V_STAGES):
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(v_empty.index(i), count=CONSUMERS)

    ring = (k_smem, v_smem, k_ready, v_ready, k_empty, v_empty)  # the loader's slots and barriers, shared by all three
    gl.warp_specialize([
        (_consume, (q_desc, o_desc, q_smem.index(0), o_smem.index(0), q_bar.index(0), ring, turn, LSE, stride_lb,
                    stride_lh, qk_scale, n_tiles, SEQ_LEN, BATCH, N_Q_HEADS, N_KV_HEADS, CAUSAL, PAIR_HEADS,
                    BLOCK_N, HEAD_DIM, K_STAGES, V_STAGES, 0, PINGPONG)),
        (_consume, (q_desc, o_desc, q_smem.index(1), o_smem.index(1), q_bar.index(1), ring, turn, LSE, stride_lb,
                    stride_lh, qk_scale, n_tiles, SEQ_LEN, BATCH, N_Q_HEADS, N_KV_HEADS, CAUSAL, PAIR_HEADS,
                    BLOCK_N, HEAD_DIM, K_STAGES, V_STAGES, 1, PINGPONG)),
        (_load_kv, (k_desc, v_desc, ring, n_tiles, SEQ_LEN, BATCH, N_Q_HEADS, N_KV_HEADS, CAUSAL, PAIR_HEADS, BLOCK_N,
                    K_STAGES, V_STAGES)),
    ], [4, 1], [240, 24])


def head_dim_tile(head_dim: int) -> int:
    return 64 if head_dim <= 64 else 128


def config_for(head_dim_pad: int):
    """128-key tiles; K in 3 slots and V in 2 at head_dim 128 (224 KiB of shared memory with Q and O),
    3 of each at 64."""
    return {"BLOCK_N": 128, "K_STAGES": 3, "V_STAGES": 2 if head_dim_pad > 64 else 3}


def shared_bytes(config, head_dim_pad, itemsize=2) -> int:
    """Q's and O's tiles for both consumers, the K and V slots, and a few barriers."""
    tiles = 2 * CONSUMERS.value * ROWS.value + (config["K_STAGES"] + config["V_STAGES"]) * config["BLOCK_N"]
    return tiles * head_dim_pad * itemsize + 512


def descriptors(q, k, v, o, head_dim_pad, block_n):
    """4-D descriptors over [B, H, N, D] with their real strides; a tile is (batch, head, row, 0)."""
    def desc(t, rows):
        block = [1, 1, rows, head_dim_pad]
        layout = gl.NVMMASharedLayout.get_default_for(block, gl.float16 if t.dtype == torch.float16 else gl.bfloat16)
        return TensorDescriptor.from_tensor(t, block, layout)
    return desc(q, ROWS.value), desc(k, block_n), desc(v, block_n), desc(o, ROWS.value)


def sm_count(device) -> int:
    """The GPU's SMs: the persistent grid's programs (a seam the GPU tests shrink to cross tiles)."""
    return runtime.on_gpu(device)[0]


def hopper_attention_forward(q, k, v, o, lse, causal, sm_scale, config=None):
    """Launch the Gluon kernel into ``o`` and ``lse`` (TMA-readable tensors, checked by the caller).
    ``config`` (``config_for`` unless given): BLOCK_N, K_STAGES and V_STAGES; PERSISTENT (default True:
    one program an SM, each taking tiles in turn; False: one program a tile); PINGPONG (default False:
    the consumers take turns to issue their products)."""
    batch, n_q_heads, seq_len, head_dim = q.shape
    n_kv_heads = k.shape[1]
    head_dim_pad = head_dim_tile(head_dim)
    config = {"PERSISTENT": True, "PINGPONG": False, **config_for(head_dim_pad), **(config or {})}
    limit = memory.shared_memory(q.device)
    if shared_bytes(config, head_dim_pad) > limit:
        raise ValueError(f"config: {config} needs {shared_bytes(config, head_dim_pad):,} bytes of shared memory at "
                         f"head_dim {head_dim}, more than the {limit:,} a program may hold here")
    pair_heads = (n_q_heads // n_kv_heads) % 2 == 0
    q_desc, k_desc, v_desc, o_desc = descriptors(q, k, v, o, head_dim_pad, config["BLOCK_N"])
    span = ROWS.value * (1 if pair_heads else CONSUMERS.value)
    n_tiles = triton.cdiv(seq_len, span) * batch * n_q_heads // (CONSUMERS.value if pair_heads else 1)
    grid = (min(n_tiles, sm_count(q.device)) if config["PERSISTENT"] else n_tiles,)
    _hopper_forward_kernel[grid](
        q_desc, k_desc, v_desc, o_desc, lse, lse.stride(0), lse.stride(1), sm_scale, seq_len, batch, n_q_heads,
        n_kv_heads, n_tiles, CAUSAL=causal, PAIR_HEADS=pair_heads, BLOCK_N=config["BLOCK_N"], HEAD_DIM=head_dim_pad,
        K_STAGES=config["K_STAGES"], V_STAGES=config["V_STAGES"], PINGPONG=config["PINGPONG"], num_warps=4)
    return o, lse


def attention(q, k, v, causal=True, sm_scale=None, config=None):
    """(O, LSE) from the Gluon kernel alone, whatever the route would pick: for benchmarks and tests.
    Inputs the TMA cannot read are copied first, as the fast forward does."""
    batch, n_q_heads, seq_len, head_dim = q.shape
    q, k, v = (memory.readable(t) for t in (q, k, v))
    o = memory.empty_readable((batch, n_q_heads, seq_len, head_dim), q.dtype, q.device)
    lse = torch.empty((batch, n_q_heads, seq_len), dtype=torch.float32, device=q.device)
    sm_scale = head_dim ** -0.5 if sm_scale is None else sm_scale
    return hopper_attention_forward(q, k, v, o, lse, causal, sm_scale, config)
