"""Input checks for the public API: bad input gets an error that names the argument.

Every public function runs these before it calls a graded module, so student
code only ever sees well-formed inputs, and a student who passes a wrong shape
reads what is wrong instead of a stack trace from deep inside Triton.
"""

from __future__ import annotations

import math
import numbers

import torch

from gqa_flash.course import runtime

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def _dtype(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def check_tensor(name: str, t, *, ndim: int | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        allowed = ", ".join(_dtype(d) for d in FLOAT_DTYPES)
        raise TypeError(f"{name} has dtype {_dtype(t.dtype)}; expected one of {allowed}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(
            f"{name} must be {ndim}-D [batch, heads, seq, head_dim]; got shape {_shape(t)}"
        )


def check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def check_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def resolve_sm_scale(sm_scale, head_dim: int) -> float:
    """``1/sqrt(head_dim)`` unless the caller gave a finite number."""
    if sm_scale is None:
        return 1.0 / math.sqrt(head_dim) if head_dim > 0 else 1.0
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
        raise TypeError(f"sm_scale must be a real number or None, got {type(sm_scale).__name__}")
    if not math.isfinite(float(sm_scale)):
        raise ValueError(f"sm_scale must be finite, got {sm_scale!r}")
    return float(sm_scale)


def check_attention_inputs(q, k, v, causal) -> None:
    """Shapes, dtypes and devices that every attention function accepts.

    Layout is PyTorch SDPA's: ``[batch, heads, seq, head_dim]``; ``k`` and ``v``
    have ``n_kv_heads`` heads, and ``n_q_heads`` must be a multiple of it.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, ndim=4)
    check_bool("causal", causal)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            "q, k and v must share one dtype; got "
            f"q {_dtype(q.dtype)}, k {_dtype(k.dtype)}, v {_dtype(v.dtype)}"
        )
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"q, k and v must be on one device; got q on {q.device}, k on {k.device}, v on {v.device}"
        )
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got k {_shape(k)} and v {_shape(v)}")
    (b, hq, n, d), (bk, hkv, nk, dk) = q.shape, k.shape
    if b != bk:
        raise ValueError(f"q and k must have the same batch size; got q {_shape(q)} and k {_shape(k)}")
    if n != nk:
        raise ValueError(
            "q and k must have the same sequence length (self-attention); "
            f"got q {_shape(q)} and k {_shape(k)}"
        )
    if d != dk:
        raise ValueError(f"q and k must have the same head_dim; got q {_shape(q)} and k {_shape(k)}")
    if hq < 1 or hkv < 1:
        raise ValueError(f"q and k need at least one head; got q {_shape(q)} and k {_shape(k)}")
    if hq % hkv != 0:
        raise ValueError(
            f"the number of query heads ({hq}, q {_shape(q)}) must be a multiple of the number "
            f"of key/value heads ({hkv}, k {_shape(k)})"
        )
    if d < 1:
        raise ValueError(f"head_dim must be at least 1; got q {_shape(q)}")


def check_kernel_inputs(q, k, v) -> None:
    """What the Triton kernel needs on top of :func:`check_attention_inputs`."""
    d = q.shape[-1]
    if d > MAX_HEAD_DIM:
        raise ValueError(
            f"the Triton kernel supports head_dim up to {MAX_HEAD_DIM}; got q {_shape(q)}"
        )
    b, hq = q.shape[0], q.shape[1]
    if b * hq > 65535:  # the launch grid's second axis: one program column per (batch, head)
        raise ValueError(
            f"batch * n_q_heads must be at most 65535 for one launch; got q {_shape(q)} "
            f"({b} * {hq} = {b * hq}); split the batch"
        )
    _check_runs_here(q, "q, k and v")


def check_window_options(q, causal, window, sink_tokens, sinks) -> bool:
    """The options of a sliding window and attention sinks (``gqa_flash.reference``): ``window`` a whole number
    of keys >= 1 or None, ``sink_tokens`` >= 0 and only with a window, ``sinks`` None or a float tensor [Hq] on
    q's device; both causal only. Returns whether any is in use."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 1):
        raise ValueError(f"window must be a whole number of keys >= 1, or None for no window; got {window!r}")
    if isinstance(sink_tokens, bool) or not isinstance(sink_tokens, numbers.Integral) or sink_tokens < 0:
        raise ValueError(f"sink_tokens must be a whole number >= 0; got {sink_tokens!r}")
    if sink_tokens and window is None:
        raise ValueError(f"sink_tokens={sink_tokens} needs a window: without one every query sees the first "
                         "keys anyway")
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor) or not sinks.is_floating_point():
            raise TypeError(f"sinks must be a float tensor [n_q_heads] of raw logits, or None; got "
                            f"{type(sinks).__name__ if not isinstance(sinks, torch.Tensor) else _dtype(sinks.dtype)}")
        if tuple(sinks.shape) != (q.shape[1],):
            raise ValueError(f"sinks must have shape [n_q_heads] = [{q.shape[1]}] (one logit a query head); "
                             f"got {_shape(sinks)}")
        if sinks.device != q.device:
            raise ValueError(f"sinks must be on q's device ({q.device}); got {sinks.device}")
    used = window is not None or sinks is not None
    if used and not causal:
        raise ValueError("window and sinks need causal=True: a sliding window and a sink look back from each query")
    return used


def _check_runs_here(q, names: str) -> None:
    """q's device and dtype (shared by the tensors ``names``) suit the Triton kernels on this machine."""
    if runtime.DEVICE.type == "cuda":
        if q.device.type != "cuda":
            raise ValueError(
                f"{names} are on {q.device} but the kernels are compiled for the GPU; "
                "move them with .cuda() (or run with TRITON_INTERPRET=1 for the CPU interpreter)"
            )
    if q.dtype not in runtime.supported_dtypes():
        allowed = ", ".join(_dtype(d) for d in runtime.supported_dtypes())
        why = (
            " (Triton's interpreter multiplies the raw bits of bf16 in tl.dot, triton issue #11584)"
            if q.dtype == torch.bfloat16 and runtime.INTERPRETER
            else ""
        )
        raise TypeError(
            f"{names} have dtype {_dtype(q.dtype)}, which the Triton kernel does not support "
            f"here{why}; use one of {allowed}"
        )


MAX_NEW_TOKENS = 16  # flash_decode: new tokens per sequence and call


def check_decode_inputs(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, return_lse,
                        max_seqlen=None, k_new=None, v_new=None) -> int:
    """What ``flash_decode`` accepts; returns the bound on ``cache_seqlens`` the launcher sizes its splits by.

    ``q`` is ``[batch, n_q_heads, n_new, head_dim]``; the cache is
    ``[batch, n_kv_heads, max_seqlen, head_dim]``, or, with ``block_table``
    ``[batch, max_pages]`` int32, the paged pool ``[num_blocks, page_size,
    n_kv_heads, head_dim]``; ``cache_seqlens`` is ``[batch]`` int32;
    ``k_new`` and ``v_new`` (both or neither) are ``[batch, n_kv_heads,
    n_new, head_dim]``.

    Two modes. Without ``max_seqlen``, the lengths and the pages they use are
    read on the host (one device-to-host copy) and checked one by one: every
    mistake gets its own message; returns the longest length. With
    ``max_seqlen`` (an int), only shapes, dtypes and devices are checked, in
    time that does not grow with the batch or the pages, and nothing is read
    from the device: a serving loop can call it every step, or capture it in a
    CUDA graph. The kernels clamp what they read, so wrong values there give
    wrong rows, never a read outside the tensors.
    """
    paged = block_table is not None
    cache_layout = ("[num_blocks, page_size, n_kv_heads, head_dim] (a paged cache: block_table is given)" if paged
                    else "[batch, n_kv_heads, max_seqlen, head_dim] (a contiguous cache: no block_table)")
    check_tensor("q", q)
    if q.dim() != 4:
        raise ValueError(f"q must be 4-D [batch, n_q_heads, n_new, head_dim]; got shape {_shape(q)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, t)
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D {cache_layout}; got shape {_shape(t)}")
    check_bool("return_lse", return_lse)
    if num_splits is not None:
        check_positive_int("num_splits", num_splits)
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise TypeError(
            "q, k_cache and v_cache must share one dtype; got "
            f"q {_dtype(q.dtype)}, k_cache {_dtype(k_cache.dtype)}, v_cache {_dtype(v_cache.dtype)}"
        )
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape; got {_shape(k_cache)} and {_shape(v_cache)}")
    b, hq, n_new, d = q.shape
    if paged:
        n_blocks, page_size, hkv, dk = k_cache.shape
    else:
        bk, hkv, capacity, dk = k_cache.shape
        if bk != b:
            raise ValueError(f"k_cache {cache_layout} must hold q's batch of {b}; got {_shape(k_cache)}")
    if d != dk or not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"q and k_cache must share one head_dim of 1 to {MAX_HEAD_DIM}; got q {_shape(q)} and "
                         f"k_cache {_shape(k_cache)}")
    if hq < 1 or hkv < 1 or hq % hkv != 0:
        raise ValueError(f"the number of query heads ({hq}, q {_shape(q)}) must be a multiple of the number of "
                         f"key/value heads ({hkv}, k_cache {_shape(k_cache)} {cache_layout})")
    if not 1 <= n_new <= MAX_NEW_TOKENS:
        raise ValueError(f"q must hold 1 to {MAX_NEW_TOKENS} new tokens (dim 2); got {n_new}, q {_shape(q)}")
    if b * hkv > 65535:  # the launch grid's third axis: one program column per (batch, KV head)
        raise ValueError(f"batch * n_kv_heads must be at most 65535 for one launch; got {b} * {hkv}: split the batch")

    tensors = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("cache_seqlens", cache_seqlens)]
    if not isinstance(cache_seqlens, torch.Tensor):
        raise TypeError(f"cache_seqlens must be a torch.Tensor of int32, got {type(cache_seqlens).__name__}")
    if cache_seqlens.dtype != torch.int32:
        raise TypeError(f"cache_seqlens must be int32, got {_dtype(cache_seqlens.dtype)}")
    if tuple(cache_seqlens.shape) != (b,):
        raise ValueError(f"cache_seqlens must be [batch] = [{b}]; got {_shape(cache_seqlens)}")
    if paged:
        if not isinstance(block_table, torch.Tensor):
            raise TypeError(f"block_table must be a torch.Tensor of int32 or None, got {type(block_table).__name__}")
        if block_table.dtype != torch.int32:
            raise TypeError(f"block_table must be int32, got {_dtype(block_table.dtype)}")
        if block_table.dim() != 2 or block_table.shape[0] != b:
            raise ValueError(f"block_table must be [batch, max_pages] with batch {b}; got {_shape(block_table)}")
        tensors.append(("block_table", block_table))
        capacity = block_table.shape[1] * page_size
    if (k_new is None) != (v_new is None):
        raise ValueError("k_new and v_new come together: pass both (the new tokens' keys and values) or neither")
    if k_new is not None:
        for name, t in (("k_new", k_new), ("v_new", v_new)):
            check_tensor(name, t)
            if t.dtype != q.dtype:
                raise TypeError(f"{name} must have q's dtype {_dtype(q.dtype)}; got {_dtype(t.dtype)}")
            if tuple(t.shape) != (b, hkv, n_new, d):
                raise ValueError(f"{name} must be [batch, n_kv_heads, n_new, head_dim] = [{b}, {hkv}, {n_new}, {d}] "
                                 f"(q {_shape(q)}, k_cache {_shape(k_cache)}); got {_shape(t)}")
            tensors.append((name, t))
    devices = {t.device for _, t in tensors}
    if len(devices) != 1:
        raise ValueError("q, k_cache, v_cache, cache_seqlens, block_table, k_new and v_new must be on one device; "
                         "got " + ", ".join(f"{name} on {t.device}" for name, t in tensors))
    _check_runs_here(q, "q, k_cache and v_cache")

    if max_seqlen is not None:
        if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, numbers.Integral):
            raise TypeError(f"max_seqlen must be an int (a bound on cache_seqlens) or None, got "
                            f"{type(max_seqlen).__name__}")
        if not n_new <= max_seqlen <= capacity:
            raise ValueError(f"max_seqlen must lie between q's {n_new} new tokens and the cache's {capacity} "
                             f"positions; got {max_seqlen}")
        return int(max_seqlen)

    # One read of the lengths (and of the pages they use) on the host: each mistake named.
    lengths = [int(n) for n in cache_seqlens.tolist()]
    for i, n in enumerate(lengths):
        if n < n_new:
            raise ValueError(f"cache_seqlens[{i}] = {n} is smaller than q's {n_new} new tokens, which are the last "
                             "positions of the cache (q is [batch, n_q_heads, n_new, head_dim])")
        if n > capacity:
            raise ValueError(f"cache_seqlens[{i}] = {n} is longer than the cache: {capacity} positions "
                             + (f"({block_table.shape[1]} pages of {page_size})" if paged
                                else f"(k_cache {_shape(k_cache)})"))
    if paged:
        for i, row in enumerate(block_table.tolist()):
            used = row[: -(-lengths[i] // page_size)]
            if used and not 0 <= min(used) <= max(used) < n_blocks:
                raise ValueError(f"block_table[{i}] names pages outside the pool of {n_blocks} pages "
                                 f"(k_cache {_shape(k_cache)}): {used}")
    return max(lengths, default=n_new)
