"""Notebook 06's checks for the bonus backward kernels: one verdict line per part.

Each check feeds the student's ``backward.py`` exact forward results (O and
the LSE from the float64 reference), so a bug in the forward kernel cannot
show up here, and compares with float64 autograd. It prints ``PASS`` or
``FAIL``, the part, and on failure where the first wrong value is and the
most likely cause. A stub or a crash is a FAIL line, never an exception.
"""

from __future__ import annotations

import torch
import triton

from gqa_flash import impl, reference, runtime
from gqa_flash.testing import gradient_error, random_qkv


def _inputs(n_q_heads, n_kv_heads, causal=True, seq_len=40, head_dim=16, dtype=torch.float32, seed=0):
    q, k, v = random_qkv(1, n_q_heads, n_kv_heads, seq_len, head_dim, dtype=dtype, seed=seed)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 7)).to(q.device, dtype)
    o, lse = reference.reference_attention(q, k, v, causal=causal)
    grads = reference.reference_gradients(q, k, v, do, causal=causal)
    return (q, k, v, do, o.to(q.device, dtype), lse.to(q.device, torch.float32)), grads


def _first_wrong(got, ref, tol, labels=("batch", "head", "row", "col")):
    err = (got.detach().double().cpu() - ref).abs()
    bad = ~(err <= tol * (ref.abs() + ref.abs().mean() + 1e-12))
    if not bad.any():
        return None
    idx = [int(i) for i in bad.nonzero()[0]]
    return ", ".join(f"{name} {i}" for name, i in zip(labels, idx))


def _relative_ok(got, ref, dtype):
    err, bound = gradient_error(got, ref, dtype)
    return err <= bound


def _say(ok, part, message):
    print(f"{'PASS' if ok else 'FAIL'} backward.py Part {part}: {message}")
    return ok


def _guard(part, fn):
    """Run a student call; a stub or a crash becomes a FAIL line (and None)."""
    try:
        return fn()
    except NotImplementedError:
        _say(False, part, f"Part {part} is not implemented yet")
    except Exception as e:  # a Triton compile error, a shape error, ...
        _say(False, part, f"the code raised {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
    return None


def check_delta():
    """Part 1: D = rowsum(dO * O), through the preprocess kernel alone."""
    bwd = impl.load("backward")
    (q, k, v, do, o, lse), _ = _inputs(2, 1)
    delta = torch.full(lse.shape, float("nan"), device=lse.device)
    block_m = 32 if runtime.INTERPRETER else 64

    def launch():
        bwd._backward_preprocess[(triton.cdiv(q.shape[2], block_m), q.shape[0] * q.shape[1])](
            o, do, delta, *o.stride(), *do.stride(), q.shape[2], q.shape[1],
            HEAD_DIM=q.shape[-1], HEAD_DIM_PAD=max(16, triton.next_power_of_2(q.shape[-1])), BLOCK_M=block_m)
        return delta

    got = _guard(1, launch)
    if got is None:
        return False
    expected = (o.double() * do.double()).sum(-1).cpu()
    where = _first_wrong(got, expected, 1e-4, labels=("batch", "head", "row"))
    if where is None:
        return _say(True, 1, "D = rowsum(dO * O) is right for every row")
    cause = "D is all zeros (still the placeholder?)" if bool((got == 0).all()) else "check the product and the axis of the sum"
    return _say(False, 1, f"first wrong D at {where}; {cause}")


def _grads(n_q_heads, n_kv_heads, causal, part, dtype=torch.float32):
    bwd = impl.load("backward")
    (q, k, v, do, o, lse), ref = _inputs(n_q_heads, n_kv_heads, causal=causal, dtype=dtype)
    got = _guard(part, lambda: bwd.flash_attention_backward(q, k, v, o, lse, do, causal=causal))
    return got, ref, dtype


def check_dkdv():
    """Part 2: dK and dV of one KV head read by one query head (MHA), causal and not."""
    for causal in (True, False):
        got, ref, dtype = _grads(2, 2, causal, part=2)
        if got is None:
            return False
        (_, dk, dv), (_, rdk, rdv) = got, ref
        if not _relative_ok(dv, rdv, dtype):
            where = _first_wrong(dv, rdv, 1e-3)
            cause = ("dV is all zeros (still the placeholder?)" if bool((dv == 0).all())
                     else "check P^T (recomputed with exp2 and the LSE in log2 units) and its mask")
            return _say(False, 2, f"dV wrong (causal={causal}) first at {where}; {cause}")
        if not _relative_ok(dk, rdk, dtype):
            where = _first_wrong(dk, rdk, 1e-3)
            return _say(False, 2, f"dV is right but dK is wrong (causal={causal}) first at {where}; "
                                  "check dS^T = P^T * (dP^T - D) and dK += dS^T Q (and Part 1's D)")
    return _say(True, 2, "dK and dV match float64 autograd (MHA, causal and not)")


def check_gqa_sum():
    """Part 3: dK and dV summed over every query head of the group."""
    got, ref, dtype = _grads(4, 2, True, part=3)
    if got is None:
        return False
    (_, dk, dv), (_, rdk, rdv) = got, ref
    for name, g, r in (("dV", dv, rdv), ("dK", dk, rdk)):
        if not _relative_ok(g, r, dtype):
            where = _first_wrong(g, r, 1e-3)
            return _say(False, 3, f"{name} wrong with 4 query heads on 2 KV heads, first at {where}; "
                                  "each KV head must add the gradients of its whole group: q_head = kv_head * group + h")
    return _say(True, 3, "dK and dV add up the whole group (GQA 4:2)")


def check_dq():
    """Part 4: dQ, causal and not."""
    for causal in (True, False):
        got, ref, dtype = _grads(4, 2, causal, part=4)
        if got is None:
            return False
        dq, rdq = got[0], ref[0]
        if not _relative_ok(dq, rdq, dtype):
            where = _first_wrong(dq, rdq, 1e-3)
            cause = ("dQ is all zeros (still the placeholder?)" if bool((dq == 0).all())
                     else "is the causal mask applied to P before dS?" if causal
                     else "check dS = P * (dP - D) and dQ += dS K")
            return _say(False, 4, f"dQ wrong (causal={causal}) first at {where}; {cause}")
    return _say(True, 4, "dQ matches float64 autograd, causal and not")


def check_backward():
    """All four parts, in order."""
    for check in (check_delta, check_dkdv, check_gqa_sum, check_dq):
        check()
