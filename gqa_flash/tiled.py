# Student version of solutions/tiled.py, written by `python -m gqa_flash.grader.release`.
# Fill in the STUDENT IMPLEMENTATION sections; leave the rest as it is.
"""FlashAttention in PyTorch, with the tiles spelled out: the kernel's blueprint.

The output is computed one *query tile* (``block_m`` rows) at a time. For each
query tile we walk over *key tiles* (``block_n`` keys) and keep, per row, only

    m    the running maximum of the scaled scores seen so far,
    l    the running sum of exp(score - m),
    acc  the running sum of exp(score - m) * v, a [block_m, D] tile,

exactly the online softmax of ``online_softmax.py``, with ``acc`` rescaled
alongside ``l``. The N x N score matrix never exists; only one
[block_m, block_n] tile of it at a time. On a GPU, Q's tile, ``m``, ``l`` and
``acc`` live in registers and shared memory for the whole walk, and K and V
stream past: that is why FlashAttention reads O(N) memory instead of O(N^2).

Each tile loop here is vectorised over batch and heads (every tensor carries
``[B, Hq, ...]`` in front), so you read only the tile logic. The Triton kernel
of ``forward.py`` does the same walk with one program per (query tile, batch,
head).

Returns ``O`` (in q's dtype) and, with ``return_lse=True``, also
``LSE = m + log(l)``, the natural-log log-sum-exp of each row's scaled
scores, float32, ``[B, Hq, N]``: the backward pass needs it to rebuild the
softmax without storing it.
"""

import torch


def tiled_attention(q, k, v, causal=True, sm_scale=None, block_m=64, block_n=64, return_lse=False):
    if sm_scale is None:
        sm_scale = q.shape[-1] ** -0.5
    batch, n_q_heads, seq_len, head_dim = q.shape
    n_kv_heads = k.shape[1]
    q32, k32, v32 = q.float(), k.float(), v.float()
    out = torch.empty(batch, n_q_heads, seq_len, head_dim, device=q.device)
    lse = torch.empty(batch, n_q_heads, seq_len, device=q.device)

    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 1) ---
    # The GQA head mapping, as in naive.py: give k32 and v32 one head per
    # query head, head h being KV head h // (n_q_heads // n_kv_heads).
    # (The kernel will not copy K and V like this; it just reads the right
    # KV head. Here the copy keeps the tile code short.)
    raise NotImplementedError("Part 1 of tiled.py is not implemented yet")
    # --- END OF STUDENT IMPLEMENTATION ---

    for q_start in range(0, seq_len, block_m):
        q_end = min(q_start + block_m, seq_len)  # the last tile may be ragged
        q_idx = torch.arange(q_start, q_end, device=q.device)
        q_tile = q32[:, :, q_start:q_end]  # [B, Hq, bm, D]

        m_i = torch.full((batch, n_q_heads, q_end - q_start), float("-inf"), device=q.device)
        l_i = torch.zeros_like(m_i)
        acc = torch.zeros_like(q_tile)

        # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 2) ---
        # Which key tiles does this query tile visit? Without the causal mask,
        # all of them: keys 0 .. seq_len - 1. With it, query i sees keys
        # j <= i only, so no row of this tile sees a key at or past q_end:
        # stop the key loop there. Those tiles are skipped, not masked: this
        # halves the work of causal attention.
        # Set kv_end, the end (exclusive) of the keys this query tile visits.
        raise NotImplementedError("Part 2 of tiled.py is not implemented yet")
        # --- END OF STUDENT IMPLEMENTATION ---

        for k_start in range(0, kv_end, block_n):
            k_end = min(k_start + block_n, kv_end)
            k_idx = torch.arange(k_start, k_end, device=q.device)
            k_tile, v_tile = k32[:, :, k_start:k_end], v32[:, :, k_start:k_end]
            s = (q_tile @ k_tile.transpose(-1, -2)) * sm_scale  # [B, Hq, bm, bn]

            # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 3) ---
            # The causal mask, on the tiles that need it. A tile whose keys
            # all come before its first query (k_idx[-1] <= q_idx[0]) is fully
            # visible: leave it alone, as the kernel does. A tile that crosses
            # the diagonal gets s[..., i, j] = -inf where key j is in the
            # future of query i (k_idx[j] > q_idx[i]).
            raise NotImplementedError("Part 3 of tiled.py is not implemented yet")
            # --- END OF STUDENT IMPLEMENTATION ---

            # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 4) ---
            # The online-softmax update for this tile (online_softmax.py, now
            # carrying acc too):
            #   m_new = max(m_i, rowmax(s))
            #   alpha = exp(m_i - m_new)          how much the old state shrinks
            #   p     = exp(s - m_new)            this tile's unnormalised probabilities
            #   l_i   = alpha * l_i + rowsum(p)
            #   acc   = alpha * acc + p @ v_tile
            #   m_i   = m_new
            # (Every row has seen a visible key by its first tile, key 0, so
            # m_new is never -inf here.)
            raise NotImplementedError("Part 4 of tiled.py is not implemented yet")
            # --- END OF STUDENT IMPLEMENTATION ---

        # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 5) ---
        # The epilogue: normalise the tile once, at the end (not in every
        # step: that is the point of keeping l), and write it into
        # out[:, :, q_start:q_end]. Also write the natural-log log-sum-exp of
        # each row, m_i + log(l_i), into lse[:, :, q_start:q_end].
        raise NotImplementedError("Part 5 of tiled.py is not implemented yet")
        # --- END OF STUDENT IMPLEMENTATION ---

    out = out.to(q.dtype)
    return (out, lse) if return_lse else out
