"""Notebook 06 (bonus): the walks of backward.py's kernels, and whether the tiny model can train yet.

* :func:`window_cause`: the likely cause of a wrong dV (Part 2) or dQ (Part 4) whose every program's block
  is the sum over a window of the rows it walks: which rows the walk left out, found from your output
  (any start or stop, however it was computed), not from a list of replayed mistakes.
* :func:`skip_verdict`: Part 2's and Part 4's causal walks, counted as the graded test counts them
  (``tile_counts.backward_score_tiles_per_program``): right gradients from a walk over every block are a FAIL.
* :func:`why_not_train`: why notebook 06's training cannot run the course's kernels yet (the forward is
  what every step calls first), or None.
"""

import math

import torch

from gqa_flash.course import api, integrity, testing, tile_counts
from gqa_flash.course.lab.checks.cases import Case
from gqa_flash.course.lab.checks.common import Stop, fail, load, run_student
from gqa_flash.reference import reference_attention

# Block sizes to try for a program's rows when the kernels' own are not known (on a GPU, autotuned): the
# largest first, since a window that fits a block fits each of its parts too.
_BLOCKS = (128, 64, 32, 16)

LATE_HINT = ("start at the query block that holds the key block's first key: that key's index rounded down to a "
             "multiple of BLOCK_M")
DKDV_END_HINT = "run the walk to SEQ_LEN: every query from the key block's diagonal on sees some of its keys"
DQ_START_HINT = "start the walk at key block 0: every query sees the first keys"
DQ_END_HINT = ("the last key a row sees is its own: stop after the key block that holds this query block's last "
               "row, (q_block_idx + 1) * BLOCK_M, or SEQ_LEN if that comes first")


def _contributions(case: Case, inputs, name):
    """[B, H, output rows, walked rows, D] float64: what each row a program walks adds to each row of ``name``.

    dV: key j gets P_ij dO_i from query i (summed over the group's query heads); dQ: query i gets
    sm_scale dS_ij K_j from key j. Zero where the causal mask hides the pair, so a walk that only visits more
    pairs than it needs adds nothing."""
    q, k, v, do, o, lse = (t.detach().to("cpu", torch.float64) for t in inputs)
    group, n = q.shape[1] // k.shape[1], q.shape[2]
    kv_of = torch.arange(q.shape[1]) // group
    s = (q @ k[:, kv_of].transpose(-1, -2)) * case.scale
    p = torch.exp(s - lse[..., None])
    if case.causal:
        p = p.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), 0.0)
    if name == "dV":  # [B, Hq, j, i, D] summed over each group into [B, Hkv, j, i, D]
        share = p.transpose(-1, -2)[..., None] * do[:, :, None, :, :]
        return share.unflatten(1, (k.shape[1], group)).sum(2)
    ds = p * (do @ v[:, kv_of].transpose(-1, -2) - (do * o).sum(-1)[..., None])
    return ds[..., None] * k[:, kv_of][:, :, None, :, :] * case.scale


def _windows(contrib, got, block, dtype):
    """Per block of ``block`` output rows, the window [s, e) of walked rows whose shares add up to ``got``'s
    rows there, within twice the gradient's tolerance; None when some block has no such window."""
    g = got.detach().to("cpu", torch.float64)
    n_walk = contrib.shape[3]
    cum = torch.cat([torch.zeros_like(contrib[:, :, :, :1]), contrib.cumsum(3)], dim=3)
    s_idx, e_idx = torch.arange(n_walk + 1)[:, None], torch.arange(n_walk + 1)[None, :]
    found = []
    for lo in range(0, contrib.shape[2], block):
        c = cum[:, :, lo:lo + block]
        sums = c[:, :, :, None, :, :] - c[:, :, :, :, None, :]  # [..., s, e, D]: rows s..e-1 walked
        err = ((sums - g[:, :, lo:lo + block, None, None, :]) ** 2).sum(dim=(0, 1, 2, 5)).sqrt()
        err = err.masked_fill(e_idx < s_idx, float("inf"))
        right = c[:, :, :, -1] - c[:, :, :, 0]
        bound = 2 * (testing.GRAD_TOLERANCE[dtype] * right.norm().item()
                     + testing.GRAD_ABS_FLOOR[dtype] * right.numel() ** 0.5)
        best = int(err.argmin())
        if not float(err.flatten()[best]) <= bound:
            return None
        wrong = not float(err[0, n_walk]) <= bound  # the whole walk (right, the mask zeroes the rest) misses
        found.append((lo, min(lo + block, contrib.shape[2]), best // (n_walk + 1), best % (n_walk + 1), wrong))
    return found


def window_cause(part, case: Case, inputs, name, got, tiles=None):
    """(cause, hint) when ``name`` (Part 2's dV, Part 4's dQ) is what a walk over a window of rows per program
    gives, and some program's window leaves out rows it needs; else None. ``tiles``: the kernels' (BLOCK_M,
    BLOCK_N) when known (in the interpreter); else every size of _BLOCKS is tried for a program's rows."""
    if (part, name) not in ((2, "dV"), (4, "dQ")):
        return None
    own_block = tiles[0 if part == 4 else 1] if tiles else None
    contrib = _contributions(case, inputs, name)
    n = contrib.shape[3]
    for block in ([own_block] if own_block else []) + [b for b in _BLOCKS if b != own_block]:
        found = _windows(contrib, got, block, case.dtype)
        if found is None:
            continue
        for lo, hi, s, e, wrong in found:
            mask = " under the causal mask" if case.causal else ""
            if part == 2:  # key block lo..hi-1: queries lo..n-1 see it (every query without the mask)
                need_lo, need_hi, walked = (lo if case.causal else 0), n, "queries"
                block_text = f"key block {lo // block} (keys {lo}-{hi - 1}, in blocks of {block})"
                needs = f"queries {need_lo}-{need_hi - 1} see its keys{mask}"
                hints = (LATE_HINT, DKDV_END_HINT)
            else:  # query block lo..hi-1: keys 0..hi-1 (every key without the mask)
                need_lo, need_hi, walked = 0, (hi if case.causal else n), "keys"
                block_text = f"query block {lo // block} (rows {lo}-{hi - 1}, in blocks of {block})"
                needs = f"its rows see keys {need_lo}-{need_hi - 1}{mask}"
                hints = (DQ_START_HINT, DQ_END_HINT)
            late, early = s > need_lo, e < need_hi
            if not wrong or not (late or early):
                continue
            missed = [f"{a}-{b - 1}" if b - 1 > a else f"{a}"
                      for a, b in ((need_lo, min(s, need_hi)), (max(e, need_lo), need_hi)) if b > a]
            how = " and ".join(w for w, m in (("starts late", late), ("stops early", early)) if m)
            share = f"the share of {walked} {s}-{e - 1} only" if e > s else f"no share of any {walked[:-1]}"
            cause = (f"the walk over {walked} {how}: {block_text} gets {share}, but {needs}, so {walked} "
                     f"{' and '.join(missed)} are left out")
            return cause, "; ".join(h for h, m in zip(hints, (late, early)) if m)
    return None


# --------------------------------------------------------------------------
# The causal skip, counted
# --------------------------------------------------------------------------

SKIP_CAUSE = {
    2: ("under the causal mask the walk over query blocks starts before the key block's diagonal: the query "
        "blocks before it end before the key block's first key, so the mask zeroes every probability they bring. "
        "The gradients are right, but those blocks are loaded and computed for nothing (about twice the work)"),
    4: ("under the causal mask the walk over key blocks runs past the query block's diagonal: the key blocks after "
        "it start after the block's last row, so the mask zeroes every probability they bring. The gradients are "
        "right, but those blocks are loaded and computed for nothing (about twice the work)"),
}
_SKIP_CASE = dict(seq_len=100, head_dim=64, n_q_heads=1, n_kv_heads=1)
RIGHT = {"gradients_right": True}  # a skip verdict's extra: the part's gradients are right (a later part's may not be)


def skip_verdict(part):
    """A FAIL verdict when Part ``part``'s (2: dK/dV, 4: dQ) causal walk computes blocks past the diagonal, as the
    graded test counts them (length 100, head dim 64, one head, causal), or when it computes no score tile with
    tl.dot; else None."""
    loaded = getattr(load("backward"), "__file__", None)

    def count():  # the course's harness; only the backward call inside it is the student's, under own_work
        return tile_counts.backward_score_tiles_per_program(
            causal=True, guard=lambda: integrity.own_work("backward", file=loaded), **_SKIP_CASE)

    counts, config = run_student("backward", count, part=part)
    problem = tile_counts.backward_walk_problem(counts, config, _SKIP_CASE["seq_len"], 1, 1, parts=(part,))
    if problem is None:
        return None
    right = "dK and dV are right" if part == 2 else "dQ is right"
    if problem["kind"] == "none":
        return fail("backward", part, f"{right}, but the graded test counts no score tile", where=problem["where"],
                    hint=problem["fix"], extra=dict(RIGHT))
    return fail("backward", part, f"{right}, but the causal walk visits blocks the causal mask hides entirely",
                where=problem["where"], cause=SKIP_CAUSE[part], hint=problem["fix"], extra=dict(RIGHT))


# --------------------------------------------------------------------------
# Training: the forward runs first
# --------------------------------------------------------------------------

# The tiny model's attention, as notebook 06 trains it on a CPU: GQA 4:2, head dim 8, 12 tokens, Q, K and V
# transposed views of one projection. Its 12 tokens fit in one key block, so a second case spans several:
# a forward that is right on one block only (a running max never rescaled, a second phase that is off) is
# not done, though the tiny model would not show it.
MODEL_CASE = Case("the tiny model's attention: GQA 4:2, causal, length 12, head dim 8, [B, N, H, D] layout",
                  None, batch=2, n_q_heads=4, n_kv_heads=2, seq_len=12, head_dim=8, layout="bnhd", seed=6)
BLOCKS_CASE = Case("several query and key blocks: GQA 4:2, causal, length 50, head dim 8, [B, N, H, D] layout",
                   None, batch=1, n_q_heads=4, n_kv_heads=2, seq_len=50, head_dim=8, layout="bnhd", seed=7)


def why_not_train():
    """Why notebook 06 cannot train with the course's kernels yet, or None.

    Training calls the forward kernel first (every step's forward pass), so forward.py must be done: the
    parts that compute addresses must pass their checks (a wrong address can crash Python on a CPU), and the
    whole kernel must match the reference on the model's own shapes and on several blocks. The backward is not
    checked here: the loss curves say whether its gradients are right."""
    from gqa_flash.course.lab.checks.kernel import why_not_run_forward

    not_done = "forward.py is not done yet, and every training step calls it first (the forward pass)"
    reason = why_not_run_forward()
    if reason is not None:
        return f"{not_done}: {reason}"
    try:
        load("forward")
    except Stop as stop:
        return f"{not_done}: {stop.verdict.headline()}"
    for case in (MODEL_CASE, BLOCKS_CASE):
        q, k, v = case.qkv()
        try:
            out = run_student("forward", api.flash_attention_forward, q, k, v, causal=True)
        except Stop as stop:
            return f"{not_done}: {stop.verdict.headline()}"
        ref, _ = reference_attention(q, k, v, causal=True)
        problem = testing.mismatch("O", out, ref, **testing.TOLERANCES[q.dtype])
        if problem is not None:
            return (f"{not_done}: on {case.name}, its output does not match the reference ({problem}); finish "
                    "it in notebook 04 (checks.check_forward()) first")
    return None


def training_verdict(losses_sdpa, losses_course, tolerance=1e-3):
    """The last cell's verdict on the two loss curves (one line)."""
    gap = max((abs(a - b) for a, b in zip(losses_sdpa, losses_course)), default=math.inf)
    if gap < tolerance:
        return "PASS: the two loss curves agree at every step"
    return ("FAIL: the loss curves part ways; the forward matches the reference on the model's shapes, so look at "
            "the backward: checks.check_backward() above names the part")
