"""Write gqa_flash/course/lab/checks/replays.pt (instructors: after changing a check's case or its list of mistakes).

    .venv/bin/python tools/make_check_replays.py

The checks of tiled.py (notebook 03) and notebook 04's gallery of kernel bugs name a failure's likely
cause by comparing it with what each usual mistake returns on the same case. Those answers come from
``tiled64`` below: tiled.py's tile walk in float64 with one mistake switched on. With none switched on it
*is* tiled.py's answer, so it lives here, outside the package (the student edition leaves ``tools/``
out), and the package ships only its outputs (``gqa_flash/course/lab/checks/replays.py`` reads them).
tests/checks/test_check_replays.py checks that the committed file is what this script writes.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the course, without `pip install -e .`

from gqa_flash.course.lab.checks import kernel, replays, tiled  # noqa: E402
from gqa_flash.course.lab.checks.cases import LOG2E, kv_index  # noqa: E402


def tiled64(q, k, v, causal, sm_scale, block_m, block_n, bug=None):
    """FlashAttention's tile walk (as in tiled.py) in float64, with at most one known bug.

    Returns (O, LSE) in float64. ``bug`` names the mistake; see TILED_MISTAKES and TILED_LSE_MISTAKES.
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
        l_i = m_i.new_zeros(m_i.shape)
        acc = torch.zeros(batch, n_q_heads, q_end - q_start, d, dtype=torch.float64)
        key_stop = q_end if causal else n
        if bug == "skip_diagonal" and causal:
            key_stop = q_start
        elif bug == "causal_end_always":
            key_stop = q_end
        elif bug == "visit_all":
            key_stop = n
        for key_lo in range(0, key_stop, block_n):
            key_hi = min(key_lo + block_n, key_stop)
            k_idx = torch.arange(key_lo, key_hi)
            s = (q[:, :, q_start:q_end] @ k[:, :, key_lo:key_hi].transpose(-1, -2)) * sm_scale
            if causal and bug != "mask_none" and k_idx[-1] > q_idx[0]:  # only tiles crossing the diagonal
                if bug == "mask_diag":
                    hide = k_idx[None, :] >= q_idx[:, None]
                elif bug == "mask_past":
                    hide = k_idx[None, :] < q_idx[:, None]
                else:
                    hide = k_idx[None, :] > q_idx[:, None]
                s = s.masked_fill(hide, float("-inf"))
            m_new = s.amax(dim=-1) if bug == "tile_max" else torch.maximum(m_i, s.amax(dim=-1))
            alpha = torch.exp(m_new - m_i) if bug == "alpha_inverted" else torch.exp(m_i - m_new)
            p = torch.exp(s - m_new[..., None])
            l_i = (l_i if bug in ("no_rescale_l", "no_rescale") else alpha * l_i) + p.sum(dim=-1)
            acc = (acc if bug in ("no_rescale_acc", "no_rescale") else alpha[..., None] * acc)
            acc = acc + p @ v[:, :, key_lo:key_hi]
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


def tiled_answers(inputs: dict | None = None) -> dict:
    """For each case of check_tiled: its inputs, and O of every mistake of TILED_MISTAKES and the LSE of
    every one of TILED_LSE_MISTAKES (float32), each only where it differs from the right answer."""
    entries = {}
    for case in tiled.TILED_CASES:
        q, k, v = (t.to(case.dtype) for t in inputs[case.name]) if inputs else (t.cpu() for t in case.qkv())
        walk = lambda bug: tiled64(q, k, v, case.causal, case.scale, case.block_m, case.block_n, bug)  # noqa: E731
        right = walk(None)
        answers = {}
        for which, mistakes in ((0, tiled.TILED_MISTAKES), (1, tiled.TILED_LSE_MISTAKES)):
            for mistake in mistakes:
                answer = walk(mistake.bug)[which]
                if not torch.equal(answer, right[which]):  # a mistake this case cannot show
                    answers[mistake.bug] = answer.float()
        entries[case.name] = {"inputs": [t.float() for t in (q, k, v)], "answers": answers}
    return entries


def kernel_answers(inputs: dict | None = None) -> dict:
    """The gallery's indicator inputs, and O and the LSE of each bug of KERNEL_BUGS on them (float32)."""
    case = kernel.gallery_case()
    q, k, v = (t.to(case.dtype) for t in inputs[case.name]) if inputs else (t.cpu() for t in kernel.indicator_qkv(case)[:3])
    answers = {}
    for bug in kernel.KERNEL_BUGS:
        if bug is None:  # the right answer is the reference's
            continue
        # exp for exp2 on scores scaled by sm_scale * log2(e): the softmax of the scores times log2(e)
        scale = case.scale * (LOG2E if bug == "exp" else 1.0)
        out, lse = tiled64(q, k, v, case.causal, scale, case.block_m, case.block_n, None if bug == "exp" else bug)
        answers[f"{bug} O"], answers[f"{bug} LSE"] = out.float(), lse.float()
    return {case.name: {"inputs": [t.float() for t in (q, k, v)], "answers": answers}}


def all_answers(inputs: dict | None = None) -> dict:
    """Every check's entries, from freshly drawn inputs, or from ``inputs`` ({group: {case: (q, k, v)}})."""
    inputs = inputs or {}
    return {"tiled": tiled_answers(inputs.get("tiled")), "kernel": kernel_answers(inputs.get("kernel"))}


if __name__ == "__main__":
    torch.save(all_answers(), replays.PATH)
    print(f"wrote {replays.PATH.relative_to(Path.cwd()) if replays.PATH.is_relative_to(Path.cwd()) else replays.PATH}"
          f" ({replays.PATH.stat().st_size // 1024} KiB)")
