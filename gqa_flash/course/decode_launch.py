"""The host's side of flash-decoding: how many splits, which tiles, and the launches (given code, not graded).

``decode.py`` holds the two kernels; this module decides, on the host, how
to launch them for one call: how many chunks each context is cut into
(``num_splits``), which tiles fit the GPU, the grids, and where the partial
softmax states go. All of that depends on the inputs' shapes, strides and
dtypes, never on their values, so it is worked out once into a
:class:`DecodePlan` and the plan launches the kernels:

    DecodePlan(kernels, q, k_cache, v_cache, block_table, ...)   # decide
        .run(q, k_cache, v_cache, cache_seqlens, block_table)     # launch

``decode.flash_decode`` makes a plan on every call: clear, and what the
notebooks and tests call. A serving loop calls ``gqa_flash.flash_decode`` with
``max_seqlen`` every step with the same shapes, and there :func:`serve` keeps
the plan of each signature of inputs: a step then costs the host a lookup,
the outputs' allocation and one launch per kernel (FlashInfer's decode
wrappers split the same way, into ``plan`` and ``run``).
"""

from __future__ import annotations

import math

import torch

from gqa_flash.course import kv_cache, runtime, validation
from gqa_flash.course.launch import Launch, cdiv, next_power_of_2  # the host's, cheaper than triton's

try:  # programmatic dependent launch, Hopper's and later GPUs' (decode.py's kernels use it)
    from triton.language.extra.cuda import gdc_wait
except ImportError:  # an older Triton: PDL is refused on the host
    gdc_wait = None

LOG2_E = 1.4426950408889634

# --- How many splits, and which tiles ----------------------------------------
#
# A split costs a merge, and a GPU gains nothing from more programs than it
# can run at once. The heuristic (FlashAttention's idea, simplified):
#   * batch x KV heads x row blocks programs already fill the SMs: no split;
#   * otherwise cut each context into as many chunks as keep all programs in
#     one wave of PROGRAMS_PER_SM a SM (two: one SM switches to the second
#     while the first waits on memory), and no more: the programs of a second,
#     partial wave would run on their own at the end, for as long as the whole
#     first wave took. (On the H200, batch 8: 4 splits, 256 programs for 264
#     places, ran 7% faster than 5 splits, 320 programs, from 8k keys.)
#   * and never more splits than key blocks.
# It reads the bound max_seqlen, never the lengths themselves: nothing is read
# back from the GPU to choose it.
# The interpreter runs programs one after the other, so splitting only adds
# work there: it pretends to be a small GPU of 4 SMs, which keeps the split
# count small while the default still exercises the merge on longer contexts.
INTERPRETER_SMS = 4
PROGRAMS_PER_SM = 2  # what SPLIT_CONFIG's shared memory allows at head_dim 128, bf16


def _sm_count(device) -> int:
    gpu = runtime.on_gpu(device)
    return INTERPRETER_SMS if gpu is None else gpu[0]


def default_num_splits(programs: int, max_seqlen: int, block_n: int, device=None, sms: int | None = None) -> int:
    """The split count the heuristic above picks for ``programs`` (batch x KV heads x row blocks), on
    ``device``'s GPU, or on a GPU of ``sms`` SMs (notebook 07 draws the H200's and the H100's)."""
    sms = _sm_count(device) if sms is None else sms
    if programs >= sms:
        return 1
    return max(1, min(PROGRAMS_PER_SM * sms // programs, cdiv(max_seqlen, block_n)))


def chunked(max_seqlen: int, num_splits: int, block_n: int) -> tuple[int, int]:
    """(chunk, splits): each split's chunk in whole key blocks, and the splits that takes (fewer than asked
    when rounding the chunks up leaves one empty, and never more than the key blocks)."""
    chunk = cdiv(cdiv(max_seqlen, num_splits), block_n) * block_n
    return chunk, cdiv(max_seqlen, chunk)


# In the interpreter: small fixed tiles (rows are padded to 16, tl.dot's least).
INTERPRETER_CONFIG = dict(BLOCK_N=16, num_warps=4, num_stages=1)
# On a GPU, tiles measured on an H200 (bench/RESULTS.md, Decoding; bf16, 32 query
# heads on 8 KV heads, head_dim 128, one new token, CUDA graphs): 64-key blocks
# on 4 warps. Split, with 3 K/V tiles in flight (96 KiB of shared memory: two
# programs a SM) and the merge kernel launched early (programmatic dependent
# launch, "pdl"): worth 1-14% at contexts of 1k to 8k, where a step takes 5 to
# 70 microseconds. Not split, with 2 tiles in flight (three programs a SM):
# 0.90 -> 1.00 of SDPA's speed at batch 64, 1k, against 3 tiles. A paged cache
# not split wants more, smaller programs (32-key blocks, 3 in flight: four
# programs a SM), each waiting on its own table loads: 0.72 -> 0.96 at batch 64.
SPLIT_CONFIG = dict(BLOCK_N=64, num_warps=4, num_stages=3, pdl=True)
# A paged cache split into short chunks (up to SHORT_PAGED_CHUNK positions a program: four 64-key blocks
# or fewer) waits on its table loads with too little else to do; twice the programs, on 32-key blocks and
# 2 warps (four programs a SM), hide more of that wait. On the H100 (CUDA graphs, measured by the
# instructor's bench/explore_decode_paged_splits.py) paged / contiguous went 0.88 -> 0.92 at batch 1, 1k;
# 0.88 -> 0.89 at batch 1, 8k; 0.89 -> 0.96 at batch 8, 1k; at longer chunks the same change lost 1-2%, so
# they keep SPLIT_CONFIG. Nor past SHORT_PAGED_SPLITS splits: with 2 KV heads at 8k (notebook 07's
# generation), 128 -> 256 splits of one 32-key block each halved the tokens a second (a merge of 256
# partial states a row costs more than it hides).
PAGED_SHORT_SPLIT_CONFIG = dict(BLOCK_N=32, num_warps=2, num_stages=3, pdl=True)
SHORT_PAGED_CHUNK = 256
SHORT_PAGED_SPLITS = 33  # the most splits that are doubled (batch 1, 8 KV heads: 33 -> 64, measured above)
WHOLE_CONFIG = dict(BLOCK_N=64, num_warps=4, num_stages=2)
PAGED_WHOLE_CONFIG = dict(BLOCK_N=32, num_warps=4, num_stages=3)
SPLIT_BLOCK_N = SPLIT_CONFIG["BLOCK_N"]
SHARED_MEMORY_HEADROOM = 24 * 1024  # bytes of a block's shared memory left for all but the K and V tiles
MERGE_TILE = 8192  # fp32 elements of partial accumulators in one merge program (64 registers a thread)


def pdl_supported(device) -> bool:
    """Programmatic dependent launch needs a GPU of compute capability 9 (Hopper) or later, and a
    Triton that has ``gdc_wait``; elsewhere (an A100, a laptop's GPU, the interpreter) the merge
    kernel is launched the ordinary way, after the split kernel."""
    gpu = runtime.on_gpu(device)
    return gpu is not None and gpu[1] >= 9 and gdc_wait is not None


def gpu_config(num_splits: int, head_dim_pad: int, itemsize: int, device, paged: bool = False,
               short: bool = False) -> dict:
    """The split kernel's tiles on a GPU (the measured configs above), shrunk to its shared memory;
    ``short``: a paged cache's short chunks (PAGED_SHORT_SPLIT_CONFIG)."""
    if num_splits > 1:
        config = dict(PAGED_SHORT_SPLIT_CONFIG if paged and short else SPLIT_CONFIG)
    else:
        config = dict(PAGED_WHOLE_CONFIG if paged else WHOLE_CONFIG)
    # K and V tiles, num_stages of each in flight, must fit in a block's shared memory (227 KiB on an
    # H200): halve the block until they fit (head_dim 256 in fp32 needs it).
    budget = runtime.on_gpu(device)[2] - SHARED_MEMORY_HEADROOM
    while config["BLOCK_N"] > 16 and 2 * config["BLOCK_N"] * head_dim_pad * itemsize * config["num_stages"] > budget:
        config["BLOCK_N"] //= 2
    return config


# --- The plan ----------------------------------------------------------------


class DecodePlan:
    """Every host decision of one ``flash_decode`` call, made from shapes, strides and dtypes only.

    ``kernels`` is decode.py's ``(split kernel, merge kernel)``. The cache is
    contiguous ``[B, Hkv, S_max, D]`` or, with ``block_table``, the paged pool
    ``[num_blocks, page_size, Hkv, D]``; both are read as ``[pages, slots,
    Hkv, D]``. ``max_seqlen`` bounds ``cache_seqlens`` (None: the cache's
    capacity) and sizes the splits; ``config`` (BLOCK_N, num_warps,
    num_stages, ``pdl``) overrides the tiles, for benchmarks. ``k_new``
    (optional, with the strides ``v_new`` shares by the plan's key) plans the
    append of the new tokens (``kv_cache.append``) before attending.
    :meth:`run` launches: it may be called again with other tensors of the
    same shapes, strides, dtypes and alignment.
    """

    def __init__(self, kernels, q, k_cache, v_cache, block_table=None, sm_scale=None, num_splits=None,
                 max_seqlen=None, config=None, return_lse=False, k_new=None, v_new=None):
        split_kernel, merge_kernel = kernels
        batch, n_q_heads, n_q, head_dim = q.shape
        paged = block_table is not None
        if paged:
            page_size, n_kv_heads = k_cache.shape[1], k_cache.shape[2]
            capacity = block_table.shape[1] * page_size
            table_strides = block_table.stride()
        else:
            n_kv_heads, capacity, page_size = k_cache.shape[1], k_cache.shape[2], 1
            table_strides = (0, 0)  # no table: the kernel is handed cache_seqlens, never read as one
        sm_scale = head_dim ** -0.5 if sm_scale is None else sm_scale
        max_seqlen = capacity if max_seqlen is None else max_seqlen
        self.paged, self.return_lse = paged, return_lse
        self.o_shape, self.lse_shape = (batch, n_q_heads, n_q, head_dim), (batch, n_q_heads, n_q)
        self.interpret = runtime.INTERPRETER or not q.is_cuda  # NaN-filled outputs (runtime.empty_output)
        self.empty = batch == 0
        self.append = (None if k_new is None or self.empty
                       else kv_cache.append_launch(k_new, v_new, k_cache, v_cache, block_table))
        if self.empty:  # nothing to launch: empty outputs
            self.buffer_size = 0
            return

        # The packed rows: every query head of a group times every new token, in tiles of
        # at least 16 rows (tl.dot's least) and at most 64 (beyond, registers run out).
        group_rows = (n_q_heads // n_kv_heads) * n_q
        block_m = max(16, min(next_power_of_2(group_rows), 64))
        row_blocks = cdiv(group_rows, block_m)
        head_dim_pad = max(16, next_power_of_2(head_dim))
        short = False
        if num_splits is None:
            guess_n = INTERPRETER_CONFIG["BLOCK_N"] if self.interpret else SPLIT_BLOCK_N
            num_splits = default_num_splits(batch * n_kv_heads * row_blocks, max_seqlen, guess_n, q.device)
            short = (paged and config is None and 1 < num_splits <= SHORT_PAGED_SPLITS
                     and cdiv(max_seqlen, num_splits) <= SHORT_PAGED_CHUNK)
            if short and not self.interpret:  # twice the programs (PAGED_SHORT_SPLIT_CONFIG's comment)
                num_splits = min(2 * num_splits, cdiv(max_seqlen, PAGED_SHORT_SPLIT_CONFIG["BLOCK_N"]))
        if config is None:
            config = (INTERPRETER_CONFIG if self.interpret
                      else gpu_config(num_splits, head_dim_pad, q.element_size(), q.device, paged, short))
        block_n = config["BLOCK_N"]
        # Chunks of whole key blocks; a split count past the number of blocks shrinks to it.
        chunk, num_splits = chunked(max_seqlen, num_splits, block_n)
        self.num_splits = num_splits

        config = dict(config)
        # Programmatic dependent launch: the merge kernel is launched while the split kernel still runs
        # and waits on the GPU for its writes, instead of after it on the host's queue.
        pdl = bool(config.pop("pdl", False)) and pdl_supported(q.device)
        direct = num_splits == 1
        # The partial states, [B, Hq, Nq, splits(, D)] fp32; one split needs none.
        self.acc_shape = None if direct else (batch, n_q_heads, n_q, num_splits, head_dim)
        # One fp32 buffer holds the LSE and the partial states acc, l and m: one allocation a call, not
        # four. Each part starts on a 64-byte boundary.
        parts = [self.lse_shape] + ([] if direct else [self.acc_shape, self.acc_shape[:-1], self.acc_shape[:-1]])
        self.parts, start = [], 0
        for shape in parts:
            self.parts.append((start, shape))
            start += cdiv(math.prod(shape), 16) * 16
        self.buffer_size = start
        o_strides = (n_q_heads * n_q * head_dim, n_q * head_dim, head_dim, 1)  # a fresh, contiguous O
        self.split = Launch(split_kernel, (row_blocks, num_splits, batch * n_kv_heads), (
            *q.stride(), *o_strides, *kv_cache.page_strides(k_cache, paged), *kv_cache.page_strides(v_cache, paged),
            *table_strides, sm_scale * LOG2_E, n_q_heads, n_kv_heads, num_splits, chunk, capacity, k_cache.shape[0],
        ), dict(
            N_Q=n_q, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, BLOCK_M=block_m, PAGE_SIZE=page_size, PAGED=paged,
            # fp32 in means fp32 products (Triton would use tf32 by default)
            INPUT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
            DIRECT=direct, PDL=pdl and not direct, **config,
        ))
        self.merge = None if direct else merge_launch(merge_kernel, self.acc_shape, o_strides, self.interpret, pdl)

    def run(self, q, k_cache, v_cache, cache_seqlens, block_table=None, k_new=None, v_new=None):
        """Launch: O ``[B, Hq, Nq, D]`` in q's dtype (and with ``return_lse`` the LSE ``[B, Hq, Nq]``)."""
        if self.interpret:  # NaN where nothing is written (runtime.empty_output)
            o = runtime.empty_output(self.o_shape, q.dtype, q.device)
            buffer = runtime.empty_output((self.buffer_size,), torch.float32, q.device)
        else:
            o = q.new_empty(self.o_shape)
            buffer = q.new_empty((self.buffer_size,), dtype=torch.float32)
        table = block_table if self.paged else cache_seqlens  # (no table: never read as one)
        if self.append is not None:
            self.append(k_new, v_new, k_cache, v_cache, cache_seqlens, table)
        if self.empty:
            return (o, buffer.view(self.lse_shape)) if self.return_lse else o
        if self.split.direct and (self.merge is None or self.merge.direct):  # raw addresses: no tensor a part
            base = buffer.data_ptr()
            lse, *partial = [base + 4 * start for start, _ in self.parts]
        else:  # tensors while Triton compiles the kernels for them (and always in the interpreter)
            lse, *partial = [buffer[start:start + math.prod(shape)].view(shape) for start, shape in self.parts]
        if self.merge is None:  # one split: no partial states, any fp32 pointer stands in for them
            self.split(q, k_cache, v_cache, cache_seqlens, table, lse, lse, lse, o, lse)
        else:
            self.split(q, k_cache, v_cache, cache_seqlens, table, *partial, o, lse)
            self.merge(*partial, o, lse)
        if not self.return_lse:
            return o
        return o, buffer[:math.prod(self.lse_shape)].view(self.lse_shape)


def merge_launch(merge_kernel, acc_shape, o_strides, interpret, pdl=False) -> Launch:
    """The merge kernel's launch for partial states ``acc`` of ``acc_shape`` [B, Hq, Nq, splits, D]
    (with ``l``, ``m`` [B, Hq, Nq, splits]; fp32, contiguous) into O (``o_strides``) and LSE [B, Hq, Nq].
    ``pdl``: launched early, waiting on the GPU for the split kernel (:func:`pdl_supported`)."""
    batch, n_q_heads, n_q, num_splits, head_dim = acc_shape
    head_dim_pad = max(16, next_power_of_2(head_dim))
    # BLOCK_R rows a program, as many as keep its [BLOCK_R, splits, head_dim] tile of partial
    # accumulators within MERGE_TILE elements (on a GPU: registers; in the interpreter, where every
    # program costs Python overhead, as many as there are, up to 64).
    n_rows, splits_pad = batch * n_q_heads * n_q, next_power_of_2(num_splits)
    fit = max(1, MERGE_TILE // (splits_pad * head_dim_pad))
    block_r = min(next_power_of_2(n_rows), 64 if interpret else 1 << (fit.bit_length() - 1))
    return Launch(merge_kernel, (cdiv(n_rows, block_r),), (*o_strides, n_rows, n_q_heads, num_splits), dict(
        N_Q=n_q, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, SPLITS_PAD=splits_pad, BLOCK_R=block_r,
        PDL=pdl, num_warps=4, **(dict(launch_pdl=True) if pdl else {}),
    ))


def flash_decode(kernels, q, k_cache, v_cache, cache_seqlens, block_table=None, sm_scale=None, num_splits=None,
                 return_lse=False, max_seqlen=None, config=None):
    """``decode.flash_decode``: plan this call, then run it (see :class:`DecodePlan`)."""
    plan = DecodePlan(kernels, q, k_cache, v_cache, block_table, sm_scale, num_splits, max_seqlen, config,
                      return_lse)
    return plan.run(q, k_cache, v_cache, cache_seqlens, block_table)


# --- A serving loop's calls ---------------------------------------------------

MAX_PLANS = 256  # plans kept (a serving loop whose batch varies makes one a batch size); then start again
_plans: dict = {}


def _signature(q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new):
    """What the checks and the plan read of the tensors: shapes, strides, dtypes, devices and whether
    each address is 16-byte aligned (Triton compiles a kernel for that)."""
    return tuple([None if t is None else (t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() & 15)
                  for t in (q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new)])


def serve(module, q, k_cache, v_cache, cache_seqlens, block_table, sm_scale, num_splits, return_lse, max_seqlen,
          k_new=None, v_new=None):
    """``gqa_flash.flash_decode`` with ``max_seqlen``: the inputs checked and the plan made once per signature.

    The first call with a new signature runs ``validation.check_decode_inputs``
    (shapes, dtypes, devices: no value read) and makes a :class:`DecodePlan`
    of ``module``'s kernels (decode.py's); a call with a signature seen before
    only runs the plan. The key holds the type of every argument too, so ``max_seqlen=8.0``
    is refused as it was the first time, not served from ``max_seqlen=8``.
    """
    # The kernels, not the module: a module edited and loaded again is the same object with new kernels.
    kernels = (module._flash_decode_split_kernel, module._flash_decode_merge_kernel)
    try:
        key = (kernels, type(sm_scale), sm_scale, type(num_splits), num_splits, type(return_lse), return_lse,
               type(max_seqlen), max_seqlen, _signature(q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new))
        plan = _plans.get(key)
    except (AttributeError, TypeError):  # not tensors, or unhashable: the checks will say what is wrong
        key = plan = None
    if plan is None:
        bound = validation.check_decode_inputs(q, k_cache, v_cache, cache_seqlens, block_table, num_splits,
                                               return_lse, max_seqlen, k_new, v_new)
        sm_scale = validation.resolve_sm_scale(sm_scale, q.shape[-1])
        plan = DecodePlan(kernels, q, k_cache, v_cache, block_table, sm_scale, num_splits, bound, None, return_lse,
                          k_new, v_new)
        if key is not None:
            if len(_plans) >= MAX_PLANS:
                _plans.clear()
            _plans[key] = plan
    return plan.run(q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new)
