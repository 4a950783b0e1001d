"""Notebook 03: the check of tiled.py, FlashAttention's tile walk in PyTorch (Parts 1-5).

One check runs tiled_attention on five cases that each isolate a part and
compares O and the LSE with the float64 reference. A wrong answer is replayed
against the usual bugs of the walk (:func:`tiled64`, the same walk in float64
with one bug switched on). A right answer must also be cheap: the causal walk
must skip the key tiles past the diagonal, which :class:`_CountScoreTiles`
counts. Notebook 04's error-map gallery replays the kernel's bugs with
:func:`tiled64` too.
"""

import torch

from gqa_flash import api, testing
from gqa_flash.lab.checks.cases import LOG2E, Case, kv_index, where_attention
from gqa_flash.lab.checks.verdict import (
    Stop, Verdict, fail, first_cause, fmt, load, prints_verdict, run_student, shape_problem, tol, what,
)
from gqa_flash.reference import reference_attention


def tiled64(q, k, v, causal, sm_scale, block_m, block_n, bug=None):
    """FlashAttention's tile walk (as in tiled.py) in float64, with at most one known bug.

    Returns (O, LSE) in float64. ``bug`` names the mistake; see _TILED_MISTAKES and _TILED_LSE_MISTAKES.
    """
    q, k, v = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
    batch, n_q_heads, n, d = q.shape
    idx = kv_index(n_q_heads, k.shape[1], "mod" if bug == "kv_mod" else "div")
    k, v = k[:, idx], v[:, idx]
    out = torch.zeros(batch, n_q_heads, n, d, dtype=torch.float64)
    lse = torch.zeros(batch, n_q_heads, n, dtype=torch.float64)
    for q_start in range(0, n, block_m):
        q_end = min(q_start + block_m, n)
        q_idx = torch.arange(q_start, q_end)
        m_i = torch.full((batch, n_q_heads, q_end - q_start), float("-inf"), dtype=torch.float64)
        l_i = torch.zeros_like(m_i)
        acc = torch.zeros(batch, n_q_heads, q_end - q_start, d, dtype=torch.float64)
        kv_end = q_end if causal else n
        if bug == "skip_diagonal" and causal:
            kv_end = q_start
        elif bug == "causal_end_always":
            kv_end = q_end
        elif bug == "visit_all":
            kv_end = n
        for k_start in range(0, kv_end, block_n):
            k_end = min(k_start + block_n, kv_end)
            k_idx = torch.arange(k_start, k_end)
            s = (q[:, :, q_start:q_end] @ k[:, :, k_start:k_end].transpose(-1, -2)) * sm_scale
            if causal and bug != "mask_none":
                if bug == "mask_diag":
                    hide = k_idx[None, :] >= q_idx[:, None]
                elif bug == "mask_past":
                    hide = k_idx[None, :] < q_idx[:, None]
                else:
                    hide = k_idx[None, :] > q_idx[:, None]
                s = s.masked_fill(hide, float("-inf"))
            m_new = torch.maximum(m_i, s.amax(dim=-1))
            alpha = torch.exp(m_new - m_i) if bug == "alpha_inverted" else torch.exp(m_i - m_new)
            p = torch.exp(s - m_new[..., None])
            l_i = (l_i if bug in ("no_rescale_l", "no_rescale") else alpha * l_i) + p.sum(dim=-1)
            acc = (acc if bug in ("no_rescale_acc", "no_rescale") else alpha[..., None] * acc)
            acc = acc + p @ v[:, :, k_start:k_end]
            if bug != "m_not_updated":
                m_i = m_new
        out[:, :, q_start:q_end] = acc if bug == "no_normalise" else acc / l_i[..., None]
        lse_rows = {
            "lse_m": m_i,
            "lse_log_l": torch.log(l_i),
            "lse_log2": (m_i + torch.log(l_i)) * LOG2E,
            "lse_log2_l": m_i + torch.log2(l_i),
        }.get(bug, m_i + torch.log(l_i))
        lse[:, :, q_start:q_end] = lse_rows
    return out, lse


_TILED_CASES = [
    Case("one head, no mask, two key tiles", (4, 5), seq_len=16, causal=False),
    Case("one head, causal, length 37", (2, 3), seq_len=37, seed=1),
    Case("GQA, 8 query heads on 2 KV heads, causal", 1, n_q_heads=8, n_kv_heads=2, seq_len=24, seed=2),
    Case("no mask, length 37", 2, n_q_heads=2, n_kv_heads=1, seq_len=37, causal=False, seed=3),
    Case("MQA in fp16, batch 2, block_m 8 with block_n 16", None, batch=2, n_q_heads=4, n_kv_heads=1,
         seq_len=29, head_dim=32, dtype=torch.float16, block_m=8, block_n=16, seed=4),
]

# (part, the bug of tiled64 that replays the mistake, what to tell the student)
_TILED_MISTAKES = [
    (1, "kv_mod", "% instead of //: query head h reads KV head h // (n_q_heads // n_kv_heads)"),
    (2, "skip_diagonal", "the key loop stops before the diagonal: a causal query tile must visit keys up to "
                         "q_end (its own rows included): kv_end = q_end"),
    (2, "causal_end_always", "without the causal mask every query sees every key: kv_end = seq_len when "
                             "causal is False"),
    (3, "mask_none", "the causal mask is not applied on the tiles that cross the diagonal"),
    (3, "mask_diag", "mask off by one: key j == query i (the diagonal) stays visible: hide k_idx > q_idx, not >="),
    (3, "mask_past", "the mask is transposed: hide the future, k_idx[j] > q_idx[i]"),
    (4, "no_rescale", "missing rescale: when the maximum rises, multiply l_i and acc by alpha = exp(m_i - m_new)"),
    (4, "no_rescale_acc", "missing rescale of acc: acc = alpha * acc + p @ v_tile"),
    (4, "no_rescale_l", "missing rescale of l_i: l_i = alpha * l_i + rowsum(p)"),
    (4, "alpha_inverted", "alpha is inverted: exp(m_i - m_new) (<= 1) shrinks the old state"),
    (4, "m_not_updated", "m_i is never updated: set m_i = m_new after each tile"),
    (5, "no_normalise", "O is not normalised: divide acc by l_i once, at the end"),
]
_TILED_LSE_MISTAKES = [
    (5, "lse_m", "the LSE is missing log(l_i): LSE = m_i + log(l_i)"),
    (5, "lse_log_l", "the LSE is missing m_i: LSE = m_i + log(l_i)"),
    (5, "lse_log2", "the LSE is in base 2: use the natural log, m_i + log(l_i)"),
    (5, "lse_log2_l", "log(l_i) must be the natural log: torch.log, not torch.log2"),
]


class _CountScoreTiles:
    """Count the score products ``q_tile @ k_tile^T`` (one per key tile visited) while active."""

    def __init__(self, head_dim: int):
        self.head_dim, self.count = head_dim, 0

    def __enter__(self):
        self._orig = torch.Tensor.__matmul__
        counter = self

        def counting(a, b):
            if (isinstance(b, torch.Tensor) and a.dim() >= 2 and b.dim() >= 2
                    and a.shape[-1] == counter.head_dim and b.shape[-2] == counter.head_dim):
                counter.count += 1
            return counter._orig(a, b)

        torch.Tensor.__matmul__ = counting
        return self

    def __exit__(self, *exc):
        torch.Tensor.__matmul__ = self._orig
        return False


def _tiles_visited(seq_len, block_m, block_n, causal):
    total = 0
    for q_start in range(0, seq_len, block_m):
        kv_end = min(q_start + block_m, seq_len) if causal else seq_len
        total += -(-kv_end // block_n)
    return total


def _check_answers(case: Case):
    """O, then the LSE, of one case against the float64 reference; a wrong one stops the check."""
    q, k, v = case.qkv()
    result = run_student("tiled", api.tiled_attention, q, k, v, causal=case.causal, block_m=case.block_m,
                         block_n=case.block_n, return_lse=True, part=case.part)
    ref, ref_lse = reference_attention(q, k, v, causal=case.causal)
    out, lse = result if isinstance(result, tuple) and len(result) == 2 else (result, None)
    shape = shape_problem(out, ref.shape) or shape_problem(lse, ref_lse.shape, "the LSE")
    if shape:
        raise Stop(fail("tiled", 5, shape, where=f"case \"{case.name}\""))
    sim = {}

    def simulated(bug):
        if bug not in sim:
            sim[bug] = tiled64(q, k, v, case.causal, case.scale, case.block_m, case.block_n, bug)
        return sim[bug]

    problem = testing.mismatch("O", out, ref, **tol(case.dtype))
    if problem is not None:
        found = first_cause(out, [((p, t), (lambda b=b: simulated(b)[0])) for p, b, t in _TILED_MISTAKES],
                            **tol(case.dtype))
        part, cause = found if found else (case.part, None)
        raise Stop(fail("tiled", part, "O does not match the float64 reference",
                        where=where_attention(problem, case, with_tile=True), cause=cause))
    problem = testing.mismatch("LSE", lse, ref_lse, labels=("batch", "head", "row"), **testing.LSE_TOLERANCE)
    if problem is not None:
        found = first_cause(lse, [((p, t), (lambda b=b: simulated(b)[1])) for p, b, t in _TILED_LSE_MISTAKES],
                            **testing.LSE_TOLERANCE)
        part, cause = found if found else (5, None)
        b, h, i = problem.index
        raise Stop(fail("tiled", part, "the LSE does not match the float64 reference",
                        where=f"case \"{case.name}\": batch {b}, query head {h}, row {i}: "
                              f"got {fmt(problem.got)}, expected {fmt(problem.expected)}",
                        cause=cause))
    if lse.dtype != torch.float32:
        raise Stop(fail("tiled", 5, f"the LSE is {lse.dtype}; it must be float32"))


def _check_work(case: Case):
    """A causal query tile must skip the key tiles past the diagonal: count the ones it visits."""
    q, k, v = case.qkv()
    with _CountScoreTiles(case.head_dim) as counter:
        run_student("tiled", api.tiled_attention, q, k, v, causal=True, block_m=case.block_m,
                    block_n=case.block_n, part=2)
    expected = _tiles_visited(case.seq_len, case.block_m, case.block_n, True)
    if counter.count != expected:
        full = _tiles_visited(case.seq_len, case.block_m, case.block_n, False)
        cause = ("the causal key loop runs past the diagonal: the answer is right (the mask hides those keys) "
                 "but the work is not halved; stop at kv_end = q_end") if counter.count >= full else None
        raise Stop(fail("tiled", 2, f"visits {counter.count} key tiles; a causal walk visits {expected}",
                        where=f"case \"{case.name}\", block_m {case.block_m}, block_n {case.block_n}",
                        cause=cause))


@prints_verdict
def check_tiled():
    """tiled.py, Parts 1-5: cases that each isolate a part, then the count of key tiles visited."""
    load("tiled")
    for case in _TILED_CASES:
        _check_answers(case)
    _check_work(_TILED_CASES[1])  # right answers; now the work
    return Verdict(True, what("tiled", (1, 5)),
                   f"O and LSE match the float64 reference in {len(_TILED_CASES)} cases "
                   "(MHA, GQA, MQA; causal and not; ragged; fp16), and the causal walk skips the future tiles")
