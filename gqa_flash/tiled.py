# Your file: fill in the STUDENT IMPLEMENTATION sections; leave the rest as it is.
# (Written from the course's completed tiled.py by its release tool.)
#
#   specification  gqa_flash/reference.py: reference_attention (O and the LSE)
#   notebook       notebooks/03_tiled_attention.ipynb, checked by checks.check_tiled()
#   graded by      tests/graded/test_tiled.py: 25 points
#   run them       make test-graded MODULE=tiled
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
stream past: that is why FlashAttention holds O(N) memory instead of O(N^2).
(Its memory *traffic* is larger: K and V are read once per query tile, about
N^2 * d / block_m numbers in all, which the GPU's L2 cache absorbs in part.)

Each tile loop here is vectorised over batch and heads (every tensor carries
``[B, Hq, ...]`` in front), so you read only the tile logic. The Triton kernel
of ``forward.py`` does the same walk with one program per (query tile, batch,
head).

Returns ``O`` (in q's dtype) and, with ``return_lse=True``, also the LSE,
the natural-log log-sum-exp of each row's scaled scores (notebook 03 derives
it from the running state), float32, ``[B, Hq, N]``: the backward pass needs
it to rebuild the softmax without storing it.

What you write, in five parts (notebook 03 checks them):

    Part 1  the GQA head mapping       which KV head each query head reads
    Part 2  the tile walk              both loops, and where the causal one stops
    Part 3  mask_future                the causal mask inside a diagonal tile
    Part 4  online_softmax_step        fold one tile of scores into (m, l, acc)
    Part 5  epilogue                   a query tile's rows of O and LSE
"""

import torch


def tiled_attention(q, k, v, causal=True, sm_scale=None, block_m=64, block_n=64, return_lse=False):
    if sm_scale is None:
        sm_scale = q.shape[-1] ** -0.5
    batch, n_q_heads, seq_len, head_dim = q.shape
    n_kv_heads = k.shape[1]
    q32, k32, v32 = q.float(), k.float(), v.float()
    # NaN until written: a row your tile walk never reaches shows up as NaN, not as stale memory
    out = torch.full((batch, n_q_heads, seq_len, head_dim), float("nan"), device=q.device)
    lse = torch.full((batch, n_q_heads, seq_len), float("nan"), device=q.device)

    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 1) ---
    # The GQA head mapping, as in naive.py: give k32 and v32 one head per
    # query head, [B, Hkv, N, D] -> [B, Hq, N, D], so that the walk below
    # can treat every query head alike.
    # Invariant: a group of consecutive query heads shares one KV head; with
    # 8 query heads on 2 KV heads, heads 0-3 read KV head 0 and heads 4-7 KV
    # head 1. (The kernel will not copy K and V like this; it just reads the
    # right KV head. Here the copy keeps the tile code short.)
    # Hint: indexing a dimension with a tensor of indices picks, and repeats,
    # entries along it.
    raise NotImplementedError("Part 1 of tiled.py is not implemented yet")
    # --- END OF STUDENT IMPLEMENTATION ---

    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 2) ---
    # The tile walk: the loops that the Triton kernel of notebook 04 runs,
    # one query tile per program. Cut the queries into tiles of block_m rows
    # and the keys into tiles of block_n keys; seq_len need not be a multiple
    # of either, so the last tile of each may be shorter. Every query tile
    # starts from the online softmax of no key at all (a running max of -inf,
    # sums of zero), folds in the tiles of scaled scores of the keys it needs
    # (Part 4; under the causal mask, Part 3 hides the future first), and
    # ends by filling its rows of out and lse (Part 5).
    # Which key tiles a query tile needs: all of them without the causal
    # mask. With it, query i sees only keys j <= i, so a key tile lying
    # wholly after the query tile's last row holds nothing the tile may see.
    # Skip such tiles: never compute their scores. Masking them instead gives
    # the same answer for about twice the work, and a graded test counts the
    # scores you compute.
    # Shapes: q32, k32, v32 are [B, Hq, N, D] (after Part 1), float32; a tile
    # of scores is [B, Hq, rows, keys]; the state is m and l [B, Hq, rows]
    # and acc [B, Hq, rows, D]. One pass of a loop serves every batch and
    # head at once.
    # Invariant: each query row folds in each key it may see exactly once.
    # Hint: the bound of the loop over key tiles may depend on the query tile.
    raise NotImplementedError("Part 2 of tiled.py is not implemented yet")
    # --- END OF STUDENT IMPLEMENTATION ---

    out = out.to(q.dtype)
    return (out, lse) if return_lse else out


def mask_future(s, q_idx, k_idx):
    """The causal mask of one tile of scores: ``s`` with -inf where a key is in its query's future.

    ``s`` is [B, Hq, rows, keys]: the scores of the queries at positions
    ``q_idx`` ([rows], ascending) against the keys at positions ``k_idx``
    ([keys], ascending).
    """
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 3) ---
    # Query i may see key j only when j <= i: its own key (the diagonal) and
    # the keys before it. Return the tile with -inf for every score of a key
    # after its query, and every other score as it was. Why -inf: e^-inf = 0,
    # so a hidden key gets no weight and adds nothing to the running sum.
    # A tile whose keys all come at or before its first query is fully
    # visible: return it untouched, as the kernel does, without building a
    # mask. Only the tiles crossing the diagonal pay for one.
    # Shapes: s [B, Hq, rows, keys] in, the same shape out.
    # Invariant: when block_m > block_n, some rows of a diagonal tile see none
    # of its keys and come out all -inf; Part 4 must (and can) cope.
    # Hint: comparing a column of query positions with a row of key positions
    # broadcasts to a [rows, keys] table, which broadcasts against s.
    raise NotImplementedError("Part 3 of tiled.py is not implemented yet")
    # --- END OF STUDENT IMPLEMENTATION ---


def online_softmax_step(m_i, l_i, acc, s, v_tile):
    """Fold one tile of scores ``s`` and its values ``v_tile`` into the running state; return ``(m, l, acc)``.

    ``m_i``, ``l_i`` are [B, Hq, rows], ``acc`` is [B, Hq, rows, D], ``s`` is
    [B, Hq, rows, keys] (scaled, with -inf for hidden keys), ``v_tile`` is
    [B, Hq, keys, D]; all float32.
    """
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 4) ---
    # The online softmax of notebook 02, with the weighted sum of the values
    # carried along: after this step, for every row,
    #   m   is the largest score seen so far (this tile's included); it never
    #       goes down;
    #   l   is the sum of e^(score - m) over every visible key seen so far;
    #   acc is the sum of e^(score - m) * v over the same keys.
    # Both sums are taken with the *new* m: the terms of earlier tiles were
    # computed with the old one and must be brought to the new one, this
    # tile's terms are added. That is what keeps every exponent <= 0: nothing
    # overflows, however large the scores.
    # Invariants: the first tile arrives with m = -inf, l = 0, acc = 0, and
    # it holds key 0, which every query sees, so m is finite from then on; a
    # row whose scores in a later tile are all -inf comes out unchanged.
    # Hint: e^(a - c) = e^(a - b) * e^(b - c): one factor per row moves both
    # old sums from the old max to the new one.
    raise NotImplementedError("Part 4 of tiled.py is not implemented yet")
    # --- END OF STUDENT IMPLEMENTATION ---


def epilogue(m_i, l_i, acc):
    """A query tile's rows of O ([B, Hq, rows, D]) and LSE ([B, Hq, rows]), from its final state."""
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 5) ---
    # After the last key tile, acc holds the sum of e^(score - m) * v and l
    # the sum of e^(score - m): the softmax's weights, not yet divided by
    # their total. Divide here, once per row, not in every step: that is the
    # point of keeping l apart.
    # The LSE is the natural log of the sum of e^score over the row's visible
    # keys; m and l hold it with the max factored out, so it never overflows.
    # Invariant: l >= 1 in every row (the row's own max adds e^0 = 1), so no
    # epsilon is needed in the division or the log.
    # Hint: log(sum e^s) = m + log(sum e^(s - m)).
    raise NotImplementedError("Part 5 of tiled.py is not implemented yet")
    # --- END OF STUDENT IMPLEMENTATION ---
