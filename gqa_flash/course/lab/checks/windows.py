"""Notebook 04b (bonus): the checks of windows.py, one per part, and the whole file through the public API.

* Part 1, :func:`check_window_mask`: the mask on every (query block, key block) of a ragged sequence, for
  windows of 1, 5 and 20 keys, with and without sink tokens;
* Part 2, :func:`check_window_key_loop`: which key blocks each query tile visits (its Parts 1 and 4 replaced
  by recorders, as notebook 04's Part 3 check does), then the scores it computes;
* Part 3, :func:`check_sink_state`: the state before the first key, for real sinks, a sink of -inf and none;
* :func:`check_windows`: the parts' verdicts, forward.py on plain causal attention (windows.py runs on its
  helpers), then ``gqa_flash.flash_attention_forward(..., window=, sink_tokens=, sinks=)`` against the float64
  reference.

Each names the usual mistake its answer matches, replayed in float64 from the specification
(``gqa_flash.reference.visible``, and the sink's weight e^sink): a window one key too wide or too narrow or
measured from the tile's first row, sink tokens ignored or seen before their position, a loop from key 0, a sink
in the wrong units or left out of l_i, a running max that starts at -inf.
"""

import dataclasses
import math

import torch
import triton

from gqa_flash.course import api, testing
from gqa_flash.course.address_check import checked_addresses
from gqa_flash.course.lab.checks.cases import LN2, LOG2E
from gqa_flash.course.lab.checks.common import (
    PLACEHOLDER, Mistake, Verdict, at, fail, first_cause, fmt, load, prints_verdict, run_student, tol, what_of,
)
from gqa_flash.course.lab.checks.kernel_parts import check_mask_scores
from gqa_flash.course.lab.checks.kernel_walk import check_load_tile
from gqa_flash.course.lab.checks.probes import dev, launch_in, windows_parts
from gqa_flash.reference import reference_attention, visible

MODULE = "windows"
_BLOCKS = dict(BLOCK_M=32, BLOCK_N=16)


def _forward_part_first(check, what, cause):
    """(cause, hint) when forward.py's part that ``check`` checks fails it (this part takes ``what`` from it),
    unless this part's own ``cause`` is its placeholder; else None."""
    if cause and PLACEHOLDER in cause:
        return None
    verdict = check.verdict()
    if verdict.ok:
        return None
    return (f"{verdict.what} fails its own check ({verdict.message}), and this part takes {what} from it: what "
            "this check sees may be forward.py's mistake",
            f"make checks.{check.__name__}() (notebook 04) pass first, then re-run this cell")


def launch(part, kernel, grid, *args, **kwargs):
    """Launch a probe of windows.py; a crash in your helper becomes a FAIL of ``part``."""
    launch_in(MODULE, part, kernel, grid, *args, **kwargs)


def _seen(n_rows, n_keys, seq_len, window, sink_tokens, bug=None):
    """[rows, keys] bool: what row i sees, as the specification says (``bug``: one of the usual mistakes)."""
    i, j = torch.arange(n_rows)[:, None], torch.arange(n_keys)[None, :]
    if bug == "first_row":  # each tile's window measured from its first row
        i_window = i // _BLOCKS["BLOCK_M"] * _BLOCKS["BLOCK_M"]
    else:
        i_window = i
    edge = {"wide": j >= i_window - window, "narrow": j > i_window - window + 1}.get(bug, j > i_window - window)
    sinks = (j < sink_tokens) & ((j <= i) | (bug == "sinks_future"))
    causal = (j <= i) | (bug == "no_causal")
    seen = (edge & causal) | (torch.zeros_like(sinks) if bug == "no_sinks" else sinks)
    if bug == "no_window":
        seen = causal
    return seen & ((j < seq_len) | (bug == "no_tail"))


# --- Part 1 ------------------------------------------------------------------

_MASK_SEQ_LEN = 45
_MASK_CASES = [(5, 0), (5, 3), (20, 18), (1, 0)]  # (W, S)

_MASK_MISTAKES = [
    Mistake("wide", "the window is one key too wide: row {i} sees key {j} with W={w} (its W keys are "
                    "{lo}..{i})", "a row sees the keys k with k > i - W, its own included: W of them"),
    Mistake("narrow", "the window is one key too narrow: row {i} does not see key {j} with W={w} (its W keys "
                      "are {lo}..{i})", "a row sees the keys k with k > i - W, its own included: W of them"),
    Mistake("first_row", "the window is measured from the query tile's first row, not from each row: row {i} "
                         "sees key {j}, older than its window {lo}..{i}",
            "compare each key with each row (broadcast offs_m against offs_n), not with one row of the tile"),
    Mistake("no_sinks", "the sink tokens are masked like any key older than the window: row {i} does not see "
                        "sink token {j} (SINK_TOKENS={s})", "a key below SINK_TOKENS stays in sight, whatever the "
                                                            "window"),
    Mistake("sinks_future", "the sink tokens are seen before their position: row {i} sees sink token {j}, in its "
                            "future", "a sink token is seen by the rows at or after it only: the causal rule holds"),
    Mistake("no_causal", "the causal rule is missing: row {i} sees key {j}, in its future",
            "call forward.mask_scores with the causal mask on (CAUSAL=True) before the window's rule"),
    Mistake("no_tail", "keys past SEQ_LEN are visible: their K rows were loaded as 0, a score of 0, a real weight",
            "keep forward.mask_scores' rule: keys at or past SEQ_LEN are hidden"),
    Mistake("no_window", "the window is not applied: row {i} sees key {j}, older than its window {lo}..{i}",
            "hide the keys older than the row's window: k <= i - W, unless a sink token"),
]


def _mask64(s, window, sink_tokens, bug=None):
    n_rows, n_cols = s.shape
    seen = _seen(n_rows, n_cols, _MASK_SEQ_LEN, window, sink_tokens, None if bug == "zero" else bug)
    fill = 0.0 if bug == "zero" else float("-inf")
    return torch.where(seen, s.double(), torch.full_like(s, fill, dtype=torch.float64))


@prints_verdict
def check_window_mask():
    """windows.py Part 1, alone: the mask on every (query block, key block) of a ragged sequence."""
    win, probes = windows_parts()
    bm, bn, n = _BLOCKS["BLOCK_M"], _BLOCKS["BLOCK_N"], _MASK_SEQ_LEN
    size = triton.cdiv(n, bm) * bm
    cols = triton.cdiv(n, bn) * bn
    s = torch.randn(size, size, generator=torch.Generator().manual_seed(71)) + 3.0  # never 0: a mask to 0 shows
    for w, sink_tokens in _MASK_CASES:
        name = f"W={w}, {sink_tokens} sink tokens, SEQ_LEN {n}, BLOCK_M {bm}, BLOCK_N {bn}"
        out = torch.full((size, size), float("nan"), device=dev())
        launch(1, probes["window_mask"], (triton.cdiv(n, bm), triton.cdiv(n, bn)), s.to(dev()), out, n, w,
               sink_tokens, size, **_BLOCKS)
        got = out.cpu()[:n, :cols]  # rows past SEQ_LEN are never stored: not compared
        want = _mask64(s, w, sink_tokens)[:n, :cols]
        problem = testing.mismatch("scores", got, want, labels=("row", "key"), atol=0, rtol=1e-6)
        if problem is None:
            continue
        i, j = problem.index
        if torch.equal(got, s[:n, :cols]):
            cause, hint = "the placeholder is still there: nothing is masked", None
        else:
            found = first_cause(got, [(m, _mask64(s, w, sink_tokens, m.bug)[:n, :cols])
                                      for m in _MASK_MISTAKES + [Mistake("zero", "", None)]], atol=0, rtol=1e-6)
            if found is not None and found.bug == "zero":
                cause, hint = "masked scores are set to 0, not -inf: 2^0 = 1 still gives them weight", \
                    "a hidden score is -inf"
            elif found is not None:
                cause = found.cause.format(i=i, j=j, w=w, s=sink_tokens, lo=max(i - w + 1, 0))
                hint = found.hint
            else:
                cause, hint = None, None
        seen_got = "masked (-inf)" if math.isinf(problem.got) and problem.got < 0 else f"visible ({fmt(problem.got)})"
        expected = "masked (-inf)" if math.isinf(problem.expected) else "visible (the score unchanged)"
        cause, hint = (_forward_part_first(check_mask_scores, "the causal rule and the ragged tail", cause)
                       or (cause, hint))
        return fail(MODULE, 1, "masks the wrong scores",
                    where=f"case \"{name}\": query row {i}, key {j}: got {seen_got}, expected {expected}",
                    cause=cause, hint=hint)
    return Verdict(True, what_of(MODULE, 1), "each row sees the keys of its window, the sink tokens at or before "
                   "it, and nothing past SEQ_LEN: windows of 1, 5 and 20 keys, with and without sink tokens")


# --- Part 2 ------------------------------------------------------------------

_LOOP_SEQ_LEN, _LOOP_HEAD_DIM, _LOOP_QK_SCALE = 100, 128, 0.3
_LOOP_CASES = [(5, 0), (20, 18), (40, 3), (1, 1)]  # (W, S): short, sink blocks reached, long, the smallest


def _loop_inputs():
    """K [2, 2, N, D] contiguous, V with key j's value e_j in batch 1, head 1 ([B, N, H, D] seen as [B, H, N, D]),
    and the query rows (zeros past N)."""
    n, d, bm = _LOOP_SEQ_LEN, _LOOP_HEAD_DIM, _BLOCKS["BLOCK_M"]
    g = torch.Generator().manual_seed(81)
    k = torch.randn(2, 2, n, d, generator=g)
    v = torch.zeros(2, n, 2, d).transpose(1, 2)
    v[1, 1, torch.arange(n), torch.arange(n)] = 1.0
    q = torch.zeros(triton.cdiv(n, bm) * bm, d)
    q[:n] = 0.5 * torch.randn(n, d, generator=g)
    return q, k, v


def _run_loop(probes, q, k, v, w, sink_tokens, scores):
    n, d, bm = _LOOP_SEQ_LEN, _LOOP_HEAD_DIM, _BLOCKS["BLOCK_M"]
    rows = triton.cdiv(n, bm) * bm
    acc = torch.full((rows, d), float("nan"), device=dev())
    blocks = torch.full((rows,), float("nan"), device=dev())
    k_dev, v_dev = k.to(dev()), v.to(dev())  # .to keeps V's strides
    launch(2, probes["window_key_loop"], (rows // bm,), (q if scores else torch.zeros_like(q)).to(dev()), k_dev,
           v_dev, acc, blocks, n, 1, 1, _LOOP_QK_SCALE, w, sink_tokens, *k_dev.stride(), *v_dev.stride(),
           HEAD_DIM=d, SCORES=scores, **_BLOCKS)
    return acc.cpu()[:, :n], blocks.cpu()


def _span(first, last, n):
    return f"key block {first // _BLOCKS['BLOCK_N']} (keys {first}-{min(last, n - 1)})"


def _walk_problem(probes, q, k, v, w, sink_tokens):
    """(where, cause, hint) of the first query tile that walks the wrong key blocks, or None."""
    n, bm, bn = _LOOP_SEQ_LEN, _BLOCKS["BLOCK_M"], _BLOCKS["BLOCK_N"]
    acc, blocks = _run_loop(probes, q, k, v, w, sink_tokens, scores=False)
    if bool((blocks[:n] == 0).all()):
        return f"W={w}, {sink_tokens} sink tokens: no query tile visits a key block", \
            "the placeholder is still there: no key block is ever visited", \
            "walk the sink blocks, then the window's, with one Python range each"
    for tile in range(triton.cdiv(n, bm)):
        first, end = tile * bm, min((tile + 1) * bm, n)
        tile_name = f"query tile {tile} (rows {first}-{end - 1}), W={w}, {sink_tokens} sink tokens"
        counts = acc[first]  # with every query 0, every row of a tile records the same visits
        if not torch.isfinite(counts).all():
            return tile_name, "the state that comes back is not the one the updates left", \
                "return acc, l_i and m_i as forward.online_softmax_update leaves them"
        masked, unmasked = torch.div(counts, 1000, rounding_mode="floor"), counts.remainder(1000)
        seen = visible(torch.arange(first, end), torch.arange(n), True, w, sink_tokens)
        needed = torch.zeros(n, dtype=torch.bool)
        for b in range(0, n, bn):
            needed[b:b + bn] = seen[:, b:b + bn].any()
        visits = masked + unmasked
        oldest = max(first - w + 1, 0)
        if (visits > 1).any():
            j = int((visits > 1).nonzero()[0])
            cause = (f"{_span(j // bn * bn, j // bn * bn + bn - 1, n)} is visited twice"
                     + (": where the window reaches back into the sink blocks, a block is visited once, not in both "
                        "runs" if j < sink_tokens else ""))
            return tile_name, cause, "stop the sink blocks where the window's first block begins"
        extra = (visits > 0) & ~needed
        if extra.any():
            j = int(extra.nonzero()[0])
            span = _span(j // bn * bn, j // bn * bn + bn - 1, n)
            if j < oldest:
                cost = ("so the loop does the work of causal attention where a window needs O(W) keys a row"
                        if j < bn and not sink_tokens else "work no row needs")
                cause = (f"{span} is visited though no row of the tile sees it: its keys are older than the first "
                         f"row's window (keys {oldest} and up) and not sink tokens, {cost}")
                hint = ("start the window's run at the block holding the first row's oldest key, first row - W + "
                        "1 rounded down to a multiple of BLOCK_N, and walk the sink blocks apart")
            else:
                cause = f"{span} is visited though it lies past the tile's last row ({end - 1}): future keys only"
                hint = "stop at the end of the tile's rows or at SEQ_LEN, as forward.py's causal loop does"
            return tile_name, cause, hint
        missing = needed & (visits == 0)
        if missing.any():
            j = int(missing.nonzero()[0])
            span = _span(j // bn * bn, j // bn * bn + bn - 1, n)
            if j < sink_tokens:
                cause = f"{span} holds sink tokens the rows see, and is never visited"
                hint = "walk the blocks that hold sink tokens, from key 0, before the window's"
            elif j < oldest // bn * bn + bn:
                cause = (f"{span} holds the first row's oldest keys (from key {oldest}), and is never visited: the "
                         "window's run must start at the block that holds key first row - W + 1")
                hint = "round the first row's oldest key down to a multiple of BLOCK_N, not up"
            else:
                cause, hint = f"{span} holds keys the rows see, and is never visited", None
            return tile_name, cause, hint
        unmasked_wrong = (unmasked > 0) & ~seen.all(dim=0)
        if unmasked_wrong.any():
            j = int(unmasked_wrong.nonzero()[0])
            row = first + int((~seen[:, j]).nonzero()[0])
            return tile_name, (f"{_span(j // bn * bn, j // bn * bn + bn - 1, n)} is visited without Part 1's "
                               f"mask, though row {row} must not see key {j}"), "mask every block you visit"
    return None


def _score_problem(probes, q, k, v, w, sink_tokens):
    """(where, cause, hint) of the first wrong score the loop computed, or None."""
    n = _LOOP_SEQ_LEN
    acc, _ = _run_loop(probes, q, k, v, w, sink_tokens, scores=True)
    walk, _ = _run_loop(probes, q, k, v, w, sink_tokens, scores=False)
    visited = walk[:n] > 0
    s = q[:n].double() @ k[1, 1].double().T
    want = torch.where(visited, s * _LOOP_QK_SCALE, torch.zeros_like(s))
    got = acc[:n].double()
    problem = testing.mismatch("scores", got, want, labels=("query row", "key"), atol=1e-2, rtol=1e-2)
    if problem is None:
        return None
    where = at(problem)
    if testing.mismatch("scores", got, torch.where(visited, s, torch.zeros_like(s)), atol=1e-2, rtol=1e-2) is None:
        return where, "the scores are not multiplied by qk_scale: plain q·k, not the log2 units Part 4 expects", \
            "multiply q·kᵀ by qk_scale"
    sv = q[:n].double() @ v[1, 1].double().T * _LOOP_QK_SCALE
    if testing.mismatch("scores", got, torch.where(visited, sv, torch.zeros_like(s)), atol=1e-2, rtol=1e-2) is None:
        return where, "the scores are taken against the V tile: a score is a query row against a key row, from K", \
            "the scores are q·kᵀ, with the K tile of the same block"
    return where, None, None


@prints_verdict
def check_window_key_loop():
    """windows.py Part 2: which key blocks each query tile visits, each once, and the scores it computes.

    K is contiguous and V a [B, N, H, D] tensor seen as [B, H, N, D]: each has strides of its own."""
    win, probes = windows_parts()
    q, k, v = _loop_inputs()
    for w, sink_tokens in _LOOP_CASES:
        walk = _walk_problem(probes, q, k, v, w, sink_tokens)
        if walk is not None:
            where, cause, hint = walk
            cause, hint = _forward_part_first(check_load_tile, "its K and V tiles", cause) or (cause, hint)
            return fail(MODULE, 2, "walks the wrong key blocks", where=f"SEQ_LEN {_LOOP_SEQ_LEN}, BLOCK_M "
                        f"{_BLOCKS['BLOCK_M']}, BLOCK_N {_BLOCKS['BLOCK_N']}: {where}", cause=cause, hint=hint)
    for w, sink_tokens in _LOOP_CASES[:2]:
        scores = _score_problem(probes, q, k, v, w, sink_tokens)
        if scores is not None:
            where, cause, hint = scores
            cause, hint = _forward_part_first(check_load_tile, "its K and V tiles", cause) or (cause, hint)
            return fail(MODULE, 2, "computes the wrong scores", where=f"W={w}, {sink_tokens} sink tokens: {where}",
                        cause=cause, hint=hint)
    return Verdict(True, what_of(MODULE, 2), "each query tile visits the key blocks some row of it sees, once each, "
                   "and no other (windows of 1 to 40 keys, sink blocks near and far); the scores are q·kᵀ times "
                   "qk_scale")


# --- Part 3 ------------------------------------------------------------------

_STATE = dict(BLOCK_M=16, HEAD_DIM_PAD=16)
_SINKS = [1.5, -2.0, float("-inf"), 0.0, 7.0]
_FLOOR_MAX = -1e4  # where there is no sink, m_i must sit far below any real score (in log2 units)


def _state(probes, sinks, has_sinks):
    bm, dp = _STATE["BLOCK_M"], _STATE["HEAD_DIM_PAD"]
    heads = len(sinks)
    acc = torch.full((heads * bm, dp), float("nan"), device=dev())
    l_i, m_i = (torch.full((heads * bm,), float("nan"), device=dev()) for _ in range(2))
    launch(3, probes["sink_state"], (heads,), torch.tensor(sinks, dtype=torch.float32, device=dev()), acc, l_i, m_i,
           HAS_SINKS=has_sinks, **_STATE)
    return acc.cpu().double(), l_i.cpu().double(), m_i.cpu().double()


def _sink_cause(sink, l, m):
    """(cause, hint) of a wrong state for a row whose sink is ``sink`` (None: no sinks), or (None, None)."""
    weight = l * 2.0 ** m if not math.isnan(m) else float("nan")
    if l == 0 and m == float("-inf") and sink is not None and math.isfinite(sink):  # a real sink left out, too
        return "the placeholder is still there: m_i = -inf, l_i = 0, forward.py's start, with no sink and no floor", \
            None
    if sink is None or sink == float("-inf"):
        if m == float("-inf"):
            return ("m_i starts at -inf where there is no sink: a row whose first visited block holds no key it "
                    "sees computes 2^(-inf - (-inf)) = NaN in forward.py's update"), \
                "start m_i at a finite floor far below any score (such as -1e30), raised to the sink where one is"
        if sink is None and (math.isnan(m) or math.isnan(l)):
            return "SINKS is read though HAS_SINKS is False: there is no sink tensor then", \
                "read SINKS only under HAS_SINKS (a Python `if`, resolved at compile time)"
        return None, None
    if weight == 0 or l == 0:
        if abs(m - sink * LOG2E) < 1e-3:
            return "the sink raises m_i but is not folded into l_i: its column has no weight", \
                "l_i starts as the sink's weight against m_i: 2^(sink * log2(e) - m_i)"
        return "the sink is not folded in: its column has no weight", "fold the sink into l_i (and so into m_i)"
    if abs(weight - 2.0 ** sink) <= 1e-5 * 2.0 ** sink:
        return "the sink is taken in log2 units: a raw logit is in natural-log units, as a score before qk_scale", \
            "multiply the sink by log2(e), and by nothing else (no sm_scale)"
    if sink != 0 and weight > 0 and math.isfinite(weight):
        factor = math.log(weight) / sink
        return (f"the sink's column weighs e^({factor:.4g} * sink), not e^sink: a factor too many in its units"), \
            "the sink in log2 units is the raw logit times log2(e), nothing else"
    return None, None


@prints_verdict
def check_sink_state():
    """windows.py Part 3, alone: the state before the first key, the learned sink folded in."""
    win, probes = windows_parts()
    bm = _STATE["BLOCK_M"]
    for has_sinks, sinks in ((True, _SINKS), (False, [float("nan")] * 2)):
        acc, l_i, m_i = _state(probes, sinks, has_sinks)
        for head, sink in enumerate(sinks):
            row = head * bm
            l, m = float(l_i[row]), float(m_i[row])
            sink = sink if has_sinks else None
            name = f"HAS_SINKS={has_sinks}" + (f", query head {head}'s sink {fmt(sink)}" if has_sinks else "")
            rows = slice(row, row + bm)
            same = all(torch.allclose(x[rows], x[row].expand(bm), rtol=0, atol=0, equal_nan=True) for x in (l_i, m_i))
            want = 0.0 if sink is None or sink == float("-inf") else math.exp(sink)
            weight = l * 2.0 ** m if not math.isnan(m) else float("nan")
            right = (same and math.isfinite(m) and bool((acc[rows] == 0).all())
                     and (abs(weight - want) <= 1e-5 * want if want else weight == 0 and m <= _FLOOR_MAX))
            if right:
                continue
            where = f"{name}: l_i = {fmt(l)}, m_i = {fmt(m)}, so the sink's column weighs l_i * 2^m_i = " \
                    f"{fmt(weight)}, where e^sink = {fmt(want)}"
            if not bool((acc[rows] == 0).all()) and math.isfinite(m):
                return fail(MODULE, 3, "acc does not start at 0", where=f"{name}",
                            cause="the sink's value is zero: it adds nothing to acc", hint="acc starts as zeros")
            if not same:
                return fail(MODULE, 3, "the rows of one head start in different states", where=name,
                            cause="every row of a query head has the same sink", hint=None)
            cause, hint = _sink_cause(sink, l, m)
            if cause is None and want == 0 and math.isfinite(m) and m > _FLOOR_MAX:
                cause = (f"m_i starts at {fmt(m)} where there is no sink: not far enough below the scores, so a row "
                         "whose scores all lie below it sums terms that underflow to 0")
                hint = "a floor such as -1e30"
            return fail(MODULE, 3, "the state before the first key is wrong", where=where, cause=cause, hint=hint)
    return Verdict(True, what_of(MODULE, 3), "each row starts with its sink's column folded in (l_i * 2^m_i = "
                   "e^sink), m_i finite, acc 0; a sink of -inf and no sinks weigh nothing")


PART_CHECKS = (check_window_mask, check_window_key_loop, check_sink_state)


# --- the whole file ------------------------------------------------------------


def _attention64(q, k, v, sm_scale, seen, sinks):
    """O and LSE in float64 with ``seen`` [N, N] and learned ``sinks`` (or None): a model of a mistake."""
    q, k, v = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
    idx = torch.arange(q.shape[1]) // (q.shape[1] // k.shape[1])
    s = (q @ k[:, idx].transpose(-1, -2) * sm_scale).masked_fill(~seen, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.double().cpu()[:, None, None].expand(*s.shape[:-1], 1)], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    return p[..., :k.shape[2]] @ v[:, idx], lse


def _whole_mistakes(q, k, v, sm_scale, w, sink_tokens, sinks):
    """(Mistake, its (O, LSE)) of the usual mistakes of the whole file, each named with its part."""
    n = q.shape[2]
    scale = sm_scale if sm_scale is not None else q.shape[-1] ** -0.5

    def model(bug=None, sinks=sinks):
        return lambda: _attention64(q, k, v, scale, _seen(n, n, n, w, sink_tokens, bug), sinks)

    out = [(Mistake("wide", f"the window is one key too wide: W + 1 = {w + 1} keys a row", None, 1), model("wide")),
           (Mistake("narrow", f"the window is one key too narrow: W - 1 = {w - 1} keys a row", None, 1),
            model("narrow")),
           (Mistake("first_row", "the window is measured from the query tile's first row, not from each row",
                    None, 1), model("first_row")),
           (Mistake("no_sinks", "the sink tokens are hidden like any key older than the window", None, 1),
            model("no_sinks")),
           (Mistake("no_causal", "a row sees its future: the causal rule is missing", None, 1), model("no_causal"))]
    if sinks is not None:
        out += [(Mistake("ln", "the sink is taken in log2 units (no log2(e))", None, 3), model(sinks=sinks * LN2)),
                (Mistake("scaled", "the sink is multiplied by sm_scale, as a score is: it is a raw logit", None, 3),
                 model(sinks=sinks * scale)),
                (Mistake("not_in_l", "the sink is not folded into l_i: O and the LSE are those of no sink", None, 3),
                 model(sinks=None))]
    return out


def _whole_cases():
    """(name, random_qkv's keywords, W, S, learned sinks?, sm_scale)."""
    return [
        ("GQA 4:2, N 70, W 5, 3 sink tokens, learned sinks (head 0's -inf), fp32",
         dict(n_q_heads=4, n_kv_heads=2, seq_len=70, head_dim=32, seed=91), 5, 3, True, None),
        ("GQA 4:1, N 45, head dim 80, W 20, no sinks, fp16",
         dict(n_q_heads=4, n_kv_heads=1, seq_len=45, head_dim=80, dtype=torch.float16, seed=92), 20, 0, False, None),
        ("MHA 2:2, N 50, W 9, 20 sink tokens, learned sinks, sm_scale 0.3",
         dict(n_q_heads=2, n_kv_heads=2, seq_len=50, head_dim=32, seed=93), 9, 20, True, 0.3),
    ]


def _forward_problem():
    """A failing verdict when forward.py is wrong on plain causal attention (windows.py runs on its helpers)."""
    q, k, v = testing.random_qkv(n_q_heads=4, n_kv_heads=2, seq_len=40, head_dim=32, seed=95)
    out = run_student("forward", lambda: api.flash_attention_forward(q, k, v), part=None)
    problem = testing.mismatch("O", out, reference_attention(q, k, v)[0], **tol(q.dtype))
    if problem is None:
        return None
    return fail(MODULE, None, "not run yet: your forward.py is wrong on plain causal attention, and windows.py runs "
                "on its helpers", where=f"forward.py: {problem}",
                hint="make checks.check_forward() (notebook 04) pass first, then re-run this cell")


@prints_verdict
def check_windows(part_verdicts=None):
    """windows.py, the whole of it: the three parts, forward.py, then flash_attention_forward with a window and
    sinks on three cases against the float64 reference."""
    load(MODULE)
    part_verdicts = part_verdicts if part_verdicts is not None else [c.verdict() for c in PART_CHECKS]
    for part, verdict in enumerate(part_verdicts, start=1):
        if not verdict.ok:  # the part's own findings, under its name: the kernel runs every part
            return dataclasses.replace(verdict, what=what_of(MODULE, part),
                                       message=f"not run yet: Part {part} fails its own check: {verdict.message}")
    problem = _forward_problem()
    if problem is not None:
        return problem
    for name, inputs, w, sink_tokens, learned, sm_scale in _whole_cases():
        q, k, v = testing.random_qkv(**inputs)
        sinks = None
        if learned:
            sinks = torch.randn(q.shape[1], generator=torch.Generator().manual_seed(inputs["seed"])) * 2
            sinks[0] = float("-inf") if q.shape[1] > 2 else sinks[0]
        options = dict(window=w, sink_tokens=sink_tokens, sinks=None if sinks is None else sinks.to(q.device))

        def run():
            with checked_addresses():
                return api.flash_attention_forward(q, k, v, sm_scale=sm_scale, return_lse=True, **options)

        out, lse = run_student(MODULE, run, part=2)
        ref, ref_lse = reference_attention(q, k, v, True, sm_scale, window=w, sink_tokens=sink_tokens, sinks=sinks)
        problem = testing.mismatch("O", out, ref, **tol(q.dtype)) or testing.mismatch(
            "LSE", lse, ref_lse, labels=("batch", "head", "row"), **testing.LSE_TOLERANCE)
        if problem is None:
            continue
        found = first_cause((out, lse), _whole_mistakes(q, k, v, sm_scale, w, sink_tokens, sinks), **tol(q.dtype))
        if found is not None:
            return fail(MODULE, found.part, f"{problem.name} of flash_attention_forward with a window does not "
                        "match the float64 reference", where=f"case \"{name}\": {at(problem)}",
                        cause=f"{found.cause}; this part passes its own check, so look at what the kernel's call "
                              "gives it that the check did not", hint=None)
        return fail(MODULE, None, f"{problem.name} of flash_attention_forward with a window does not match the "
                    "float64 reference", where=f"case \"{name}\": {at(problem)}",
                    cause="the three parts pass their own checks, but not together",
                    hint="look at what your helpers assume that the kernel's call does not give them")
    return Verdict(True, what_of(MODULE), "flash_attention_forward with sliding windows, sink tokens and learned "
                   "sinks matches the float64 reference: GQA 4:2, 4:1 and MHA, fp32 and fp16, O and the LSE")
