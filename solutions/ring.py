"""Ring attention: causal attention over a sequence split across the ranks of a process group.

A sequence of a million tokens does not fit one GPU's memory, nor its time.
Context parallelism splits it: each rank holds a *shard*, a slice of the
sequence's Q, K and V (``[B, H, N_local, D]``), and computes the attention
of its own queries. Those queries need every key, so the keys travel: the
ranks stand in a ring, and at each step every rank hands the K and V block it
holds to the next rank and takes the previous rank's. After ``world_size``
steps every block has visited every rank, and each rank has folded each
visiting block into the running (O, LSE) of its queries, with the merge of
notebook 02: the output of a row over disjoint sets of keys combines exactly,
weighted by each part's exp(LSE). While a block is used, the next one is
already on its way (the send and receive are posted before the compute), so
with enough work per block the transfers hide behind it.

Which chunk of the sequence a rank holds is its layout
(``context_parallel.chunk_ids``): ``contiguous`` gives rank r chunk r of
``world_size``; ``zigzag`` gives it chunks r and 2 * world_size - 1 - r of
``2 * world_size``, one early and one late, so that under the causal mask
every rank has the same work. A rank's shard is its chunks in that order,
each ``N_local / chunks`` positions long; a K/V block that arrives is another
rank's shard, in the same layout.

What you write (plain PyTorch and integers; the attention of a block is
given, ``context_parallel.block_attention``):

    Part 1  ring_source     which rank's K/V block this rank holds at a step
    Part 2  block_pairs     which of its chunks attend to which of the block's, and with which mask
    Part 3  merge_blocks    fold one block's (O, LSE) into the running (O, LSE)

GQA's gift: only the K and V heads travel, so a 32:8 model sends a quarter
of the bytes multi-head attention would.
"""

import torch

from gqa_flash.course import context_parallel


def ring_source(rank, step, world_size):
    """The rank whose K/V block ``rank`` holds at ``step`` (0 .. world_size - 1) of the ring."""
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 1) ---
    # What: at step 0 every rank holds its own block. At every step each rank
    # sends the block it holds to rank + 1 and receives rank - 1's (around
    # the ring: rank world_size - 1 sends to rank 0).
    # Why: the loop below must know where each block came from: which chunks
    # of the sequence it holds decides the causal mask (Part 2).
    # Shapes: integers; the answer lies in 0 .. world_size - 1.
    # Invariants: over the steps 0 .. world_size - 1 a rank sees every rank's
    # block exactly once.
    # Hint: follow one block: after one step it is one rank further on.
    ### BEGIN SOLUTION
    return (rank - step) % world_size
    ### END SOLUTION
    # --- END OF STUDENT IMPLEMENTATION ---


def block_pairs(layout, rank, source, world_size, causal):
    """Which attention to compute between ``rank``'s queries and the K/V block of ``source``.

    Returns a list of ``(q_chunk, kv_chunk, diagonal)``: the index of one of
    the rank's own chunks (0 or 1: its place in the shard), the index of one
    of the block's chunks, and whether the pair is a diagonal block, which
    needs the causal mask. Pairs that have nothing to compute are left out.
    """
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 2) ---
    # What: both shards are chunks of the one sequence, in layout order
    # (context_parallel.chunk_ids gives the global chunk numbers, in shard
    # order). Under the causal mask, a query chunk sees the whole of every
    # earlier chunk, the lower triangle of its own chunk, and nothing of a
    # later chunk. Without it, every chunk sees every chunk, whole.
    # Why: this is where causal attention's work is skipped; with zigzag,
    # every step then costs each rank the same.
    # Shapes: a list of up to 1 (contiguous) or 4 (zigzag) tuples of (int, int,
    # bool).
    # Invariants: a pair (q chunk, kv chunk) appears at most once; nothing a
    # query must not see is in the list, and nothing it must see is left out.
    # Hint: compare global chunk numbers, never shard positions.
    ### BEGIN SOLUTION
    mine = context_parallel.chunk_ids(rank, world_size, layout)
    theirs = context_parallel.chunk_ids(source, world_size, layout)
    pairs = []
    for i, q_chunk in enumerate(mine):
        for j, kv_chunk in enumerate(theirs):
            if not causal or kv_chunk < q_chunk:
                pairs.append((i, j, False))
            elif kv_chunk == q_chunk:
                pairs.append((i, j, True))
    return pairs
    ### END SOLUTION
    # --- END OF STUDENT IMPLEMENTATION ---


def merge_blocks(o, lse, o_blk, lse_blk):
    """Fold one block's ``(o_blk, lse_blk)`` into the running ``(o, lse)``; return the merged pair.

    ``o``, ``o_blk`` [..., n, D] and ``lse``, ``lse_blk`` [..., n], fp32: the
    normalised output of some rows over two disjoint sets of keys, and the
    natural-log log-sum-exp of their scaled scores. A row that has seen no key
    yet has ``lse = -inf`` (and any ``o``).
    """
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 3) ---
    # What: notebook 02's merge, for outputs: each part's O is a softmax
    # average over its own keys only, so weigh each by its share of the
    # whole row's sum of exponentials. An lse is the log of one part's sum:
    # the two shares and the merged lse come from the two lse's alone.
    # Why: a rank never sees the whole row of scores at once, only one
    # block's; the LSE carries exactly what the merge needs.
    # Shapes: as the inputs; return o [..., n, D] and lse [..., n].
    # Invariants: merging with a part whose lse is -inf changes nothing, and
    # gives no NaN, even when both are -inf.
    # Hint: logaddexp for the total; guard the weights where it is -inf.
    ### BEGIN SOLUTION
    total = torch.logaddexp(lse, lse_blk)
    safe = torch.where(torch.isneginf(total), torch.zeros_like(total), total)
    w, w_blk = torch.exp(lse - safe), torch.exp(lse_blk - safe)
    o = torch.nan_to_num(o) * w[..., None] + torch.nan_to_num(o_blk) * w_blk[..., None]
    return o, total
    ### END SOLUTION
    # --- END OF STUDENT IMPLEMENTATION ---


def ring_attention(q, k, v, causal=True, sm_scale=None, group=None, layout="zigzag", return_lse=False):
    """This rank's shard of attention over the whole sequence (see the module's docstring).

    ``q`` [B, Hq, N_local, D], ``k``, ``v`` [B, Hkv, N_local, D]: this rank's
    shards in ``layout``. Returns this rank's O shard (q's dtype) and, with
    ``return_lse``, its LSE [B, Hq, N_local] (fp32). The public API
    (``gqa_flash.ring_attention``) checks the inputs first.
    """
    ring = context_parallel.Ring(group)
    chunks = context_parallel.check_layout(layout)
    c = q.shape[2] // chunks  # positions a chunk
    sm_scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    o = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full(q.shape[:3], float("-inf"), dtype=torch.float32, device=q.device)
    kv = (k.contiguous(), v.contiguous())
    for step in range(ring.world_size):
        if step + 1 < ring.world_size:
            ring.start(kv, step + 1)  # the next block travels while this one is used
        source = ring_source(ring.rank, step, ring.world_size)
        for i, j, diagonal in block_pairs(layout, ring.rank, source, ring.world_size, causal):
            rows, keys = slice(i * c, (i + 1) * c), slice(j * c, (j + 1) * c)
            o_blk, lse_blk = context_parallel.block_attention(q[:, :, rows], kv[0][:, :, keys], kv[1][:, :, keys],
                                                              diagonal, sm_scale)
            o[:, :, rows], lse[:, :, rows] = merge_blocks(o[:, :, rows], lse[:, :, rows], o_blk, lse_blk)
        if step + 1 < ring.world_size:
            kv = tuple(ring.wait(step + 1))
    o = o.to(q.dtype)
    return (o, lse) if return_lse else o
