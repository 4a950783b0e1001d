"""Notebook 07 (bonus): decode.py's Parts 3 and 4 in float64, and the usual mistakes replayed.

The checks of decode_parts.py compare your helpers with these replays:
:func:`partial64` walks one split's chunk block by block as the kernel does,
:func:`merge64` merges the splits' states. Each takes at most one *bug*, a
usual mistake (the ``bug`` of a Mistake of ``SPLIT_MISTAKES`` or ``MERGE_MISTAKES``,
which says it in words, with its fix): when your output matches a replay with a bug,
the check names that mistake. Everything here is plain PyTorch: nothing runs
your code.
"""

import math

import torch

from gqa_flash.course.lab.checks.cases import LN2
from gqa_flash.course.lab.checks.common import Mistake

NAN = float("nan")
NEG_INF = float("-inf")
STATE_TOL = dict(atol=1e-4, rtol=1e-4)  # of the partial and merged states, fp32 against float64

# --------------------------------------------------------------------------
# Part 3: one split's partial state
# --------------------------------------------------------------------------

SPLIT_BLOCK_N = 16


def split_cases():
    """(name, dict of the case). Every cache holds NaN at and past the sequence's length."""
    return [
        ("1 new token, GQA 8:2, 45 positions in chunks of 32 (two key blocks; the last chunk ragged, a third "
         "past the end)", dict(batch=2, b=1, n_q_heads=8, n_kv=2, kv=1, n_new=1, head_dim=32, seq_len=45,
                               chunk=32, splits=3, capacity=112, layout="bhsd", seed=31)),
        ("16 new tokens at positions 29-44, GQA 4:2, chunks of 16: tokens 0-2 see none of the last chunk",
         dict(batch=1, b=0, n_q_heads=4, n_kv=2, kv=0, n_new=16, head_dim=16, seq_len=45, chunk=16, splits=4,
              capacity=80, layout="bhsd", seed=32)),
        ("5 new tokens at positions 35-39, GQA 8:2, head dim 24, a [B, S, H, D] cache: the causal rule inside "
         "a chunk", dict(batch=2, b=1, n_q_heads=8, n_kv=2, kv=1, n_new=5, head_dim=24, seq_len=40, chunk=32,
                         splits=2, capacity=72, layout="bshd", seed=33)),
    ]


def split_inputs(c):
    g = torch.Generator().manual_seed(c["seed"])
    rows = (c["n_q_heads"] // c["n_kv"]) * c["n_new"]
    d = c["head_dim"]
    q = torch.randn(rows, d, generator=g)
    shape = (c["batch"], c["n_kv"], c["capacity"], d)
    k, v = (torch.randn(shape, generator=g) for _ in range(2))
    for x in (k, v):
        x[:, :, c["seq_len"]:] = NAN
    if c["layout"] == "bshd":
        k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (k, v))
    tokens = torch.arange(rows) % c["n_new"]
    return q, tokens, k, v


def _walk(c, split, bug=None):
    """(first, stop, end) of split ``split``'s walk: blocks start at first, first + BLOCK_N, ... below stop, and
    their keys are cut at end. Right: the chunk [split * CHUNK, (split + 1) * CHUNK), cut at seq_len."""
    n, chunk, block = c["seq_len"], c["chunk"], SPLIT_BLOCK_N
    lo = split * chunk
    hi = min(lo + chunk, n)
    if bug == "whole_context":
        return 0, n, n
    if bug == "partial_block_dropped":  # whole blocks only
        return lo, hi - block + 1, hi
    if bug == "last_block_dropped":
        return lo, hi - block, hi
    if bug == "last_position_dropped":
        return lo, min(lo + chunk, n - 1), min(lo + chunk, n - 1)
    if isinstance(bug, tuple):  # ("start", how, whether the end is counted from the shifted start)
        _, how, end_from_start = bug
        start = {"one": lo + 1, "block": lo + block, "chunk": lo + chunk, "blocks": split * block}[how]
        end = min(start + chunk, n) if end_from_start else hi
        return start, end, end
    return lo, hi, hi


def partial64(q, tokens, k, v, c, split, scale, bug=None, zeros=False):
    """One split's partial (acc, l, m) in float64, block by block as the kernel walks, with at most one bug.

    ``k``, ``v``: [capacity, D] of this batch and KV head; ``scale`` includes log2(e). ``zeros``: a block's
    keys past the walk's end load as 0 and are hidden by the causal rule alone (a score of 0 where a row's
    position lies beyond that end), as in a kernel that does not mask its scores with the load's mask.
    """
    q, k, v = (x.to(torch.float64) for x in (q, k, v))
    n, n_new = c["seq_len"], c["n_new"]
    position = {"reversed": n - 1 - tokens, "from_start": tokens}.get(bug, n - n_new + tokens)
    scale = 1.0 if bug == "no_scale" else scale
    first, stop, end = _walk(c, split, bug)
    base = math.e if bug == "exp" else 2.0
    m = torch.full((q.shape[0],), NEG_INF, dtype=torch.float64)
    l, acc = torch.zeros_like(m), torch.zeros(q.shape, dtype=torch.float64)
    for start in range(first, stop, SPLIT_BLOCK_N):
        keys = torch.arange(start, start + SPLIT_BLOCK_N if zeros else min(start + SPLIT_BLOCK_N, end))
        loaded = (keys < end)[:, None]
        k_tile, v_tile = (torch.where(loaded, x[keys.clamp(max=x.shape[0] - 1)], 0.0) for x in (k, v))
        s = (q @ k_tile.T) * scale
        if bug == "strict":
            seen = keys[None, :] < position[:, None]
        elif bug == "no_causal":
            seen = torch.ones_like(s, dtype=torch.bool)
        else:
            seen = keys[None, :] <= position[:, None]
        s = s.masked_fill(~seen, NEG_INF)
        top = torch.maximum(m, s.amax(dim=1))
        ref = torch.where(torch.isneginf(top), torch.zeros_like(top), top)
        shrink = base ** (m - ref)
        w = (math.e if bug == "exp_p" else base) ** (s - ref[:, None])
        l = l * shrink + w.sum(dim=1)
        acc = (acc if bug == "no_rescale" else acc * shrink[:, None]) + w @ v_tile
        m = top
    if bug == "normalised":
        acc = torch.where(l[:, None] > 0, acc / l.clamp(min=1e-300)[:, None], acc)
    return acc, l, m


_CAUSAL = "new token i sits at position cache_seqlens - N_Q + i and sees no later position"
_OWN_CHUNK = "split s owns the positions [s * CHUNK, (s + 1) * CHUNK), cut at seq_len"
_LOG2 = "the scores are in log2 units (qk_scale holds log2 e), so every exponential is a power of 2 (tl.exp2)"
# In the order they are tried: the first that all three cases match is named. Each bug is partial64's.
SPLIT_MISTAKES = [
    Mistake("no_causal", "every new token sees the whole cache, up to its end: the causal rule is missing among the "
                         "new tokens (or puts every one at the last position)", _CAUSAL),
    Mistake("strict", "a row does not see its own position: the causal rule keeps only the positions before it",
            "keep the positions up to and including the row's own (<=)"),
    Mistake("reversed", "the new tokens' positions run backwards: token i was put i positions before the end, so "
                        "token 0 sees the most and the last token the least", _CAUSAL + ": token 0 is the earliest"),
    Mistake("from_start", "the new tokens' positions were counted from the start of the cache: token i was put at "
                          "position i", _CAUSAL),
    Mistake("no_scale", "the scores are not scaled: qk_scale (sm_scale times log2 e) was left out",
            "multiply the scores by qk_scale before the mask and the exponentials"),
    Mistake("whole_context", "every split walked the whole context, not its own chunk", _OWN_CHUNK),
    Mistake("last_position_dropped", "the sequence's last position is never walked: the walk ends one position "
                                     "short of seq_len (position seq_len - 1 is the newest token's own)",
            "the positions below seq_len exist: cut the chunk at seq_len itself"),
    Mistake("partial_block_dropped", "the chunk's last, partial block is never walked: the walk takes whole "
                                     "blocks only, so a ragged end is skipped",
            "walk every block that starts before the chunk's end, and mask its keys past the end (key_ok) instead "
            "of skipping the block"),
    Mistake("last_block_dropped", "the walk stops one block early: the chunk's last block is never walked",
            "walk every block that starts before the chunk's end"),
    *(Mistake(("start", how, end_from_start), text, _OWN_CHUNK + ": start the walk at the first of them")
      for how, text in (
          ("one", "every split starts one position late: the first position of each chunk is never walked"),
          ("block", "every split starts one key block late: the first block of each chunk is never walked"),
          ("chunk", "split s walks the next split's chunk: its start is shifted by a whole chunk"),
          ("blocks", "split s starts at block s (position s * BLOCK_N), not at its chunk's first position "
                     "(s * CHUNK)"))
      for end_from_start in (True, False) if (how, end_from_start) != ("chunk", False)),
    Mistake("exp", "the exponentials use e^x: " + _LOG2, "use tl.exp2 for the rescale factor and the probabilities"),
    Mistake("exp_p", "the probabilities use e^x, though the rescale factor uses 2^x: " + _LOG2,
            "the probabilities are 2^(score - m), like the rescale factor"),
    Mistake("no_rescale", "acc is not rescaled when the running maximum rises, though l is",
            "acc shrinks by the same factor as l"),
    Mistake("normalised", "the state was normalised (acc / l): the merge needs it as it is",
            "return acc, l and m unnormalised"),
]


# --------------------------------------------------------------------------
# Part 4: the merge
# --------------------------------------------------------------------------


def merge_cases():
    """(name, acc [R, S, D], l [R, S], m [R, S]). States in log2 units; an empty split is (0, 0, -inf)."""
    g = torch.Generator().manual_seed(41)

    def states(rows, splits, d, spread):
        m = torch.randn(rows, splits, generator=g) * spread
        l = 1 + 4 * torch.rand(rows, splits, generator=g)
        acc = torch.randn(rows, splits, d, generator=g) * l[..., None]
        return acc, l, m

    acc1, l1, m1 = states(8, 4, 16, 3.0)
    acc2, l2, m2 = states(8, 8, 16, 3.0)
    empty = torch.zeros(8, 8, dtype=torch.bool)
    empty[:, 5:] = True  # padding splits past num_splits = 5
    empty[1, 1:] = True  # a row that sees only split 0 (a new token early in a short sequence)
    empty[2, 3] = empty[4, 2] = empty[4, 4] = True  # chunks that start past the row's position
    acc2[empty], l2[empty], m2[empty] = 0.0, 0.0, NEG_INF
    acc3, l3, m3 = states(8, 4, 16, 60.0)  # maxima 100 apart: 2^100 overflows fp32 without the rescale
    return [("4 splits of random states", acc1, l1, m1),
            ("5 splits padded to 8, with empty splits (0, 0, -inf)", acc2, l2, m2),
            ("maxima that differ by up to 2^200", acc3, l3, m3)]


def merge64(acc, l, m, bug=None):
    """The merged rows (O, LSE) in float64, with at most one of MERGE_MISTAKES."""
    acc, l, m = (x.to(torch.float64) for x in (acc, l, m))
    top = m.amax(dim=1)
    if bug == "no_rescale":
        weight = torch.ones_like(m).masked_fill(torch.isneginf(m), 0.0)
    elif bug == "exp":
        weight = torch.exp(m - top[:, None])
    else:
        weight = torch.exp2(m - top[:, None])
    total = (l * weight).sum(dim=1)
    o = (acc * weight[..., None]).sum(dim=1)
    if bug != "unnormalised":
        o = o / total[:, None]
    lse = top + torch.log2(total)
    if bug == "lse_log2":
        return o, lse
    if bug == "lse_mixed":
        return o, top + torch.log(total)
    return o, lse * LN2


MERGE_MISTAKES = [
    Mistake("no_rescale", "the splits were added as they are, though each one's acc and l are sums against its own "
                          "maximum", "rescale split s by 2^(m_s - m), m the row's largest maximum, before adding"),
    Mistake("exp", "the rescale uses e^x, though m and the splits' maxima are in log2 units",
            "the factor is a power of 2: 2^(m_s - m)"),
    Mistake("unnormalised", "O is not normalised", "divide the merged acc by the merged l"),
    Mistake("lse_log2", "the LSE is left in log2 units; the course's LSE is a natural log",
            "the natural log is (m + log2 l) * ln 2"),
    Mistake("lse_mixed", "the LSE mixes bases: m is in log2 units, but l was taken with the natural log",
            "ln(2^m * l) = (m + log2 l) * ln 2"),
]
