"""Notebooks 04, 04b and 07: the probes, one tiny Triton kernel per part of forward.py, windows.py, decode.py.

The kernel parts of ``forward.py`` are small ``@triton.jit`` helpers, and each
is checked on its own by a *probe*: an ordinary kernel that loads chosen
inputs, calls ONE of your helpers, and stores what it returns. The probes
below are plain functions that say ``fwd.program_ids(...)``;
:func:`forward_parts` turns them into Triton kernels bound to one version of
your forward module. Part 3's two probes are the exception to "one helper":
they run your key loop, which calls your Part 2, with Parts 4 and 5 replaced
by recorders (of the key blocks it walks, and of the scores it computes). The
checks that launch the probes are in kernel_walk.py (Parts 1-3) and
kernel_parts.py (Parts 4-6). For two mistakes that only a GPU would show
(a masked load with no ``other``, batch and head offsets in int32) the
interpreter's loads and stores are swapped, for the length of a probe, for
ones that show them (the end of this file). decode.py's probes
(``dec.group_tile(...)`` and the others) are launched by decode_parts.py, and
windows.py's (``win.window_mask(...)``...) by windows.py.

Why a fresh kernel per version: a compiled Triton kernel remembers the code of
every helper it calls (it hashes them once, on first launch). If the probe
were a single global kernel, editing forward.py would leave it running your
old helper on a GPU. So each time the file changes (impl.load re-executes
it, which makes new helper objects) we build new probe kernels, each with its
own globals dict in which ``fwd`` (or ``dec``, ``win``) is the module; that dict never
changes, so Triton's "global variable changed since compiled" check stays quiet. In the
interpreter the same code runs as Python, unchanged.
"""

import contextlib
import functools
import types

import numpy as np

import triton
import triton.language as tl

from gqa_flash.course import runtime
from gqa_flash.course.lab.checks.common import PARTS, Stop, fail, load, rel, run_student


def _probe_program_ids(OUT, N_Q_HEADS, N_KV_HEADS):
    """Part 1: each program stores the four numbers program_ids gives it, at its place in the grid."""
    slot = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) * 4
    q_tile_idx, batch_idx, q_head_idx, kv_head_idx = fwd.program_ids(N_Q_HEADS, N_KV_HEADS)  # noqa: F821
    tl.store(OUT + slot, q_tile_idx)
    tl.store(OUT + slot + 1, batch_idx)
    tl.store(OUT + slot + 2, q_head_idx)
    tl.store(OUT + slot + 3, kv_head_idx)


def _probe_load_tile(X, OUT, BATCH, HEAD, stride_b, stride_h, stride_row, stride_col, n_rows, n_cols, ROW0,
                     BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Part 2: one tile of X[BATCH, HEAD], rows ROW0.., stored densely in OUT."""
    zero = tl.program_id(0)  # 0: batch and head arrive as tensors, as in the kernel
    rows = ROW0 + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    tile = fwd.load_tile(X, zero + BATCH, zero + HEAD, rows, cols, stride_b, stride_h,  # noqa: F821
                         stride_row, stride_col, n_rows, n_cols)
    tl.store(OUT + tl.arange(0, BLOCK_R)[:, None] * BLOCK_C + cols[None, :], tile)


@triton.jit
def _record_update(acc, l_i, m_i, s, v, INPUT_PRECISION: tl.constexpr):
    """Part 3's stand-in for Part 4: count the key blocks, and which keys came with or without the mask.

    The probe's queries are 0, so every score is 0; _mark_masked turns the
    scores of a masked block into -1. With v[j] = e_j (key j's value is the
    j-th unit vector), acc[:, j] gains 1 per unmasked visit of key j and 1000
    per masked one; l_i counts the blocks.
    """
    weight = tl.where(s == 0.0, 1.0, 0.0) + tl.where(s == -1.0, 1000.0, 0.0)
    acc += tl.dot(weight.to(v.dtype), v, input_precision=INPUT_PRECISION)
    return acc, l_i + 1.0, m_i


@triton.jit
def _mark_masked(s, offs_m, offs_n, SEQ_LEN, CAUSAL: tl.constexpr):
    """Part 3's stand-in for Part 5: marks the block as masked instead of masking it."""
    return s - 1.0


def _probe_key_loop(K, V, ACC_OUT, BLOCKS_OUT, SEQ_LEN, BATCH, HEAD,
                    stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn, stride_vd,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr):
    """Part 3: your key loop with Parts 4 and 5 replaced by recorders; stores what they recorded.

    K and V come with strides of their own (the check lays them out differently)."""
    tile = tl.program_id(0)
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    acc, l_i, m_i = recorded_key_loop(  # noqa: F821
        acc, l_i, m_i, q, K, V, tile * 0 + BATCH, tile * 0 + HEAD,
        stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn, stride_vd,
        tile, offs_m, offs_d, 1.0, SEQ_LEN, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, "ieee")
    rows = tl.arange(0, BLOCK_M)
    tl.store(ACC_OUT + (tile * BLOCK_M + rows[:, None]) * HEAD_DIM + offs_d[None, :], acc)
    tl.store(BLOCKS_OUT + tile * BLOCK_M + rows, l_i)


@triton.jit
def _record_scores(acc, l_i, m_i, s, v, INPUT_PRECISION: tl.constexpr):
    """Part 3's other stand-in for Part 4: with v[j] = e_j, acc[:, j] gains the score of key j, each visit."""
    acc += tl.dot(s, v, input_precision=INPUT_PRECISION)
    return acc, l_i + 1.0, m_i


@triton.jit
def _keep_scores(s, offs_m, offs_n, SEQ_LEN, CAUSAL: tl.constexpr):
    """Part 3's other stand-in for Part 5: masks nothing, so the recorder sees every score the loop computed."""
    return s


def _probe_key_scores(Q, K, V, ACC_OUT, SEQ_LEN, BATCH, HEAD, qk_scale,
                      stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn, stride_vd,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr):
    """Part 3: your key loop on real queries, its scores recorded (acc[i, j] = the score of row i, key j).

    Q is [query tiles * BLOCK_M, HEAD_DIM], contiguous (rows past SEQ_LEN hold zeros)."""
    tile = tl.program_id(0)
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + offs_m[:, None] * HEAD_DIM + offs_d[None, :])
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    acc, l_i, m_i = scored_key_loop(  # noqa: F821
        acc, l_i, m_i, q, K, V, tile * 0 + BATCH, tile * 0 + HEAD,
        stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn, stride_vd,
        tile, offs_m, offs_d, qk_scale, SEQ_LEN, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, "ieee")
    tl.store(ACC_OUT + offs_m[:, None] * HEAD_DIM + offs_d[None, :], acc)


def _probe_online_softmax_update(ACC, L, M, S, V, ACC_OUT, L_OUT, M_OUT,
                                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                                 INPUT_PRECISION: tl.constexpr):
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    acc = tl.load(ACC + rows[:, None] * HEAD_DIM + dims[None, :])
    l_i = tl.load(L + rows)
    m_i = tl.load(M + rows)
    s = tl.load(S + rows[:, None] * BLOCK_N + cols[None, :])
    v = tl.load(V + cols[:, None] * HEAD_DIM + dims[None, :])
    acc, l_i, m_i = fwd.online_softmax_update(acc, l_i, m_i, s, v, INPUT_PRECISION)  # noqa: F821
    tl.store(ACC_OUT + rows[:, None] * HEAD_DIM + dims[None, :], acc)
    tl.store(L_OUT + rows, l_i)
    tl.store(M_OUT + rows, m_i)


def _probe_mask_scores(S, OUT, SEQ_LEN, stride_row, CAUSAL: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offsets = offs_m[:, None] * stride_row + offs_n[None, :]
    s = tl.load(S + offsets)
    tl.store(OUT + offsets, fwd.mask_scores(s, offs_m, offs_n, SEQ_LEN, CAUSAL))  # noqa: F821


def _probe_epilogue(ACC, L, M, O, LSE, BATCH, HEAD, stride_ob, stride_oh, stride_on, stride_od,
                    stride_lb, stride_lh, stride_ln, SEQ_LEN, HEAD_DIM,
                    BLOCK_M: tl.constexpr, HEAD_DIM_PAD: tl.constexpr):
    zero = tl.program_id(0)
    rows = tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM_PAD)
    acc = tl.load(ACC + rows[:, None] * HEAD_DIM_PAD + dims[None, :])
    l_i = tl.load(L + rows)
    m_i = tl.load(M + rows)
    fwd.epilogue(acc, l_i, m_i, O, LSE, zero + BATCH, zero + HEAD, rows, dims,  # noqa: F821
                 stride_ob, stride_oh, stride_on, stride_od, stride_lb, stride_lh, stride_ln, SEQ_LEN, HEAD_DIM)


_PROBES = (_probe_program_ids, _probe_load_tile, _probe_key_loop, _probe_key_scores,
           _probe_online_softmax_update, _probe_mask_scores, _probe_epilogue)


# --- decode.py (notebook 07): the same idea, one probe per helper; ``dec`` is your decode module ---


def _probe_group_tile(Q, Q_OUT, HEAD_OUT, TOKEN_OUT, BATCH, KV_HEAD, stride_qb, stride_qh, stride_qn, stride_qd,
                      N_Q_HEADS, N_KV_HEADS, N_Q: tl.constexpr, HEAD_DIM: tl.constexpr,
                      HEAD_DIM_PAD: tl.constexpr, BLOCK_M: tl.constexpr):
    """Part 1: row block program_id(0) of KV head KV_HEAD's group; stores the tile and each row's head and token."""
    row_block = tl.program_id(0)
    rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < (N_Q_HEADS // N_KV_HEADS) * N_Q
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    zero = row_block * 0  # batch and KV head arrive as tensors, as in the kernel
    tile, heads, tokens = dec.group_tile(Q, zero + BATCH, zero + KV_HEAD, rows, row_ok, offs_d,  # noqa: F821
                                         stride_qb, stride_qh, stride_qn, stride_qd, N_Q_HEADS, N_KV_HEADS,
                                         N_Q, HEAD_DIM)
    tl.store(Q_OUT + rows[:, None] * HEAD_DIM_PAD + offs_d[None, :], tile.to(tl.float32))
    tl.store(HEAD_OUT + rows, heads)
    tl.store(TOKEN_OUT + rows, tokens)


def _probe_page_slots(TABLE, PAGE_OUT, SLOT_OUT, BATCH, SEQ_LEN, stride_tb, stride_tp,
                      BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, PAGED: tl.constexpr):
    """Part 2: the (page, slot) of positions program_id(0) * BLOCK_N ... of sequence BATCH."""
    block = tl.program_id(0)
    positions = block * BLOCK_N + tl.arange(0, BLOCK_N)
    exists = positions < SEQ_LEN
    pages, slots = dec.page_slots(TABLE, block * 0 + BATCH, positions, exists, stride_tb,  # noqa: F821
                                  stride_tp, PAGE_SIZE, PAGED)
    tl.store(PAGE_OUT + positions, pages)
    tl.store(SLOT_OUT + positions, slots)


def _probe_split_partial(Q, TOKENS, K, V, SEQLENS, ACC_OUT, L_OUT, M_OUT, BATCH, KV_HEAD, qk_scale, CHUNK, N_PAGES,
                         stride_kp, stride_ks, stride_kh, stride_kd, stride_vp, stride_vs, stride_vh, stride_vd,
                         N_Q: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Part 3: split program_id(0) of a contiguous cache, from a fresh state; stores its partial (acc, l, m)."""
    split = tl.program_id(0)
    r = tl.arange(0, BLOCK_M)
    d = tl.arange(0, HEAD_DIM_PAD)
    q = tl.load(Q + r[:, None] * HEAD_DIM_PAD + d[None, :])
    tokens = tl.load(TOKENS + r)
    batch = split * 0 + BATCH
    n_valid = tl.load(SEQLENS + batch)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    l_run = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_run = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    # No block table (a contiguous cache): the kernel passes the lengths' pointer and strides of 0 in its place.
    acc, l_run, m_run = dec.split_partial(  # noqa: F821
        acc, l_run, m_run, q, tokens, K, V, SEQLENS, batch, split * 0 + KV_HEAD, split, n_valid, d, qk_scale,
        CHUNK, stride_kp, stride_ks, stride_kh, stride_kd, stride_vp, stride_vs, stride_vh, stride_vd, 0, 0,
        N_Q, HEAD_DIM, N_PAGES, BLOCK_N, 1, False, "ieee")
    out = split * BLOCK_M + r
    tl.store(ACC_OUT + out[:, None] * HEAD_DIM_PAD + d[None, :], acc)
    tl.store(L_OUT + out, l_run)
    tl.store(M_OUT + out, m_run)


def _probe_merge_splits(ACC, L, M, O_OUT, LSE_OUT, BLOCK_R: tl.constexpr, SPLITS_PAD: tl.constexpr,
                        HEAD_DIM_PAD: tl.constexpr):
    """Part 4: BLOCK_R rows of SPLITS_PAD partial states each, merged; stores O and the LSE."""
    r = tl.arange(0, BLOCK_R)
    sp = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, HEAD_DIM_PAD)
    idx = r[:, None] * SPLITS_PAD + sp[None, :]
    parts_l = tl.load(L + idx)
    parts_m = tl.load(M + idx)
    parts_acc = tl.load(ACC + idx[:, :, None] * HEAD_DIM_PAD + d[None, None, :])
    o, lse = dec.merge_splits(parts_acc, parts_l, parts_m)  # noqa: F821
    tl.store(O_OUT + r[:, None] * HEAD_DIM_PAD + d[None, :], o)
    tl.store(LSE_OUT + r, lse)


_DECODE_PROBES = (_probe_group_tile, _probe_page_slots, _probe_split_partial, _probe_merge_splits)


# --- windows.py (notebook 04b): ``win`` is your windows module ----------------------------------------------
#
# Part 2's two probes run your window_key_loop with its Part 1 and forward.py's Part 4 replaced by the
# recorders of forward.py's Part 3 probes (your forward.load_tile stays): one records the walk, one the scores.


def _probe_window_mask(S, OUT, SEQ_LEN, WINDOW, SINK_TOKENS, stride_row, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr):
    """Part 1: query block program_id(0) against key block program_id(1)."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offsets = offs_m[:, None] * stride_row + offs_n[None, :]
    s = tl.load(S + offsets)
    tl.store(OUT + offsets, win.window_mask(s, offs_m, offs_n, SEQ_LEN, WINDOW, SINK_TOKENS))  # noqa: F821


@triton.jit
def _mark_masked_window(s, offs_m, offs_n, SEQ_LEN, WINDOW, SINK_TOKENS):
    """Part 2's stand-in for Part 1: marks the block as masked instead of masking it."""
    return s - 1.0


@triton.jit
def _keep_window_scores(s, offs_m, offs_n, SEQ_LEN, WINDOW, SINK_TOKENS):
    """Part 2's other stand-in for Part 1: masks nothing, so the recorder sees every score the loop computed."""
    return s


def _probe_window_key_loop(Q, K, V, ACC_OUT, BLOCKS_OUT, SEQ_LEN, BATCH, HEAD, qk_scale, WINDOW, SINK_TOKENS,
                           stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn, stride_vd,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                           SCORES: tl.constexpr):
    """Part 2: your window_key_loop from a fresh state, with recorders for Parts 1 and 4 (SCORES: the scores'
    recorder, else the walk's); stores what they recorded. Q is [query tiles * BLOCK_M, HEAD_DIM], contiguous."""
    tile = tl.program_id(0)
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + offs_m[:, None] * HEAD_DIM + offs_d[None, :])
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], -1e30, dtype=tl.float32)
    if SCORES:
        acc, l_i, m_i = scored_window_loop(  # noqa: F821
            acc, l_i, m_i, q, K, V, tile * 0 + BATCH, tile * 0 + HEAD,
            stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn, stride_vd,
            tile, offs_m, offs_d, qk_scale, SEQ_LEN, HEAD_DIM, WINDOW, SINK_TOKENS, BLOCK_M, BLOCK_N, "ieee")
    else:
        acc, l_i, m_i = walked_window_loop(  # noqa: F821
            acc, l_i, m_i, q, K, V, tile * 0 + BATCH, tile * 0 + HEAD,
            stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn, stride_vd,
            tile, offs_m, offs_d, qk_scale, SEQ_LEN, HEAD_DIM, WINDOW, SINK_TOKENS, BLOCK_M, BLOCK_N, "ieee")
    tl.store(ACC_OUT + offs_m[:, None] * HEAD_DIM + offs_d[None, :], acc)
    tl.store(BLOCKS_OUT + offs_m, l_i)


def _probe_sink_state(SINKS, ACC_OUT, L_OUT, M_OUT, HAS_SINKS: tl.constexpr, BLOCK_M: tl.constexpr,
                      HEAD_DIM_PAD: tl.constexpr):
    """Part 3: the state of query head program_id(0)'s rows before their first key."""
    head = tl.program_id(0)
    acc, l_i, m_i = win.sink_state(SINKS, head, HAS_SINKS, BLOCK_M, HEAD_DIM_PAD)  # noqa: F821
    rows = head * BLOCK_M + tl.arange(0, BLOCK_M)
    tl.store(ACC_OUT + rows[:, None] * HEAD_DIM_PAD + tl.arange(0, HEAD_DIM_PAD)[None, :], acc)
    tl.store(L_OUT + rows, l_i)
    tl.store(M_OUT + rows, m_i)


_WINDOW_PROBES = (_probe_window_mask, _probe_window_key_loop, _probe_sink_state)


# --- building the probes for one version of your file -------------------------------------------


def _rebind(fn, scope_updates):
    """A copy of the plain function ``fn`` whose globals are a copy of its own, updated."""
    scope = dict(fn.__globals__)
    scope.update(scope_updates)
    bound = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    # What `def` sets besides the code: Triton reads `tl.constexpr` from the annotations.
    bound.__annotations__ = dict(fn.__annotations__)
    bound.__kwdefaults__ = fn.__kwdefaults__
    bound.__qualname__, bound.__doc__ = fn.__qualname__, fn.__doc__
    return triton.jit(bound)


_probe_cache: dict = {}  # (module name, id of the module) -> (its helpers, the probe kernels)


def _module_and_probes(name, probes, scope):
    """Your graded module ``name`` and its probe kernels, built once per version of the file.

    ``scope(module)`` gives the globals every probe sees beside its own (the module's name in the
    probes' code, and what else a probe calls). A helper missing from the file stops the check.
    """
    module = load(name)
    missing = [helper for helper in PARTS[name].values() if not hasattr(module, helper)]
    if missing:
        raise Stop(fail(name, None, f"{rel(name)} has no {', '.join(missing)}",
                        hint="the helpers' names and arguments must stay as given"))
    version = tuple(getattr(module, helper) for helper in PARTS[name].values())
    cached = _probe_cache.get((name, id(module)))
    if cached is None or cached[0] != version:
        extra = scope(module)
        kernels = {fn.__name__.removeprefix("_probe_"): _rebind(fn, extra) for fn in probes}
        _probe_cache[(name, id(module))] = cached = (version, kernels)
    return module, cached[1]


def _forward_scope(fwd):
    # Part 3's probes run your key_loop with Parts 4 and 5 swapped for the recorders above
    # (your Part 2 stays: the key loop loads its tiles with it): one records the walk, one the scores.
    loop = fwd.key_loop.fn
    recorded = _rebind(loop, {"online_softmax_update": _record_update, "mask_scores": _mark_masked})
    scored = _rebind(loop, {"online_softmax_update": _record_scores, "mask_scores": _keep_scores})
    return {"fwd": fwd, "recorded_key_loop": recorded, "scored_key_loop": scored}


def _windows_scope(win):
    # Part 2's probes: your window_key_loop, its `forward` a module of your forward.py's load_tile and a recorder
    # for the update, its window_mask a stand-in (a module: Triton reads attributes of modules only).
    fwd = win.forward if isinstance(getattr(win, "forward", None), types.ModuleType) else load("forward")
    loop = win.window_key_loop.fn
    scopes = {}
    for name, update, mask in (("walked", _record_update, _mark_masked_window),
                               ("scored", _record_scores, _keep_window_scores)):
        recorders = types.ModuleType(f"forward_{name}")
        recorders.load_tile, recorders.online_softmax_update = fwd.load_tile, update
        recorders.mask_scores = fwd.mask_scores
        scopes[f"{name}_window_loop"] = _rebind(loop, {"forward": recorders, "window_mask": mask})
    return {"win": win, **scopes}


def windows_parts():
    """Your windows module and its probe kernels; a missing helper stops the check."""
    return _module_and_probes("windows", _WINDOW_PROBES, _windows_scope)


def forward_parts():
    """Your forward module and its probe kernels; a missing helper stops the check."""
    return _module_and_probes("forward", _PROBES, _forward_scope)


def decode_parts():
    """Your decode module and its probe kernels; a missing helper stops the check."""
    return _module_and_probes("decode", _DECODE_PROBES, lambda dec: {"dec": dec})


def launch_in(module, part, kernel, grid, *args, **kwargs):
    """Launch a probe of ``module``; a crash in your helper becomes a FAIL of ``part``."""
    run_student(module, lambda: kernel[grid](*args, **kwargs), part=part)


launch = functools.partial(launch_in, "forward")


def dev():
    return runtime.DEVICE


# --- what the interpreter can show and a GPU hides: masked lanes, and addresses past 2^31 elements ---------
#
# Two mistakes of forward.py give right answers in every small test and wrong ones on a GPU only:
# a masked load with no ``other`` (the interpreter reads 0 in the masked lanes, a GPU leaves whatever its
# registers held) and batch or head offsets computed in int32 (they wrap once a tensor passes 2^31
# elements, far more than a test can allocate). The interpreter runs every load and store through one
# object, so for the length of a probe the two context managers below swap its loads and stores for
# ones that show these mistakes. On a GPU machine :func:`gqa_flash.course.interpreter.in_interpreter` runs the
# probe in a child Python with the GPU hidden, so in the interpreter there too.

POISON_INT = -777  # what an integer lane that a masked load leaves undefined reads under masked_lanes_poisoned


@contextlib.contextmanager
def masked_lanes_poisoned():
    """While inside, a masked load with no ``other`` reads NaN (integers: POISON_INT) in its masked-off
    lanes, as a GPU may leave anything there. Interpreter only."""
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle, _get_np_dtype

    original = InterpreterBuilder.create_masked_load

    def poisoned(builder, ptrs, mask, other, *args, **kwargs):
        if other is None and not np.all(mask.data):
            dtype = ptrs.get_element_ty()
            np_dtype = _get_np_dtype(dtype)
            fill = np.nan if np.issubdtype(np_dtype, np.floating) else POISON_INT
            other = TensorHandle(np.full(ptrs.data.shape, fill, dtype=np_dtype), dtype)
        return original(builder, ptrs, mask, other, *args, **kwargs)

    InterpreterBuilder.create_masked_load = poisoned
    try:
        yield
    finally:
        InterpreterBuilder.create_masked_load = original


@contextlib.contextmanager
def addresses_recorded():
    """While inside, the interpreter's loads and stores touch no memory: each appends
    ``(kind, addresses, mask)`` ("load" or "store", two NumPy arrays of one shape) to the list this
    yields, and every load reads 0. So a probe may form any address, far outside its tensors."""
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle, _get_np_dtype

    saved = InterpreterBuilder.create_masked_load, InterpreterBuilder.create_masked_store
    seen: list = []

    def load(builder, ptrs, mask, *args, **kwargs):
        seen.append(("load", ptrs.data.copy(), np.broadcast_to(mask.data, ptrs.data.shape).copy()))
        dtype = ptrs.get_element_ty()
        return TensorHandle(np.zeros(ptrs.data.shape, dtype=_get_np_dtype(dtype)), dtype)

    def store(builder, ptrs, value, mask, *args, **kwargs):
        seen.append(("store", ptrs.data.copy(), np.broadcast_to(mask.data, ptrs.data.shape).copy()))

    InterpreterBuilder.create_masked_load, InterpreterBuilder.create_masked_store = load, store
    try:
        with np.errstate(all="ignore"):  # the values read are zeros: a division by them is no news
            yield seen
    finally:
        InterpreterBuilder.create_masked_load, InterpreterBuilder.create_masked_store = saved


