"""The trusted reference: attention and softmax in float64 on the CPU.

Every check in the course compares against these, never against a student's
own naive code: a bug in ``naive.py`` must not make a wrong kernel look right.
The code is deliberately the most direct statement of the maths.
"""

from __future__ import annotations

import math

import torch


def _causal_bias(n: int) -> torch.Tensor:
    """[n, n] float64: 0 where query i may see key j (j <= i), -inf above the diagonal (the future)."""
    return torch.full((n, n), float("-inf"), dtype=torch.float64).triu(1)


def visible(query_pos, key_pos, causal: bool = True, window: int | None = None, sink_tokens: int = 0):
    """[queries, keys] bool: which keys each query sees. Causal: key j <= query i. A sliding ``window`` W (causal
    only) keeps the last W keys, i - W < j <= i, the query's own included; ``sink_tokens`` S keeps keys 0 .. S-1
    visible too (causally), whatever the window."""
    q, k = query_pos[:, None], key_pos[None, :]
    seen = k <= q if causal else torch.ones(q.shape[0], k.shape[1], dtype=torch.bool)
    if window is not None:
        seen = seen & ((k > q - window) | (k < sink_tokens))
    return seen


def _bias(n_q: int, n_k: int, causal: bool, window: int | None, sink_tokens: int):
    """What the scores [.., n_q, n_k] get added: 0 where a query sees a key, -inf where it does not (0 alone
    without a mask: every query sees every key, however many each side has)."""
    if window is None and not causal:
        return 0.0
    if window is None:
        return _causal_bias(n_q)
    seen = visible(torch.arange(n_q), torch.arange(n_k), causal, window, sink_tokens)
    return torch.zeros(n_q, n_k, dtype=torch.float64).masked_fill(~seen, float("-inf"))


def _attend(scores, v, sinks):
    """O and LSE of float64 ``scores`` [B, Hq, N, N'] against ``v``; ``sinks`` [Hq] (or None): one more logit in
    each row's softmax, a column whose weight is dropped before P @ V. The LSE counts it."""
    if sinks is None:
        lse = torch.logsumexp(scores, dim=-1)
    else:  # [Hq] float64, broadcast as one column per row (scores [..., Hq, N, N'])
        column = sinks.to(torch.float64)[:, None, None].expand(*scores.shape[:-1], 1)
        lse = torch.logsumexp(torch.cat([scores, column], dim=-1), dim=-1)
    return torch.exp(scores - lse[..., None]) @ v, lse


def _check_window(causal, window, sink_tokens, sinks, n_q_heads):
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be a whole number of keys >= 1 (or None), got {window!r}")
    if window is not None and not causal:
        raise ValueError("window needs causal=True: a sliding window looks back from each query")
    if isinstance(sink_tokens, bool) or not isinstance(sink_tokens, int) or sink_tokens < 0:
        raise ValueError(f"sink_tokens must be a whole number >= 0, got {sink_tokens!r}")
    if sinks is not None and tuple(sinks.shape) != (n_q_heads,):
        raise ValueError(f"sinks must have shape [n_q_heads] = [{n_q_heads}], got {list(sinks.shape)}")


def reference_attention(q, k, v, causal: bool = True, sm_scale: float | None = None, *, window: int | None = None,
                        sink_tokens: int = 0, sinks=None):
    """Exact attention in float64. Returns ``(O, LSE)``.

    ``O`` is ``[B, Hq, N, D]`` float64 and ``LSE`` (natural log of the row sums
    of ``exp(scaled scores)``) is ``[B, Hq, N]`` float64, both on the CPU.
    Query head ``h`` reads key/value head ``h // (Hq // Hkv)``.

    A sliding ``window`` of W keys (causal only): query i sees keys i-W+1 .. i, and ``sink_tokens`` S keeps
    keys 0 .. S-1 in sight too (StreamingLLM's sink tokens). ``sinks`` [Hq], raw logits not multiplied by
    ``sm_scale`` (GPT-OSS's learned sinks): one more column in each row's softmax, dropped before ``P @ V``;
    the LSE then counts it.
    """
    q64, k64, v64 = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
    n_q_heads, n_kv_heads = q64.shape[1], k64.shape[1]
    _check_window(causal, window, sink_tokens, sinks, n_q_heads)
    group = n_q_heads // n_kv_heads
    kv_head_of = torch.arange(n_q_heads) // group
    k64, v64 = k64[:, kv_head_of], v64[:, kv_head_of]
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(q64.shape[-1])
    scores = (q64 @ k64.transpose(-1, -2)) * sm_scale + _bias(q64.shape[2], k64.shape[2], causal, window, sink_tokens)
    return _attend(scores, v64, None if sinks is None else sinks.detach().to("cpu", torch.float64))


def reference_softmax(x, dim: int = -1):
    """Softmax in float64 on the CPU."""
    return torch.softmax(x.detach().to("cpu", torch.float64), dim=dim)


def reference_gradients(q, k, v, do, causal: bool = True, sm_scale: float | None = None, *,
                        window: int | None = None, sink_tokens: int = 0, sinks=None):
    """dQ, dK, dV of ``sum(O * do)`` in float64 by autograd, on the CPU; with ``sinks``, dQ, dK, dV and dSinks.

    Indexing K and V by query head (as :func:`reference_attention` does) makes
    autograd sum each KV head's gradient over its group, which is the GQA rule.
    ``window``, ``sink_tokens`` and ``sinks`` as in :func:`reference_attention`; a sink's gradient is a sum over
    every row of its head.
    """
    q64, k64, v64 = (t.detach().to("cpu", torch.float64).requires_grad_(True) for t in (q, k, v))
    sink64 = None if sinks is None else sinks.detach().to("cpu", torch.float64).requires_grad_(True)
    with torch.enable_grad():
        n_q_heads, n_kv_heads = q64.shape[1], k64.shape[1]
        _check_window(causal, window, sink_tokens, sinks, n_q_heads)
        kv_head_of = torch.arange(n_q_heads) // (n_q_heads // n_kv_heads)
        scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q64.shape[-1])
        scores = (q64 @ k64[:, kv_head_of].transpose(-1, -2)) * scale
        scores = scores + _bias(q64.shape[2], k64.shape[2], causal, window, sink_tokens)
        out, _ = _attend(scores, v64[:, kv_head_of], sink64)
        inputs = (q64, k64, v64) if sink64 is None else (q64, k64, v64, sink64)
        return torch.autograd.grad(out, inputs, do.detach().to("cpu", torch.float64))


def reference_decode(q, k_cache, v_cache, cache_seqlens, block_table=None, sm_scale: float | None = None, *,
                     window: int | None = None, sink_tokens: int = 0, sinks=None):
    """Exact attention of the new tokens over a KV cache, in float64. Returns ``(O, LSE)``.

    ``q`` is ``[B, Hq, Nq, D]``; the cache is ``[B, Hkv, S_max, D]``, or with
    ``block_table`` ``[B, max_pages]`` the paged pool ``[num_blocks, page_size,
    Hkv, D]``. Sequence ``b`` holds ``cache_seqlens[b]`` positions, the Nq new
    tokens the last of them; new token ``i`` sits at position
    ``cache_seqlens[b] - Nq + i`` and sees the positions up to its own. Only
    those positions are gathered, so what lies past them (NaN included) never
    reaches the result. ``O`` is ``[B, Hq, Nq, D]`` and ``LSE`` ``[B, Hq, Nq]``,
    float64 on the CPU. ``window``, ``sink_tokens`` and ``sinks`` as in
    :func:`reference_attention`: a windowed new token sees its last W positions
    (and the first S).
    """
    q64 = q.detach().to("cpu", torch.float64)
    batch, n_q_heads, n_new, head_dim = q64.shape
    _check_window(True, window, sink_tokens, sinks, n_q_heads)
    sink64 = None if sinks is None else sinks.detach().to("cpu", torch.float64)
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    outs, lses = [], []
    for b, seq_len in enumerate(int(n) for n in cache_seqlens.tolist()):
        positions = torch.arange(seq_len)
        if block_table is None:  # [Hkv, positions, D]
            k, v = (c[b, :, :seq_len].detach().to("cpu", torch.float64) for c in (k_cache, v_cache))
        else:  # page block_table[b, p // page_size], slot p % page_size; [positions, Hkv, D] -> [Hkv, positions, D]
            page_size = k_cache.shape[1]
            pages = block_table[b].detach().to("cpu", torch.long)[positions // page_size]
            slots = positions % page_size
            k, v = (c.detach().cpu()[pages, slots].to(torch.float64).transpose(0, 1) for c in (k_cache, v_cache))
        kv_head_of = torch.arange(n_q_heads) // (n_q_heads // k.shape[0])
        scores = (q64[b] @ k[kv_head_of].transpose(-1, -2)) * sm_scale  # [Hq, Nq, positions]
        query_pos = seq_len - n_new + torch.arange(n_new)
        seen = visible(query_pos, positions, True, window, sink_tokens)
        out, lse = _attend(scores.masked_fill(~seen[None], float("-inf")), v[kv_head_of], sink64)
        outs.append(out)
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)
