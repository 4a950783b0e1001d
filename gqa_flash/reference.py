"""The trusted reference: attention and softmax in float64 on the CPU.

Every check in the course compares against these, never against a student's
own naive code: a bug in ``naive.py`` must not make a wrong kernel look right.
The code is deliberately the most direct statement of the maths.
"""

from __future__ import annotations

import math

import torch


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
        n = q64.shape[2]
        future = torch.ones(n, n, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
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
            n = q64.shape[2]
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v64[:, kv_head_of]
        dq, dk, dv = torch.autograd.grad(out, (q64, k64, v64), do.detach().to("cpu", torch.float64))
    return dq, dk, dv
