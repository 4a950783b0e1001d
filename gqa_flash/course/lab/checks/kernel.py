"""Notebook 04: the whole forward kernel, its check and its error map.

* :func:`check_forward` runs the six parts' checks (kernel_parts.py), then
  the kernel on four cases (GQA, MQA, MHA; causal and not; ragged; half
  precision; head dim 80; strided and [B, N, H, D] layouts), and says which
  query head, query block and key block is wrong first.
* :func:`forward_error_map` measures the kernel's error per (query head,
  query block, key block) from one launch on *indicator* inputs, where column
  kb of V marks the keys of key block kb; :func:`simulated_error_map` draws
  such a map for a known bug (KERNEL_BUGS) from its stored answer
  (replays.py), at the interpreter's tiles, for the gallery.
"""

import math
from dataclasses import dataclass

import torch
import triton

from gqa_flash.course import runtime, testing
from gqa_flash.course.lab.checks import replays
from gqa_flash.course.lab.checks.cases import Case, kv_of
from gqa_flash.course.lab.checks.common import (
    PARTS, Mistake, Stop, Verdict, fail, file_of, load, matches, part_regions, prints_verdict, rel, run_student,
    shape_problem, tol, what_of,
)
from gqa_flash.course.lab.checks.kernel_parts import PART_CHECKS
from gqa_flash.reference import reference_attention


def kernel_config() -> dict:
    """The fixed tile the checks launch with (no autotuning, so the blocks are known)."""
    if runtime.INTERPRETER or runtime.DEVICE.type != "cuda":
        return dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1)
    return dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)


def _forward_cases(cfg=None):
    cfg = cfg or kernel_config()
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    ragged = 2 * bm + bn + 3  # 3 query blocks, the last one partial; 6 key blocks
    half = runtime.default_dtype()
    return [
        Case("GQA 8:2, causal, ragged length", None, n_q_heads=8, n_kv_heads=2, seq_len=ragged, head_dim=16,
             block_m=bm, block_n=bn, seed=51),
        Case("GQA 4:2, no causal mask, ragged length, sm_scale 0.3", None, n_q_heads=4, n_kv_heads=2,
             seq_len=ragged, head_dim=16, causal=False, sm_scale=0.3, block_m=bm, block_n=bn, seed=52),
        Case("MQA 4:1, half precision, batch 2, [B, N, H, D] layout", None, batch=2, n_q_heads=4, n_kv_heads=1,
             seq_len=bm + 5, head_dim=32, dtype=half, layout="bnhd", block_m=bm, block_n=bn, seed=53),
        Case("MHA 2:2, head dim 80 (padded to 128), strided", None, n_q_heads=2, n_kv_heads=2, seq_len=bm + bn - 3,
             head_dim=80, layout="strided", block_m=bm, block_n=bn, seed=54),
    ]


def _indicator_blocks(case: Case) -> int:
    """How many key blocks the indicator columns of V mark (0 where the head dim is too narrow for them)."""
    n_kb = triton.cdiv(case.seq_len, case.block_n)
    return n_kb if case.head_dim >= n_kb + 1 else 0


def indicator_qkv(case: Case):
    """Inputs whose output says where each row's probability went.

    Column kb of V is 1 on the keys of key block kb and 0 elsewhere, so column
    kb of O is the softmax mass that row puts on key block kb. The last column
    of V holds the KV head's own index, so the last column of O is the index of
    the KV head the program read (the probabilities sum to 1).
    """
    q, k, v = case.qkv()
    n_kb = _indicator_blocks(case)
    if not n_kb:
        return q, k, v, 0
    block_of = torch.arange(case.seq_len) // case.block_n
    indicator = (block_of[:, None] == torch.arange(n_kb)[None, :]).to(torch.float32)
    with torch.no_grad():
        v[..., :n_kb] = indicator.to(v.dtype).to(v.device)
        v[..., -1] = torch.arange(case.n_kv_heads, dtype=v.dtype, device=v.device).view(1, -1, 1)
    return q, k, v, n_kb


def _run_kernel(fwd, case: Case):
    q, k, v, n_kb = indicator_qkv(case)
    result = run_student("forward", fwd.flash_attention_forward, q, k, v, causal=case.causal,
                         sm_scale=case.sm_scale, return_lse=True, config=kernel_config())
    return q, k, v, n_kb, result


# --------------------------------------------------------------------------
# The error map
# --------------------------------------------------------------------------


@dataclass
class ErrorMap:
    """The kernel's error per (query head, query block, key block), from one launch on indicator inputs."""

    err: torch.Tensor | None  # [Hq, n_query_blocks, n_key_blocks], max |mass error| over the block's rows
    lse_err: torch.Tensor | None  # [Hq, n_query_blocks]
    kv_expected: list
    kv_read: list  # the KV head each query head read (None when it cannot be told)
    block_m: int
    block_n: int
    seq_len: int
    causal: bool
    tol: float
    message: str | None = None  # set when the kernel did not run


def _error_map(q, k, v, n_kb, out, lse, case: Case) -> ErrorMap:
    ref, ref_lse = reference_attention(q, k, v, causal=case.causal, sm_scale=case.sm_scale)
    got = out.detach().to("cpu", torch.float64)[0]
    ref = ref[0]
    n, bm = case.seq_len, case.block_m
    n_qb = triton.cdiv(n, bm)
    mass_err = (got[..., :n_kb] - ref[..., :n_kb]).abs().nan_to_num(nan=float("inf"))
    err = torch.stack([mass_err[:, i * bm:(i + 1) * bm].amax(dim=1) for i in range(n_qb)], dim=1)
    lse_got = lse.detach().to("cpu", torch.float64)[0]
    lse_e = (lse_got - ref_lse[0]).abs().nan_to_num(nan=float("inf"))
    lse_err = torch.stack([lse_e[:, i * bm:(i + 1) * bm].amax(dim=1) for i in range(n_qb)], dim=1)
    tag = got[..., -1]
    kv_read = []
    for h in range(case.n_q_heads):
        t = tag[h]
        r = t.round()
        ok = torch.isfinite(t).all() and ((t - r).abs() < 0.02).all() and (r == r[0]).all()
        kv_read.append(int(r[0]) if ok else None)
    return ErrorMap(err=err, lse_err=lse_err, kv_expected=[kv_of(h, case) for h in range(case.n_q_heads)],
                    kv_read=kv_read, block_m=bm, block_n=case.block_n, seq_len=n, causal=case.causal,
                    tol=tol(case.dtype)["atol"])


def _no_map(case: Case, message: str) -> ErrorMap:
    """The map of ``case`` with no errors measured, and ``message`` saying why."""
    return ErrorMap(None, None, [kv_of(h, case) for h in range(case.n_q_heads)], [None] * case.n_q_heads,
                    case.block_m, case.block_n, case.seq_len, case.causal, tol(case.dtype)["atol"], message)


def forward_error_map() -> ErrorMap:
    """Run your kernel once on indicator inputs (GQA 8:2, causal) and measure its error per tile.

    Never raises: if the kernel does not run, the map carries the reason.
    """
    case = _forward_cases()[0]
    reason = why_not_run_forward()
    if reason is not None:
        return _no_map(case, reason)
    try:
        fwd = load("forward")
        q, k, v, n_kb, result = _run_kernel(fwd, case)
    except Stop as stop:
        return _no_map(case, stop.verdict.headline())
    if not (isinstance(result, tuple) and len(result) == 2):
        return _no_map(case, "flash_attention_forward did not return (O, LSE)")
    return _error_map(q, k, v, n_kb, result[0], result[1], case)


KERNEL_BUGS = {
    None: "right",
    "kv_mod": "Part 1: % instead of //",
    "no_rescale_acc": "Part 4: acc not rescaled",
    "exp": "Part 4: exp instead of exp2",
    "mask_diag": "Part 5: mask off by one",
}
"""Known kernel bugs that :func:`simulated_error_map` can replay."""


def gallery_case() -> Case:
    """The case of :func:`simulated_error_map`: :func:`forward_error_map`'s first, at the interpreter's
    tiles on every machine (its bugs' answers are stored for those inputs: replays.py)."""
    return _forward_cases(dict(BLOCK_M=32, BLOCK_N=16))[0]


def simulated_error_map(bug=None) -> ErrorMap:
    """The error map a kernel with ``bug`` (a key of KERNEL_BUGS) would show.

    The inputs of :func:`forward_error_map`, at the interpreter's tiles (BLOCK_M 32, BLOCK_N 16) on every
    machine. No kernel runs: the bug's answer was computed in float64 beforehand and stored (replays.py),
    so this is instant and needs no student code.
    """
    if bug not in KERNEL_BUGS:
        raise ValueError(f"bug must be one of {list(KERNEL_BUGS)}; got {bug!r}")
    case = gallery_case()
    kept = replays.stored("kernel", case.name, case.dtype)
    if kept is None:
        return _no_map(case, "no stored answers (gqa_flash/course/lab/checks/replays.pt is missing)")
    (q, k, v), answers = kept  # the inputs the answers were computed from (the indicator columns included)
    if bug is None:
        out, lse = reference_attention(q, k, v, causal=case.causal, sm_scale=case.sm_scale)
    else:
        out, lse = answers[f"{bug} O"], answers[f"{bug} LSE"]
    return _error_map(q, k, v, _indicator_blocks(case), out, lse, case)


# --------------------------------------------------------------------------
# The whole kernel
# --------------------------------------------------------------------------


def _where_kernel(case: Case, problem, got, ref, n_kb) -> str:
    """The case, the heads, the query block and (from the indicator columns) the key block that went wrong."""
    b, h, i = problem.index[:3]
    qb, row = i // case.block_m, i % case.block_m
    where = f"case \"{case.name}\": batch {b}, query head {h}, KV head {kv_of(h, case)}"
    if n_kb:
        tag = float(got[b, h, i, -1])
        if math.isfinite(tag) and abs(tag - round(tag)) < 0.02 and round(tag) != kv_of(h, case):
            where += f" (the kernel read KV head {round(tag)})"
        mass_err = (got[b, h, i, :n_kb] - ref[b, h, i, :n_kb]).abs().nan_to_num(nan=float("inf"))
        if float(mass_err.max()) > tol(case.dtype)["atol"]:
            where += f", query block {qb}, key block {int(mass_err.argmax())}"
        else:
            where += f", query block {qb}"
    else:
        where += f", query block {qb}"
    return where + f", row {row} of the block (sequence position {i})"


# The parts that compute addresses: while one of them is wrong, the kernel may read or write outside
# its tensors, which on a CPU can crash the Python process (the notebook's kernel dies). Part numbers.
_ADDRESS_PARTS = (1, 2, 6)


def _unsafe_part(verdicts_by_part: dict):
    """The first failing verdict among the address parts, or None. ``verdicts_by_part``: {part number: verdict}.

    A part whose mistake shows only past 2^31 elements or on a GPU (int32 offsets, a masked load with no
    ``other``: its verdict says ``safe_on_small_tensors``) does not stop the kernel's small cases."""
    return next((verdicts_by_part[p] for p in _ADDRESS_PARTS
                 if not verdicts_by_part[p].ok and not verdicts_by_part[p].extra.get("safe_on_small_tensors")), None)


def why_not_run_forward():
    """Why your whole kernel must not run yet (a part that computes addresses fails its own check), or None.

    Only those parts' checks run, not the kernel: call this before any cell that runs the kernel."""
    unsafe = _unsafe_part({part: PART_CHECKS[part - 1].verdict() for part in _ADDRESS_PARTS})
    return None if unsafe is None else _not_run(unsafe)


def _not_run(verdict) -> str:
    return (f"the whole kernel is not run until {verdict.what} passes: that part computes addresses, and while "
            "its check fails a wrong one is not ruled out, whatever its mistake is (its own message says); a wrong "
            "address can read or write outside the tensors (on a CPU that can crash Python)")


# The kernel's scale is sm_scale * log2(e) (qk_scale), in Part 3's scores; exp2 in Part 4 and ln 2 in Part 6
# undo the log2(e). So a missing qk_scale is a softmax scale of ln 2, and a qk_scale without log2(e) one of
# sm_scale * ln 2: both are the reference at another sm_scale. Each bug gives the sm_scale it amounts to.
_SCALE_MISTAKES = [
    Mistake(lambda sm_scale: math.log(2),
            "the scores are never multiplied by qk_scale (Part 3): the kernel computes the softmax of the plain dot "
            "products q·k, in log2 units", "multiply q·kᵀ by qk_scale in both phases of Part 3"),
    Mistake(lambda sm_scale: sm_scale * math.log(2),
            "the scores are scaled by sm_scale alone: log2(e) is missing from qk_scale, so the powers of 2 in Part 4 "
            "are not the exponentials of the scaled scores", "qk_scale = sm_scale * log2(e)"),
]

# When every part passes its own check and the answer matches no mistake above.
_UNEXPLAINED = ("the six parts pass their own checks, on their own inputs: the mistake shows only on this case's "
                "sizes, layout or dtype, or it lies outside the six parts, in a line of the kernel that you edited",
                "compare the case named in where with the parts' own cases; the kernel's lines outside the "
                "STUDENT IMPLEMENTATION banners are the course's, and work as given")


def _scale_mistake(out, lse, q, k, v, case: Case):
    """(cause, hint) when O and the LSE are the reference's at the sm_scale of a known scale mistake, else None."""
    t = tol(case.dtype)
    for mistake in _SCALE_MISTAKES:
        o_ref, lse_ref = reference_attention(q, k, v, causal=case.causal, sm_scale=mistake.bug(case.scale))
        if matches(out, o_ref, 2 * t["atol"], 2 * t["rtol"]) and (
                lse is None or matches(lse, lse_ref, 2 * testing.LSE_TOLERANCE["atol"],
                                       2 * testing.LSE_TOLERANCE["rtol"])):
            return mistake.cause, mistake.hint
    return None


# Helpers that Part 3 calls with arguments of its own making: a crash inside one of them, while its own check
# (which calls it with the right arguments) passes, is the call's mistake.
_CALLED_BY_KEY_LOOP = (4, 5)


def _calls_in_key_loop(helper: str) -> list[int]:
    """The lines of Part 3 (key_loop) in the checked file that call ``helper``."""
    path = file_of("forward")
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    return [n for first, last, part in part_regions(path) if part == 3 for n in range(first, last + 1)
            if f"{helper}(" in lines[n - 1] and not lines[n - 1].strip().startswith("#")]


def _blame_the_call(crash: Verdict, part_verdicts, fwd) -> Verdict:
    """A crash inside Part 4 or 5 whose own check passes, as Part 3's: its call passes the wrong arguments."""
    part = next((p for p in _CALLED_BY_KEY_LOOP if crash.what == what_of("forward", p)), None)
    if part is None or not part_verdicts[part - 1].ok or crash.cause is None:
        return crash
    helper = PARTS["forward"][part]
    params = ", ".join(getattr(getattr(fwd, helper, None), "arg_names", None) or ())
    calls = _calls_in_key_loop(helper)
    where = crash.where
    if calls:
        lines = f"{'line' if len(calls) == 1 else 'lines'} {', '.join(map(str, calls))}"
        where = (f"{rel('forward')}, {lines} (the call in Part 3); the error is raised inside Part {part}"
                 + (f", at {crash.where}" if crash.where else ""))
    return fail("forward", 3, f"{crash.message}, inside {what_of('forward', part)}, which passes its own check",
                where=where,
                cause=(f"{what_of('forward', part)} passes its own check, where the probe calls it with the right "
                       "arguments; in the kernel Part 3 calls it, so the blocks it gets are wrong: the call in "
                       f"key_loop passes its arguments in the wrong order, or the wrong ones ({crash.cause})"),
                hint=(f"compare the call of {helper} in key_loop with its signature, {helper}({params})"
                      + (": which offsets are the query rows, and which the keys" if part == 5 else "")))


@prints_verdict
def check_forward(part_verdicts=None):
    """forward.py, the whole kernel: its six parts first, then the kernel on four cases."""
    fwd = load("forward")
    if part_verdicts is None:
        part_verdicts = [check.verdict() for check in PART_CHECKS]
    broken = next((v for v in part_verdicts if not v.ok), None)
    unsafe = _unsafe_part(dict(enumerate(part_verdicts, start=1)))
    if unsafe is not None:  # no cause: the reason shows at once
        return fail("forward", None, f"not run yet: {_not_run(unsafe)}",
                    hint=f"make {unsafe.what}'s own check pass first (its verdict is above), then re-run this cell")
    for case in _forward_cases():
        try:
            q, k, v, n_kb, result = _run_kernel(fwd, case)
        except Stop as stop:
            raise Stop(_blame_the_call(stop.verdict, part_verdicts, fwd)) from None
        out, lse = result if isinstance(result, tuple) and len(result) == 2 else (result, None)
        ref, ref_lse = reference_attention(q, k, v, causal=case.causal, sm_scale=case.sm_scale)
        shape = shape_problem(out, ref.shape) or shape_problem(lse, ref_lse.shape, "the LSE")
        if shape:
            raise Stop(fail("forward", None, shape, where=f"case \"{case.name}\""))
        problem = testing.mismatch("O", out, ref, **tol(case.dtype))
        output = "O"
        if problem is None:
            problem = testing.mismatch("LSE", lse, ref_lse, labels=("batch", "head", "row"), **testing.LSE_TOLERANCE)
            output = "the LSE"
        if problem is None:
            continue
        scale = _scale_mistake(out, lse, q, k, v, case)
        if scale is not None:
            cause, hint = scale
        elif broken is not None:
            cause, hint = f"{broken.what} fails its own check above: {broken.cause or broken.message}", broken.hint
        else:
            cause, hint = _UNEXPLAINED
        return fail("forward", None, f"{output} of the kernel does not match the float64 reference",
                    where=_where_kernel(case, problem, out.detach().to("cpu", torch.float64), ref, n_kb), cause=cause,
                    hint=hint)
    if broken is not None:  # right answers here, but a part is wrong where these cases do not look
        return fail("forward", None, f"the kernel's answers are right on these cases, but {broken.what} "
                    "fails its own check", cause=broken.cause, hint=broken.hint)
    return Verdict(True, "forward.py", f"the kernel matches the float64 reference (O and LSE) in "
                   f"{len(_forward_cases())} cases: GQA, MQA, MHA; causal and not; ragged lengths; "
                   "half precision; head dim 80; strided layouts")
