"""The public API: check the inputs, then call the graded module chosen by the switch.

Each function here is a thin seam: it validates (so student code only sees
well-formed inputs, and bad input gets an error that names the argument),
handles empty tensors, and hands over to ``impl.load(<module>)``, which is the
student's file or the solution's (``GQA_FLASH_IMPL``).
"""

from __future__ import annotations

import torch

from gqa_flash.course import context_parallel, decode_launch, impl, kv_cache, validation


def _empty_result(q, return_lse):
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    return (out, lse) if return_lse else out


def _is_empty(q) -> bool:
    return q.shape[0] == 0 or q.shape[2] == 0


def naive_attention(q, k, v, causal=True, sm_scale=None):
    """Attention with the whole N x N score matrix, in PyTorch (``naive.py``)."""
    validation.check_attention_inputs(q, k, v, causal)
    sm_scale = validation.resolve_sm_scale(sm_scale, q.shape[-1])
    if _is_empty(q):
        return _empty_result(q, False)
    return impl.load("naive").naive_attention(q, k, v, causal=causal, sm_scale=sm_scale)


def online_softmax(x, block_size):
    """Softmax over the last dimension, streamed ``block_size`` columns at a time (``online_softmax.py``)."""
    validation.check_tensor("x", x)
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension (softmax runs over the last one)")
    validation.check_positive_int("block_size", block_size)
    if x.numel() == 0:
        return torch.empty_like(x)
    return impl.load("online_softmax").online_softmax(x, block_size)


def merge_softmax_states(m_a, l_a, m_b, l_b):
    """Merge the softmax states ``(m, l)`` of two disjoint parts of the same rows (``online_softmax.py``)."""
    for name, t in (("m_a", m_a), ("l_a", l_a), ("m_b", m_b), ("l_b", l_b)):
        validation.check_tensor(name, t)
    shapes = {t.shape for t in (m_a, l_a, m_b, l_b)}
    if len(shapes) != 1:
        raise ValueError(
            "m_a, l_a, m_b and l_b must share one shape; got "
            + ", ".join(f"{n} {list(t.shape)}" for n, t in (("m_a", m_a), ("l_a", l_a), ("m_b", m_b), ("l_b", l_b)))
        )
    return impl.load("online_softmax").merge_states(m_a, l_a, m_b, l_b)


def tiled_attention(q, k, v, causal=True, sm_scale=None, block_m=64, block_n=64, return_lse=False):
    """FlashAttention with explicit tile loops, in PyTorch (``tiled.py``). Optionally returns the LSE."""
    validation.check_attention_inputs(q, k, v, causal)
    validation.check_positive_int("block_m", block_m)
    validation.check_positive_int("block_n", block_n)
    validation.check_bool("return_lse", return_lse)
    sm_scale = validation.resolve_sm_scale(sm_scale, q.shape[-1])
    if _is_empty(q):
        return _empty_result(q, return_lse)
    return impl.load("tiled").tiled_attention(
        q, k, v, causal=causal, sm_scale=sm_scale, block_m=block_m, block_n=block_n, return_lse=return_lse
    )


def _launch_forward(launcher, q, k, v, causal, sm_scale, return_lse, **windows):
    """Checks shared by the forward kernels, then ``launcher`` (a module's forward function); ``windows``: the
    fast kernel's window, sink_tokens and sinks, passed on only where one is in use."""
    validation.check_attention_inputs(q, k, v, causal)
    validation.check_bool("return_lse", return_lse)
    validation.check_kernel_inputs(q, k, v)
    if windows and not validation.check_window_options(q, causal, **windows):
        windows = {}
    sm_scale = validation.resolve_sm_scale(sm_scale, q.shape[-1])
    if _is_empty(q):
        return _empty_result(q, return_lse)
    return launcher(q, k, v, causal=causal, sm_scale=sm_scale, return_lse=return_lse, **windows)


def flash_attention_forward(q, k, v, causal=True, sm_scale=None, return_lse=False, *, window=None, sink_tokens=0,
                            sinks=None):
    """The Triton FlashAttention forward kernel with GQA (``forward.py``). Optionally returns the LSE.

    With a sliding ``window``, ``sink_tokens`` or learned ``sinks`` (causal only; as in
    :func:`gqa_flash.reference.reference_attention`, whose LSE also counts the sinks) the kernel of
    ``windows.py`` (bonus) runs instead, built on forward.py's helpers.
    """
    return _launch_forward(_student_forward, q, k, v, causal, sm_scale, return_lse, window=window,
                           sink_tokens=sink_tokens, sinks=sinks)


def _student_forward(q, k, v, causal, sm_scale, return_lse, window=None, sink_tokens=0, sinks=None):
    """The student's forward: ``windows.py``'s kernel where a window or sinks are in use (``_launch_forward``
    passes them on only then), else ``forward.py``'s."""
    if window is None and sinks is None:
        return impl.load("forward").flash_attention_forward(q, k, v, causal=causal, sm_scale=sm_scale,
                                                            return_lse=return_lse)
    return impl.load("windows").windowed_attention_forward(q, k, v, window=window, sink_tokens=sink_tokens,
                                                           sinks=sinks, sm_scale=sm_scale, return_lse=return_lse)


def fast_attention_forward(q, k, v, causal=True, sm_scale=None, return_lse=False, *, window=None, sink_tokens=0,
                           sinks=None):
    """The course's fastest forward kernel (``fast/forward.py``, not graded): same contract as
    :func:`flash_attention_forward`, plus a sliding ``window``, ``sink_tokens`` and learned ``sinks`` (causal
    only; as in :func:`gqa_flash.reference.reference_attention`, whose LSE also counts the sinks)."""
    from gqa_flash import fast

    return _launch_forward(fast.fast_attention_forward, q, k, v, causal, sm_scale, return_lse, window=window,
                           sink_tokens=sink_tokens, sinks=sinks)


class FlashAttentionFunction(torch.autograd.Function):
    """The forward kernel and the backward kernels as one autograd op.

    The forward saves O and the LSE (O(N) extra memory); the backward
    recomputes the attention probabilities from them, tile by tile.

    A sliding window or sinks (``windows``: window, sink_tokens, sinks) run ``windows.py``'s forward (or with
    ``fast`` the fast one) and the fast backward, which take them; ``sinks`` is then an input of the op, and its
    gradient is the fast backward's dSinks.
    """

    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale, fast=False, window=None, sink_tokens=0, sinks=None):
        windows = dict(window=window, sink_tokens=sink_tokens, sinks=sinks)
        if window is not None or sinks is not None:
            if fast:
                from gqa_flash.fast import fast_attention_forward as forward
            else:  # the student's windows.py (bonus); causal, as validation.check_window_options holds it
                forward = impl.load("windows").windowed_attention_forward
            o, lse = forward(q, k, v, sm_scale=sm_scale, return_lse=True, **windows)
        else:
            if fast:  # the course's fastest kernels (not graded)
                from gqa_flash.fast import fast_attention_forward as forward
            else:
                forward = impl.load("forward").flash_attention_forward
            o, lse = forward(q, k, v, causal=causal, sm_scale=sm_scale, return_lse=True)
        ctx.save_for_backward(q, k, v, o, lse, sinks)
        ctx.causal, ctx.sm_scale, ctx.fast, ctx.window, ctx.sink_tokens = causal, sm_scale, fast, window, sink_tokens
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, sinks = ctx.saved_tensors
        if ctx.window is not None or sinks is not None:
            from gqa_flash.fast import fast_attention_backward

            dq, dk, dv, *dsinks = fast_attention_backward(q, k, v, o, lse, do, causal=ctx.causal,
                                                          sm_scale=ctx.sm_scale, window=ctx.window,
                                                          sink_tokens=ctx.sink_tokens, sinks=sinks)
            return dq, dk, dv, None, None, None, None, None, (dsinks[0] if dsinks else None)
        if ctx.fast:
            from gqa_flash.fast import fast_attention_backward as backward
        else:
            backward = impl.load("backward").flash_attention_backward
        dq, dk, dv = backward(q, k, v, o, lse, do, causal=ctx.causal, sm_scale=ctx.sm_scale)
        return dq, dk, dv, None, None, None, None, None, None


def flash_attention(q, k, v, causal=True, sm_scale=None, fast=False, *, window=None, sink_tokens=0, sinks=None):
    """Differentiable FlashAttention with GQA: the forward kernel (``forward.py``) and the
    backward kernels (``backward.py``, bonus) as one autograd op. ``fast=True`` uses the
    course's fastest kernels instead (``gqa_flash/fast/``).

    It behaves like ``F.scaled_dot_product_attention(q, k, v, is_causal=causal,
    enable_gqa=True)``: use it in a model and call ``loss.backward()``.

    Current models' options (causal only; the float64 statement is
    :func:`gqa_flash.reference.reference_attention`):

    * ``window=W``: query i sees keys i-W+1 .. i, the last W (GPT-OSS, Mistral, Gemma's local layers);
    * ``sink_tokens=S`` (with a window): keys 0 .. S-1 stay in sight too (StreamingLLM);
    * ``sinks``: a float tensor [Hq] of raw logits, not scaled (GPT-OSS's learned sinks): one more column in
      each row's softmax, dropped before P @ V. Learnable: its gradient is returned.

    The forward of these is ``windows.py``'s (bonus; the fast one with ``fast=True``), and their backward is
    always the fast kernels' (``gqa_flash/fast/backward.py``): ``backward.py`` takes no window.
    """
    validation.check_attention_inputs(q, k, v, causal)
    validation.check_kernel_inputs(q, k, v)
    windowed = validation.check_window_options(q, causal, window, sink_tokens, sinks)
    sm_scale = validation.resolve_sm_scale(sm_scale, q.shape[-1])
    if _is_empty(q):
        return _empty_result(q, False)
    if not windowed:
        return FlashAttentionFunction.apply(q, k, v, causal, sm_scale, fast)
    return FlashAttentionFunction.apply(q, k, v, causal, sm_scale, fast, window, sink_tokens, sinks)


def _launch_backward(launcher, q, k, v, o, lse, do, causal, sm_scale, **windows):
    """Check the backward's inputs once for every backward kernel, then launch it (``windows`` as in
    ``_launch_forward``; with sinks, dSinks comes fourth)."""
    validation.check_attention_inputs(q, k, v, causal)
    validation.check_kernel_inputs(q, k, v)
    if windows and not validation.check_window_options(q, causal, **windows):
        windows = {}
    for name, t in (("o", o), ("do", do)):
        validation.check_tensor(name, t, ndim=4)
        if t.shape != q.shape:
            raise ValueError(f"{name} must have q's shape {list(q.shape)}; got {list(t.shape)}")
    validation.check_tensor("lse", lse, ndim=3)
    if lse.shape != q.shape[:3]:
        raise ValueError(f"lse must be [batch, q_heads, seq] = {list(q.shape[:3])}; got {list(lse.shape)}")
    sm_scale = validation.resolve_sm_scale(sm_scale, q.shape[-1])
    if _is_empty(q):
        grads = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        return grads if windows.get("sinks") is None else (*grads, torch.zeros_like(windows["sinks"]))
    return launcher(q, k, v, o, lse, do, causal=causal, sm_scale=sm_scale, **windows)


def flash_attention_backward(q, k, v, o, lse, do, causal=True, sm_scale=None):
    """dQ, dK, dV from the backward kernels (``backward.py``, bonus)."""
    return _launch_backward(impl.load("backward").flash_attention_backward, q, k, v, o, lse, do, causal, sm_scale)


def fast_attention_backward(q, k, v, o, lse, do, causal=True, sm_scale=None, *, window=None, sink_tokens=0,
                            sinks=None):
    """dQ, dK, dV from the course's fastest backward kernel (``fast/backward.py``, not graded):
    same contract as :func:`flash_attention_backward`; ``window``, ``sink_tokens`` and ``sinks`` as in the
    forward that made ``o`` and ``lse``, and with ``sinks`` dSinks [Hq] comes fourth. By default dQ
    comes from a pass of its own (the same bits every run); ``gqa_flash.fast.backward.fast_attention_backward(...,
    dq_mode="atomic")`` adds it up with atomics in one pass instead (its last bits can change
    from run to run)."""
    from gqa_flash import fast

    return _launch_backward(fast.fast_attention_backward, q, k, v, o, lse, do, causal, sm_scale, window=window,
                            sink_tokens=sink_tokens, sinks=sinks)


def flash_decode(q, k_cache, v_cache, cache_seqlens, block_table=None, sm_scale=None, num_splits=None,
                 return_lse=False, max_seqlen=None, k_new=None, v_new=None):
    """Attention of a few new tokens over a KV cache, contiguous or paged (``decode.py``, bonus).

    ``q`` is ``[B, Hq, Nq, D]`` with 1 <= Nq <= 16 new tokens; the cache is
    ``[B, Hkv, S_max, D]`` (any strides), or with ``block_table`` ``[B,
    max_pages]`` int32 the paged pool ``[num_blocks, page_size, Hkv, D]``;
    ``cache_seqlens`` ``[B]`` int32 counts each sequence's valid positions,
    the Nq new tokens (its last ones) included. New token i sits at position
    ``cache_seqlens[b] - Nq + i`` and sees the positions up to its own.
    ``num_splits`` cuts each context into that many chunks (None: a heuristic
    that fills the GPU). Returns O ``[B, Hq, Nq, D]`` in q's dtype, and with
    ``return_lse`` also the natural-log LSE ``[B, Hq, Nq]``, float32.

    ``k_new``, ``v_new`` ``[B, Hkv, Nq, D]`` (optional, both or neither): the
    new tokens' keys and values, written into the cache at those Nq positions
    before attending (as ``flash_attn_with_kvcache(k=, v=)`` does).

    Two modes, by ``max_seqlen``:

    * ``max_seqlen=None`` (notebooks, tests, first tries): ``cache_seqlens``
      and the pages they use are read on the host and checked, so a length
      past the cache or a page outside the pool is an error that names it.
      That read waits for the GPU and cannot be captured in a CUDA graph.
    * ``max_seqlen=<int>``, a bound on every ``cache_seqlens`` (a serving
      loop's): only shapes, dtypes and devices are checked, in time that does
      not grow with the batch or the pages; nothing is read back from the
      GPU, so the call (the append included) can be captured once in a CUDA
      graph and replayed after ``cache_seqlens``, ``block_table`` and the
      cache change in place. The kernels trust no value: lengths are clamped
      to the cache and page indices to the pool, so a wrong value gives wrong
      rows, never a read or write outside the tensors. The checks and the
      launch plan (splits, tiles, grids) are made once per signature of the
      inputs (shapes, strides, dtypes, devices, alignment, the other
      arguments): a later call with the same signature only allocates the
      output and launches, a few microseconds of the host's time
      (``decode_launch.serve``).
    """
    if max_seqlen is not None:  # the serving path: checked and planned once per signature of inputs
        return decode_launch.serve(impl.load("decode"), q, k_cache, v_cache, cache_seqlens, block_table, sm_scale,
                                   num_splits, return_lse, max_seqlen, k_new, v_new)
    bound = validation.check_decode_inputs(q, k_cache, v_cache, cache_seqlens, block_table, num_splits,
                                           return_lse, max_seqlen, k_new, v_new)
    sm_scale = validation.resolve_sm_scale(sm_scale, q.shape[-1])
    if q.shape[0] == 0:
        return _empty_result(q, return_lse)
    if k_new is not None:
        kv_cache.append(k_new, v_new, k_cache, v_cache, cache_seqlens, block_table)
    return impl.load("decode").flash_decode(q, k_cache, v_cache, cache_seqlens, block_table=block_table,
                                            sm_scale=sm_scale, num_splits=num_splits, return_lse=return_lse,
                                            max_seqlen=bound)


def ring_attention(q, k, v, causal=True, sm_scale=None, group=None, layout="zigzag", return_lse=False):
    """This rank's shard of attention over a sequence split across a process group (``ring.py``, bonus).

    ``q`` [B, Hq, N_local, D], ``k``, ``v`` [B, Hkv, N_local, D] are this
    rank's shards of the sequence in ``layout`` ("zigzag": chunks r and
    2W - 1 - r of 2W; "contiguous": chunk r of W; ``shard_sequence`` makes
    them). K and V blocks travel around the ranks of ``group`` (default: the
    world) with torch.distributed's point-to-point operations, gloo or NCCL,
    and each rank folds every visiting block into its running (O, LSE).
    Returns this rank's O shard in q's dtype and, with ``return_lse``, its
    LSE [B, Hq, N_local] (natural log, fp32). Every rank of the group must
    call it with shards of one shape; a rank that fails ends the others'
    wait after the group's timeout, with an error that names it. No
    backward.
    """
    context_parallel.check_ring_inputs(q, k, v, causal, layout, return_lse)
    sm_scale = validation.resolve_sm_scale(sm_scale, q.shape[-1])
    return impl.load("ring").ring_attention(q, k, v, causal=causal, sm_scale=sm_scale, group=group, layout=layout,
                                            return_lse=return_lse)


shard_sequence = context_parallel.shard_sequence
unshard_sequence = context_parallel.unshard_sequence
