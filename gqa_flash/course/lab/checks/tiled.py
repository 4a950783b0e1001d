"""Notebook 03: the check of tiled.py, FlashAttention's tile walk in PyTorch (Parts 1-5).

One check runs tiled_attention on five cases that each isolate a part and
compares O and the LSE with the float64 reference. A wrong answer is compared
with what each usual bug of the walk returns on the same case (stored answers:
replays.py), and the first bug that gives the same wrong answer names the part
to look at. A right answer must also be cheap: the causal walk must skip the key
tiles past the diagonal, which :class:`gqa_flash.course.tile_counts.ScoreProducts` checks
by counting the scores computed (as the graded test does).
"""

import re

import torch

from gqa_flash.course import api, testing, tile_counts
from gqa_flash.course.lab.checks import replays
from gqa_flash.course.lab.checks.cases import (
    Case, attention64, gqa_cause, head_mapping, run_torch, student_frame, where_attention,
)
from gqa_flash.course.lab.checks.common import (
    Mistake, Stop, Verdict, fail, first_cause, fmt, load, prints_verdict, run_student, shape_problem, tol, what_of,
)
from gqa_flash.reference import reference_attention


TILED_CASES = [
    Case("one head, no mask, two key tiles", (4, 5), seq_len=16, causal=False),
    Case("one head, causal, length 37", (2, 3), seq_len=37, seed=1),
    Case("GQA, 8 query heads on 2 KV heads, causal", 1, n_q_heads=8, n_kv_heads=2, seq_len=24, seed=2),
    Case("no mask, length 37", 2, n_q_heads=2, n_kv_heads=1, seq_len=37, causal=False, seed=3),
    Case("MQA in fp16, batch 2, block_m 8 with block_n 16", None, batch=2, n_q_heads=4, n_kv_heads=1,
         seq_len=29, head_dim=32, dtype=torch.float16, block_m=8, block_n=16, seed=4),
]

# The case whose work is counted: its head dim (24) is no other size of the case
# (batch, heads, tiles, length), so a product that contracts it is a tile of scores.
_WORK_CASE = Case("causal, length 50, head_dim 24", 2, n_q_heads=2, n_kv_heads=1, seq_len=50, head_dim=24,
                  block_m=16, block_n=8, seed=5)

# The mistakes whose answers replays.pt stores, each under its bug's name (tools/make_check_replays.py). Those of O
# say what is wrong, in words, with no hint: the fix is yours to write.
TILED_MISTAKES = [
    Mistake("kv_mod", "query heads are dealt to the KV heads in turn; a group of consecutive query heads must "
                      "share one KV head", part=1),
    Mistake("skip_diagonal", "the causal key loop stops before the diagonal: a query tile must also visit the key "
                             "tile(s) holding its own rows' keys", part=2),
    Mistake("causal_end_always", "the key loop stops at the diagonal even without the causal mask: then every "
                                 "query sees every key", part=2),
    Mistake("mask_none", "the causal mask is not applied on the tiles that cross the diagonal", part=3),
    Mistake("mask_diag", "mask off by one: it hides the diagonal too; a query's own key must stay visible", part=3),
    Mistake("mask_past", "the mask is the wrong way round: it hides the past instead of the future", part=3),
    Mistake("no_rescale", "missing rescale: when the running max rises, the old l and acc must both be brought "
                          "to the new max", part=4),
    Mistake("no_rescale_acc", "acc is not rescaled when the running max rises (l is)", part=4),
    Mistake("no_rescale_l", "l is not rescaled when the running max rises (acc is)", part=4),
    Mistake("alpha_inverted", "the rescale factor is inverted: moving the old sums to a larger max must shrink "
                              "them (a factor <= 1), not grow them", part=4),
    Mistake("m_not_updated", "the running max never changes: the new max must be returned by the step and "
                             "carried to the next tile", part=4),
    Mistake("tile_max", "the new max is this tile's max alone, not the larger of it and the running max: a row "
                        "that sees none of a tile's keys gets NaN", part=4),
    Mistake("no_normalise", "O is not normalised: the accumulator must be divided by the running sum, once, "
                            "at the end", part=5),
]
_LSE_HINT = "LSE = m + log(l), with the natural log (torch.log), once every key tile is in the running state"
TILED_LSE_MISTAKES = [
    Mistake("lse_m", "the LSE is missing the log of the running sum: it is the max plus that log",
            _LSE_HINT, part=5),
    Mistake("lse_log_l", "the LSE is missing the running max: it is the max plus the log of the running sum",
            _LSE_HINT, part=5),
    Mistake("lse_log2", "the LSE is in base 2; the course's LSE is the natural log",
            _LSE_HINT, part=5),
    Mistake("lse_log2_l", "the log of the running sum is in base 2; it must be the natural log",
            _LSE_HINT, part=5),
]

# What to compare next when no usual mistake explains a wrong O, by the part the case isolates.
_COMPARE = {
    (4, 5): "your running state after each key tile (m, l and acc, printed for one row) with notebook 02's online "
            "softmax done by hand on the same row of scores; then O = acc / l and the LSE = m + log(l) at the end",
    (2, 3): "the key tiles each query tile visits (print their ranges) and, on a tile that crosses the diagonal, the "
            "scores after the mask: only the keys after their query hidden",
    1: "the KV head each query head reads (print it) with the mapping the banner of Part 1 gives",
    2: "the query and key tiles your walk cuts (print their ranges): every row in exactly one query tile, every "
       "key in exactly one key tile, the last tile of each cut at the sequence's end",
    None: "the tiles and the dtype: this case is MQA in fp16 with block_m smaller than block_n; print the tile "
          "ranges, and where the inputs become float32 and O goes back to the input's dtype",
}
_COMPARE_LSE = ("your LSE for the row named under where with m + log(l) from your final state (print both): the "
                "natural log of the sum of e^score over the row's visible keys, its max included")

# The shapes of the tile the broadcast probe hands Parts 4 and 5: all different, so that a vector of one number
# per row ([B, Hq, rows]) that meets a [B, Hq, rows, D] tensor without a last dimension of its own raises.
_PROBE = dict(batch=1, heads=2, rows=3, keys=5, head_dim=4)


def _broadcast_cause(case: Case):
    """The Mistake (found by a probe, not replayed: its bug None) when Part 4's step or Part 5's epilogue multiplies
    (or divides) a [rows, D] tensor by a per-row vector that has no last dimension of its own, found by running
    them on a tile whose sizes all differ (in the case that failed, rows and head_dim may be equal, so it ran and
    gave wrong numbers); else None."""
    mod = load("tiled")
    b, h, rows, keys, d = _PROBE.values()
    g = torch.Generator().manual_seed(31)
    m, l = torch.randn(b, h, rows, generator=g), 1 + torch.rand(b, h, rows, generator=g)
    acc, s = torch.randn(b, h, rows, d, generator=g), torch.randn(b, h, rows, keys, generator=g)
    v = torch.randn(b, h, keys, d, generator=g)
    for part, name, args in ((4, "online_softmax_step", (m, l, acc, s, v)), (5, "epilogue", (m, l, acc))):
        fn = getattr(mod, name, None)
        if fn is None:
            continue
        try:
            run_student("tiled", fn, *args, part=part)
            continue
        except Stop as stop:
            exc = stop.__context__
        if exc is None or "must match the size of tensor" not in str(exc) or f"({rows})" not in str(exc) \
                or f"({d})" not in str(exc):
            continue
        local, line = student_frame(exc, "tiled")
        names = re.findall(r"[A-Za-z_]\w*", line)
        shaped = lambda shape: next((n for n in names if isinstance((local or {}).get(n), torch.Tensor)  # noqa: E731
                                     and tuple(local[n].shape) == shape), None)
        vec = shaped((b, h, rows)) or "a per-row vector"
        mat = shaped((b, h, rows, d)) or "a [B, Hq, rows, D] tensor"
        tile = f"{case.block_m} rows" if case.block_m == case.head_dim else "its rows"
        return Mistake(
            None,
            f"{vec} (one number per row, [B, Hq, rows]) meets {mat} ([B, Hq, rows, D]) without a last dimension "
            f"of its own: broadcasting lines its rows up with the last dimension, head_dim, so each column is "
            f"scaled by another row's factor. In the case named under where a query tile has {tile} and "
            f"head_dim is {case.head_dim}, so it ran and gave wrong numbers; on a tile of {rows} rows with "
            f"head_dim {d} it raises",
            "a per-row vector needs a trailing dimension of 1 to scale whole rows of a [B, Hq, rows, D] tensor "
            "(the banners' shapes: m_i and l_i are [B, Hq, rows], acc is [B, Hq, rows, D])",
            part=part)
    return None


def _computed_mistakes(q, k, v, case: Case):
    """The mistakes that no stored answer replays, each with its ``bug`` a function that computes its answer
    in float64."""
    n, scale = case.seq_len, case.scale
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    future = (j > i) if case.causal else torch.zeros(n, n, dtype=torch.bool)
    last_row = (i % case.block_m == case.block_m - 1) | (i == n - 1)  # each query tile's last row
    first_key_before = (j // case.block_n * case.block_n) <= (i // case.block_m * case.block_m)
    mistakes = [
        Mistake(lambda: attention64(q, k, v, 1.0, future),
                "the scores are not scaled by sm_scale: O matches attention with sm_scale = 1",
                "multiply each tile of scores by sm_scale", part=2),
        Mistake(lambda: attention64(q, k, v, 1.0 / scale, future),
                "the scores are divided by sm_scale, not multiplied: O matches attention with 1 / sm_scale",
                "multiply each tile of scores by sm_scale (it already is 1/sqrt(head_dim))", part=2),
        Mistake(lambda: attention64(q, k, v, scale * scale, future),
                "the scores are scaled twice: O matches attention with sm_scale squared",
                "multiply each tile of scores by sm_scale once", part=2),
    ]
    if case.causal:
        mistakes += [
            Mistake(lambda: attention64(q, k, v, scale, future | (last_row & (j == i))),
                    "the causal key loop stops one key short: the last row of each query tile never sees its own "
                    "key (the diagonal), though every row's own key is visible",
                    "a query tile needs every key up to and including its last row's, so the loop's bound is the "
                    "position just past that row", part=2),
            Mistake(lambda: attention64(q, k, v, scale, future & ~first_key_before),
                    "the tile is returned unmasked when its FIRST key is at or before the first query: a tile that "
                    "crosses the diagonal starts there too, so its future keys stay visible",
                    "a tile is wholly visible only when its LAST key is at or before its first query; test that one",
                    part=3),
        ]
    return mistakes


def _tile_crash(case: Case):
    """For run_torch: a size mismatch raised in Parts 3-5 whose tiles from Part 2 disagree, or a mask transposed."""

    def diagnose(exc, local, line):
        if "must match the size of tensor" not in str(exc):
            return None
        s, q_idx, k_idx, v_tile = (local.get(name) for name in ("s", "q_idx", "k_idx", "v_tile"))
        if not isinstance(s, torch.Tensor) or s.dim() < 2:
            return None
        rows, keys = s.shape[-2:]
        where = f"case \"{case.name}\" (length {case.seq_len}, block_m {case.block_m}, block_n {case.block_n})"
        end = case.seq_len - 1
        if isinstance(q_idx, torch.Tensor) and isinstance(k_idx, torch.Tensor):  # Part 3
            if (len(q_idx), len(k_idx)) == (rows, keys):
                if (rows, keys) != (keys, rows) and f"({rows})" in str(exc) and f"({keys})" in str(exc):
                    return dict(message=f"the mask's shape does not fit the tile of scores [{rows} queries x "
                                        f"{keys} keys] ({where})",
                                cause=f"the mask is [keys, queries] ({keys} x {rows}), the transpose of the "
                                      "scores' [queries, keys]: the key positions run down its column and the "
                                      "query positions along its row",
                                hint="put the query positions down a column ([:, None]) and the key positions "
                                     "along a row ([None, :])")
                return None
            tile, got, positions = (("query", rows, q_idx) if len(q_idx) != rows else ("key", keys, k_idx))
        elif isinstance(v_tile, torch.Tensor) and v_tile.dim() >= 2 and v_tile.shape[-2] != keys:  # Part 4
            tile, got, positions = "key", keys, None
        else:
            return None
        past = (f": its positions run to {int(positions[-1])}, past the last one, {end}"
                if positions is not None and len(positions) and int(positions[-1]) > end else "")
        return dict(what=what_of("tiled", 2), where=where,
                    message=f"the tiles that Part 2 hands to Parts 3-5 have mismatched lengths: a tile of scores "
                            f"with {got} {'rows' if tile == 'query' else 'keys'} arrives with "
                            f"{len(positions) if positions is not None else 'a different number of'} "
                            f"{tile} positions" + ("" if positions is not None else " (values)"),
                    cause=f"the last {tile} tile is not cut at the sequence's end{past}; slicing the tensor "
                          f"stops at the end by itself, so it holds only {got} {'rows' if tile == 'query' else 'keys'}",
                    hint=f"end each {tile} tile at the smaller of its start plus its block size and the "
                         "sequence's end (min), and build its positions and its slice from that one end")

    return diagnose


def _check_answers(case: Case):
    """O, then the LSE, of one case against the float64 reference; a wrong one stops the check."""
    # The case's stored inputs and the usual mistakes' answers on them (replays.py), if stored
    (q, k, v), answers = replays.stored("tiled", case.name, case.dtype) or (case.qkv(), {})
    result = run_torch("tiled", api.tiled_attention, q, k, v, causal=case.causal, block_m=case.block_m,
                       block_n=case.block_n, return_lse=True, part=case.part, diagnose=_tile_crash(case))
    ref, ref_lse = reference_attention(q, k, v, causal=case.causal)
    out, lse = result if isinstance(result, tuple) and len(result) == 2 else (result, None)
    shape = shape_problem(out, ref.shape) or shape_problem(lse, ref_lse.shape, "the LSE")
    if shape:
        raise Stop(fail("tiled", 5, shape, where=f"case \"{case.name}\""))
    problem = testing.mismatch("O", out, ref, **tol(case.dtype))
    if problem is not None:
        heads = gqa_cause("tiled", 1, head_mapping(out, q, k, v, case.causal, case.scale, **tol(case.dtype)),
                          case.n_q_heads, case.n_kv_heads)
        found = (Mistake(None, *heads, part=1) if heads else None) or first_cause(
            out, [(mistake, answers[mistake.bug]) for mistake in TILED_MISTAKES if mistake.bug in answers]
            + [(mistake, mistake.bug) for mistake in _computed_mistakes(q, k, v, case)], **tol(case.dtype)
        ) or _broadcast_cause(case)
        part, cause, hint = (found.part, found.cause, found.hint) if found else (case.part, None, None)
        raise Stop(fail("tiled", part, "O does not match the float64 reference",
                        where=where_attention(problem, case, with_tile=True), cause=cause, hint=hint,
                        compare=None if found else _COMPARE.get(case.part, _COMPARE[None])))
    problem = testing.mismatch("LSE", lse, ref_lse, labels=("batch", "head", "row"), **testing.LSE_TOLERANCE)
    if problem is not None:
        found = first_cause(lse, [(mistake, answers[mistake.bug]) for mistake in TILED_LSE_MISTAKES
                                  if mistake.bug in answers], **testing.LSE_TOLERANCE)
        part, cause, hint = (found.part, found.cause, found.hint) if found else (5, None, None)
        b, h, i = problem.index
        raise Stop(fail("tiled", part, "the LSE does not match the float64 reference",
                        where=f"case \"{case.name}\": batch {b}, query head {h}, row {i}: "
                              f"got {fmt(problem.got)}, expected {fmt(problem.expected)}",
                        cause=cause, hint=hint, compare=None if found else _COMPARE_LSE))
    if lse.dtype != torch.float32:
        raise Stop(fail("tiled", 5, f"the LSE is {lse.dtype}; it must be float32"))


def _check_work(case: Case):
    """A causal query tile must skip the key tiles past the diagonal: count the scores it computes."""
    q, k, v = case.qkv()
    with tile_counts.ScoreProducts(case.head_dim) as counter:
        run_student("tiled", api.tiled_attention, q, k, v, causal=True, block_m=case.block_m,
                    block_n=case.block_n, part=2)
    where = f"case \"{case.name}\", block_m {case.block_m}, block_n {case.block_n}"
    if counter.products == 0:
        raise Stop(fail("tiled", 2, "no tile of scores was computed with a matrix product", where=where,
                        hint="compute each tile of scores as a product of the query tile and the key tile's "
                             "transpose (the @ operator), as the kernel will with tl.dot"))
    needed, everything = (tile_counts.score_elements_needed(case.batch, case.n_q_heads, case.seq_len, case.block_m,
                                                        case.block_n, causal=c) for c in (True, False))
    if counter.elements > needed:
        cause = ("the causal key loop walks every key tile: the answer is right (the mask hides the future) "
                 "but the work is not halved; key tiles past the diagonal must be skipped, not masked"
                 if counter.elements >= everything else
                 "some key tiles past the diagonal are computed; they must be skipped, not masked")
        raise Stop(fail("tiled", 2, f"computes {counter.elements} scores where a causal walk needs {needed}",
                        where=where, cause=cause))


@prints_verdict
def check_tiled():
    """tiled.py, Parts 1-5: cases that each isolate a part, then the count of scores the causal walk computes."""
    load("tiled")
    for case in TILED_CASES:
        _check_answers(case)
    _check_work(_WORK_CASE)  # right answers; now the work
    return Verdict(True, what_of("tiled", (1, 5)),
                   f"O and LSE match the float64 reference in {len(TILED_CASES)} cases "
                   "(MHA, GQA, MQA; causal and not; ragged; fp16), and the causal walk skips the future tiles")
