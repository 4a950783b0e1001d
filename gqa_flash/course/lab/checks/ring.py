"""Notebook 08: the checks of ring.py, one per part, and the whole ring on CPU processes.

* Part 1, :func:`check_ring_source`: the source rank of every step, for rings of 1 to 6 ranks, against a
  replay of the ring (blocks moved one rank on per step), not the formula.
* Part 2, :func:`check_block_pairs`: the (q chunk, kv chunk, diagonal) pairs for both layouts, every rank and
  source, causal or not, against pairs this check finds by comparing every query position with every key
  position of the two shards.
* Part 3, :func:`check_merge_blocks`: merging (O, LSE) of random rows, rows that have seen nothing yet (-inf)
  included, against the float64 attention of the two key sets taken together.
* :func:`check_ring_attention`: ``gqa_flash.ring_attention`` on 2 and 3 gloo processes against the reference,
  once the three parts pass their own checks (a part that fails is the one its verdict names).

On a wrong answer each check replays the usual mistakes (the ring turning the wrong way, the diagonal
unmasked, the zigzag halves swapped, a merge without the LSE...) and names the one your result matches.
"""

from __future__ import annotations

import dataclasses

import torch

from gqa_flash.course import context_parallel
from gqa_flash.course.lab.checks.common import (
    PARTS, Mistake, Stop, Verdict, fail, load, prints_verdict, run_student, what_of,
)

MODULE = "ring"


# --- Part 1 -------------------------------------------------------------------------------------------------


def replayed_sources(world_size):
    """holder[step][rank]: whose block each rank holds, by moving every block one rank on per step (the model
    the check, notebook 08's picture and the graded test share)."""
    holding, out = list(range(world_size)), []
    for _ in range(world_size):
        out.append(list(holding))
        holding = [holding[(r - 1) % world_size] for r in range(world_size)]  # rank r takes r - 1's
    return out


_SOURCE_MISTAKES = [  # each bug gives the source rank the mistake gives, from (rank, step, world_size)
    Mistake(lambda r, s, w: (r + s) % w, "the ring turns the wrong way: each rank sends to rank + 1, so at step s "
                                         "it holds the block of rank - s"),
    Mistake(lambda r, s, w: r - s, "the rank goes negative: wrap it around the ring (modulo world_size)"),
    Mistake(lambda r, s, w: (s - r) % w, "rank and step are the wrong way round: the block came s ranks back from "
                                         "rank"),
    Mistake(lambda r, s, w: s, "every rank holds the same block at a step: at step 0 each holds its own"),
]


@prints_verdict
def check_ring_source():
    """ring.py Part 1: the rank whose K/V block each rank holds at each step."""
    mod = load(MODULE)
    for world_size in range(1, 7):
        expected = replayed_sources(world_size)
        for step in range(world_size):
            for rank in range(world_size):
                got = run_student(MODULE, mod.ring_source, rank, step, world_size, part=1)
                if got == expected[step][rank]:
                    continue
                cause = next((mistake.cause for mistake in _SOURCE_MISTAKES
                              if mistake.bug(rank, step, world_size) == got), None)
                raise Stop(fail(MODULE, 1, "the wrong source rank",
                                where=f"rank {rank} of {world_size} at step {step}: got {got!r}, expected "
                                      f"{expected[step][rank]}", cause=cause))
    return Verdict(True, what_of(MODULE, 1), "every rank's source at every step of rings of 1 to 6 ranks")


# --- Part 2 -------------------------------------------------------------------------------------------------


def seen_pairs(layout, rank, source, world_size, causal, c=2, chunk_ids=context_parallel.chunk_ids,
                diagonal_masked=True, swap_mine=False, swap_theirs=False):
    """The pairs found position by position: chunk i of rank's shard against chunk j of source's; a pair is
    in when some query may see some key, and diagonal when some query of it may not see every key."""
    mine, theirs = chunk_ids(rank, world_size, layout), chunk_ids(source, world_size, layout)
    mine, theirs = mine[::-1] if swap_mine else mine, theirs[::-1] if swap_theirs else theirs
    pairs = []
    for i, qc in enumerate(mine):
        for j, kc in enumerate(theirs):
            seen = [[not causal or kc * c + b <= qc * c + a for b in range(c)] for a in range(c)]
            if any(map(any, seen)):
                partial = not all(map(all, seen))
                pairs.append((i, j, partial and diagonal_masked))
    return sorted(pairs)


def _positions(rank, world_size, layout):
    return tuple(range(context_parallel.check_layout(layout)))


def _ranks(rank, world_size, layout):
    """Every chunk of a shard numbered by its rank: a block_pairs that compares ranks, not chunk numbers."""
    return (rank,) * context_parallel.check_layout(layout)


_PAIR_MISTAKES = [  # each bug is the keyword arguments of seen_pairs that replay it
    Mistake(dict(diagonal_masked=False), "a diagonal pair is not marked diagonal: the block where a chunk meets "
                                         "itself needs the causal mask (True)"),
    Mistake(dict(causal=False), "the causal mask is ignored: a query chunk sees nothing of a later chunk"),
    *[Mistake(dict(swap_mine=m, swap_theirs=t), "the zigzag halves are swapped: a shard holds chunk r first, "
                                                "then 2 * world_size - 1 - r (context_parallel.chunk_ids)")
      for m, t in ((True, True), (False, True), (True, False))],
    Mistake(dict(chunk_ids=_positions), "shard positions are compared, not global chunk numbers: chunk 1 of one "
                                        "shard is not chunk 1 of another; compare context_parallel.chunk_ids"),
    Mistake(dict(chunk_ids=_ranks), "ranks are compared, not chunk numbers: with the zigzag layout a rank holds two "
                                    "chunks far apart (chunk r and chunk 2 * world_size - 1 - r), so the rank that "
                                    "sent a block does not say which of its chunks come before a query chunk; "
                                    "compare the global chunk numbers of context_parallel.chunk_ids, pair by pair"),
]


def _as_pairs(out, where):
    problem = None
    if not isinstance(out, (list, tuple)):
        problem = f"block_pairs returned a {type(out).__name__}; expected a list of (q_chunk, kv_chunk, diagonal)"
    else:
        for item in out:
            if not (isinstance(item, (tuple, list)) and len(item) == 3 and isinstance(item[2], bool)
                    and all(isinstance(x, int) and not isinstance(x, bool) for x in item[:2])):
                problem = f"{item!r} is not a (q_chunk, kv_chunk, diagonal) triple of (int, int, bool)"
                break
    if problem:
        raise Stop(fail(MODULE, 2, problem, where=where))
    return sorted(tuple(item) for item in out)


_PAIRS_COMPARE = ("for the case named under where, the global chunk numbers of both shards "
                  "(context_parallel.chunk_ids) and, for each (q chunk, kv chunk) of them, whether every query of "
                  "the one may see every key of the other (earlier chunk), some of them (the same chunk: diagonal) "
                  "or none (later chunk); your list must hold exactly the first two kinds")


@prints_verdict
def check_block_pairs():
    """ring.py Part 2: which chunk pairs a rank computes with a visiting block, and which are diagonal."""
    mod = load(MODULE)
    cases = 0
    for layout in context_parallel.LAYOUTS:
        for world_size in (1, 2, 3, 4):
            for causal in (True, False):
                for rank in range(world_size):
                    for source in range(world_size):
                        ranks = f"{world_size} rank" + ("s" if world_size > 1 else "")
                        where = (f"layout={layout!r}, {ranks}, rank {rank}, the block of rank {source}, "
                                 f"causal={causal}")
                        got = _as_pairs(run_student(MODULE, mod.block_pairs, layout, rank, source, world_size,
                                                    causal, part=2), where)
                        expected = seen_pairs(layout, rank, source, world_size, causal)
                        cases += 1
                        if got == expected:
                            continue
                        args = dict(layout=layout, rank=rank, source=source, world_size=world_size, causal=causal)
                        cause = next((mistake.cause for mistake in _PAIR_MISTAKES
                                      if seen_pairs(**{**args, **mistake.bug}) == got), None)
                        raise Stop(fail(MODULE, 2, "the wrong pairs", where=f"{where}: got {got}, expected "
                                        f"{expected}", cause=cause, compare=_PAIRS_COMPARE))
    return Verdict(True, what_of(MODULE, 2), f"right pairs in all {cases} cases (both layouts, 1 to 4 ranks, "
                                              "causal and not)")


# --- Part 3 -------------------------------------------------------------------------------------------------


def attention64(s, v):
    """(O, LSE) of scores s [..., n, k] (-inf where masked) and values v [..., k, D], float64; O = 0 where a
    row sees nothing."""
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isneginf(lse), 0.0, lse)[..., None])
    return p @ v, lse


# The mistakes of the merged O, whatever the merged LSE is: each bug gives the O the mistake gives
_MERGE_O_MISTAKES = [
    Mistake(lambda o, l, ob, lb: (o + ob) / 2,
            "the outputs are averaged: weigh each by exp(its lse - the merged lse), its share of the row's sum"),
    Mistake(lambda o, l, ob, lb: torch.where(torch.isneginf(l)[:, None], ob, (o + ob) / 2),
            "the outputs are averaged where both parts saw keys: weigh each by exp(its lse - the merged lse), its "
            "share of the row's sum"),
    Mistake(lambda o, l, ob, lb: o + ob,
            "the outputs are added without weights: each part's O is already normalised over its own keys, so each "
            "must be weighed by exp(its lse - the merged lse), its share of the row's sum, before adding"),
    Mistake(lambda o, l, ob, lb: o * torch.exp(l)[:, None] + ob * torch.exp(lb)[:, None],
            "each output is weighed by exp(lse) but not divided by the row's total: the weights must sum to 1"),
]
# The mistakes of the merged LSE: each bug gives the LSE the mistake gives
_MERGE_LSE_MISTAKES = [
    Mistake(lambda l, lb: torch.maximum(l, lb), "the merged lse is the larger one: it is the log of the sum of both "
                                                "parts' sums (logaddexp)"),
    Mistake(lambda l, lb: l + lb, "the two lse are added: the merged lse is the log of the sum of both parts' sums "
                                  "(logaddexp), not of their product"),
    Mistake(lambda l, lb: l, "the running lse is kept: the merged lse must count the new block's keys too "
                             "(logaddexp)"),
]
_MERGE_COMPARE = ("for the row named under where, each part's weight, exp(its lse - the merged lse) (print both, "
                  "they sum to 1), and the merged lse, the log of the sum of both parts' sums, with yours")


@prints_verdict
def check_merge_blocks():
    """ring.py Part 3: folding one block's (O, LSE) into the running (O, LSE)."""
    mod = load(MODULE)
    gen = torch.Generator().manual_seed(8)
    n, k, d = 6, 5, 4
    s = torch.randn(n, 2 * k, generator=gen, dtype=torch.float64) * 3
    s[0] = float("-inf")  # row 0 sees no key at all
    s[1, :k] = float("-inf")  # row 1 sees nothing of the first block, row 2 nothing of the second
    s[2, k:] = float("-inf")
    v = torch.randn(2 * k, d, generator=gen, dtype=torch.float64)
    o_a, lse_a = attention64(s[:, :k], v[:k])
    o_b, lse_b = attention64(s[:, k:], v[k:])
    want_o, want_lse = attention64(s, v)
    got = run_student(MODULE, mod.merge_blocks, o_a.float(), lse_a.float(), o_b.float(), lse_b.float(), part=3)
    if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
        raise Stop(fail(MODULE, 3, f"merge_blocks returned {type(got).__name__}; expected a pair (o, lse)"))
    o, lse = got
    if o.shape != want_o.shape or lse.shape != want_lse.shape:
        raise Stop(fail(MODULE, 3, f"shapes o {list(o.shape)}, lse {list(lse.shape)}; expected "
                                   f"{list(want_o.shape)} and {list(want_lse.shape)}"))
    bad_rows = [r for r in range(n) if not (
        torch.allclose(o[r].double(), want_o[r], atol=1e-5)
        and (torch.isneginf(want_lse[r]) == torch.isneginf(lse[r]).item())
        and (torch.isneginf(want_lse[r]) or abs(lse[r].item() - want_lse[r].item()) < 1e-5))]
    if not bad_rows:
        return Verdict(True, what_of(MODULE, 3), "rows over two blocks, rows that saw only one, and a row that saw "
                                                 "none yet (-inf) all merge right")
    row = bad_rows[0]
    kind = {0: "a row that has seen no key in either part (both lse -inf)",
            1: "a row whose running part saw nothing yet (its lse -inf)",
            2: "a row the new block adds nothing to (lse_blk -inf)"}.get(row, "a row that saw keys in both parts")
    o_right = torch.allclose(o[row].double(), want_o[row], atol=1e-5)

    def same(replay, got):  # on every row: the first wrong row alone may fit several mistakes
        return torch.allclose(replay, got.double(), atol=1e-5, equal_nan=True)

    if o[row].isnan().any():
        cause = "NaN where an lse is -inf: guard the weights (exp(-inf - (-inf)) is NaN)"
    elif not o_right:
        cause = next((mistake.cause for mistake in _MERGE_O_MISTAKES
                      if same(mistake.bug(o_a, lse_a, o_b, lse_b), o)), None)
    else:
        cause = next((mistake.cause for mistake in _MERGE_LSE_MISTAKES if same(mistake.bug(lse_a, lse_b), lse)),
                     None)
    raise Stop(fail(MODULE, 3, "the merged (O, LSE) differs from attention over both blocks at once",
                    where=f"row {row}, {kind}: O {_short(o[row])} expected {_short(want_o[row])}; lse "
                          f"{lse[row].item():.4g} expected {want_lse[row].item():.4g}", cause=cause,
                    compare=_MERGE_COMPARE))


def _short(row):
    return "[" + ", ".join(f"{x:.4g}" for x in row.tolist()) + "]"


# --- The whole ring ---------------------------------------------------------------------------------------------


PART_CHECKS = (check_ring_source, check_block_pairs, check_merge_blocks)

_RING_COMPARE = ("ring_attention's own code (outside the banners) with the file you were given: its three parts "
                 "pass their own checks, so the difference comes from how they are used; then print, on rank 0 of "
                 "2, the source of each step, the pairs and the merged LSE after each")


def _failing_part(part_verdicts) -> Verdict | None:
    """The first part whose own check fails, as the whole ring's verdict: the ring runs every part at every step."""
    for v in part_verdicts:
        if not v.ok:
            part = next((p for p, name in PARTS[MODULE].items() if v.what == what_of(MODULE, p)), None)
            return dataclasses.replace(
                v, what=what_of(MODULE, part) if part else v.what,
                message=f"not run yet: Part {part} fails its own check, and the ring runs it at every step: "
                        f"{v.message}" if part else v.message)
    return None


@prints_verdict
def check_ring_attention(part_verdicts=None):
    """ring.py: ring_attention on 2 and 3 gloo processes (CPU), both layouts, against the float64 reference.

    Its parts are checked first (``part_verdicts``, when given, are theirs): a part that fails its own check is
    the one this verdict names, with that check's findings, and the ring is not run.
    """
    from gqa_flash.course.lab import ring_run

    load(MODULE)
    failing = _failing_part(part_verdicts if part_verdicts is not None else [c.verdict() for c in PART_CHECKS])
    if failing is not None:
        raise Stop(failing)
    for world_size in (2, 3):
        cases = [dict(seed=world_size * 10 + i, batch=1, hq=4, hkv=2, n=4 * world_size, d=8, causal=causal,
                      layout=layout, dtype=torch.float32)
                 for i, (causal, layout) in enumerate([(True, "zigzag"), (True, "contiguous"), (False, "zigzag")])]
        results = ring_run.run_on_cpu(ring_run.ring_cases, world_size, cases, timeout_s=20)
        errors = [f"rank {r}: {value.splitlines()[0]}" for r, (status, value) in enumerate(results) if status != "ok"]
        if errors:
            raise Stop(fail(MODULE, None, f"ring_attention failed on {world_size} processes",
                            where="; ".join(errors), compare=_RING_COMPARE))
        for case, (o, _, ref, _) in zip(cases, ring_run.whole_outputs(results, cases)):
            if not torch.allclose(o.double(), ref, atol=1e-5):
                raise Stop(fail(MODULE, None, "ring_attention's output differs from the reference",
                                where=f"{world_size} ranks, layout={case['layout']!r}, causal={case['causal']}: "
                                      f"max error {(o.double() - ref).abs().max().item():.2e}",
                                compare=_RING_COMPARE))
    return Verdict(True, what_of(MODULE), "ring_attention on 2 and 3 gloo processes, both layouts, causal and not, "
                                          "matches the reference")
