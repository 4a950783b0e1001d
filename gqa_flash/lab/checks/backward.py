"""Notebook 06 (bonus): the checks of backward.py, the backward kernels with GQA.

Each check feeds your kernels *exact* forward results (O and the LSE of the
float64 reference), so a bug in your forward kernel cannot show up here, and
compares with float64 autograd (``reference_gradients``). A gradient passes
on its relative error, as in the graded tests (``testing.gradient_error``).

* Part 1, :func:`check_delta`: D = rowsum(dO * O), the preprocess kernel alone, in fp32 and in
  fp16 (where D must still be summed in fp32);
* Part 2, :func:`check_dkdv`: dK and dV with MHA (one query head per KV head,
  so Part 3 cannot matter yet), causal and not;
* Part 3, :func:`check_gqa_sum`: dK and dV with GQA 4:2 and MQA 4:1, where a
  KV head adds up what its whole group of query heads sends back;
* Part 4, :func:`check_dq`: dQ with GQA 4:2, causal and not, and with every score near -100 (where
  a key past the end that is not masked out of P turns dQ into NaN);
* :func:`check_backward`: the four parts, then all of backward.py on two more
  cases (fp16, batch 2, MQA, head dim 80, sm_scale, [B, N, H, D] layout).

A failure says where the first wrong entry is and the likely cause: a part
this one builds on failing its own check (dK and dQ use Part 1's D; the GQA
sum adds up Part 2's dK and dV), the placeholder, or one of the usual
mistakes, replayed in float64 by :func:`_backward64` and matched against
your output.
"""

import torch
import triton

from gqa_flash import api, runtime, testing
from gqa_flash.lab.checks.cases import LN2, LOG2E, Case
from gqa_flash.lab.checks.verdict import (
    PARTS, Stop, Verdict, at, fail, fmt, load, prints_verdict, run_student, shape_problem, what,
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


def _backward64(case: Case, inputs, bug=None, tiles=None):
    """dQ, dK, dV in float64, computed the way the kernels do, with at most one known bug.

    P is recomputed from the saved LSE, D = rowsum(dO * O), dS = P * (dP - D),
    and KV head j adds up what the query heads of its group send back. ``bug``
    is one of _MISTAKES' (it changes every kernel; a check compares only the
    gradient it is about). ``tiles``, the kernels' (BLOCK_M, BLOCK_N), matters
    only to "no_mask": without the mask, the future leaks in only where the
    causal loops still visit it, on the tiles that cross the diagonal.
    """
    q, k, v, do, o, lse = (t.detach().to("cpu", torch.float64) for t in inputs)
    n_q, n_kv, n = q.shape[1], k.shape[1], q.shape[2]
    group = n_q // n_kv
    delta = torch.zeros_like(lse) if bug == "no_delta" else (do * o).sum(-1)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]  # query row, key
    if not case.causal:
        hidden_dq = hidden_dkdv = torch.zeros(n, n, dtype=torch.bool)
    elif bug == "no_mask":
        bm, bn = tiles
        hidden_dq = j >= (i // bm + 1) * bm  # _backward_dq stops after the query tile's own keys
        hidden_dkdv = i < (j // bn * bn) // bm * bm  # _backward_dkdv starts at the key tile's first queries
    else:
        hidden_dq = hidden_dkdv = (j >= i) if bug == "mask_diag" else (j > i)

    def share(h, kv):
        """What query head h sends back through KV head kv: its dQ, and its parts of dK and dV."""
        s = (q[:, h] @ k[:, kv].transpose(-1, -2)) * case.scale
        p = torch.exp(s - lse[:, h, :, None])  # P, exactly, from the saved LSE
        if bug == "exp":  # exp(log2(e) * x) where exp2(log2(e) * x) = exp(x) belongs
            p = p ** LOG2E
        if bug == "lse_base":  # exp2(s * log2(e) - lse): the natural-log LSE taken for log2 units
            p = torch.exp(s - lse[:, h, :, None] * LN2)
        dp = do[:, h] @ v[:, kv].transpose(-1, -2)
        p_dq, p_dkdv = p.masked_fill(hidden_dq, 0.0), p.masked_fill(hidden_dkdv, 0.0)
        ds_dq, ds_dkdv = p_dq * (dp - delta[:, h, :, None]), p_dkdv * (dp - delta[:, h, :, None])
        return (ds_dq @ k[:, kv] * case.scale, ds_dkdv.transpose(-1, -2) @ q[:, h] * case.scale,
                p_dkdv.transpose(-1, -2) @ do[:, h])

    member = _GROUP_MEMBER.get(bug, _GROUP_MEMBER[None])
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for h in range(n_q):
        dq[:, h] = share(h, h // group)[0]
    for kv in range(n_kv):
        for g in range(group):
            h = member(kv, g, group, n_kv)
            if not 0 <= h < n_q:
                raise IndexError("this mistake reads a query head that does not exist")
            _, dk_h, dv_h = share(h, kv)
            dk[:, kv] += dk_h
            dv[:, kv] += dv_h
    return dq, dk, dv


# The kernels' (BLOCK_M, BLOCK_N) are fixed in the interpreter and autotuned on a GPU: a mistake
# whose replay depends on them ("no_mask") is tried with each of these.
_TILES = [(bm, bn) for bm in (16, 32, 64, 128) for bn in (16, 32, 64, 128)]


_LSE_BASE = ("the saved LSE is a natural log, but exp2 wants log2 units: P = exp2(S * qk_scale - lse2) needs "
             "lse2 = LSE * log2(e) (1.4426950408889634), as the given load of lse2 has it")
# Found without a replay: NaN in dQ where every score is near -100 (_VeryNegative).
NO_KEY_MASK = ("the keys past the end (offs_n >= SEQ_LEN) are not masked out of P: they load as zeros, so "
               "their score is 0, and with every real score near -100 (an LSE near -96) p = exp2(0 - lse2) "
               "overflows to inf, and inf times the zero key is NaN. Zero p where offs_n[None, :] >= SEQ_LEN, "
               "with or without the causal mask")
DELTA_FP16 = ("D is summed in fp16: every D is an fp16 number. O and dO are fp16 here, so o * do and its sum "
              "stay fp16 (rounded to 3 digits) unless you convert first: o.to(tl.float32) * do.to(tl.float32)")

_MISTAKES = {
    2: [
        ("no_mask", "the causal mask is missing from P^T: zero pT where a key comes after the query, "
                    "offs_n[:, None] > offs_m[None, :]"),
        ("mask_diag", "mask off by one: a query sees its own key (offs_n == offs_m): keep offs_n <= offs_m"),
        ("exp", "exp instead of exp2: the scores and lse2 are in log2 units, so pT = exp2(sT * qk_scale - lse2)"),
        ("lse_base", _LSE_BASE),
        ("no_delta", "D is left out of dS: the softmax's backward subtracts each query row's D from dP "
                     "before multiplying by P"),
        ("group_no_offset", "every KV head adds up the gradient of query head 0 (Part 3's q_head_idx): the h-th "
                            "query head of the group is kv_head_idx * group_size + h, even with MHA"),
    ],
    3: [
        ("group_placeholder", "the placeholder is still there: one query head is added group_size times; "
                              "the h-th head of KV head g's group is g times the group size, plus h"),
        ("group_first", "only the group's first query head is added (group_size times): the h-th head of KV "
                        "head g's group is g times the group size, plus h"),
        ("group_mod", "the query heads of a group are consecutive (forward Part 1), not dealt out in turn: the "
                      "h-th head of KV head g's group is g times the group size plus h, not h times N_KV_HEADS "
                      "plus g"),
        ("group_no_offset", "every KV head adds up query heads 0..group_size-1: start at its own group, "
                            "g times the group size"),
    ],
    4: [
        ("no_mask", "the causal mask is missing from P: zero p where offs_n[None, :] > offs_m[:, None], "
                    "or gradient leaks from the future"),
        ("mask_diag", "mask off by one: a query sees its own key (offs_n == offs_m): keep offs_n <= offs_m"),
        ("exp", "exp instead of exp2: the scores and lse2 are in log2 units, so p = exp2(s * qk_scale - lse2)"),
        ("lse_base", _LSE_BASE),
        ("no_delta", "D is left out of dS: subtract each query row's D from dP before multiplying by P"),
    ],
}


def _hint(part, name, causal):
    """Where to look when no known mistake matches."""
    if part == 2 and name == "dV":
        return "check P^T (recomputed with exp2 and the LSE in log2 units) and its mask"
    if part == 2:
        return "dV is right, so P^T is: check dS^T = P^T * (dP^T - D) and dK += dS^T Q"
    if part == 3:
        return "each KV head must add the gradients of its whole group: q_head = kv_head * group_size + h"
    if causal:
        return "is the causal mask applied to P before dS?"
    return "check dS = P * (dP - D) and dQ += dS K"


def _builds_on(part, name):
    """The parts whose results this gradient uses: D for dK and dQ, Part 2's dK and dV for the GQA sum."""
    return ([1] if name in ("dK", "dQ") else []) + ([2] if part == 3 else [])


def _part_diagnosis(part):
    """The likely cause of a wrong gradient in ``part``: (cause, hint)."""

    def diagnose(case, inputs, name, got):
        for needed in _builds_on(part, name):
            if not PART_CHECKS[needed - 1].verdict().ok:
                return f"Part {needed} ({PARTS['backward'][needed]}) fails its own check: fix it first", None
        if part != 3 and bool((got == 0).all()):
            return f"the placeholder is still there: {name} is all zeros", None
        if part == 4 and isinstance(case, _VeryNegative) and not bool(torch.isfinite(got).all()):
            return NO_KEY_MASK, None
        index = _GRADIENTS.index(name)
        for bug, text in _MISTAKES[part]:
            for tiles in _TILES if bug == "no_mask" else [None]:
                try:
                    variant = _backward64(case, inputs, bug, tiles)[index]
                except IndexError:  # a mistake that cannot happen for these heads
                    continue
                err, bound = testing.gradient_error(got, variant, case.dtype)
                if err <= 2 * bound:
                    return text, None
        return None, _hint(part, name, case.causal)

    return diagnose


# --------------------------------------------------------------------------
# Running the backward and comparing gradients
# --------------------------------------------------------------------------


def _check_gradients(part, cases, names, diagnose):
    """Run the backward on each case; the first gradient of ``names`` that is wrong stops the check.

    ``diagnose(case, inputs, name, got)`` gives the (cause, hint) of a wrong gradient.
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
            problem = _first_wrong(name, got, ref, 10 * testing.GRAD_TOLERANCE[case.dtype], _LABELS[name])
            where = (f"case \"{case.name}\": {name}, {at(problem)} ({relative})" if problem is not None else
                     f"case \"{case.name}\": {name} is a little off everywhere, not at one entry ({relative})")
            cause, hint = diagnose(case, inputs, name, got)
            raise Stop(fail("backward", part, f"{name} does not match float64 autograd", where=where,
                            cause=cause, hint=hint))


# --------------------------------------------------------------------------
# The checks
# --------------------------------------------------------------------------

_MASKS = ((True, "causal"), (False, "no causal mask"))

# Each part's cases (length 40, head dim 16, fp32), then the whole backward's (part None).
_CASES = {
    1: [Case("GQA 2:1, causal, length 40", 1, n_q_heads=2, n_kv_heads=1, seq_len=40),
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
        run_student("backward", lambda: bwd._backward_preprocess[grid](
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
            cause, hint = DELTA_FP16, None
        else:
            cause, hint = None, ("multiply dO and O elementwise in fp32 and sum over the head dim (axis 1): "
                                 "one number per row")
        where = f"case \"{case.name}\": {at(problem)}"
        if fmt(problem.got) == fmt(problem.expected):  # a difference in the last digits: show them
            where += f" (to 7 digits: got {problem.got:.7g}, expected {problem.expected:.7g})"
        return fail("backward", 1, "D does not match rowsum(dO * O) in float64", where=where, cause=cause, hint=hint)
    return Verdict(True, what("backward", 1), f"right for every row ({_CASES[1][0].name})")


def _gradient_check(name, part, gradients, passed):
    """The check of Part ``part``: the ``gradients`` of each of its cases against float64 autograd."""

    def check():
        load("backward")
        _check_gradients(part, _CASES[part], gradients, _part_diagnosis(part))
        return Verdict(True, what("backward", part), passed)

    check.__name__ = check.__qualname__ = name
    check.__doc__ = (f"backward.py Part {part} ({PARTS['backward'][part]}): {' and '.join(gradients)} "
                     f"against float64 autograd, on {'; '.join(case.name for case in _CASES[part])}.")
    return prints_verdict(check)


check_dkdv = _gradient_check("check_dkdv", 2, ("dV", "dK"), "dK and dV match float64 autograd (MHA, causal and not)")
check_gqa_sum = _gradient_check("check_gqa_sum", 3, ("dV", "dK"), "dK and dV add up the whole group (GQA 4:2, MQA 4:1)")
check_dq = _gradient_check("check_dq", 4, ("dQ",), "dQ matches float64 autograd (GQA 4:2, causal and not)")
PART_CHECKS = (check_delta, check_dkdv, check_gqa_sum, check_dq)


@prints_verdict
def check_backward(part_verdicts=None):
    """backward.py, all of it: its four parts first, then dQ, dK and dV on two more cases."""
    load("backward")
    if part_verdicts is None:
        part_verdicts = [check.verdict() for check in PART_CHECKS]
    broken = next((v for v in part_verdicts if not v.ok), None)

    def diagnose(case, inputs, name, got):
        if broken is not None:
            return f"{broken.what} fails its own check: {broken.cause or broken.message}", None
        return ("the four parts pass on their own, so look at what changed around them "
                "(the loads, the strides, the grids)"), None

    _check_gradients(None, _CASES[None], _GRADIENTS, diagnose)
    if broken is not None:  # right answers here, but a part is wrong where these cases do not look
        return fail("backward", None, f"the backward's answers are right on these cases, but {broken.what} "
                    "fails its own check", cause=broken.cause)
    return Verdict(True, "backward.py", "dQ, dK and dV match float64 autograd in every part's cases and in two "
                   "more: fp16, batch 2, MQA, head dim 80, sm_scale 0.3, [B, N, H, D] layout")
