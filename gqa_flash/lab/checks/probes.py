"""Notebook 04: the probes, one tiny Triton kernel per part of forward.py.

The kernel parts of ``forward.py`` are small ``@triton.jit`` helpers, and each
is checked on its own by a *probe*: an ordinary kernel that loads chosen
inputs, calls ONE of your helpers, and stores what it returns. The probes
below are plain functions that say ``fwd._kv_head_index(...)``;
:func:`probe_kernels` turns them into Triton kernels bound to one version of
your forward module. The checks that launch them are in kernel_parts.py.

Why a fresh kernel per version: a compiled Triton kernel remembers the code of
every helper it calls (it hashes them once, on first launch). If the probe
were a single global kernel, editing forward.py would leave it running your
old helper on a GPU. So each time forward.py changes (impl.load re-executes
it, which makes new helper objects) we build new probe kernels, each with its
own globals dict in which ``fwd`` is the module; that dict never changes, so
Triton's "global variable changed since compiled" check stays quiet. In the
interpreter the same code runs as Python, unchanged.
"""

import types

import triton
import triton.language as tl

from gqa_flash import runtime
from gqa_flash.lab.checks.verdict import PARTS, Stop, fail, load, rel, run_student


def _probe_kv_head_index(OUT, N_Q_HEADS, N_KV_HEADS):
    q_head_idx = tl.program_id(0)
    tl.store(OUT + q_head_idx, fwd._kv_head_index(q_head_idx, N_Q_HEADS, N_KV_HEADS))  # noqa: F821


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
    acc, l_i, m_i = fwd._online_softmax_update(acc, l_i, m_i, s, v, INPUT_PRECISION)  # noqa: F821
    tl.store(ACC_OUT + rows[:, None] * HEAD_DIM + dims[None, :], acc)
    tl.store(L_OUT + rows, l_i)
    tl.store(M_OUT + rows, m_i)


def _probe_mask_scores(S, OUT, SEQ_LEN, stride_row, CAUSAL: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offsets = offs_m[:, None] * stride_row + offs_n[None, :]
    s = tl.load(S + offsets)
    tl.store(OUT + offsets, fwd._mask_scores(s, offs_m, offs_n, SEQ_LEN, CAUSAL))  # noqa: F821


def _probe_epilogue(ACC, L, M, O, LSE, SEQ_LEN, HEAD_DIM, stride_row,
                    BLOCK_M: tl.constexpr, HEAD_DIM_PAD: tl.constexpr):
    rows = tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM_PAD)
    acc = tl.load(ACC + rows[:, None] * HEAD_DIM_PAD + dims[None, :])
    l_i = tl.load(L + rows)
    m_i = tl.load(M + rows)
    o_ptrs = O + rows[:, None] * stride_row + dims[None, :]
    fwd._epilogue(acc, l_i, m_i, o_ptrs, LSE + rows, rows < SEQ_LEN, dims < HEAD_DIM)  # noqa: F821


_PROBES = (_probe_kv_head_index, _probe_online_softmax_update, _probe_mask_scores, _probe_epilogue)
_probe_cache: dict = {}


def probe_kernels(fwd_module) -> dict:
    """The probe kernels bound to this version of the forward module (built once per version)."""
    key = id(fwd_module)
    version = tuple(getattr(fwd_module, name, None) for name in PARTS["forward"].values())
    cached = _probe_cache.get(key)
    if cached is not None and cached[0] == version:
        return cached[1]
    kernels = {}
    for fn in _PROBES:
        scope = dict(fn.__globals__)  # a private copy of this module's globals...
        scope["fwd"] = fwd_module  # ...in which `fwd` is your forward module, set once
        bound = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
        # What `def` sets besides the code: Triton reads `tl.constexpr` from the annotations.
        bound.__annotations__ = dict(fn.__annotations__)
        bound.__kwdefaults__ = fn.__kwdefaults__
        bound.__qualname__, bound.__doc__ = fn.__qualname__, fn.__doc__
        kernels[fn.__name__.removeprefix("_probe_")] = triton.jit(bound)
    _probe_cache[key] = (version, kernels)
    return kernels


def forward_parts():
    """Your forward module and its probe kernels; a missing helper stops the check."""
    fwd = load("forward")
    missing = [name for name in PARTS["forward"].values() if not hasattr(fwd, name)]
    if missing:
        raise Stop(fail("forward", None, f"{rel('forward')} has no {', '.join(missing)}",
                        hint="the helpers' names and arguments must stay as given"))
    return fwd, probe_kernels(fwd)


def launch(part, kernel, grid, *args, **kwargs):
    """Launch a probe; a crash in your helper becomes a FAIL of ``part``."""
    run_student("forward", lambda: kernel[grid](*args, **kwargs), part=part)


def dev():
    return runtime.DEVICE
