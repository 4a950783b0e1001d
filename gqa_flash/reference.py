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


def reference_attention(q, k, v, causal: bool = True, sm_scale: float | None = None):
    """Exact attention in float64. Returns ``(O, LSE)``.

    ``O`` is ``[B, Hq, N, D]`` float64 and ``LSE`` (natural log of the row sums
    of ``exp(scaled scores)``) is ``[B, Hq, N]`` float64, both on the CPU.
    Query head ``h`` reads key/value head ``h // (Hq // Hkv)``.
    """
    q64, k64, v64 = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
    n_q_heads, n_kv_heads = q64.shape[1], k64.shape[1]
    group = n_q_heads // n_kv_heads
    kv_head_of = torch.arange(n_q_heads) // group
    k64, v64 = k64[:, kv_head_of], v64[:, kv_head_of]
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(q64.shape[-1])
    scores = (q64 @ k64.transpose(-1, -2)) * sm_scale
    if causal:
        scores = scores + _causal_bias(q64.shape[2])
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.exp(scores - lse[..., None]) @ v64
    return out, lse


def reference_softmax(x, dim: int = -1):
    """Softmax in float64 on the CPU."""
    return torch.softmax(x.detach().to("cpu", torch.float64), dim=dim)


def reference_gradients(q, k, v, do, causal: bool = True, sm_scale: float | None = None):
    """dQ, dK, dV of ``sum(O * do)`` in float64 by autograd, on the CPU.

    Indexing K and V by query head (as :func:`reference_attention` does) makes
    autograd sum each KV head's gradient over its group, which is the GQA rule.
    """
    q64, k64, v64 = (t.detach().to("cpu", torch.float64).requires_grad_(True) for t in (q, k, v))
    with torch.enable_grad():
        n_q_heads, n_kv_heads = q64.shape[1], k64.shape[1]
        kv_head_of = torch.arange(n_q_heads) // (n_q_heads // n_kv_heads)
        scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q64.shape[-1])
        scores = (q64 @ k64[:, kv_head_of].transpose(-1, -2)) * scale
        if causal:
            scores = scores + _causal_bias(q64.shape[2])
        out = torch.softmax(scores, dim=-1) @ v64[:, kv_head_of]
        dq, dk, dv = torch.autograd.grad(out, (q64, k64, v64), do.detach().to("cpu", torch.float64))
    return dq, dk, dv


def reference_decode(q, k_cache, v_cache, cache_seqlens, block_table=None, sm_scale: float | None = None):
    """Exact attention of the new tokens over a KV cache, in float64. Returns ``(O, LSE)``.

    ``q`` is ``[B, Hq, Nq, D]``; the cache is ``[B, Hkv, S_max, D]``, or with
    ``block_table`` ``[B, max_pages]`` the paged pool ``[num_blocks, page_size,
    Hkv, D]``. Sequence ``b`` holds ``cache_seqlens[b]`` positions, the Nq new
    tokens the last of them; new token ``i`` sits at position
    ``cache_seqlens[b] - Nq + i`` and sees the positions up to its own. Only
    those positions are gathered, so what lies past them (NaN included) never
    reaches the result. ``O`` is ``[B, Hq, Nq, D]`` and ``LSE`` ``[B, Hq, Nq]``,
    float64 on the CPU.
    """
    q64 = q.detach().to("cpu", torch.float64)
    batch, n_q_heads, n_new, head_dim = q64.shape
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
        scores = scores.masked_fill(positions[None, None, :] > query_pos[None, :, None], float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        outs.append(torch.exp(scores - lse[..., None]) @ v[kv_head_of])
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)
