"""Notebook 04: the checks of forward.py's Parts 4-6, each alone, through its probe.

(Parts 1-3, the program's coordinates, the tile loads and the key loop, are
checked in kernel_walk.py.)

* Part 4, :func:`check_online_softmax_update`: one online-softmax step on
  chosen tiles (the first tile, rising and steady maxima, masked rows);
* Part 5, :func:`check_mask_scores`: the mask on every block of a ragged
  sequence, causal and not;
* Part 6, :func:`check_epilogue`: normalise, store O and the LSE in the right
  batch and head, and write nothing else; then, in the interpreter, the
  addresses of the stores at a batch or head offset past 2^31 elements.

Each launches a probe (probes.py) and compares what your helper returned with
a float64 replay; on a wrong answer the replay runs again with each of the
usual mistakes switched on, and the verdict names the one your output matches.
"""

import math

import torch
import triton

from gqa_flash.course import interpreter, testing
from gqa_flash.course.lab.checks.cases import LN2
from gqa_flash.course.lab.checks.common import (
    Mistake, Stop, Verdict, at, fail, first_cause, fmt, matches, prints_verdict, tol, what_of,
)
from gqa_flash.course.lab.checks.kernel_walk import (
    address_set, check_key_loop, check_load_tile, check_program_ids, offset_cases, overflow_cause, recorded,
    wrapped_int32, wrong_addresses_cause,
)
from gqa_flash.course.lab.checks.probes import addresses_recorded, dev, forward_parts, launch
from gqa_flash.course.lab.checks.triton_errors import builtins_cause, builtins_hint, python_builtins_called

# --- Part 4 ------------------------------------------------------------------

# Three different sizes, so that a vector broadcast on the wrong axis cannot pass for the right one.
_UPD = dict(BLOCK_M=16, BLOCK_N=32, HEAD_DIM=64)
_STATE = ("acc", "l", "m")


def _update_cases():
    g = torch.Generator().manual_seed(21)
    bm, bn, d = _UPD["BLOCK_M"], _UPD["BLOCK_N"], _UPD["HEAD_DIM"]
    s = torch.randn(bm, bn, generator=g) * 2
    v = torch.randn(bn, d, generator=g)
    first = dict(acc=torch.zeros(bm, d), l=torch.zeros(bm), m=torch.full((bm,), float("-inf")), s=s, v=v)
    s2 = torch.randn(bm, bn, generator=g) * 2
    s2[12:] = float("-inf")  # rows that see none of this tile's keys (a diagonal tile)
    m2 = s2.amax(dim=1).clone()
    m2[:6] += 1.5  # the maximum stays in rows 0-5
    m2[6:12] -= 2.0  # and rises in rows 6-11
    m2[12:] = torch.randn(4, generator=g)
    running = dict(acc=torch.randn(bm, d, generator=g), l=1 + 3 * torch.rand(bm, generator=g), m=m2, s=s2,
                   v=torch.randn(bn, d, generator=g))
    half = dict(running, v=running["v"].to(torch.float16))
    return [
        ("the first tile (m_i = -inf, l_i = 0, acc = 0)", first),
        ("a running state: the max stays in rows 0-5, rises in rows 6-11; rows 12-15 see no key "
         "of this tile", running),
        ("the running state with fp16 values v", half),
    ]


def _update64(c, bug=None):
    """The new state (acc, l_i, m_i) in float64, with at most one of _UPDATE_MISTAKES."""
    base = math.e if bug == "exp" else 2.0
    acc, l, m, s = (c[k].to(torch.float64) for k in ("acc", "l", "m", "s"))
    v = c["v"]
    m_new = s.amax(dim=1) if bug == "m_from_tile" else torch.maximum(m, s.amax(dim=1))
    alpha = {"alpha_inverted": base ** (m_new - m), "alpha_new_only": base ** -m_new}.get(bug, base ** (m - m_new))
    p = base ** s if bug == "p_unshifted" else base ** (s - m_new[:, None])
    p_cast = p.to(v.dtype).to(torch.float64)  # the kernel multiplies p in v's dtype
    l_new = (l if bug in ("no_rescale_l", "no_rescale") else l * alpha) + p.sum(dim=1)
    acc_new = (acc if bug in ("no_rescale_acc", "no_rescale") else acc * alpha[:, None]) + p_cast @ v.to(torch.float64)
    return acc_new, l_new, (m if bug == "m_unchanged" else m_new)


_UPDATE_MISTAKES = [
    Mistake("exp", "e^x instead of 2^x: the scores are already in log2 units (log2(e) is folded into qk_scale)",
            "every exponential here is a power of 2"),
    Mistake("no_rescale", "the old state is not rescaled when the running max grows",
            "both l_i and acc shrink by 2^(old max - new max) before this tile is added"),
    Mistake("no_rescale_acc", "acc is not rescaled when the running max grows (l_i is)",
            "acc shrinks by the same factor as l_i before this tile is added"),
    Mistake("no_rescale_l", "l_i is not rescaled when the running max grows (acc is)",
            "l_i shrinks by the same factor as acc before this tile's sum is added"),
    Mistake("alpha_inverted", "the rescale factor is inverted: it grows the old state instead of shrinking it",
            "the factor is 2^(old max - new max), at most 1"),
    Mistake("alpha_new_only", "the rescale factor uses the new max alone, without the old",
            "the factor is 2^(old max - new max): the old terms were shifted by the old max"),
    Mistake("m_unchanged", "the old maximum is returned, not the new one", "return the new running max"),
    Mistake("m_from_tile", "the new max is this tile's row max alone, and the running max never goes down",
            "the new max is the larger of the running max and the tile's row maxima"),
    Mistake("p_unshifted", "the probabilities are not shifted by the new row max",
            "subtract the new row max from the scores before taking the power of 2"),
]


@prints_verdict
def check_online_softmax_update():
    """forward.py Part 4, alone: one online-softmax step on chosen tiles."""
    fwd, probes = forward_parts()
    bm, d = _UPD["BLOCK_M"], _UPD["HEAD_DIM"]
    for name, c in _update_cases():
        outs = dict(acc=torch.full((bm, d), float("nan"), device=dev()),
                    l=torch.full((bm,), float("nan"), device=dev()), m=torch.full((bm,), float("nan"), device=dev()))
        precision = "ieee" if c["v"].dtype == torch.float32 else "tf32"
        launch(4, probes["online_softmax_update"], (1,),
               c["acc"].to(dev()), c["l"].to(dev()), c["m"].to(dev()), c["s"].to(dev()), c["v"].to(dev()),
               outs["acc"], outs["l"], outs["m"], INPUT_PRECISION=precision, **_UPD)
        got = {k: outs[k].cpu() for k in _STATE}
        want = dict(zip(_STATE, _update64(c)))
        problems = (testing.mismatch(k, got[k], want[k], labels=("row", "column") if k == "acc" else ("row",),
                                     **tol(c["v"].dtype)) for k in ("m", "l", "acc"))
        problem = next((p for p in problems if p is not None), None)
        if problem is None:
            continue
        state = tuple(got[k] for k in _STATE)
        builtins = python_builtins_called(fwd.online_softmax_update)
        if builtins:  # right on a GPU (Triton turns them into tl.maximum...), wrong in the interpreter
            cause, hint = builtins_cause(builtins), builtins_hint(builtins)
        elif matches(state, tuple(c[k] for k in _STATE), 0, 0):
            cause, hint = "the placeholder is still there: the state comes back unchanged", None
        else:
            found = first_cause(state, [(mistake, lambda bug=mistake.bug: _update64(c, bug))
                                        for mistake in _UPDATE_MISTAKES], **tol(c["v"].dtype))
            cause, hint = (found.cause, found.hint) if found else (None, None)
        return fail("forward", 4, "the new state (acc, l_i, m_i) does not match the float64 reference",
                    where=f"case \"{name}\": {problem.name}, {at(problem)}", cause=cause, hint=hint)
    return Verdict(True, what_of("forward", 4), "the new state matches the float64 reference: first tile, "
                   "rising and steady maxima, fully masked rows, fp16 values")


# --- Part 5 ------------------------------------------------------------------

_MASK = dict(BLOCK_M=32, BLOCK_N=16)
_MASK_SEQ_LEN = 40


def _mask64(s, seq_len, causal, bug=None):
    n_rows, n_cols = s.shape
    i = torch.arange(n_rows)[:, None]
    j = torch.arange(n_cols)[None, :]
    visible = j < seq_len
    if bug == "no_tail":
        visible = torch.ones_like(visible)
    if (causal or bug == "causal_always") and bug != "no_causal":
        rule = {"diag": j < i, "plus_one": j <= i + 1, "transposed": j >= i}.get(bug, j <= i)
        visible = visible & rule
    fill = 0.0 if bug == "zero" else float("-inf")
    return torch.where(visible, s.to(torch.float64), torch.full_like(s, fill, dtype=torch.float64))


_MASK_MISTAKES = [
    Mistake("diag", "mask off by one: a row's own key (the diagonal) is hidden", "the diagonal stays visible"),
    Mistake("plus_one", "mask off by one: the key just after a row's own is visible, and it is already in the "
                        "row's future", "a row sees the keys at or before its own position"),
    Mistake("transposed", "the mask is transposed: a row sees the keys after its own position, not before",
            "a row sees the keys at or before its own position"),
    Mistake("no_tail", "keys past SEQ_LEN are not masked: the padding keys of the ragged last block were loaded "
                       "as 0, so their score is 0, a real weight", "hide the keys past SEQ_LEN, causal or not"),
    Mistake("no_causal", "the causal rule is missing: only the keys past SEQ_LEN are hidden, and a row sees its "
                         "future", "under the causal mask, also hide the keys after the row's own position"),
    Mistake("causal_always", "the causal mask is applied when CAUSAL is False",
            "apply the causal rule only under the causal mask (a Python `if` on CAUSAL)"),
    Mistake("zero", "masked scores are set to 0, not -inf: 2^0 = 1 still gives them weight",
            "a hidden score is -inf"),
]


@prints_verdict
def check_mask_scores():
    """forward.py Part 5, alone: the mask applied to every (query block, key block) of a ragged sequence."""
    fwd, probes = forward_parts()
    bm, bn, n = _MASK["BLOCK_M"], _MASK["BLOCK_N"], _MASK_SEQ_LEN
    size = max(triton.cdiv(n, bm) * bm, triton.cdiv(n, bn) * bn)
    cols = triton.cdiv(n, bn) * bn
    g = torch.Generator().manual_seed(31)
    s = torch.randn(size, size, generator=g) + 3.0  # never 0, so a mask to 0 shows
    for causal in (True, False):
        name = f"{'causal' if causal else 'no causal mask'}, SEQ_LEN {n}, BLOCK_M {bm}, BLOCK_N {bn}"
        out = torch.full((size, size), float("nan"), device=dev())
        launch(5, probes["mask_scores"], (triton.cdiv(n, bm), triton.cdiv(n, bn)), s.to(dev()), out, n, size,
               CAUSAL=causal, **_MASK)
        got = out.cpu()[:n, :cols]  # rows past SEQ_LEN are never stored: not compared
        problem = testing.mismatch("scores", got, _mask64(s, n, causal)[:n, :cols], labels=("row", "key"),
                                   atol=0, rtol=1e-6)
        if problem is None:
            continue
        if causal and torch.equal(got, s[:n, :cols]):
            cause, hint = "the placeholder is still there: nothing is masked", None
        else:
            found = first_cause(got, [(mistake, _mask64(s, n, causal, mistake.bug)[:n, :cols])
                                      for mistake in _MASK_MISTAKES], atol=0, rtol=1e-6)
            cause, hint = (found.cause, found.hint) if found else (None, None)
        i, j = problem.index
        seen = "masked (-inf)" if math.isinf(problem.got) and problem.got < 0 else f"{fmt(problem.got)}"
        expected = "masked (-inf)" if math.isinf(problem.expected) else "visible (the score unchanged)"
        return fail("forward", 5, "masks the wrong scores",
                    where=f"case \"{name}\": query row {i} (query block {i // bm}), key {j} (key block {j // bn}): "
                          f"got {seen}, expected {expected}",
                    cause=cause, hint=hint)
    return Verdict(True, what_of("forward", 5), "the causal mask and the ragged tail are right, "
                   "on every block of a ragged sequence, causal and not")


# --- Part 6 ------------------------------------------------------------------

_EPI = dict(BLOCK_M=16, HEAD_DIM_PAD=16)
_EPI_SEQ_LEN, _EPI_HEAD_DIM = 11, 12
_SENTINEL = 4096.0  # exact in fp16 and fp32; a slot that must not be written keeps it


def _epilogue_inputs():
    g = torch.Generator().manual_seed(41)
    bm, dp = _EPI["BLOCK_M"], _EPI["HEAD_DIM_PAD"]
    return torch.randn(bm, dp, generator=g) * 3, 1 + 5 * torch.rand(bm, generator=g), torch.randn(bm, generator=g) * 4


def _epilogue64(acc, l, m, bug=None):
    acc, l, m = acc.double(), l.double(), m.double()
    o = {"no_normalise": acc, "twice": acc / l[:, None] ** 2}.get(bug, acc / l[:, None])
    lse = {
        "lse_log2": m + torch.log2(l),
        "lse_mixed": m + torch.log(l),
        "lse_m": m * LN2,
        "lse_no_m": torch.log(l),
    }.get(bug, (m + torch.log2(l)) * LN2)
    return o, lse


_EPILOGUE_MISTAKES = [
    Mistake("no_normalise", "o is not normalised by the row sums l_i", "divide the accumulator by l_i, once, here"),
    Mistake("twice", "o is divided by the row sums l_i twice", "divide the accumulator by l_i once"),
    Mistake("lse_log2", "the LSE is in log2 units: the backward pass wants the natural log", "multiply by ln 2"),
    Mistake("lse_mixed", "m_i is in log2 units but l_i's log is natural",
            "take both in base 2, then convert the sum to natural log"),
    Mistake("lse_m", "the LSE is missing the log of l_i", "the LSE is the running max plus the log of the row sum"),
    Mistake("lse_no_m", "the LSE is missing the running max m_i",
            "the LSE is the running max plus the log of the row sum"),
]


_OFFSETS = "offset O and the LSE by the batch and the head, each times its own stride"


def _stored_elsewhere(label, buffer, others):
    """(cause, hint) when ``label``'s own batch and head hold nothing: stored into another, or not at all."""
    written = (~(buffer == _SENTINEL).flatten(2).all(-1) & others).nonzero().tolist()
    if not written:
        return f"{label} is never stored", f"store {label} too"
    (bb, hh), (b, h) = written[0], _EPI_SLOT
    return (f"{label} is stored into batch {bb}, head {hh}, not batch {b}, head {h}: its batch or head offset is "
            "wrong", _OFFSETS)
_EPI_SLOT = (1, 2)  # the probe writes batch 1, head 2 of a [2, 3, BLOCK_M, HEAD_DIM_PAD] buffer


def _lse_row_stride(buffer, want, o_row_stride):
    """(cause, hint) when the LSE's rows were stored at another row stride than its own (1), else (None, None)."""
    t = testing.LSE_TOLERANCE
    base = (_EPI_SLOT[0] * 3 + _EPI_SLOT[1]) * _EPI["BLOCK_M"]
    for stride in range(2, (buffer.numel() - 1 - base) // max(1, len(want) - 1) + 1):
        got = buffer[base + stride * torch.arange(len(want))]
        if matches(got, want, t["atol"], t["rtol"]):
            whose = " (O's row stride, stride_on)" if stride == o_row_stride else ""
            return (f"the LSE's rows are stored {stride} elements apart{whose}: the LSE is [B, H, N] with rows 1 "
                    "apart (its own row stride, stride_ln), so row 1 and the rows after it land in other heads, "
                    "or past the tensor", "step the LSE's rows with the LSE's own row stride")
    return None, None


@prints_verdict
def check_epilogue():
    """forward.py Part 6, alone: normalise; store O and the LSE in their batch and head, and nothing else."""
    fwd, probes = forward_parts()
    bm, dp = _EPI["BLOCK_M"], _EPI["HEAD_DIM_PAD"]
    n, d = _EPI_SEQ_LEN, _EPI_HEAD_DIM
    b, h = _EPI_SLOT
    acc, l, m = _epilogue_inputs()
    for dtype in (torch.float32, torch.float16):
        name = (f"O in {str(dtype).replace('torch.', '')}, batch {b}, head {h}, {n} real rows of {bm}, "
                f"head dim {d} padded to {dp}")
        # Buffers larger than O and LSE: rows past SEQ_LEN and columns past HEAD_DIM exist in them,
        # holding a sentinel, so a store that should have been masked shows.
        o = torch.full((2, 3, bm, dp), _SENTINEL, dtype=dtype, device=dev())
        # The LSE's buffer goes on past its end (as far as O's), so a store at a wrong row stride lands there.
        lse_buf = torch.full((o.numel(),), _SENTINEL, dtype=torch.float32, device=dev())
        lse = lse_buf[: 2 * 3 * bm].view(2, 3, bm)
        launch(6, probes["epilogue"], (1,), acc.to(dev()), l.to(dev()), m.to(dev()), o, lse, b, h,
               *o.stride(), *lse.stride(), n, d, **_EPI)
        o, lse, lse_buf = o.cpu().double(), lse.cpu().double(), lse_buf.cpu().double()
        if (o == _SENTINEL).all() and (lse == _SENTINEL).all():
            return fail("forward", 6, "stores nothing", where=f"case \"{name}\"",
                        cause="the placeholder is still there", hint="store O and the LSE")
        mine_o, mine_lse = o[b, h], lse[b, h]
        others = torch.ones(2, 3, dtype=torch.bool)
        others[b, h] = False
        if (mine_o == _SENTINEL).all() and not (o[others] == _SENTINEL).all():
            bb, hh = (~(o == _SENTINEL).flatten(2).all(-1) & others).nonzero()[0].tolist()
            return fail("forward", 6, "stores into the wrong batch or head", where=f"case \"{name}\": "
                        f"wrote batch {bb}, head {hh}", cause="the batch or head offset of the stores is wrong",
                        hint=_OFFSETS)
        # O's real rows and columns, then the LSE's real rows, each against the float64 replay
        for label, pick, real, t, labels in (("O", 0, (slice(n), slice(d)), tol(dtype), ("row", "column")),
                                             ("LSE", 1, (slice(n),), testing.LSE_TOLERANCE, ("row",))):
            got = (mine_o, mine_lse)[pick][real]
            problem = testing.mismatch(label, got, _epilogue64(acc, l, m)[pick][real], labels=labels, **t)
            if problem is None:
                continue
            found = first_cause(got, [(mistake, _epilogue64(acc, l, m, mistake.bug)[pick][real])
                                      for mistake in _EPILOGUE_MISTAKES], **t)
            cause, hint = (found.cause, found.hint) if found else (None, None)
            if cause is None and (got == _SENTINEL).all():
                cause, hint = _stored_elsewhere(label, (o, lse)[pick], others)
            if cause is None and label == "LSE":
                cause, hint = _lse_row_stride(lse_buf, _epilogue64(acc, l, m)[1][:n], o.shape[-1])
            return fail("forward", 6, f"{label} does not match the float64 reference",
                        where=f"case \"{name}\": {at(problem)}", cause=cause, hint=hint)
        if not (mine_o[n:] == _SENTINEL).all() or not (mine_lse[n:] == _SENTINEL).all():
            return fail("forward", 6, "writes rows past SEQ_LEN", where=f"case \"{name}\"",
                        cause="the stores are not masked by row: those rows are not part of O or the LSE "
                              "(in the real kernel they belong to the next head, or to no tensor at all)",
                        hint="mask both stores by row")
        if not (mine_o[:, d:] == _SENTINEL).all():
            return fail("forward", 6, "writes the padding columns past HEAD_DIM", where=f"case \"{name}\"",
                        cause="the store of O is not masked by column: those columns belong to the next row",
                        hint="mask the store of O by column too")
        if not (o[others] == _SENTINEL).all() or not (lse[others] == _SENTINEL).all():
            return fail("forward", 6, "also writes into another batch or head", where=f"case \"{name}\"",
                        cause="the batch or head offset of a store is wrong", hint=_OFFSETS)
    problem = interpreter.in_interpreter(f"{__name__}:epilogue_offsets_problem")
    if problem is not None:  # right on small tensors: the whole kernel may still run (kernel.py)
        return fail("forward", 6, **problem, extra=dict(safe_on_small_tensors=True))
    return Verdict(True, what_of("forward", 6), "O is normalised and the LSE is in natural log, in their own "
                   "batch and head; padding rows and columns are left alone; fp32 and fp16 O")


def epilogue_offsets_problem():
    """Part 6 in the interpreter, with its stores recorded, not made: None when O's and the LSE's addresses
    are the 64-bit ones at batch and head offsets past 2^31 elements, else the problem (message, where, cause,
    hint)."""
    fwd, probes = forward_parts()
    bm, dp = _EPI["BLOCK_M"], _EPI["HEAD_DIM_PAD"]
    n, d = _EPI_SEQ_LEN, _EPI_HEAD_DIM
    acc, l, m = (torch.zeros(bm, dp), torch.ones(bm), torch.zeros(bm))  # never read: the recorder reads 0
    o, lse = torch.zeros(1, dtype=torch.float16), torch.zeros(1)  # never written: the recorder touches no memory
    for which, b, h, s_b, s_h in offset_cases():
        o_strides, lse_strides = (s_b, s_h, 2 * dp, 2), (s_b, s_h, 3)  # rows and columns strided too
        try:
            with addresses_recorded() as seen:
                launch(6, probes["epilogue"], (1,), acc, l, m, o, lse, b, h, *o_strides, *lse_strides, n, d, **_EPI)
        except Stop as stop:
            return dict(message=stop.verdict.message, where=stop.verdict.where, cause=stop.verdict.cause,
                        hint=stop.verdict.hint)
        got = recorded(seen, "store")
        if not got:
            return dict(message="stores nothing", where=f"batch {b}, head {h}",
                        cause="the placeholder is still there", hint="store O and the LSE")
        index, stride = (b, s_b) if which == "batch" else (h, s_h)
        base, wrapped = b * s_b + h * s_h, b * s_b + h * s_h - index * stride + wrapped_int32(index * stride)
        rows, cols = torch.meshgrid(torch.arange(n), torch.arange(d), indexing="ij")
        for name, ptr, size, cells in (("O", o.data_ptr(), 2, (rows * o_strides[2] + cols * o_strides[3]).flatten()),
                                       ("the LSE", lse.data_ptr(), 4, torch.arange(n) * lse_strides[2])):
            want = address_set(ptr, size, (base + cells).tolist())
            if want <= got:
                continue
            fix = "batch_idx.to(tl.int64) * stride_ob" if which == "batch" else "q_head_idx.to(tl.int64) * stride_oh"
            if name != "O":
                fix = fix.replace("_o", "_l")
            if address_set(ptr, size, (wrapped + cells).tolist()) <= got:
                cause, hint = overflow_cause(which, stride, index, fix, name, kind="store")
            else:
                cause, hint = wrong_addresses_cause(which, name)
            return dict(message=f"stores {name} at wrong addresses in a tensor past 2^31 elements",
                        where=f"batch {b}, head {h} of a tensor with batch stride {s_b} and head stride {s_h} "
                              f"(elements): {len(want - got)} of {len(want)} elements of {name} written at the wrong "
                              "address", cause=cause, hint=hint)
    return None


# The six parts in order: check_forward runs them before the whole kernel.
PART_CHECKS = (check_program_ids, check_load_tile, check_key_loop, check_online_softmax_update, check_mask_scores,
               check_epilogue)
