"""Checks that teach: run one graded piece, compare it with the float64 reference, say what is wrong.

The notebooks call one check after every exercise. Each check

* reaches your code the way the course does (the public API, or
  ``impl.load(<module>)`` for the pieces the API does not expose), so
  ``GQA_FLASH_IMPL`` is honoured and a file you just saved is re-imported;
* runs it on a few small inputs built to isolate one idea (for instance every
  KV head holds different values, so reading the wrong head shows);
* compares with the float64 reference (``reference.py``), never with your own
  earlier code, and never raises for a wrong answer: it prints a verdict.

A verdict is one line, ``PASS`` or ``FAIL``, the file and the part, then on a
failure a few indented lines: where the first wrong value is, and the most
likely cause. The likely cause comes from replaying the usual mistakes (``%``
for ``//``, a missing rescale, a mask off by one, ``exp`` for ``exp2``...) in
float64 and seeing which one your output matches.

The kernel parts of ``forward.py`` are small ``@triton.jit`` helpers, and each
is checked on its own by a *probe*: a tiny kernel, defined here, that loads
chosen inputs, calls your helper, and stores what it returns. See
:func:`_probe_kernels` for how a probe is bound to the current version of your
file.
"""


import math
import re
import sys
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
import triton
import triton.language as tl

from gqa_flash import api, impl, layout, runtime, testing
from gqa_flash.reference import reference_attention, reference_softmax

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

PARTS = {
    "naive": {1: "GQA head mapping", 2: "scores and causal mask", 3: "softmax and P @ V"},
    "online_softmax": {1: "block_state", 2: "merge_states", 3: "online_softmax"},
    "tiled": {
        1: "GQA head mapping",
        2: "which key tiles to visit",
        3: "causal mask on the diagonal tiles",
        4: "online-softmax update",
        5: "epilogue: O and LSE",
    },
    "forward": {1: "_kv_head_index", 2: "_online_softmax_update", 3: "_mask_scores", 4: "_epilogue"},
}
_HELPER_PART = {name: part for part, name in PARTS["forward"].items()}


# --------------------------------------------------------------------------
# Verdicts
# --------------------------------------------------------------------------


@dataclass
class Verdict:
    """What a check found: PASS or FAIL, about which part, and why."""

    ok: bool
    what: str  # e.g. "naive.py Part 1 (GQA head mapping)"
    message: str
    where: str | None = None
    cause: str | None = None
    hint: str | None = None
    extra: dict = field(default_factory=dict, repr=False)

    def headline(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'} {self.what}: {self.message}"

    def lines(self) -> list[str]:
        out = [self.headline()]
        for label, text in (("where", self.where), ("likely cause", self.cause), ("hint", self.hint)):
            if text:
                out.append(f"    {label}: {text}")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def _what(module: str, part=None) -> str:
    if part is None:
        return f"{module}.py"
    if isinstance(part, tuple):
        return f"{module}.py Parts {part[0]}-{part[-1]}"
    return f"{module}.py Part {part} ({PARTS[module][part]})"


def _fail(module, part, message, **kw) -> Verdict:
    return Verdict(False, _what(module, part), message, **kw)


class _Stop(Exception):
    """Raised inside a check to end it with this verdict."""

    def __init__(self, verdict: Verdict):
        super().__init__(str(verdict))
        self.verdict = verdict


def _rel(module: str) -> str:
    """``gqa_flash/naive.py`` (or ``solutions/naive.py``): the file the check runs."""
    path = impl.path_of(module)
    try:
        return str(path.relative_to(layout.COURSE_DIR))
    except ValueError:
        return str(path)


def _load(module: str):
    """The graded module, re-imported if it changed; a broken file becomes a verdict."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return impl.load(module)
    except Exception as e:  # a syntax error, an import error...
        raise _Stop(_fail(module, None, f"{_rel(module)} does not import: {_describe_exception(e)}",
                          hint="fix the error, save the file, and re-run this cell")) from None


# --- exceptions from student code -------------------------------------------


def _part_regions(path: Path) -> list[tuple[int, int, int]]:
    """(first line, last line, part) of every STUDENT IMPLEMENTATION banner in a file."""
    regions, start, part = [], None, None
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return regions
    for lineno, line in enumerate(lines, start=1):
        m = layout.BANNER.search(line)
        if m and line.strip().startswith("#"):
            start, part = lineno, int(m.group(1))
        elif line.strip() == layout.BANNER_END and start is not None:
            regions.append((start, lineno, part))
            start = None
    return regions


def _unwrap(exc: BaseException) -> BaseException:
    """The exception student code raised, out of the wrappers of Triton's interpreter."""
    while type(exc).__name__ == "InterpreterError" and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def _part_from_traceback(module: str, exc: BaseException):
    """The part whose banner holds the deepest line of ``module``'s file in the traceback."""
    path = impl.path_of(module).resolve()
    line = None
    chain, e = [], exc
    while e is not None and e not in chain:  # the interpreter re-raises: look through the causes
        chain.append(e)
        e = e.__cause__
    for e in chain:
        tb = e.__traceback__
        while tb is not None:
            try:
                if Path(tb.tb_frame.f_code.co_filename).resolve() == path:
                    line = tb.tb_lineno
            except (OSError, ValueError):
                pass
            tb = tb.tb_next
    if line is None:
        return None, None
    for first, last, part in _part_regions(path):
        if first <= line <= last:
            return part, line
    return None, line


def _innermost_compile_error(exc: BaseException):
    try:
        from triton.compiler.errors import CompilationError
    except ImportError:  # pragma: no cover
        return None
    found, e, seen = None, exc, set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, CompilationError):
            found = e
        e = e.__cause__ or e.__context__
    return found


def _describe_exception(exc: BaseException) -> str:
    """``TypeError: message``, one line, short; for Triton compile errors the error and its line."""
    ce = _innermost_compile_error(exc)
    if ce is not None:
        msg = (getattr(ce, "error_message", None) or "").strip().splitlines()
        text = msg[-1] if msg else type(ce).__name__
        node, src = getattr(ce, "node", None), getattr(ce, "src", None)
        if src and hasattr(node, "lineno"):
            source_lines = src.splitlines()
            if 0 < node.lineno <= len(source_lines):
                text += f" (in `{source_lines[node.lineno - 1].strip()}`)"
        return f"the kernel does not compile: {type(ce).__name__}: {_short(text)}"
    exc = _unwrap(exc)
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {_short(text[0] if text else '')}".rstrip(": ")


def _short(text: str, limit: int = 220) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _helper_of_compile_error(exc: BaseException):
    ce = _innermost_compile_error(exc)
    if ce is None or not getattr(ce, "src", None):
        return None
    m = re.search(r"def\s+(\w+)\s*\(", ce.src)
    return _HELPER_PART.get(m.group(1)) if m else None


def _run_student(module: str, fn, *args, part=None, **kwargs):
    """Call student code; NotImplementedError and crashes become verdicts (raised as _Stop)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(*args, **kwargs)
    except _Stop:
        raise
    except NotImplementedError as e:
        m = re.search(r"Part (\d+)", str(e))
        p = int(m.group(1)) if m else (_part_from_traceback(module, e)[0] or part)
        p = p if p in PARTS[module] else part
        raise _Stop(_fail(module, p, f"Part {p} is not implemented yet" if p else "not implemented yet",
                          hint=f"open {_rel(module)}, fill in Part {p}, save, and re-run this cell")) from None
    except Exception as e:
        p, line = _part_from_traceback(module, e)
        if p is None and module == "forward":
            p = _helper_of_compile_error(e)
        p = p or part
        where = f"{_rel(module)}, line {line}" if line else None
        raise _Stop(_fail(module, p, f"your code raised {_describe_exception(e)}", where=where)) from None


def _verdict_of(check, *args, **kwargs) -> Verdict:
    """Run a check body; whatever happens, come back with a Verdict."""
    try:
        return check(*args, **kwargs)
    except _Stop as stop:
        return stop.verdict


# --------------------------------------------------------------------------
# Comparing tensors
# --------------------------------------------------------------------------


def _tol(dtype):
    return testing.TOLERANCES.get(dtype, testing.TOLERANCES[torch.float32])


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _close(got, exp, atol, rtol):
    """Elementwise: within tolerance of a finite expected value, or exactly the expected +-inf."""
    close = ((got - exp).abs() <= atol + rtol * exp.abs()) & torch.isfinite(exp)
    return close | (got == exp)


def _matches(out, candidate, atol, rtol) -> bool:
    """True when ``out`` equals ``candidate`` within tolerance; NaN matches NaN, inf matches inf."""
    if candidate is None or not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(candidate.shape):
        return False
    got = out.detach().to("cpu", torch.float64)
    exp = candidate.detach().to("cpu", torch.float64)
    return bool((_close(got, exp, atol, rtol) | (torch.isnan(got) & torch.isnan(exp))).all())


def _first_cause(out, variants, atol, rtol):
    """The description of the first known mistake whose output ``out`` matches."""
    for description, candidate in variants:
        try:
            value = candidate() if callable(candidate) else candidate
        except Exception:  # a variant that cannot happen for these shapes
            continue
        if _matches(out, value, 2 * atol, 2 * rtol):
            return description
    return None


def _shape_problem(out, ref_shape, what="the output"):
    if not isinstance(out, torch.Tensor):
        return f"{what} should be a tensor, got {type(out).__name__}"
    if tuple(out.shape) != tuple(ref_shape):
        return f"{what} has shape {list(out.shape)}; expected {list(ref_shape)}"
    return None


# --------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------


@dataclass
class _Case:
    name: str
    part: object  # the part this case isolates: an int, a tuple of parts, or None
    batch: int = 1
    n_q_heads: int = 1
    n_kv_heads: int = 1
    seq_len: int = 8
    head_dim: int = 16
    causal: bool = True
    dtype: torch.dtype = torch.float32
    layout: str = "contiguous"
    sm_scale: float | None = None
    block_m: int = 16
    block_n: int = 8
    seed: int = 0

    def qkv(self):
        return testing.random_qkv(
            batch=self.batch, n_q_heads=self.n_q_heads, n_kv_heads=self.n_kv_heads, seq_len=self.seq_len,
            head_dim=self.head_dim, dtype=self.dtype, layout=self.layout, seed=self.seed,
        )

    @property
    def scale(self) -> float:
        return self.sm_scale if self.sm_scale is not None else 1.0 / math.sqrt(self.head_dim)


def _kv_of(h: int, case: _Case) -> int:
    return h // (case.n_q_heads // case.n_kv_heads)


# --------------------------------------------------------------------------
# Known mistakes, replayed in float64
# --------------------------------------------------------------------------


def _kv_index(n_q_heads, n_kv_heads, how="div"):
    h = torch.arange(n_q_heads)
    idx = {
        "div": h // (n_q_heads // n_kv_heads),
        "mod": h % n_kv_heads,
        "div_kv": h // n_kv_heads,
        "zero": torch.zeros_like(h),
    }[how]
    if int(idx.max()) >= n_kv_heads:
        raise IndexError("variant reads a KV head that does not exist")
    return idx


def _naive64(q, k, v, causal, sm_scale, kv="div", mask="future", scale="mul", softmax="keys"):
    """Attention in float64 with one known mistake switched on (the defaults are right)."""
    q, k, v = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
    idx = _kv_index(q.shape[1], k.shape[1], kv)
    k, v = k[:, idx], v[:, idx]
    s = q @ k.transpose(-1, -2)
    s = {"mul": s * sm_scale, "none": s, "div": s / sm_scale}[scale]
    if causal and mask != "none":
        n = q.shape[2]
        ones = torch.ones(n, n, dtype=torch.bool)
        hide = {"future": ones.triu(1), "diag": ones.triu(0), "past": ones.tril(-1)}.get(mask, ones.triu(1))
        s = s.masked_fill(hide, 0.0 if mask == "zero" else float("-inf"))
    if softmax == "queries":
        p = torch.softmax(s, dim=-2)
    elif softmax == "unnormalised":
        p = torch.exp(s - s.amax(dim=-1, keepdim=True))
    else:
        p = torch.softmax(s, dim=-1)
    return p @ v


def _tiled64(q, k, v, causal, sm_scale, block_m, block_n, bug=None):
    """FlashAttention's tile walk (as in tiled.py) in float64, with at most one known bug.

    Returns (O, LSE) in float64. ``bug`` names the mistake; see _TILED_BUGS.
    """
    q, k, v = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
    batch, n_q_heads, n, d = q.shape
    idx = _kv_index(n_q_heads, k.shape[1], "mod" if bug == "kv_mod" else "div")
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
            acc = (acc if bug in ("no_rescale_acc", "no_rescale") else alpha[..., None] * acc) + p @ v[:, :, k_start:k_end]
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


# --------------------------------------------------------------------------
# naive.py
# --------------------------------------------------------------------------

_NAIVE_CASES = [
    _Case("one head, no mask", (2, 3), causal=False),
    _Case("one head, causal", 2, causal=True, seed=1),
    _Case("GQA, 8 query heads on 2 KV heads, causal", 1, n_q_heads=8, n_kv_heads=2, seed=2),
    _Case("GQA, 6 query heads on 3 KV heads, no mask", 1, n_q_heads=6, n_kv_heads=3, causal=False, seed=3),
    _Case("MQA, 4 query heads on 1 KV head", 1, n_q_heads=4, n_kv_heads=1, seed=4),
    _Case("fp16, batch 2, length 13", None, batch=2, n_q_heads=4, n_kv_heads=2, seq_len=13,
          dtype=torch.float16, seed=5),
    _Case("strided inputs (every dimension)", None, n_q_heads=4, n_kv_heads=2, seq_len=12,
          layout="strided", seed=6),
]

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
    (2, dict(mask="zero"), "masked scores are set to 0, not -inf: exp(0) = 1 still gives the future a weight"),
    (3, dict(softmax="queries"), "softmax over the wrong dimension: normalise each row over the keys (dim=-1)"),
    (3, dict(softmax="unnormalised"), "the probabilities are not normalised: divide by the row sums "
                                      "(or use torch.softmax)"),
]


def _where_attention(problem, case: _Case, with_tile=False) -> str:
    b, h, i, c = problem.index
    text = f"case \"{case.name}\": batch {b}, query head {h} (should read KV head {_kv_of(h, case)}), "
    if with_tile:
        t = i // case.block_m
        text += f"query tile {t} (rows {t * case.block_m}-{min((t + 1) * case.block_m, case.seq_len) - 1}), "
    return text + f"row {i}, column {c}: got {_fmt(problem.got)}, expected {_fmt(problem.expected)}"


def _naive_body() -> Verdict:
    _load("naive")  # a file that does not import is reported before anything runs
    for case in _NAIVE_CASES:
        q, k, v = case.qkv()
        out = _run_student("naive", api.naive_attention, q, k, v, causal=case.causal, part=case.part)
        ref, _ = reference_attention(q, k, v, causal=case.causal)
        shape = _shape_problem(out, ref.shape)
        if shape:
            raise _Stop(_fail("naive", case.part if isinstance(case.part, int) else 3, shape,
                              where=f"case \"{case.name}\""))
        if out.dtype != q.dtype:
            raise _Stop(_fail("naive", 3, f"the output is {out.dtype} for {q.dtype} inputs",
                              where=f"case \"{case.name}\"", hint="return out.to(q.dtype)"))
        tol = _tol(case.dtype)
        problem = testing.mismatch("O", out, ref, **tol)
        if problem is None:
            continue
        variants = [
            ((part, text), (lambda kw=kw: _naive64(q, k, v, case.causal, case.scale, **kw)))
            for part, kw, text in _NAIVE_MISTAKES
        ]
        found = _first_cause(out, variants, **tol)
        part, cause = found if found else (case.part, None)
        raise _Stop(_fail("naive", part, "does not match the float64 reference",
                          where=_where_attention(problem, case), cause=cause))
    return Verdict(True, _what("naive", (1, 3)),
                   f"{len(_NAIVE_CASES)} cases match the float64 reference "
                   "(MHA, GQA, MQA; causal and not; fp32 and fp16; strided)")


def check_naive() -> None:
    """naive.py, Parts 1-3: the whole function on cases that each isolate one part."""
    print(_verdict_of(_naive_body))


# --------------------------------------------------------------------------
# online_softmax.py
# --------------------------------------------------------------------------


def _softmax_rows():
    """Rows that test the corners: ordinary, huge (exp overflows), partly and wholly masked."""
    g = torch.Generator().manual_seed(11)
    ordinary = torch.randn(4, 8, generator=g) * 2
    special = torch.randn(4, 8, generator=g)
    special[0] += 1000.0  # exp(1000) is inf: only a safe softmax survives
    special[1] = float("-inf")  # a wholly masked row (a causal row's future block)
    special[2, 5:] = float("-inf")  # a partly masked row
    special[3] -= 1000.0  # exp(-1000) is 0: again only a safe softmax survives
    batched = torch.randn(2, 3, 5, generator=g)
    return [("ordinary rows [4, 8]", ordinary),
            ("corner rows: +1000, all -inf, partly -inf, -1000", special),
            ("a batch of rows [2, 3, 5]", batched)]


def _state64(x):
    x = x.to(torch.float64)
    m = x.amax(dim=-1)
    m0 = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    return m, torch.exp(x - m0[..., None]).sum(dim=-1)


def _where_row(case_name, index, what, got, expected):
    idx = ", ".join(str(i) for i in index)
    return f"case \"{case_name}\": {what}[{idx}]: got {_fmt(got)}, expected {_fmt(expected)}"


def _block_state_body() -> Verdict:
    mod = _load("online_softmax")
    for name, x in _softmax_rows():
        result = _run_student("online_softmax", mod.block_state, x.clone(), part=1)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise _Stop(_fail("online_softmax", 1, "block_state must return the pair (m, l)"))
        m, l = result
        m_ref, l_ref = _state64(x)
        for label, got, ref in (("m", m, m_ref), ("l", l, l_ref)):
            shape = _shape_problem(got, ref.shape, label)
            if shape:
                raise _Stop(_fail("online_softmax", 1, shape, where=f"case \"{name}\"",
                                  hint="reduce over the last dimension only (dim=-1)"))
        for label, got, ref in (("m", m, m_ref), ("l", l, l_ref)):
            problem = testing.mismatch(label, got, ref, atol=1e-5, rtol=1e-5, labels=("row",) * x.dim())
            if problem is None:
                continue
            got64 = got.detach().to(torch.float64)
            cause = None
            if label == "l" and torch.isnan(got64).any() and torch.isneginf(m_ref[torch.isnan(got64)]).all():
                cause = ("a row that is all -inf gives NaN: its m is -inf and exp(-inf - (-inf)) is NaN; "
                         "subtract 0 where m is -inf (torch.where(torch.isneginf(m), 0, m))")
            elif label == "l" and _matches(got, torch.exp(x.double()).sum(-1), 1e-5, 1e-5):
                cause = ("not a safe softmax: subtract the row maximum before exp "
                         "(exp(1000) is inf, exp(-1000) is 0 in float32)")
            elif label == "l" and not torch.isfinite(got64[torch.isfinite(l_ref)]).all():
                cause = "l overflowed or became NaN: compute exp(x - m), not exp(x)"
            elif label == "m" and _matches(got, x.double().amin(-1), 1e-5, 1e-5):
                cause = "m is the row minimum: it must be the maximum"
            raise _Stop(_fail("online_softmax", 1, "does not match the float64 reference",
                              where=_where_row(name, problem.index, label, problem.got, problem.expected),
                              cause=cause))
    return Verdict(True, _what("online_softmax", 1),
                   "(m, l) match the float64 reference, huge and fully masked rows included")


def check_block_state() -> None:
    """online_softmax.py Part 1: the state (m, l) of one block."""
    print(_verdict_of(_block_state_body))


def _merge_cases():
    g = torch.Generator().manual_seed(12)
    m_a, m_b = torch.randn(6, generator=g) * 3, torch.randn(6, generator=g) * 3
    l_a, l_b = 1 + torch.rand(6, generator=g) * 4, 1 + torch.rand(6, generator=g) * 4
    inf = float("-inf")
    empty_m = torch.tensor([inf, 1.5, inf, 2.0])
    empty_l = torch.tensor([0.0, 2.0, 0.0, 3.0])
    other_m = torch.tensor([0.5, inf, inf, 2.0])
    other_l = torch.tensor([1.5, 0.0, 0.0, 1.0])
    return [
        ("random states", (m_a, l_a, m_b, l_b)),
        ("empty parts (m = -inf, l = 0): one side, the other, both; equal maxima",
         (empty_m, empty_l, other_m, other_l)),
    ]


def _merge64(m_a, l_a, m_b, l_b, how="right"):
    m_a, l_a, m_b, l_b = (t.to(torch.float64) for t in (m_a, l_a, m_b, l_b))
    m = torch.maximum(m_a, m_b)
    m0 = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    if how == "no_rescale":
        return m, l_a + l_b
    if how == "inverted":
        return m, l_a * torch.exp(m0 - m_a) + l_b * torch.exp(m0 - m_b)
    if how == "nan_empty":
        return m, l_a * torch.exp(m_a - m) + l_b * torch.exp(m_b - m)
    return m, l_a * torch.exp(m_a - m0) + l_b * torch.exp(m_b - m0)


def _merge_states_body() -> Verdict:
    _load("online_softmax")
    for name, (m_a, l_a, m_b, l_b) in _merge_cases():
        result = _run_student("online_softmax", api.merge_softmax_states, m_a, l_a, m_b, l_b, part=2)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise _Stop(_fail("online_softmax", 2, "merge_states must return the pair (m, l)"))
        m, l = result
        m_ref, l_ref = _merge64(m_a, l_a, m_b, l_b)
        for label, got, ref in (("m", m, m_ref), ("l", l, l_ref)):
            problem = testing.mismatch(label, got, ref, atol=1e-5, rtol=1e-5, labels=("row",))
            if problem is None:
                continue
            cause = None
            if label == "m":
                cause = "m must be the larger of the two maxima: torch.maximum(m_a, m_b)"
            else:
                for how, text in (
                    ("no_rescale", "missing rescale: each partial sum was taken against its own maximum; "
                                   "multiply l_a by exp(m_a - m) and l_b by exp(m_b - m) before adding"),
                    ("inverted", "the rescale is inverted: exp(m_a - m) (<= 1) shrinks l_a to the new maximum"),
                    ("nan_empty", "two empty parts (m = -inf on both sides) give NaN: exp(-inf - (-inf)) is NaN; "
                                  "subtract 0 where the new maximum is -inf"),
                ):
                    if _matches(l, _merge64(m_a, l_a, m_b, l_b, how)[1], 1e-5, 1e-5):
                        cause = text
                        break
            raise _Stop(_fail("online_softmax", 2, "does not match the float64 reference",
                              where=_where_row(name, problem.index, label, problem.got, problem.expected),
                              cause=cause))
    return Verdict(True, _what("online_softmax", 2), "merged states match the float64 reference, empty parts included")


def check_merge_states() -> None:
    """online_softmax.py Part 2: merging the states of two parts of the same rows."""
    print(_verdict_of(_merge_states_body))


def _online_cases():
    g = torch.Generator().manual_seed(13)
    ragged = torch.randn(3, 37, generator=g) * 3
    causal_rows = torch.randn(4, 20, generator=g)
    causal_rows[:, :8] = float("-inf")  # a whole first block masked: the state starts empty
    causal_rows[1, 8:15] = float("-inf")
    half = (torch.randn(2, 16, generator=g) * 2).to(torch.float16)
    return [
        ("37 columns in blocks of 8 (the last block is shorter)", ragged, 8),
        ("one column at a time", ragged, 1),
        ("a block wider than the row", ragged, 64),
        ("rows whose first block is all -inf", causal_rows, 8),
        ("fp16 input", half, 4),
    ]


def _online_softmax_body() -> Verdict:
    _load("online_softmax")
    parts_first = [(1, _verdict_of(_block_state_body)), (2, _verdict_of(_merge_states_body))]
    for name, x, block in _online_cases():
        out = _run_student("online_softmax", api.online_softmax, x.clone(), block, part=3)
        ref = reference_softmax(x)
        shape = _shape_problem(out, ref.shape)
        if shape:
            raise _Stop(_fail("online_softmax", 3, shape, where=f"case \"{name}\""))
        if out.dtype != x.dtype:
            raise _Stop(_fail("online_softmax", 3, f"returns {out.dtype} for {x.dtype} input",
                              where=f"case \"{name}\"", hint="return probs.to(x.dtype)"))
        tol = _tol(x.dtype)
        problem = testing.mismatch("softmax", out, ref, labels=("row", "column"), **tol)
        if problem is None:
            continue
        cause = None
        for part, verdict in parts_first:
            if not verdict.ok:
                cause = f"Part {part} ({PARTS['online_softmax'][part]}) fails its own check: fix it first"
                break
        if cause is None:
            x64, n = x.to(torch.float64), x.shape[-1]
            tail = (n // block) * block if n % block else n - block
            m_last, l_last = _state64(x64[..., tail:])
            m_head, l_head = _state64(x64[..., :tail]) if tail > 0 else (None, None)
            variants = [("only the last block's state is used: merge every block's state into the "
                         "running (m, l) with merge_states", torch.exp(x64 - m_last[..., None]) / l_last[..., None])]
            if m_head is not None and n % block:
                variants.append(("the last, shorter block is skipped: loop with range(0, n, block_size)",
                                 torch.exp(x64 - m_head[..., None]) / l_head[..., None]))
            cause = _first_cause(out, variants, **tol)
        raise _Stop(_fail("online_softmax", 3, "does not match the float64 reference",
                          where=f"case \"{name}\": row {problem.index[0]}, column {problem.index[1]}: "
                                f"got {_fmt(problem.got)}, expected {_fmt(problem.expected)}",
                          cause=cause))
    return Verdict(True, _what("online_softmax", 3),
                   "matches the float64 softmax for every block size, masked blocks and fp16 included")


def check_online_softmax() -> None:
    """online_softmax.py Part 3: the streaming softmax, block after block."""
    print(_verdict_of(_online_softmax_body))


# --------------------------------------------------------------------------
# tiled.py
# --------------------------------------------------------------------------

_TILED_CASES = [
    _Case("one head, no mask, two key tiles", (4, 5), seq_len=16, causal=False),
    _Case("one head, causal, length 37", (2, 3), seq_len=37, seed=1),
    _Case("GQA, 8 query heads on 2 KV heads, causal", 1, n_q_heads=8, n_kv_heads=2, seq_len=24, seed=2),
    _Case("no mask, length 37", 2, n_q_heads=2, n_kv_heads=1, seq_len=37, causal=False, seed=3),
    _Case("MQA in fp16, batch 2, block_m 8 with block_n 16", None, batch=2, n_q_heads=4, n_kv_heads=1,
          seq_len=29, head_dim=32, dtype=torch.float16, block_m=8, block_n=16, seed=4),
]

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


def _tiled_body() -> Verdict:
    _load("tiled")
    for case in _TILED_CASES:
        q, k, v = case.qkv()
        result = _run_student("tiled", api.tiled_attention, q, k, v, causal=case.causal, block_m=case.block_m,
                              block_n=case.block_n, return_lse=True, part=case.part)
        ref, ref_lse = reference_attention(q, k, v, causal=case.causal)
        out, lse = result if isinstance(result, tuple) and len(result) == 2 else (result, None)
        shape = _shape_problem(out, ref.shape) or _shape_problem(lse, ref_lse.shape, "the LSE")
        if shape:
            raise _Stop(_fail("tiled", 5, shape, where=f"case \"{case.name}\""))
        tol = _tol(case.dtype)
        problem = testing.mismatch("O", out, ref, **tol)
        sim = {}

        def simulated(bug):
            if bug not in sim:
                sim[bug] = _tiled64(q, k, v, case.causal, case.scale, case.block_m, case.block_n, bug)
            return sim[bug]

        if problem is not None:
            found = _first_cause(out, [((p, t), (lambda b=b: simulated(b)[0])) for p, b, t in _TILED_MISTAKES], **tol)
            part, cause = found if found else (case.part, None)
            raise _Stop(_fail("tiled", part, "O does not match the float64 reference",
                              where=_where_attention(problem, case, with_tile=True), cause=cause))
        problem = testing.mismatch("LSE", lse, ref_lse, labels=("batch", "head", "row"), **testing.LSE_TOLERANCE)
        if problem is not None:
            found = _first_cause(lse, [((p, t), (lambda b=b: simulated(b)[1])) for p, b, t in _TILED_LSE_MISTAKES],
                                 **testing.LSE_TOLERANCE)
            part, cause = found if found else (5, None)
            b, h, i = problem.index
            raise _Stop(_fail("tiled", part, "the LSE does not match the float64 reference",
                              where=f"case \"{case.name}\": batch {b}, query head {h}, row {i}: "
                                    f"got {_fmt(problem.got)}, expected {_fmt(problem.expected)}",
                              cause=cause))
        if lse.dtype != torch.float32:
            raise _Stop(_fail("tiled", 5, f"the LSE is {lse.dtype}; it must be float32"))
    # Right answers; now the work. A causal query tile must skip the key tiles past the diagonal.
    case = _TILED_CASES[1]
    q, k, v = case.qkv()
    with _CountScoreTiles(case.head_dim) as counter:
        _run_student("tiled", api.tiled_attention, q, k, v, causal=True, block_m=case.block_m, block_n=case.block_n,
                     part=2)
    expected = _tiles_visited(case.seq_len, case.block_m, case.block_n, True)
    if counter.count != expected:
        full = _tiles_visited(case.seq_len, case.block_m, case.block_n, False)
        cause = ("the causal key loop runs past the diagonal: the answer is right (the mask hides those keys) "
                 "but the work is not halved; stop at kv_end = q_end") if counter.count >= full else None
        raise _Stop(_fail("tiled", 2, f"visits {counter.count} key tiles; a causal walk visits {expected}",
                          where=f"case \"{case.name}\", block_m {case.block_m}, block_n {case.block_n}",
                          cause=cause))
    return Verdict(True, _what("tiled", (1, 5)),
                   f"O and LSE match the float64 reference in {len(_TILED_CASES)} cases "
                   "(MHA, GQA, MQA; causal and not; ragged; fp16), and the causal walk skips the future tiles")


def check_tiled() -> None:
    """tiled.py, Parts 1-5: cases that each isolate a part, then the count of key tiles visited."""
    print(_verdict_of(_tiled_body))


# --------------------------------------------------------------------------
# forward.py: probes, one tiny kernel per part
# --------------------------------------------------------------------------
#
# A probe is an ordinary kernel that loads chosen inputs, calls ONE of your
# helpers, and stores what it returns, so each part is checked on its own.
# The probes below are plain functions that say `fwd._kv_head_index(...)`;
# _probe_kernels() turns them into Triton kernels bound to one version of your
# forward module.
#
# Why a fresh kernel per version: a compiled Triton kernel remembers the code of
# every helper it calls (it hashes them once, on first launch). If the probe
# were a single global kernel, editing forward.py would leave it running your
# old helper on a GPU. So each time forward.py changes (impl.load re-executes
# it, which makes new helper objects) we build new probe kernels, each with its
# own globals dict in which `fwd` is the module; that dict never changes, so
# Triton's "global variable changed since compiled" check stays quiet. In the
# interpreter the same code runs as Python, unchanged.


def _probe_kv_head_index(OUT, N_Q_HEADS, N_KV_HEADS):
    q_head_idx = tl.program_id(0)
    tl.store(OUT + q_head_idx, fwd._kv_head_index(q_head_idx, N_Q_HEADS, N_KV_HEADS))  # noqa: F821


def _probe_online_softmax_update(ACC, L, M, S, V, ACC_OUT, L_OUT, M_OUT,
                                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                                 INPUT_PRECISION: tl.constexpr):
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    acc = tl.load(ACC + rows[:, None] * HEAD_DIM + dims[None, :])
    l_i = tl.load(L + rows)
    m_i = tl.load(M + rows)
    s = tl.load(S + rows[:, None] * BLOCK_N + cols[None, :])
    v = tl.load(V + cols[:, None] * HEAD_DIM + dims[None, :])
    acc, l_i, m_i = fwd._online_softmax_update(acc, l_i, m_i, s, v, INPUT_PRECISION)  # noqa: F821
    tl.store(ACC_OUT + rows[:, None] * HEAD_DIM + dims[None, :], acc)
    tl.store(L_OUT + rows, l_i)
    tl.store(M_OUT + rows, m_i)


def _probe_mask_scores(S, OUT, SEQ_LEN, stride_row, CAUSAL: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offsets = offs_m[:, None] * stride_row + offs_n[None, :]
    s = tl.load(S + offsets)
    tl.store(OUT + offsets, fwd._mask_scores(s, offs_m, offs_n, SEQ_LEN, CAUSAL))  # noqa: F821


def _probe_epilogue(ACC, L, M, O, LSE, SEQ_LEN, HEAD_DIM, stride_row,
                    BLOCK_M: tl.constexpr, HEAD_DIM_PAD: tl.constexpr):
    rows = tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM_PAD)
    acc = tl.load(ACC + rows[:, None] * HEAD_DIM_PAD + dims[None, :])
    l_i = tl.load(L + rows)
    m_i = tl.load(M + rows)
    o_ptrs = O + rows[:, None] * stride_row + dims[None, :]
    fwd._epilogue(acc, l_i, m_i, o_ptrs, LSE + rows, rows < SEQ_LEN, dims < HEAD_DIM)  # noqa: F821


_PROBES = (_probe_kv_head_index, _probe_online_softmax_update, _probe_mask_scores, _probe_epilogue)
_probe_cache: dict = {}


def _probe_kernels(fwd_module) -> dict:
    """The probe kernels bound to this version of the forward module (built once per version)."""
    key = id(fwd_module)
    version = tuple(getattr(fwd_module, name, None) for name in PARTS["forward"].values())
    cached = _probe_cache.get(key)
    if cached is not None and cached[0] == version:
        return cached[1]
    kernels = {}
    for fn in _PROBES:
        scope = dict(fn.__globals__)  # a private copy of this module's globals...
        scope["fwd"] = fwd_module  # ...in which `fwd` is your forward module, set once
        bound = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
        # What `def` sets besides the code: Triton reads `tl.constexpr` from the annotations.
        bound.__annotations__ = dict(fn.__annotations__)
        bound.__kwdefaults__ = fn.__kwdefaults__
        bound.__qualname__, bound.__doc__ = fn.__qualname__, fn.__doc__
        kernels[fn.__name__.removeprefix("_probe_")] = triton.jit(bound)
    _probe_cache[key] = (version, kernels)
    return kernels


def _forward_parts():
    fwd = _load("forward")
    missing = [name for name in PARTS["forward"].values() if not hasattr(fwd, name)]
    if missing:
        raise _Stop(_fail("forward", None, f"{_rel('forward')} has no {', '.join(missing)}",
                          hint="the helpers' names and arguments must stay as given"))
    return fwd, _probe_kernels(fwd)


def _launch(part, kernel, grid, *args, **kwargs):
    _run_student("forward", lambda: kernel[grid](*args, **kwargs), part=part)


def _dev():
    return runtime.DEVICE


# --- Part 1 ------------------------------------------------------------------

_KV_CONFIGS = [(8, 2), (6, 3), (32, 8), (4, 4), (4, 1)]


def _kv_head_index_body() -> Verdict:
    fwd, probes = _forward_parts()
    for n_q, n_kv in _KV_CONFIGS:
        out = torch.full((n_q,), -1, dtype=torch.int32, device=_dev())
        _launch(1, probes["kv_head_index"], (n_q,), out, n_q, n_kv)
        got = out.cpu().tolist()
        group = n_q // n_kv
        want = [h // group for h in range(n_q)]
        if got == want:
            continue
        h = next(i for i in range(n_q) if got[i] != want[i])
        h_ = torch.arange(n_q)
        if all(g == 0 for g in got):
            cause = "the placeholder is still there: every query head reads KV head 0"
        elif got == (h_ % n_kv).tolist():
            cause = ("% instead of //: consecutive query heads share a KV head (heads 0..group_size-1 read KV "
                     "head 0), so divide by the group size; % deals them out in turn")
        elif got == (h_ // n_kv).tolist():
            cause = "divided by N_KV_HEADS: divide by the group size, N_Q_HEADS // N_KV_HEADS"
        elif got == h_.tolist():
            cause = "returns the query head itself (right only for MHA, where the group size is 1)"
        elif not 0 <= got[h] < n_kv:
            cause = f"KV head {got[h]} does not exist: there are {n_kv}"
        else:
            cause = None
        return _fail("forward", 1, "maps a query head to the wrong KV head",
                     where=f"{n_q} query heads on {n_kv} KV heads (group size {group}): query head {h} "
                           f"got KV head {got[h]}, expected {want[h]}",
                     cause=cause)
    return Verdict(True, _what("forward", 1), f"every query head finds its KV head in {len(_KV_CONFIGS)} "
                   "layouts (GQA 8:2, 6:3, 32:8; MHA; MQA)")


def check_kv_head_index() -> None:
    """forward.py Part 1, alone: query head -> KV head, probed for every head of five layouts."""
    print(_verdict_of(_kv_head_index_body))


# --- Part 2 ------------------------------------------------------------------

_UPD = dict(BLOCK_M=16, BLOCK_N=16, HEAD_DIM=16)


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


def _update64(c, base=2.0, bug=None):
    acc, l, m, s = (c[k].to(torch.float64) for k in ("acc", "l", "m", "s"))
    v = c["v"]
    m_new = s.amax(dim=1) if bug == "m_from_tile" else torch.maximum(m, s.amax(dim=1))
    alpha = base ** (m_new - m) if bug == "alpha_inverted" else base ** (m - m_new)
    p = base ** s if bug == "p_unshifted" else base ** (s - m_new[:, None])
    p_cast = p.to(v.dtype).to(torch.float64)  # the kernel multiplies p in v's dtype
    l_new = (l if bug in ("no_rescale_l", "no_rescale") else l * alpha) + p.sum(dim=1)
    acc_new = (acc if bug in ("no_rescale_acc", "no_rescale") else acc * alpha[:, None]) + p_cast @ v.to(torch.float64)
    return acc_new, l_new, (m if bug == "m_unchanged" else m_new)


_UPDATE_MISTAKES = [
    ("exp", "exp instead of exp2: the scores are already in log2 units (log2(e) is folded into qk_scale), "
            "so every exponential is tl.exp2"),
    ("no_rescale", "missing rescale: multiply both l_i and acc by alpha = exp2(m_i - m_new)"),
    ("no_rescale_acc", "missing rescale of acc: acc = acc * alpha[:, None] + p @ v"),
    ("no_rescale_l", "missing rescale of l_i: l_i = l_i * alpha + tl.sum(p, 1)"),
    ("alpha_inverted", "alpha is inverted: exp2(m_i - m_new) (<= 1) shrinks the old state"),
    ("m_unchanged", "returns the old maximum: return m_new, the new running max"),
    ("m_from_tile", "m_new must be the larger of m_i and the tile's row maxima: "
                    "tl.maximum(m_i, tl.max(s, 1)); the running max never goes down"),
    ("p_unshifted", "p = exp2(s - m_new[:, None]): subtract the new maximum before exp2"),
]


def _online_softmax_update_body() -> Verdict:
    fwd, probes = _forward_parts()
    bm, d = _UPD["BLOCK_M"], _UPD["HEAD_DIM"]
    for name, c in _update_cases():
        dev = _dev()
        outs = dict(acc=torch.full((bm, d), float("nan"), device=dev), l=torch.full((bm,), float("nan"), device=dev),
                    m=torch.full((bm,), float("nan"), device=dev))
        precision = "ieee" if c["v"].dtype == torch.float32 else "tf32"
        _launch(2, probes["online_softmax_update"], (1,),
                c["acc"].to(dev), c["l"].to(dev), c["m"].to(dev), c["s"].to(dev), c["v"].to(dev),
                outs["acc"], outs["l"], outs["m"], INPUT_PRECISION=precision, **_UPD)
        got = {k: t.cpu() for k, t in outs.items()}
        want = dict(zip(("acc", "l", "m"), _update64(c)))
        tol = _tol(c["v"].dtype)
        problem, label = None, None
        for label in ("m", "l", "acc"):
            labels = ("row", "column") if label == "acc" else ("row",)
            problem = testing.mismatch(label, got[label], want[label], labels=labels, **tol)
            if problem is not None:
                break
        if problem is None:
            continue
        if all(_matches(got[k], c[k], 0, 0) for k in ("acc", "l", "m")):
            cause = "the placeholder is still there: the state comes back unchanged"
        else:
            cause = None
            for bug, text in _UPDATE_MISTAKES:
                base = math.e if bug == "exp" else 2.0
                variant = dict(zip(("acc", "l", "m"), _update64(c, base=base, bug=None if bug == "exp" else bug)))
                if all(_matches(got[k], variant[k], 2 * tol["atol"], 2 * tol["rtol"]) for k in ("acc", "l", "m")):
                    cause = text
                    break
        index = ", ".join(f"{n} {i}" for n, i in zip(problem.labels, problem.index))
        return _fail("forward", 2, "the new state (acc, l_i, m_i) does not match the float64 reference",
                     where=f"case \"{name}\": {label}, {index}: got {_fmt(problem.got)}, "
                           f"expected {_fmt(problem.expected)}",
                     cause=cause)
    return Verdict(True, _what("forward", 2), "the new state matches the float64 reference: first tile, "
                   "rising and steady maxima, fully masked rows, fp16 values")


def check_online_softmax_update() -> None:
    """forward.py Part 2, alone: one online-softmax step on chosen tiles."""
    print(_verdict_of(_online_softmax_update_body))


# --- Part 3 ------------------------------------------------------------------

_MASK = dict(BLOCK_M=32, BLOCK_N=16)
_MASK_SEQ_LEN = 40


def _mask64(s, seq_len, causal, bug=None):
    n_rows, n_cols = s.shape
    i = torch.arange(n_rows)[:, None]
    j = torch.arange(n_cols)[None, :]
    visible = j < seq_len
    if bug == "no_tail":
        visible = torch.ones_like(visible)
    if causal or bug == "causal_always":
        rule = {"diag": j < i, "plus_one": j <= i + 1, "transposed": j >= i}.get(bug, j <= i)
        visible = visible & rule
    fill = 0.0 if bug == "zero" else float("-inf")
    return torch.where(visible, s.to(torch.float64), torch.full_like(s, fill, dtype=torch.float64))


_MASK_MISTAKES = [
    ("diag", "mask off by one: the diagonal key (offs_n == offs_m) must stay visible: offs_n <= offs_m, not <"),
    ("plus_one", "mask off by one: key offs_m + 1 is in the future: visible means offs_n <= offs_m"),
    ("transposed", "the mask is transposed: a row offs_m sees keys offs_n <= offs_m, "
                   "so compare offs_n[None, :] <= offs_m[:, None]"),
    ("no_tail", "keys past SEQ_LEN are not masked: the padding keys of the ragged last block were loaded as 0, "
                "so their score is 0, a real weight; add offs_n < SEQ_LEN"),
    ("causal_always", "the causal mask is applied when CAUSAL is False: wrap it in `if CAUSAL:`"),
    ("zero", "masked scores are set to 0, not -inf: exp2(0) = 1 still gives them weight"),
]


def _mask_scores_body() -> Verdict:
    fwd, probes = _forward_parts()
    bm, bn, n = _MASK["BLOCK_M"], _MASK["BLOCK_N"], _MASK_SEQ_LEN
    size = max(triton.cdiv(n, bm) * bm, triton.cdiv(n, bn) * bn)
    g = torch.Generator().manual_seed(31)
    s = torch.randn(size, size, generator=g) + 3.0  # never 0, so a mask to 0 shows
    for causal in (True, False):
        name = f"{'causal' if causal else 'no causal mask'}, SEQ_LEN {n}, BLOCK_M {bm}, BLOCK_N {bn}"
        out = torch.full((size, size), float("nan"), device=_dev())
        _launch(3, probes["mask_scores"], (triton.cdiv(n, bm), triton.cdiv(n, bn)), s.to(_dev()), out, n, size,
                CAUSAL=causal, **_MASK)
        got = out.cpu()[:n, : triton.cdiv(n, bn) * bn]  # rows past SEQ_LEN are never stored: not compared
        want = _mask64(s, n, causal)[:n, : triton.cdiv(n, bn) * bn]
        problem = testing.mismatch("scores", got, want, labels=("row", "key"), atol=0, rtol=1e-6)
        if problem is None:
            continue
        if causal and torch.equal(got, s[:n, : got.shape[1]]):
            cause = "the placeholder is still there: nothing is masked"
        else:
            cause = _first_cause(got, [(text, _mask64(s, n, causal, bug)[:n, : got.shape[1]])
                                       for bug, text in _MASK_MISTAKES], atol=0, rtol=1e-6)
        i, j = problem.index
        seen = "masked (-inf)" if math.isinf(problem.got) and problem.got < 0 else f"{_fmt(problem.got)}"
        expected = "masked (-inf)" if math.isinf(problem.expected) else "visible (the score unchanged)"
        return _fail("forward", 3, "masks the wrong scores",
                     where=f"case \"{name}\": query row {i} (query block {i // bm}), key {j} (key block {j // bn}): "
                           f"got {seen}, expected {expected}",
                     cause=cause)
    return Verdict(True, _what("forward", 3), "the causal mask and the ragged tail are right, "
                   "on every block of a ragged sequence, causal and not")


def check_mask_scores() -> None:
    """forward.py Part 3, alone: the mask applied to every (query block, key block) of a ragged sequence."""
    print(_verdict_of(_mask_scores_body))


# --- Part 4 ------------------------------------------------------------------

_EPI = dict(BLOCK_M=16, HEAD_DIM_PAD=16)
_EPI_SEQ_LEN, _EPI_HEAD_DIM = 11, 12
_SENTINEL = 4096.0  # exact in fp16 and fp32; a slot that must not be written keeps it


def _epilogue_inputs():
    g = torch.Generator().manual_seed(41)
    bm, dp = _EPI["BLOCK_M"], _EPI["HEAD_DIM_PAD"]
    return torch.randn(bm, dp, generator=g) * 3, 1 + 5 * torch.rand(bm, generator=g), torch.randn(bm, generator=g) * 4


def _epilogue64(acc, l, m, bug=None):
    acc, l, m = acc.double(), l.double(), m.double()
    o = acc if bug == "no_normalise" else acc / l[:, None]
    lse = {
        "lse_log2": m + torch.log2(l),
        "lse_mixed": m + torch.log(l),
        "lse_m": m * LN2,
        "lse_no_m": torch.log(l),
    }.get(bug, (m + torch.log2(l)) * LN2)
    return o, lse


_EPILOGUE_MISTAKES = [
    ("no_normalise", "o is not normalised: o = acc / l_i[:, None]"),
    ("lse_log2", "the LSE is in log2 units: multiply m_i + log2(l_i) by ln(2) to get the natural log"),
    ("lse_mixed", "m_i is in log2 units but log(l_i) is natural: LSE = (m_i + tl.log2(l_i)) * ln(2)"),
    ("lse_m", "the LSE is missing log2(l_i): LSE = (m_i + tl.log2(l_i)) * ln(2)"),
    ("lse_no_m", "the LSE is missing m_i: LSE = (m_i + tl.log2(l_i)) * ln(2)"),
]


def _epilogue_body() -> Verdict:
    fwd, probes = _forward_parts()
    bm, dp = _EPI["BLOCK_M"], _EPI["HEAD_DIM_PAD"]
    n, d = _EPI_SEQ_LEN, _EPI_HEAD_DIM
    acc, l, m = _epilogue_inputs()
    for dtype in (torch.float32, torch.float16):
        name = f"O in {str(dtype).replace('torch.', '')}, {n} real rows of {bm}, head dim {d} padded to {dp}"
        o = torch.full((bm, dp), _SENTINEL, dtype=dtype, device=_dev())
        lse = torch.full((bm,), _SENTINEL, dtype=torch.float32, device=_dev())
        _launch(4, probes["epilogue"], (1,), acc.to(_dev()), l.to(_dev()), m.to(_dev()), o, lse, n, d, dp, **_EPI)
        o, lse = o.cpu().double(), lse.cpu().double()
        if (o == _SENTINEL).all() and (lse == _SENTINEL).all():
            return _fail("forward", 4, "stores nothing", where=f"case \"{name}\"",
                         cause="the placeholder is still there: store o and lse with tl.store")
        want_o, want_lse = _epilogue64(acc, l, m)
        tol = _tol(dtype)
        for label, got, want, kind in (("O", o[:n, :d], want_o[:n, :d], "o"),
                                       ("LSE", lse[:n], want_lse[:n], "lse")):
            t = tol if kind == "o" else testing.LSE_TOLERANCE
            labels = ("row", "column") if kind == "o" else ("row",)
            problem = testing.mismatch(label, got, want, labels=labels, **t)
            if problem is None:
                continue
            cause = None
            for bug, text in _EPILOGUE_MISTAKES:
                vo, vl = _epilogue64(acc, l, m, bug)
                variant = vo[:n, :d] if kind == "o" else vl[:n]
                if _matches(got, variant, 2 * t["atol"], 2 * t["rtol"]):
                    cause = text
                    break
            if cause is None and (got == _SENTINEL).all():
                cause = f"{label} is never stored"
            index = ", ".join(f"{a} {b}" for a, b in zip(problem.labels, problem.index))
            return _fail("forward", 4, f"{label} does not match the float64 reference",
                         where=f"case \"{name}\": {index}: got {_fmt(problem.got)}, expected {_fmt(problem.expected)}",
                         cause=cause)
        if not (o[n:] == _SENTINEL).all() or not (lse[n:] == _SENTINEL).all():
            return _fail("forward", 4, "writes rows past SEQ_LEN", where=f"case \"{name}\"",
                         cause="mask both stores with row_ok: those rows are not part of O or LSE "
                               "(in the real kernel they belong to the next head, or to no tensor at all)")
        if not (o[:, d:] == _SENTINEL).all():
            return _fail("forward", 4, "writes the padding columns past HEAD_DIM", where=f"case \"{name}\"",
                         cause="mask the store of o with row_ok[:, None] & col_ok[None, :]")
    return Verdict(True, _what("forward", 4), "O is normalised and the LSE is in natural log; "
                   "padding rows and columns are left alone; fp32 and fp16 O")


def check_epilogue() -> None:
    """forward.py Part 4, alone: normalise, store O and the LSE, and nothing else."""
    print(_verdict_of(_epilogue_body))


# --------------------------------------------------------------------------
# forward.py: the whole kernel
# --------------------------------------------------------------------------


def kernel_config() -> dict:
    """The fixed tile the checks launch with (no autotuning, so the blocks are known)."""
    if runtime.INTERPRETER or runtime.DEVICE.type != "cuda":
        return dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1)
    return dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)


def _forward_cases():
    cfg = kernel_config()
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    ragged = 2 * bm + bn + 3  # 3 query blocks, the last one partial; 6 key blocks
    half = runtime.default_dtype()
    return [
        _Case("GQA 8:2, causal, ragged length", None, n_q_heads=8, n_kv_heads=2, seq_len=ragged, head_dim=16,
              block_m=bm, block_n=bn, seed=51),
        _Case("GQA 4:2, no causal mask, ragged length, sm_scale 0.3", None, n_q_heads=4, n_kv_heads=2,
              seq_len=ragged, head_dim=16, causal=False, sm_scale=0.3, block_m=bm, block_n=bn, seed=52),
        _Case("MQA 4:1, half precision, batch 2, [B, N, H, D] layout", None, batch=2, n_q_heads=4, n_kv_heads=1,
              seq_len=bm + 5, head_dim=32, dtype=half, layout="bnhd", block_m=bm, block_n=bn, seed=53),
        _Case("MHA 2:2, head dim 80 (padded to 128), strided", None, n_q_heads=2, n_kv_heads=2, seq_len=bm + bn - 3,
              head_dim=80, layout="strided", block_m=bm, block_n=bn, seed=54),
    ]


def _indicator_qkv(case: _Case):
    """Inputs whose output says where each row's probability went.

    Column kb of V is 1 on the keys of key block kb and 0 elsewhere, so column
    kb of O is the softmax mass that row puts on key block kb. The last column
    of V holds the KV head's own index, so the last column of O is the index of
    the KV head the program read (the probabilities sum to 1).
    """
    q, k, v = case.qkv()
    n_kb = triton.cdiv(case.seq_len, case.block_n)
    if case.head_dim < n_kb + 1:
        return q, k, v, 0
    block_of = torch.arange(case.seq_len) // case.block_n
    indicator = (block_of[:, None] == torch.arange(n_kb)[None, :]).to(torch.float32)
    with torch.no_grad():
        v[..., :n_kb] = indicator.to(v.dtype).to(v.device)
        v[..., -1] = torch.arange(case.n_kv_heads, dtype=v.dtype, device=v.device).view(1, -1, 1)
    return q, k, v, n_kb


def _run_kernel(fwd, case: _Case):
    q, k, v, n_kb = _indicator_qkv(case)
    cfg = kernel_config()
    result = _run_student("forward", fwd.flash_attention_forward, q, k, v, causal=case.causal,
                          sm_scale=case.sm_scale, return_lse=True, config=cfg)
    return q, k, v, n_kb, result


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


def _error_map(q, k, v, n_kb, out, lse, case: _Case) -> ErrorMap:
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
    return ErrorMap(err=err, lse_err=lse_err, kv_expected=[_kv_of(h, case) for h in range(case.n_q_heads)],
                    kv_read=kv_read, block_m=bm, block_n=case.block_n, seq_len=n, causal=case.causal,
                    tol=_tol(case.dtype)["atol"])


def forward_error_map() -> ErrorMap:
    """Run your kernel once on indicator inputs (GQA 8:2, causal) and measure its error per tile.

    Never raises: if the kernel does not run, the map carries the reason.
    """
    case = _forward_cases()[0]
    cfg = kernel_config()
    empty = ErrorMap(None, None, [_kv_of(h, case) for h in range(case.n_q_heads)], [None] * case.n_q_heads,
                     cfg["BLOCK_M"], cfg["BLOCK_N"], case.seq_len, case.causal, _tol(case.dtype)["atol"])
    try:
        fwd = _load("forward")
        q, k, v, n_kb, result = _run_kernel(fwd, case)
    except _Stop as stop:
        empty.message = stop.verdict.headline()
        return empty
    if not (isinstance(result, tuple) and len(result) == 2):
        empty.message = "flash_attention_forward did not return (O, LSE)"
        return empty
    return _error_map(q, k, v, n_kb, result[0], result[1], case)


KERNEL_BUGS = {
    None: "right",
    "kv_mod": "Part 1: % instead of //",
    "no_rescale_acc": "Part 2: acc not rescaled",
    "exp": "Part 2: exp instead of exp2",
    "mask_diag": "Part 3: mask off by one",
}
"""Known kernel bugs that :func:`simulated_error_map` can replay."""


def simulated_error_map(bug=None) -> ErrorMap:
    """The error map a kernel with ``bug`` (a key of KERNEL_BUGS) would show, replayed in float64.

    The same inputs and tiles as :func:`forward_error_map`; no kernel runs, so
    this is instant and needs no student code.
    """
    if bug not in KERNEL_BUGS:
        raise ValueError(f"bug must be one of {list(KERNEL_BUGS)}; got {bug!r}")
    case = _forward_cases()[0]
    q, k, v, n_kb = _indicator_qkv(case)
    # exp for exp2 on scores scaled by sm_scale * log2(e): softmax of the scores times log2(e)
    scale = case.scale * (LOG2E if bug == "exp" else 1.0)
    out, lse = _tiled64(q, k, v, case.causal, scale, case.block_m, case.block_n, None if bug == "exp" else bug)
    return _error_map(q, k, v, n_kb, out, lse, case)


def _forward_body(part_verdicts=None) -> Verdict:
    fwd = _load("forward")
    if part_verdicts is None:
        part_verdicts = [_verdict_of(body) for body in _FORWARD_PART_BODIES]
    broken = next((v for v in part_verdicts if not v.ok), None)
    for case in _forward_cases():
        q, k, v, n_kb, result = _run_kernel(fwd, case)
        out, lse = result if isinstance(result, tuple) and len(result) == 2 else (result, None)
        ref, ref_lse = reference_attention(q, k, v, causal=case.causal, sm_scale=case.sm_scale)
        shape = _shape_problem(out, ref.shape) or _shape_problem(lse, ref_lse.shape, "the LSE")
        if shape:
            raise _Stop(_fail("forward", None, shape, where=f"case \"{case.name}\""))
        tol = _tol(case.dtype)
        problem = testing.mismatch("O", out, ref, **tol)
        what = "O"
        if problem is None:
            problem = testing.mismatch("LSE", lse, ref_lse, labels=("batch", "head", "row"), **testing.LSE_TOLERANCE)
            what = "the LSE"
        if problem is None:
            continue
        b, h, i = problem.index[:3]
        qb, row = i // case.block_m, i % case.block_m
        where = f"case \"{case.name}\": batch {b}, query head {h}, KV head {_kv_of(h, case)}"
        got = out.detach().to("cpu", torch.float64)
        if n_kb:
            tag = float(got[b, h, i, -1])
            if math.isfinite(tag) and abs(tag - round(tag)) < 0.02 and round(tag) != _kv_of(h, case):
                where += f" (the kernel read KV head {round(tag)})"
            mass_err = (got[b, h, i, :n_kb] - ref[b, h, i, :n_kb]).abs().nan_to_num(nan=float("inf"))
            if float(mass_err.max()) > tol["atol"]:
                where += f", query block {qb}, key block {int(mass_err.argmax())}"
            else:
                where += f", query block {qb}"
        else:
            where += f", query block {qb}"
        where += f", row {row} of the block (sequence position {i})"
        if broken is not None:
            cause = f"{broken.what} fails its own check above: {broken.cause or broken.message}"
        else:
            cause = ("the four parts pass on their own, so look at what changed around them in the kernel "
                     "(the loads, the loops, the pointers)")
        return _fail("forward", None, f"{what} of the kernel does not match the float64 reference",
                     where=where, cause=cause)
    if broken is not None:  # right answers here, but a part is wrong where these cases do not look
        return _fail("forward", None, f"the kernel's answers are right on these cases, but {broken.what} "
                     "fails its own check", cause=broken.cause)
    return Verdict(True, "forward.py", f"the kernel matches the float64 reference (O and LSE) in "
                   f"{len(_forward_cases())} cases: GQA, MQA, MHA; causal and not; ragged lengths; "
                   "half precision; head dim 80; strided layouts")


_FORWARD_PART_BODIES = (_kv_head_index_body, _online_softmax_update_body, _mask_scores_body, _epilogue_body)


def check_forward() -> None:
    """forward.py, the whole kernel: its four parts first, then the kernel on four cases."""
    print(_verdict_of(_forward_body))


# --------------------------------------------------------------------------
# Everything at once
# --------------------------------------------------------------------------


def verdicts() -> list[Verdict]:
    """Every check's verdict, in course order."""
    out = [
        _verdict_of(_naive_body),
        _verdict_of(_block_state_body),
        _verdict_of(_merge_states_body),
        _verdict_of(_online_softmax_body),
        _verdict_of(_tiled_body),
    ]
    parts = [_verdict_of(body) for body in _FORWARD_PART_BODIES]
    out += parts
    out.append(_verdict_of(_forward_body, parts))
    return out


def progress() -> None:
    """One line per check, in course order: where you stand."""
    for verdict in verdicts():
        print(verdict.headline())


__all__ = [
    "Verdict",
    "ErrorMap",
    "check_naive",
    "check_block_state",
    "check_merge_states",
    "check_online_softmax",
    "check_tiled",
    "check_kv_head_index",
    "check_online_softmax_update",
    "check_mask_scores",
    "check_epilogue",
    "check_forward",
    "forward_error_map",
    "simulated_error_map",
    "KERNEL_BUGS",
    "kernel_config",
    "progress",
    "verdicts",
]

if __name__ == "__main__":  # python -m gqa_flash.lab.checks: the progress table
    progress()
    sys.exit(0)
