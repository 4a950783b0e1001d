"""Notebook 01: the check of naive.py, attention straight from its definition (Parts 1-3).

One check runs the whole function on seven cases, each built to isolate one
part (MHA without a mask for Part 3, causal for Part 2, GQA and MQA for Part
1, then fp16 and strided inputs). On a wrong answer it replays the usual
mistakes in float64 (:func:`naive64`) and names the one your output matches.
"""

import torch

from gqa_flash.course import api, testing
from gqa_flash.course.lab.checks.cases import Case, gqa_cause, head_mapping, kv_index, run_torch, where_attention
from gqa_flash.course.lab.checks.common import (
    Mistake, Stop, Verdict, fail, first_cause, load, prints_verdict, shape_problem, tol, what_of,
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


# What to compare next when no usual mistake explains a wrong output, by the part the case isolates.
_COMPARE = {
    1: "the KV head each query head reads (print it) with the mapping the banner of Part 1 gives; then, for one "
       "query head, your scores and probabilities with the same computed by hand for that head alone",
    2: "your scores after the mask, for the case named under where, with Q K^T times sm_scale computed by hand: "
       "the diagonal kept, only the future -inf",
    (2, 3): "your scores (after the mask) and your probabilities, for the case named under where, with Q K^T "
            "times sm_scale and its softmax over the keys computed by hand: the first that differs is the part",
    None: "the dtype and the layout: this case runs the same maths as the others, so a difference here comes from "
          "a cast (fp16 in, float32 inside, the input's dtype out) or from an assumption about strides "
          "(a .view where the input is not contiguous)",
}

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

# Each bug is the switches of naive64 that replay it. Part 1's mistakes are found by the KV head each query head
# of the output read (cases.head_mapping), not replayed.
_NAIVE_MISTAKES = [
    Mistake(dict(scale="none"), "the scores are not scaled: multiply Q K^T by sm_scale", part=2),
    Mistake(dict(scale="div"), "the scores are divided by sm_scale: multiply by it (it already is 1/sqrt(head_dim))",
            part=2),
    Mistake(dict(mask="none"), "the causal mask is missing: with causal=True, query i must not see keys j > i",
            part=2),
    Mistake(dict(mask="diag"), "mask off by one: the diagonal (key j == query i) is hidden too; query i must see "
                               "its own key, and only the keys after it are hidden (row 0, left with no key at all, "
                               "comes out NaN)",
            "mark the future only: the triangle strictly above the diagonal", part=2),
    Mistake(dict(mask="past"), "the mask is transposed: it hides the past (j < i) instead of the future (j > i)",
            part=2),
    Mistake(dict(mask="tril1"), "the mask is the lower triangle (tril), not the upper: it hides the past, the "
                                "diagonal and the key just after it, and keeps the rest of the future visible",
            "mark the future, the triangle above the diagonal, with triu", part=2),
    Mistake(dict(mask="tril0"), "the mask is the lower triangle (tril), not the upper: it hides the past and the "
                                "diagonal, and keeps the future visible",
            "mark the future, the triangle above the diagonal, with triu", part=2),
    Mistake(dict(mask="zero"), "masked scores are set to 0, not -inf: exp(0) = 1 still gives the future a weight",
            part=2),
    Mistake(dict(softmax="queries"), "softmax over the wrong dimension: normalise each row over the keys (dim=-1)",
            part=3),
    Mistake(dict(softmax="unnormalised"), "the probabilities are not normalised: divide by the row sums "
                                          "(or use torch.softmax)", part=3),
]


_GROUP_HINT = ("with n_q_heads query heads on n_kv_heads KV heads, each KV head serves a group of "
               "n_q_heads // n_kv_heads consecutive query heads: print the group size and the KV head each query "
               "head gets, for the case named under where")


def _heads_crash(case: Case):
    """For run_torch: a crash whose cause is Part 1's head mapping (a wrong group size), wherever it raised."""
    n_q, n_kv = case.n_q_heads, case.n_kv_heads

    def diagnose(exc, local, line):
        text = str(exc)
        if "ZeroDivisionError" in text or isinstance(exc, ZeroDivisionError):
            return dict(what=what_of("naive", 1),
                        cause=f"the group size is 0 in case \"{case.name}\" ({n_q} query heads on {n_kv} KV "
                              "heads), and the query heads are divided by it: a division the wrong way round "
                              "(n_kv_heads // n_q_heads) gives 0 whenever there are more query heads than KV heads",
                        hint=_GROUP_HINT)
        if isinstance(exc, IndexError) and f"with size {n_kv}" in text:
            return dict(what=what_of("naive", 1),
                        cause=f"a query head is mapped to a KV head that does not exist (there are {n_kv} in case "
                              f"\"{case.name}\"): the "
                              f"group size is too small; it is n_q_heads // n_kv_heads = {n_q // n_kv}",
                        hint=_GROUP_HINT)
        k32 = local.get("k32")
        if ("must match the size of tensor" in text and isinstance(k32, torch.Tensor) and k32.dim() == 4
                and k32.shape[1] != n_q):
            return dict(what=what_of("naive", 1),
                        cause=f"K and V leave Part 1 with {k32.shape[1]} heads, not one per query head ({n_q}): "
                              f"Part 2's product cannot pair {n_q} query heads with {k32.shape[1]} key heads; the "
                              "group size (how many times each KV head is repeated) is wrong", hint=_GROUP_HINT)
        return None

    return diagnose


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _shape_failure(out, ref, case: Case, shape: str):
    """A wrong shape: the head count is Part 1's (K and V with another number of heads broadcast in Part 2)."""
    if (isinstance(out, torch.Tensor) and out.dim() == 4 and out.shape[1] != ref.shape[1]
            and (out.shape[0], *out.shape[2:]) == (ref.shape[0], *ref.shape[2:])):
        return fail("naive", 1, shape, where=f"case \"{case.name}\" ({_count(case.n_q_heads, 'query head')} on "
                                             f"{_count(case.n_kv_heads, 'KV head')})",
                    cause=f"the output has {out.shape[1]} heads for {_count(ref.shape[1], 'query head')}: K and V "
                          f"leave Part 1 with {out.shape[1]} heads, not one per query head, and Part 2's product "
                          "broadcasts the "
                          "query heads over them; the group size (how many times each KV head is repeated) is wrong",
                    hint=_GROUP_HINT)
    return fail("naive", case.part if isinstance(case.part, int) else 3, shape, where=f"case \"{case.name}\"")


@prints_verdict
def check_naive():
    """naive.py, Parts 1-3: the whole function on cases that each isolate one part."""
    load("naive")  # a file that does not import is reported before anything runs
    for case in _NAIVE_CASES:
        q, k, v = case.qkv()
        out = run_torch("naive", api.naive_attention, q, k, v, causal=case.causal, part=case.part,
                        diagnose=_heads_crash(case))
        ref, _ = reference_attention(q, k, v, causal=case.causal)
        shape = shape_problem(out, ref.shape)
        if shape:
            raise Stop(_shape_failure(out, ref, case, shape))
        if out.dtype != q.dtype:
            raise Stop(fail("naive", 3, f"the output is {out.dtype} for {q.dtype} inputs",
                            where=f"case \"{case.name}\"", hint="return out.to(q.dtype)"))
        problem = testing.mismatch("O", out, ref, **tol(case.dtype))
        if problem is None:
            continue
        mapping = head_mapping(out, q, k, v, case.causal, case.scale, **tol(case.dtype))
        heads = gqa_cause("naive", 1, mapping, case.n_q_heads, case.n_kv_heads)
        if heads:
            raise Stop(fail("naive", 1, "does not match the float64 reference", where=where_attention(problem, case),
                            cause=heads[0], hint=heads[1]))
        variants = [(mistake, lambda kw=mistake.bug: naive64(q, k, v, case.causal, case.scale, **kw))
                    for mistake in _NAIVE_MISTAKES]
        found = first_cause(out, variants, **tol(case.dtype))
        part, cause, hint = (found.part, found.cause, found.hint) if found else (case.part, None, None)
        raise Stop(fail("naive", part, "does not match the float64 reference",
                        where=where_attention(problem, case), cause=cause, hint=hint,
                        compare=None if found else _COMPARE.get(case.part, _COMPARE[None])))
    return Verdict(True, what_of("naive", (1, 3)),
                   f"{len(_NAIVE_CASES)} cases match the float64 reference "
                   "(MHA, GQA, MQA; causal and not; fp32 and fp16; strided)")
