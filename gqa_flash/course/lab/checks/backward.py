"""Notebook 06 (bonus): the checks of backward.py, the backward kernels with GQA.

Each check feeds your kernels *exact* forward results (O and the LSE of the
float64 reference), so a bug in your forward kernel cannot show up here, and
compares with float64 autograd (``reference_gradients``). A gradient passes
on its relative error, as in the graded tests (``testing.gradient_error``).

* Part 1, :func:`check_delta`: D = rowsum(dO * O), the preprocess kernel alone, in fp32 and in
  fp16 (where D must still be summed in fp32);
* Part 2, :func:`check_dkdv`: dK and dV with MHA (one query head per KV head,
  so Part 3 cannot matter yet), causal and not; then the causal walk, counted
  (backward_walks.skip_verdict): a query block before the key block's diagonal
  must never be loaded;
* Part 3, :func:`check_gqa_sum`: dK and dV with GQA 4:2 and MQA 4:1, where a
  KV head adds up what its whole group of query heads sends back;
* Part 4, :func:`check_dq`: dQ with GQA 4:2, causal and not, and with every score near -100 (where
  a key past the end that is not masked out of P turns dQ into NaN); then the causal walk, counted: a
  key block past the query block's diagonal must never be loaded;
* :func:`check_backward`: the four parts, then all of backward.py on two more
  cases (fp16, batch 2, MQA, head dim 80, sm_scale, [B, N, H, D] layout).

A failure is told in two steps (common.py). First what is wrong and where:
the gradient, its first wrong entry, which keys or query rows and which heads
hold wrong entries, and a constant factor when the whole gradient is off by
one. Then, when the cell is run again, the likely cause and its fix: a part
this one builds on failing its own check (dK and dQ use Part 1's D; the GQA
sum adds up Part 2's dK and dV), the placeholder, a scale (the factor is
exactly 1/sm_scale, sm_scale or log2(e)), or one of the usual mistakes,
replayed in float64 by :func:`_backward64` and matched against your output:
the causal mask missing or off by one, a walk that starts or stops a block
off, an accumulator assigned instead of added to, the exponential in the
wrong units (exp for exp2, the LSE or the scores in the wrong base), D left
out, the group's heads taken wrongly. A walk that starts or stops elsewhere
(however its bound was computed) is found from the output itself: each
program's dV or dQ is the share of a window of the rows it walked
(backward_walks.window_cause). When none matches, the hint says what the
passing checks rule out, and guesses nothing.
"""

import torch
import triton

from gqa_flash.course import api, runtime, testing
from gqa_flash.course.lab.checks import backward_walks
from gqa_flash.course.lab.checks.cases import LN2, LOG2E, Case
from gqa_flash.course.lab.checks.common import (
    PARTS, Mistake, Stop, Verdict, at, fail, fmt, load, prints_verdict, run_student, shape_problem, what_of,
)
from gqa_flash.reference import reference_attention, reference_gradients

_GRADIENTS = ("dQ", "dK", "dV")  # in the order flash_attention_backward returns them
_LABELS = {
    "dQ": ("batch", "query head", "row", "column"),
    "dK": ("batch", "KV head", "key", "column"),
    "dV": ("batch", "KV head", "key", "column"),
}


def _inputs(case: Case):
    """q, k, v, dO, and the forward's exact O and LSE (float64, then cast as the forward kernel stores them)."""
    q, k, v = case.qkv()
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(case.seed + 7)).to(q.device, case.dtype)
    o, lse = reference_attention(q, k, v, causal=case.causal, sm_scale=case.sm_scale)
    return q, k, v, do, o.to(q.device, case.dtype), lse.to(q.device, torch.float32)


class _VeryNegative(Case):
    """A case whose every score is near -100 (default sm_scale): column 0 holds 100 in q and
    -sqrt(head_dim) in k, as in the graded test; every row's LSE is then near -96."""

    def qkv(self):
        q, k, v = super().qkv()
        q[..., 0], k[..., 0] = 100.0, -(self.head_dim**0.5)
        return q, k, v


def _first_wrong(name, got, ref, rel, labels):
    """The first entry off by more than ``rel`` times its own size plus the mean size (a testing.Mismatch)."""
    scale = ref.abs().mean().item() + 1e-12
    return testing.mismatch(name, got, ref, atol=rel * scale, rtol=rel, labels=labels)


# --------------------------------------------------------------------------
# The usual mistakes, replayed in float64
# --------------------------------------------------------------------------

# Which query head is the i-th of KV head j's group (g heads; n_kv KV heads), right and wrong.
_GROUP_MEMBER = {
    None: lambda j, i, g, n_kv: j * g + i,
    "group_placeholder": lambda j, i, g, n_kv: j,
    "group_first": lambda j, i, g, n_kv: j * g,
    "group_mod": lambda j, i, g, n_kv: i * n_kv + j,
    "group_no_offset": lambda j, i, g, n_kv: i,
}

# The mistakes whose replay depends on the kernels' tiles (BLOCK_M, BLOCK_N): where the walks start and stop,
# and which block an accumulator that is assigned (=), not added to (+=), keeps.
_TILED = {"no_mask", "dkdv_late", "dq_early", "dq_no_diagonal", "assign"}


def _seen(case: Case, n: int, bug=None, tiles=None):
    """Which keys j each query row i sees, [n, n] booleans: in the dQ kernel, and in the dK/dV kernel.

    Right, both are the causal mask (or every key). A mistake of the mask or of a walk's bounds changes
    one of them; with ``tiles`` (BLOCK_M, BLOCK_N) a walk visits what the kernels' loops would.
    """
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]  # query row, key
    full = torch.ones(n, n, dtype=torch.bool)
    mask = (j < i if bug == "mask_diag" else j <= i) if case.causal else full
    dq, dkdv = mask, mask
    if tiles is None:
        return dq, dkdv
    bm, bn = tiles
    first_query = (j // bn * bn) // bm * bm  # where backward_dkdv's causal walk starts for key j's block
    end_key = torch.clamp((i // bm + 1) * bm, max=n) if case.causal else torch.full_like(i, n)  # dQ's walk ends
    if bug == "no_mask" and case.causal:  # the walks' bounds still hold; inside them, the future leaks in
        dq, dkdv = j < end_key, i >= first_query
    elif bug == "dkdv_late" and case.causal:
        dkdv = mask & (i >= first_query + bm)
    elif bug == "dq_early" and case.causal:
        stop = end_key - bn
        dq = mask & (j < torch.div(stop + bn - 1, bn, rounding_mode="floor").clamp(min=0) * bn)
    elif bug == "dq_no_diagonal" and case.causal:
        dq = mask & (j < i // bm * bm)
    elif bug == "assign":  # only the last block each walk visits is left
        dkdv = mask & (i >= (n - 1) // bm * bm)
        dq = mask & (j >= (end_key - 1) // bn * bn)
    return dq, dkdv


def _backward64(case: Case, inputs, bug=None, tiles=None):
    """dQ, dK, dV in float64, computed the way the kernels do, with at most one known bug.

    P is recomputed from the saved LSE, D = rowsum(dO * O), dS = P * (dP - D),
    and KV head j adds up what the query heads of its group send back. ``bug``
    is one of _MISTAKES' (it changes every kernel; a check compares only the
    gradient it is about). ``tiles``, the kernels' (BLOCK_M, BLOCK_N), matters
    only to the mistakes of _TILED.
    """
    q, k, v, do, o, lse = (t.detach().to("cpu", torch.float64) for t in inputs)
    n_q, n_kv, n = q.shape[1], k.shape[1], q.shape[2]
    group = n_q // n_kv
    delta = torch.zeros_like(lse) if bug == "no_delta" else (do * o).sum(-1)
    seen_dq, seen_dkdv = _seen(case, n, bug, tiles)

    def share(h, kv):
        """What query head h sends back through KV head kv: its dQ, and its parts of dK and dV."""
        s = (q[:, h] @ k[:, kv].transpose(-1, -2)) * case.scale
        x = lse[:, h, :, None]
        p = {  # P, exactly, from the saved LSE; or as a mistake recomputes it
            "exp": lambda: torch.exp(s - x) ** LOG2E,  # exp(log2(e) x) where exp2(log2(e) x) = exp(x) belongs
            "lse_base": lambda: torch.exp(s - x * LN2),  # exp2(s * log2(e) - lse): the LSE taken for log2 units
            "qk_no_log2e": lambda: torch.exp(s * LN2 - x),  # exp2(s * sm_scale - lse * log2(e))
            "scores_unscaled": lambda: torch.exp(s / case.scale - x),  # exp2(s * log2(e) - lse * log2(e))
        }.get(bug, lambda: torch.exp(s - x))()
        dp = do[:, h] @ v[:, kv].transpose(-1, -2)
        p_dq, p_dkdv = p.masked_fill(~seen_dq, 0.0), p.masked_fill(~seen_dkdv, 0.0)
        ds_dq, ds_dkdv = p_dq * (dp - delta[:, h, :, None]), p_dkdv * (dp - delta[:, h, :, None])
        return (ds_dq @ k[:, kv] * case.scale, ds_dkdv.transpose(-1, -2) @ q[:, h] * case.scale,
                p_dkdv.transpose(-1, -2) @ do[:, h])

    member = _GROUP_MEMBER.get(bug, _GROUP_MEMBER[None])
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for h in range(n_q):
        dq[:, h] = share(h, h // group)[0]
    for kv in range(n_kv):
        # An assigned accumulator keeps the last query head's share only.
        for g in range(group - 1, group) if bug == "assign" else range(group):
            h = member(kv, g, group, n_kv)
            if not 0 <= h < n_q:
                raise IndexError("this mistake reads a query head that does not exist")
            _, dk_h, dv_h = share(h, kv)
            dk[:, kv] += dk_h
            dv[:, kv] += dv_h
    return dq, dk, dv


# The kernels' (BLOCK_M, BLOCK_N) are fixed in the interpreter and autotuned on a GPU: a mistake
# whose replay depends on them (_TILED) is tried with each of these.
_TILES = [(bm, bn) for bm in (16, 32, 64, 128) for bn in (16, 32, 64, 128)]


def _tile_order():
    """([the kernels' own tiles] when known, which is in the interpreter), [the other tiles of _TILES]."""
    config = getattr(load("backward"), "INTERPRETER_CONFIG", None) if runtime.INTERPRETER else None
    first = [(config["BLOCK_M"], config["BLOCK_N"])] if isinstance(config, dict) and "BLOCK_N" in config else []
    return first, [t for t in _TILES if t not in first]


# The causes (step two: the mistake) and hints (its fix) of the usual mistakes. Each `where` says what is
# wrong and where (step one); these say why.
_LSE_BASE = ("the LSE is loaded as the forward saved it, a natural log, and used as it is beside scores in log2 "
             "units: the exponent of exp2 mixes the two units")
_LSE_BASE_HINT = ("convert the LSE as you load it: times log2(e) = 1.4426950408889634, the factor qk_scale "
                  "gives the scores")
_NO_LOG2E = ("the scores go into exp2 scaled by sm_scale alone, in natural units, next to an LSE converted "
             "to log2 units: log2(e) is missing from the scores' scale")
_NO_LOG2E_HINT = "scale the scores by qk_scale = sm_scale * log2(e), as forward.py does, before exp2"
_EXP = ("exp where exp2 belongs: the exponent is in log2 units (scores times sm_scale * log2(e), the LSE "
        "converted), and e to that power is not the probability")
_EXP_HINT = "tl.exp2 of an exponent in log2 units; or tl.exp of one in natural units, with no log2(e) anywhere"
_UNSCALED = "the scores lack sm_scale: the probabilities are recomputed from Q K^T, not from sm_scale * Q K^T"
_UNSCALED_HINT = "multiply the scores by qk_scale = sm_scale * log2(e) before exp2"
_MASK_DIAG = "the causal mask hides the diagonal: a query does not see its own key"
_MASK_DIAG_HINT = "a key is visible to a query when its index is at most the query's (<=, not <)"
_NO_DELTA = "D is left out of dS: the softmax's backward is P times (dP minus D), with D one number per query row"
_NO_DELTA_HINT = "subtract each query row's D (Part 1's Delta) from dP before multiplying by P"
_ASSIGN = ("{name} keeps only the last share the walk adds: it is assigned (=) where it must be added to (+=), or "
           "set back to zero inside the walk, over the {block} blocks or over a group's query heads")
_ASSIGN_HINT = "{acc} += each block's share: every {block} block visited (and every query head of a group) adds"
DKDV_LATE = ("under the causal mask the walk over query blocks starts one block late: it skips the query block "
             "that holds this key block's diagonal, the first queries that see these keys")
DQ_EARLY = ("under the causal mask the walk over key blocks stops one block early: it misses the last key "
            "block this query block sees, the one that holds its last rows' own keys")
DQ_NO_DIAGONAL = ("under the causal mask the walk over key blocks stops where this query block starts: the "
                  "diagonal blocks, which hold the keys of its own rows, are never visited")
_DQ_END_HINT = ("the last key a row sees is its own: stop after the key block that holds this query block's "
                "last row, (q_block_idx + 1) * BLOCK_M, or SEQ_LEN if that comes first")
# Found without a replay: NaN in dQ where every score is near -100 (_VeryNegative).
NO_KEY_MASK = ("the keys past the end (past SEQ_LEN) are not masked out of P: they load as zeros, so their "
               "score is 0, and with every real score near -100 (an LSE near -96) their probability overflows to "
               "inf, and inf times the zero key is NaN")
_NO_KEY_MASK_HINT = "make the probability 0 for a key at or past SEQ_LEN, with or without the causal mask"
DELTA_FP16 = ("D is summed in fp16: every D is an fp16 number. O and dO are fp16 here, so their product and its "
              "sum stay fp16 (rounded to 3 digits) unless they are converted first")
_DELTA_FP16_HINT = "convert o and do to tl.float32 before you multiply them"
_GROUP_HINT = ("the h-th query head of KV head g's group is g times the group size, plus h (forward.py Part 1's "
               "map, backwards)")


def _no_mask(name):
    return (f"the causal mask is missing from the recomputed probabilities: keys in a query's future send "
            f"gradient to {name}")


_NO_MASK_HINT = "make a probability 0 where the key comes after the query, under CAUSAL, as well as past SEQ_LEN"

# Each part's usual mistakes, tried in this order, each bug a name _backward64 replays. A cause or hint may name
# the gradient ({name}), its accumulator ({acc}) and the blocks its walk visits ({block}).
_MISTAKES = {
    2: [
        Mistake("no_mask", _no_mask("{name}"), _NO_MASK_HINT),
        Mistake("mask_diag", _MASK_DIAG, _MASK_DIAG_HINT),
        Mistake("dkdv_late", DKDV_LATE, "start at the query block that holds the key block's first key: that key's "
                                        "index rounded down to a multiple of BLOCK_M"),
        Mistake("assign", _ASSIGN, _ASSIGN_HINT),
        Mistake("exp", _EXP, _EXP_HINT),
        Mistake("lse_base", _LSE_BASE, _LSE_BASE_HINT),
        Mistake("qk_no_log2e", _NO_LOG2E, _NO_LOG2E_HINT),
        Mistake("scores_unscaled", _UNSCALED, _UNSCALED_HINT),
        Mistake("no_delta", _NO_DELTA, _NO_DELTA_HINT),
        Mistake("group_no_offset", "every KV head adds up the gradient of query head 0: Part 3 leaves out the KV "
                                   "head, even with one query head per KV head", _GROUP_HINT),
    ],
    3: [
        Mistake("group_placeholder", "Part 3's placeholder is still there: one query head is added group_size times",
                _GROUP_HINT),
        Mistake("group_first", "only the group's first query head is added, group_size times: Part 3 leaves out h",
                _GROUP_HINT),
        Mistake("group_mod", "the query heads of a group are dealt out to the KV heads in turn, not taken "
                             "consecutively as forward.py Part 1 groups them", _GROUP_HINT),
        Mistake("group_no_offset", "every KV head adds up query heads 0 to group_size - 1: Part 3 leaves out the KV "
                                   "head's own group", _GROUP_HINT),
        Mistake("assign", _ASSIGN, _ASSIGN_HINT),
    ],
    4: [
        Mistake("no_mask", _no_mask("{name}"), _NO_MASK_HINT),
        Mistake("mask_diag", _MASK_DIAG, _MASK_DIAG_HINT),
        Mistake("dq_early", DQ_EARLY, _DQ_END_HINT),
        Mistake("dq_no_diagonal", DQ_NO_DIAGONAL, _DQ_END_HINT),
        Mistake("assign", _ASSIGN, _ASSIGN_HINT),
        Mistake("exp", _EXP, _EXP_HINT),
        Mistake("lse_base", _LSE_BASE, _LSE_BASE_HINT),
        Mistake("qk_no_log2e", _NO_LOG2E, _NO_LOG2E_HINT),
        Mistake("scores_unscaled", _UNSCALED, _UNSCALED_HINT),
        Mistake("no_delta", _NO_DELTA, _NO_DELTA_HINT),
    ],
}

# A gradient off by one factor everywhere (step one says by how much): which scale went wrong.
SCALE_MISSING = ("{name} lacks sm_scale: S = sm_scale * Q K^T, so the gradient that reaches {operand} through S "
                 "carries sm_scale once")
SCALE_TWICE = "{name} carries sm_scale twice: it is applied to {acc} once too often"
SCALE_LOG2E = ("{name} is scaled by qk_scale, sm_scale times log2(e): log2(e) belongs to the exponent of the "
               "probabilities, not to the gradient")
SCALE_ON_DV = "dV is scaled by sm_scale, but V is not in the scores: dV = P^T dO carries no scale"


def _factor(got, ref, dtype):
    """c when ``got`` is c times ``ref`` (within the gradient's tolerance) for a c that is not 1, else None."""
    g, r = got.detach().to("cpu", torch.float64), ref.detach().to("cpu", torch.float64)
    norm = float((r * r).sum())
    if norm == 0 or not bool(torch.isfinite(g).all()):
        return None
    c = float((g * r).sum()) / norm
    err, bound = testing.gradient_error(got, c * r, dtype)
    return c if err <= bound and abs(c - 1) > 1e-2 else None


def _factor_cause(name, c, scale):
    """(cause, hint) of a gradient that is c times the right one; (None, hint) for a factor no mistake explains."""
    fill = dict(name=name, acc=name.lower(), operand=name[1:])
    close = lambda x: abs(c - x) <= 1e-3 * abs(x)  # noqa: E731
    if name == "dV" and close(scale):
        return SCALE_ON_DV, "leave sm_scale out of dv"
    if name != "dV":
        if close(1 / scale):
            return SCALE_MISSING.format(**fill), f"multiply {fill['acc']} by sm_scale once, after its walk"
        if close(scale):
            return SCALE_TWICE.format(**fill), f"multiply {fill['acc']} by sm_scale once, after its walk"
        if close(LOG2E):
            return SCALE_LOG2E.format(**fill), f"multiply {fill['acc']} by sm_scale, not by qk_scale"
    return None, f"a constant factor is wrong: look at every number {name} is multiplied by"


def _hint(part, name):
    """Where to look when no known mistake matches: what the passing checks rule out, no guess."""
    if part == 2 and name == "dV":
        return ("none of the usual mistakes: dV needs only the recomputed probabilities and dO, so compare "
                "the probabilities of one tile with torch.softmax of its scores (notebook 06 shows how)")
    if part == 2:
        return ("dV is right, so the walk and the probabilities are: what is left for dK is dP, D, dS and "
                "the product with Q")
    if part == 3:
        return ("Part 2 passes with one query head per KV head: what changes with more is which query heads a "
                "KV head adds up, and how many")
    return ("none of the usual mistakes: Part 2's tile is this one transposed, so compare the two: the walk's "
            "bounds, the loads and their masks, the units of the exponential, the scale")


def _builds_on(part, name):
    """The parts whose results this gradient uses: D for dK and dQ, Part 2's dK and dV for the GQA sum."""
    return ([1] if name in ("dK", "dQ") else []) + ([2] if part == 3 else [])


def _mistake_text(text, name, part):
    return text.format(name=name, acc=name.lower(), block="key" if part == 4 else "query")


def _part_diagnosis(part):
    """The likely cause of a wrong gradient in ``part``: (cause, hint)."""

    def diagnose(case, inputs, name, got, ref):
        for needed in _builds_on(part, name):
            verdict = PART_CHECKS[needed - 1].verdict()
            if not verdict.ok and not verdict.extra.get("gradients_right"):  # a walk past the diagonal is right
                return (f"Part {needed} ({PARTS['backward'][needed]}) fails its own check",
                        f"make Part {needed}'s check pass first")
        if part != 3 and bool((got == 0).all()):
            return f"the placeholder is still there: {name} is all zeros", None
        if part == 4 and isinstance(case, _VeryNegative) and not bool(torch.isfinite(got).all()):
            return NO_KEY_MASK, _NO_KEY_MASK_HINT
        index = _GRADIENTS.index(name)
        c = _factor(got, ref, case.dtype)
        if c is not None:
            return _factor_cause(name, c, case.scale)
        # Two mistakes of the walks may look alike at some tiles: the kernels' own tiles are tried first. Then a
        # walk's bound that is none of them (each program's rows are the share of a window of the rows it
        # walked), before the other tiles (a GPU's, autotuned) are replayed.
        first, others = _tile_order()
        tries = [(m, tiles) for m in _MISTAKES[part] for tiles in (first if m.bug in _TILED else [None])]
        tries += [(None, None)] + [(m, tiles) for m in _MISTAKES[part] if m.bug in _TILED for tiles in others]
        for mistake, tiles in tries:
            if mistake is None:
                found = backward_walks.window_cause(part, case, inputs, name, got, first[0] if first else None)
                if found is not None:
                    return found
                continue
            try:
                variant = _backward64(case, inputs, mistake.bug, tiles)[index]
            except IndexError:  # a mistake that cannot happen for these heads
                continue
            err, bound = testing.gradient_error(got, variant, case.dtype)
            if err <= 2 * bound:
                return _mistake_text(mistake.cause, name, part), _mistake_text(mistake.hint, name, part)
        return None, _hint(part, name)

    return diagnose


# --------------------------------------------------------------------------
# Running the backward and comparing gradients
# --------------------------------------------------------------------------

# What the rows and the heads of each gradient are, for `where`.
_AXES = {"dQ": ("query rows", "query head"), "dK": ("keys", "KV head"), "dV": ("keys", "KV head")}


def _spans(indices) -> str:
    """'0-15, 32 and 34-39': a sorted list of indices as runs."""
    runs, start = [], None
    for a, b in zip(indices, indices[1:] + [None]):
        start = a if start is None else start
        if b != a + 1:
            runs.append(f"{start}" if start == a else f"{start}-{a}")
            start = None
    return runs[0] if len(runs) == 1 else ", ".join(runs[:-1]) + " and " + runs[-1]


def _where_wrong(name, got, ref, rel) -> str:
    """Which rows (queries or keys) and heads of a gradient hold a wrong entry, in words."""
    g, r = got.detach().to("cpu", torch.float64), ref.detach().to("cpu", torch.float64)
    scale = r.abs().mean().item() + 1e-12
    bad = ~((g - r).abs() <= rel * scale + rel * r.abs())  # NaN is wrong too
    rows_label, head_label = _AXES[name]
    rows = [int(i) for i in bad.any(3).any(1).any(0).nonzero().flatten()]
    heads = [int(i) for i in bad.any(3).any(2).any(0).nonzero().flatten()]
    n, n_heads = bad.shape[2], bad.shape[1]
    text = f"every one of the {n} {rows_label}" if len(rows) == n else f"{rows_label} {_spans(rows)} of {n}"
    if n_heads > 1:
        text += f", in every {head_label}" if len(heads) == n_heads else \
            f", in {head_label}{'s' if len(heads) > 1 else ''} {_spans(heads)} only"
    return text


def _check_gradients(part, cases, names, diagnose):
    """Run the backward on each case; the first gradient of ``names`` that is wrong stops the check.

    ``diagnose(case, inputs, name, got, ref)`` gives the (cause, hint) of a wrong gradient.
    """
    for case in cases:
        inputs = _inputs(case)
        q, k, v, do, o, lse = inputs
        grads = run_student("backward", api.flash_attention_backward, q, k, v, o, lse, do, causal=case.causal,
                            sm_scale=case.sm_scale, part=part)
        if not (isinstance(grads, tuple) and len(grads) == 3):
            raise Stop(fail("backward", part, "flash_attention_backward must return (dQ, dK, dV)"))
        refs = reference_gradients(q, k, v, do, causal=case.causal, sm_scale=case.sm_scale)
        for name in names:
            got, ref = grads[_GRADIENTS.index(name)], refs[_GRADIENTS.index(name)]
            shape = shape_problem(got, ref.shape, name)
            if shape:
                raise Stop(fail("backward", part, shape, where=f"case \"{case.name}\""))
            err, bound = testing.gradient_error(got, ref, case.dtype)
            if err <= bound:
                continue
            relative = (f"relative error {err / max(ref.norm().item(), 1e-12):.2g}, "
                        f"tolerance {testing.GRAD_TOLERANCE[case.dtype]:.0e}")
            rel = 10 * testing.GRAD_TOLERANCE[case.dtype]
            problem = _first_wrong(name, got, ref, rel, _LABELS[name])
            if problem is None:
                where = f"case \"{case.name}\": {name} is a little off everywhere, not at one entry ({relative})"
            else:
                where = (f"case \"{case.name}\": {name}, {at(problem)} ({relative}); wrong entries at "
                         f"{_where_wrong(name, got, ref, rel)}")
            factor = _factor(got, ref, case.dtype)
            if factor is not None:
                where += f"; every entry of {name} is {factor:.4g} times the right one"
            cause, hint = diagnose(case, inputs, name, got, ref)
            raise Stop(fail("backward", part, f"{name} does not match float64 autograd", where=where,
                            cause=cause, hint=hint))


# --------------------------------------------------------------------------
# The checks
# --------------------------------------------------------------------------

_MASKS = ((True, "causal"), (False, "no causal mask"))

# Each part's cases (length 40, head dim 16, fp32), then the whole backward's (part None).
_CASES = {
    1: [Case("GQA 2:1, causal, length 40, head dim 24 (padded to 32)", 1, n_q_heads=2, n_kv_heads=1, seq_len=40,
             head_dim=24),
        Case("GQA 2:1 in fp16, causal, length 40, head dim 64", 1, n_q_heads=2, n_kv_heads=1, seq_len=40,
             head_dim=64, dtype=torch.float16, seed=1)],
    2: [Case(f"MHA 2:2, {mask}, length 40", 2, n_q_heads=2, n_kv_heads=2, seq_len=40, causal=causal)
        for causal, mask in _MASKS],
    3: [Case("GQA 4:2, causal, length 40", 3, n_q_heads=4, n_kv_heads=2, seq_len=40),
        Case("MQA 4:1, no causal mask, length 40", 3, n_q_heads=4, n_kv_heads=1, seq_len=40, causal=False, seed=1)],
    4: [*(Case(f"GQA 4:2, {mask}, length 40", 4, n_q_heads=4, n_kv_heads=2, seq_len=40, causal=causal)
          for causal, mask in _MASKS),
        _VeryNegative("GQA 4:2, no causal mask, length 40, every score near -100", 4, n_q_heads=4, n_kv_heads=2,
                      seq_len=40, causal=False, seed=2)],
    None: [Case("GQA 4:2 in fp16, batch 2, length 33, head dim 32", None, batch=2, n_q_heads=4, n_kv_heads=2,
                seq_len=33, head_dim=32, dtype=torch.float16, seed=61),
           Case("MQA 4:1, no causal mask, length 45, head dim 80 (padded to 128), sm_scale 0.3, [B, N, H, D] "
                "layout", None, n_q_heads=4, n_kv_heads=1, seq_len=45, head_dim=80, causal=False, sm_scale=0.3,
                layout="bnhd", seed=62)],
}


@prints_verdict
def check_delta():
    """backward.py Part 1, alone: D = rowsum(dO * O), from the preprocess kernel, in fp32 and in fp16."""
    bwd = load("backward")
    for case in _CASES[1]:
        q, k, v, do, o, lse = _inputs(case)
        delta = torch.full(lse.shape, float("nan"), device=lse.device)
        block_m = 32 if runtime.INTERPRETER else 64
        grid = (triton.cdiv(q.shape[2], block_m), q.shape[1], q.shape[0])  # (query blocks, heads, batch)
        run_student("backward", lambda: bwd.backward_preprocess[grid](
            o, do, delta, *o.stride(), *do.stride(), q.shape[2], q.shape[1],
            HEAD_DIM=q.shape[-1], HEAD_DIM_PAD=max(16, triton.next_power_of_2(q.shape[-1])), BLOCK_M=block_m),
            part=1)
        expected = (o.double() * do.double()).sum(-1).cpu()
        problem = _first_wrong("D", delta, expected, 1e-4, ("batch", "query head", "row"))
        if problem is None:
            continue
        if bool((delta == 0).all()):
            cause, hint = "the placeholder is still there: D is all zeros", None
        elif case.dtype == torch.float16 and bool((delta == delta.half().float()).all()):
            cause, hint = DELTA_FP16, _DELTA_FP16_HINT
        else:
            cause, hint = None, (f"D_i is the sum over the head dim's {case.head_dim} real columns of dO times O, "
                                 "one number per row: look at the loads' addresses and their mask (rows below "
                                 "SEQ_LEN, columns below HEAD_DIM) and at the axis of the sum")
        where = f"case \"{case.name}\": {at(problem)}"
        if fmt(problem.got) == fmt(problem.expected):  # a difference in the last digits: show them
            where += f" (to 7 digits: got {problem.got:.7g}, expected {problem.expected:.7g})"
        return fail("backward", 1, "D does not match rowsum(dO * O) in float64", where=where, cause=cause, hint=hint)
    return Verdict(True, what_of("backward", 1), "right for every row, in fp32 (head dim 24, padded) and in fp16")


def _gradient_check(name, part, gradients, passed):
    """The check of Part ``part``: the ``gradients`` of each of its cases against float64 autograd."""

    def body():
        load("backward")
        _check_gradients(part, _CASES[part], gradients, _part_diagnosis(part))
        skipped = backward_walks.skip_verdict(part) if part in (2, 4) else None  # right, and no more work
        return skipped or Verdict(True, what_of("backward", part), passed)

    body.__name__ = body.__qualname__ = name
    body.__doc__ = (f"backward.py Part {part} ({PARTS['backward'][part]}): {' and '.join(gradients)} "
                    f"against float64 autograd, on {'; '.join(case.name for case in _CASES[part])}.")
    return prints_verdict(body)


check_dkdv = _gradient_check("check_dkdv", 2, ("dV", "dK"), "dK and dV match float64 autograd (MHA, causal and not), "
                             "and the causal walk skips the query blocks before the diagonal")
check_gqa_sum = _gradient_check("check_gqa_sum", 3, ("dV", "dK"), "dK and dV add up the whole group (GQA 4:2, MQA 4:1)")
check_dq = _gradient_check("check_dq", 4, ("dQ",), "dQ matches float64 autograd (GQA 4:2, causal and not), and the "
                           "causal walk skips the key blocks past the diagonal")
PART_CHECKS = (check_delta, check_dkdv, check_gqa_sum, check_dq)


@prints_verdict
def check_backward(part_verdicts=None):
    """backward.py, all of it: its four parts first, then dQ, dK and dV on two more cases."""
    load("backward")
    if part_verdicts is None:
        part_verdicts = [check.verdict() for check in PART_CHECKS]
    broken = next((v for v in part_verdicts if not v.ok), None)

    def diagnose(case, inputs, name, got, ref):
        if broken is not None:
            return f"{broken.what} fails its own check: {broken.cause or broken.message}", broken.hint
        return None, ("the four parts pass their own cases (batch 1, head dim 16, contiguous, the default "
                      "sm_scale), so look at what this case adds: the batch's offset in your loads, the padding "
                      "columns past the head dim, the strides of a [B, N, H, D] layout, an sm_scale that is not "
                      "1 / sqrt(head dim)")

    _check_gradients(None, _CASES[None], _GRADIENTS, diagnose)
    if broken is not None:  # right answers here, but a part is wrong where these cases do not look
        return fail("backward", None, f"the backward's answers are right on these cases, but {broken.what} "
                    "fails its own check", cause=broken.cause)
    return Verdict(True, "backward.py", "dQ, dK and dV match float64 autograd in every part's cases and in two "
                   "more: fp16, batch 2, MQA, head dim 80, sm_scale 0.3, [B, N, H, D] layout")
