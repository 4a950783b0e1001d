"""Writing the new tokens' keys and values into a KV cache, on the GPU (given code, not graded).

A serving step computes K and V for its ``Nq`` new tokens and must put them in
the cache before attention reads it: ``flash_decode(..., k_new=, v_new=)``
calls :func:`append` for that, as FlashAttention's ``flash_attn_with_kvcache(k=,
v=)`` and vLLM's ``reshape_and_cache`` do. New token ``i`` of sequence ``b``
goes to position ``cache_seqlens[b] - Nq + i``: ``cache_seqlens`` already
counts the new tokens, as everywhere in ``flash_decode``.

The positions are read on the GPU, not on the host, so the write can be
captured in a CUDA graph with the attention after it. Nothing here trusts the
values it reads: a position outside the cache, or a page outside the pool,
is skipped (that token is not written), never written out of bounds.
"""

from __future__ import annotations

import triton
import triton.language as tl

from gqa_flash.course import runtime  # picks the interpreter before the kernel below is defined
from gqa_flash.course.launch import Launch, next_power_of_2


@triton.jit
def _append_kernel(K_NEW, V_NEW, K, V, SEQLENS, BLOCK_TABLE,
                   stride_kn_b, stride_kn_h, stride_kn_n, stride_kn_d,
                   stride_vn_b, stride_vn_h, stride_vn_n, stride_vn_d,
                   stride_kp, stride_ks, stride_kh, stride_kd,
                   stride_vp, stride_vs, stride_vh, stride_vd,
                   stride_tb, stride_tp, N_KV_HEADS, CAPACITY, N_PAGES,
                   N_Q: tl.constexpr, N_Q_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                   PAGE_SIZE: tl.constexpr, PAGED: tl.constexpr):
    """One (batch, KV head): its N_Q new rows of K and V into the cache, read as [pages, slots, Hkv, D]."""
    batch_idx = tl.program_id(0) // N_KV_HEADS
    kv_head_idx = tl.program_id(0) % N_KV_HEADS
    token = tl.arange(0, N_Q_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    pos = tl.load(SEQLENS + batch_idx) - N_Q + token
    ok = (token < N_Q) & (pos >= 0) & (pos < CAPACITY)
    if PAGED:
        page = tl.load(BLOCK_TABLE + batch_idx.to(tl.int64) * stride_tb + (pos // PAGE_SIZE) * stride_tp,
                       mask=ok, other=0)
        ok = ok & (page >= 0) & (page < N_PAGES)
        slot = pos % PAGE_SIZE
    else:
        page = tl.zeros_like(pos) + batch_idx
        slot = pos
    tile_ok = ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    rows_in = batch_idx.to(tl.int64) * stride_kn_b + kv_head_idx * stride_kn_h + token * stride_kn_n
    k = tl.load(K_NEW + rows_in[:, None] + offs_d[None, :] * stride_kn_d, mask=tile_ok)
    rows_in = batch_idx.to(tl.int64) * stride_vn_b + kv_head_idx * stride_vn_h + token * stride_vn_n
    v = tl.load(V_NEW + rows_in[:, None] + offs_d[None, :] * stride_vn_d, mask=tile_ok)
    page, slot = page.to(tl.int64), slot.to(tl.int64)
    rows_out = page * stride_kp + slot * stride_ks + kv_head_idx * stride_kh
    tl.store(K + rows_out[:, None] + offs_d[None, :] * stride_kd, k, mask=tile_ok)
    rows_out = page * stride_vp + slot * stride_vs + kv_head_idx * stride_vh
    tl.store(V + rows_out[:, None] + offs_d[None, :] * stride_vd, v, mask=tile_ok)


def page_strides(cache, paged):
    """A cache's strides as [pages, slots, Hkv, D]: a paged pool's own; a contiguous [B, Hkv, S_max, D]'s with
    the middle two swapped (sequence b is page b, position p its slot p)."""
    s = cache.stride()
    return s if paged else (s[0], s[2], s[1], s[3])


def append_launch(k_new, v_new, k_cache, v_cache, block_table=None) -> Launch:
    """The append's launch for inputs of these shapes and strides (``append`` says what it does); call it
    with ``(k_new, v_new, k_cache, v_cache, cache_seqlens, block_table or cache_seqlens)``."""
    batch, n_kv_heads, n_new, head_dim = k_new.shape
    paged = block_table is not None
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[2]
    table_strides = block_table.stride() if paged else (0, 0)
    return Launch(_append_kernel, (batch * n_kv_heads,), (
        *k_new.stride(), *v_new.stride(), *page_strides(k_cache, paged), *page_strides(v_cache, paged),
        *table_strides, n_kv_heads, capacity, k_cache.shape[0],
    ), dict(
        N_Q=n_new, N_Q_PAD=next_power_of_2(n_new), HEAD_DIM=head_dim,
        HEAD_DIM_PAD=next_power_of_2(head_dim), PAGE_SIZE=k_cache.shape[1] if paged else 1, PAGED=paged,
        num_warps=1 if runtime.INTERPRETER else 4,
    ))


def append(k_new, v_new, k_cache, v_cache, cache_seqlens, block_table=None):
    """Write ``k_new``, ``v_new`` [B, Hkv, Nq, D] into the cache at positions ``cache_seqlens[b] - Nq + i``.

    The cache is ``[B, Hkv, S_max, D]``, or with ``block_table`` [B,
    max_pages] int32 the pool ``[num_blocks, page_size, Hkv, D]``. Inputs are
    assumed checked (``validation.check_decode_inputs``); values are not.
    """
    if k_new.shape[0] == 0:
        return
    table = block_table if block_table is not None else cache_seqlens  # never read when not paged
    append_launch(k_new, v_new, k_cache, v_cache, block_table)(k_new, v_new, k_cache, v_cache, cache_seqlens, table)
