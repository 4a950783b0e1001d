"""Notebook 01: the check of naive.py, attention straight from its definition (Parts 1-3).

One check runs the whole function on seven cases, each built to isolate one
part (MHA without a mask for Part 3, causal for Part 2, GQA and MQA for Part
1, then fp16 and strided inputs). On a wrong answer it replays the usual
mistakes in float64 (:func:`naive64`) and names the one your output matches.
"""

import torch

from gqa_flash import api, testing
from gqa_flash.lab.checks.cases import Case, kv_index, where_attention
from gqa_flash.lab.checks.verdict import (
    Stop, Verdict, fail, first_cause, load, prints_verdict, run_student, shape_problem, tol, what,
)
from gqa_flash.reference import reference_attention


def naive64(q, k, v, causal, sm_scale, kv="div", mask="future", scale="mul", softmax="keys"):
    """Attention in float64 with one known mistake switched on (the defaults are right)."""
    q, k, v = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
    idx = kv_index(q.shape[1], k.shape[1], kv)
    k, v = k[:, idx], v[:, idx]
    s = q @ k.transpose(-1, -2)
    s = {"mul": s * sm_scale, "none": s, "div": s / sm_scale}[scale]
    if causal and mask != "none":
        n = q.shape[2]
        ones = torch.ones(n, n, dtype=torch.bool)
        hide = {"future": ones.triu(1), "diag": ones.triu(0), "past": ones.tril(-1), "tril0": ones.tril(0),
                "tril1": ones.tril(1)}.get(mask, ones.triu(1))
        s = s.masked_fill(hide, 0.0 if mask == "zero" else float("-inf"))
    if softmax == "queries":
        p = torch.softmax(s, dim=-2)
    elif softmax == "unnormalised":
        p = torch.exp(s - s.amax(dim=-1, keepdim=True))
    else:
        p = torch.softmax(s, dim=-1)
    return p @ v


_NAIVE_CASES = [
    Case("one head, no mask", (2, 3), causal=False),
    Case("one head, causal", 2, causal=True, seed=1),
    Case("GQA, 8 query heads on 2 KV heads, causal", 1, n_q_heads=8, n_kv_heads=2, seed=2),
    Case("GQA, 6 query heads on 3 KV heads, no mask", 1, n_q_heads=6, n_kv_heads=3, causal=False, seed=3),
    Case("MQA, 4 query heads on 1 KV head", 1, n_q_heads=4, n_kv_heads=1, seed=4),
    Case("fp16, batch 2, length 13", None, batch=2, n_q_heads=4, n_kv_heads=2, seq_len=13,
         dtype=torch.float16, seed=5),
    Case("strided inputs (every dimension)", None, n_q_heads=4, n_kv_heads=2, seq_len=12,
         layout="strided", seed=6),
]

# (part, the switches of naive64 that replay the mistake, what to tell the student[, the fix])
_NAIVE_MISTAKES = [
    (1, dict(kv="mod"), "% instead of //: query head h reads KV head h // (n_q_heads // n_kv_heads) "
                        "(consecutive query heads share one KV head); h % n_kv_heads deals them out in turn"),
    (1, dict(kv="div_kv"), "divided by n_kv_heads: divide by the group size, n_q_heads // n_kv_heads"),
    (1, dict(kv="zero"), "every query head reads KV head 0"),
    (2, dict(scale="none"), "the scores are not scaled: multiply Q K^T by sm_scale"),
    (2, dict(scale="div"), "the scores are divided by sm_scale: multiply by it (it already is 1/sqrt(head_dim))"),
    (2, dict(mask="none"), "the causal mask is missing: with causal=True, query i must not see keys j > i"),
    (2, dict(mask="diag"), "mask off by one: the diagonal (key j == query i) stays visible; "
                           "mask with triu(diagonal=1), not triu(diagonal=0)"),
    (2, dict(mask="past"), "the mask is transposed: it hides the past (j < i) instead of the future (j > i)"),
    (2, dict(mask="tril1"), "the mask is the lower triangle (tril), not the upper: it hides the past, the diagonal "
                            "and the key just after it, and keeps the rest of the future visible",
     "mark the future, the triangle above the diagonal, with triu"),
    (2, dict(mask="tril0"), "the mask is the lower triangle (tril), not the upper: it hides the past and the "
                            "diagonal, and keeps the future visible",
     "mark the future, the triangle above the diagonal, with triu"),
    (2, dict(mask="zero"), "masked scores are set to 0, not -inf: exp(0) = 1 still gives the future a weight"),
    (3, dict(softmax="queries"), "softmax over the wrong dimension: normalise each row over the keys (dim=-1)"),
    (3, dict(softmax="unnormalised"), "the probabilities are not normalised: divide by the row sums "
                                      "(or use torch.softmax)"),
]


@prints_verdict
def check_naive():
    """naive.py, Parts 1-3: the whole function on cases that each isolate one part."""
    load("naive")  # a file that does not import is reported before anything runs
    for case in _NAIVE_CASES:
        q, k, v = case.qkv()
        out = run_student("naive", api.naive_attention, q, k, v, causal=case.causal, part=case.part)
        ref, _ = reference_attention(q, k, v, causal=case.causal)
        shape = shape_problem(out, ref.shape)
        if shape:
            raise Stop(fail("naive", case.part if isinstance(case.part, int) else 3, shape,
                            where=f"case \"{case.name}\""))
        if out.dtype != q.dtype:
            raise Stop(fail("naive", 3, f"the output is {out.dtype} for {q.dtype} inputs",
                            where=f"case \"{case.name}\"", hint="return out.to(q.dtype)"))
        problem = testing.mismatch("O", out, ref, **tol(case.dtype))
        if problem is None:
            continue
        variants = [
            ((part, text, hint[0] if hint else None), (lambda kw=kw: naive64(q, k, v, case.causal, case.scale, **kw)))
            for part, kw, text, *hint in _NAIVE_MISTAKES
        ]
        found = first_cause(out, variants, **tol(case.dtype))
        part, cause, hint = found if found else (case.part, None, None)
        raise Stop(fail("naive", part, "does not match the float64 reference",
                        where=where_attention(problem, case), cause=cause, hint=hint))
    return Verdict(True, what("naive", (1, 3)),
                   f"{len(_NAIVE_CASES)} cases match the float64 reference "
                   "(MHA, GQA, MQA; causal and not; fp32 and fp16; strided)")
