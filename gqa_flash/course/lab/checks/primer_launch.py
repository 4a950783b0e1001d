"""Notebook 03b's checks, the machinery: launching your kernel, and judging what it wrote and read.

Every output lives at the start of a larger buffer whose tail holds a sentinel (:func:`output`), so a
store past the end is seen (and harmless) instead of spoiling memory, and an entry your kernel never wrote is
told from a wrong one; :func:`judge` compares the whole buffer with the expected one and names the first
replayed mistake (:class:`Writes`) that gives what your kernel wrote. A load past the end leaves no trace in
what a masked store writes: :func:`reads_within` runs the kernel again with its loads recorded (in the
interpreter) or reads its source (on a GPU). :func:`launch` turns a crash into a verdict, and a call of
Python's own ``max``, ``min`` or ``sum`` in a kernel is named at once (:func:`no_builtins`).
"""

from __future__ import annotations

import ast
import inspect
import math
import re
import textwrap
import warnings

import torch
import triton

from gqa_flash.course import runtime
from gqa_flash.course.lab.checks.common import Stop, Verdict, describe_exception, matches, staged, verdict_of

PUZZLES = {
    1: "program ids",
    2: "tl.arange and broadcasting",
    3: "masked loads and stores",
    4: "reductions",
    5: "tl.dot and tl.trans",
    6: "tl.where",
    7: "tl.maximum",
    8: "casts with .to",
}
GUARD = 32  # sentinel entries after every output
SENTINEL = {torch.int32: -1, torch.float32: 1234.5}
DEBUG_HINT = ("print a block inside your kernel to see it (in the interpreter print('x', x) works; "
               "on a GPU, tl.device_print('x', x)), and compare it with the spec above")


def what_of(n: int) -> str:
    """A puzzle's verdict's ``what``: ``primer puzzle 1 (program ids)``."""
    return f"primer puzzle {n} ({PUZZLES[n]})"


def fail(n: int, message: str, **kw) -> Verdict:
    return Verdict(False, what_of(n), message, **kw)


def prints(body):
    """The notebook's check: run the body on the student's kernel and print its verdict (two steps)."""

    def check(kernel) -> None:
        print(staged(verdict_of(body, kernel)))

    check.__name__, check.__qualname__, check.__doc__ = body.__name__, body.__qualname__, body.__doc__
    check.verdict = lambda kernel: verdict_of(body, kernel)
    return check


# --- launching your kernel ----------------------------------------------------------------------------------


def source(kernel):
    """(source lines, line of the def's first decorator in its cell or file), or (None, 0)."""
    fn = getattr(kernel, "fn", None)
    try:
        return textwrap.dedent(inspect.getsource(fn)).splitlines(), fn.__code__.co_firstlineno
    except (TypeError, OSError, AttributeError):
        return None, 0


BUILTINS = {
    "max": ("Python's max(a, b) asks whether b > a, and needs one True or False. A block of many values cannot "
            "give one: the interpreter calls every block True, so max(a, b) silently returns b; compiled for a "
            "GPU, Triton swaps in tl.maximum, a use it has deprecated. Same code, two answers",
            "tl.maximum(a, b) is the larger of two blocks, element by element; tl.max(x, axis) the largest "
            "along an axis"),
    "min": ("Python's min(a, b) asks whether b < a, and needs one True or False. A block of many values cannot "
            "give one: the interpreter calls every block True, so min(a, b) silently returns b; compiled for a "
            "GPU, Triton swaps in tl.minimum, a use it has deprecated. Same code, two answers",
            "tl.minimum(a, b) is the smaller of two blocks, element by element; tl.min(x, axis) along an axis"),
    "sum": ("Python's sum(x) walks over x one element at a time and adds them up: a Triton block cannot be "
            "walked over like a list: the interpreter fails inside it, and the compiler does not know sum at all",
            "tl.sum(x, axis) adds a block up along an axis"),
}


def no_builtins(n: int, kernel) -> None:
    """Stop at the first call of Python's max, min or sum in the kernel: they do not work on blocks."""
    lines, first = source(kernel)
    if lines is None:
        return
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in BUILTINS:
            name = node.func.id
            cause, hint = BUILTINS[name]
            raise Stop(fail(n, f"your kernel calls Python's built-in {name}() on Triton values",
                             where=f"line {first + node.lineno - 1} of the cell that defines {kernel.fn.__name__}",
                             cause=cause, hint=hint))


def kernel_line(kernel, exc: BaseException):
    """The line of the kernel that raised: `code`, from the traceback (interpreter) or the compile error."""
    lines, _ = source(kernel)
    if lines is None:
        return None
    code = kernel.fn.__code__
    found, e, seen = None, exc, set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        tb = e.__traceback__
        while tb is not None:
            f = tb.tb_frame.f_code
            if f.co_filename == code.co_filename and f.co_name == code.co_name:
                found = tb.tb_lineno - code.co_firstlineno
            tb = tb.tb_next
        node = getattr(e, "node", None)
        if found is None and getattr(e, "src", None) and hasattr(node, "lineno"):
            src = e.src.splitlines()
            return src[node.lineno - 1].strip() if 0 < node.lineno <= len(src) else None
        e = e.__cause__ or e.__context__
    return lines[found].strip() if found is not None and 0 <= found < len(lines) else None


def chain_text(exc: BaseException) -> str:
    texts, e, seen = [], exc, set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        texts.append(f"{type(e).__name__}: {e}")
        e = e.__cause__ or e.__context__
    return "\n".join(texts)


# What a crash says, and the kind of mistake it is: each check says what that kind means in its puzzle.
CRASHES = (
    ("shape", r"make_shape_compatible|incompatible dimensions|[Ss]hape mismatch|must have the same shape"),
    ("dot_k", r"equal reduction dimensions|reduction dimension"),
    ("dot_dtype", r"same dtype|must have the same dtype|Both operands must be"),
)


def launch(n: int, kernel, grid, *args, crashes=None, case="", **meta) -> None:
    """Run the student's kernel; a crash becomes a verdict that names the cause when the puzzle knows it."""
    if not isinstance(kernel, triton.runtime.jit.KernelInterface):
        raise Stop(fail(n, f"{getattr(kernel, '__name__', kernel)!r} is not a Triton kernel",
                         hint="put @triton.jit on the line above its def, run that cell, then this one"))
    no_builtins(n, kernel)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kernel[grid](*args, **meta)
    except NotImplementedError:
        raise Stop(fail(n, "your kernel is not written yet",
                         hint="write its body in the cell above, run that cell, then this one")) from None
    except Exception as e:  # a shape error, a dtype error, a typo...
        line = kernel_line(kernel, e)
        text = chain_text(e)
        kind = next((k for k, pattern in CRASHES if re.search(pattern, text)), None)
        cause, hint = (crashes or {}).get(kind, (None, None))
        raise Stop(fail(n, f"your kernel does not run{case}: {describe_exception(e)}",
                         where=f"in `{line}`" if line else None, cause=cause,
                         hint=hint or "read the error, fix the line it names, re-run the kernel's cell")) from None


def output(shape, dtype=torch.float32):
    """An output of this shape at the start of a buffer with GUARD sentinel entries after it: (out, buffer)."""
    numel = math.prod(shape)
    buffer = torch.full((numel + GUARD,), SENTINEL[dtype], dtype=dtype, device=runtime.DEVICE)
    return buffer[:numel].view(shape), buffer


def buffer_of(values, dtype=torch.float32) -> torch.Tensor:
    """What a whole output buffer holds when its first entries are ``values`` (float64, on the CPU)."""
    flat = torch.as_tensor(values, dtype=torch.float64).flatten()
    return torch.cat([flat, torch.full((GUARD,), float(SENTINEL[dtype]), dtype=torch.float64)])


def fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e6 else f"{x:.4g}"


def runs(indices) -> str:
    """[1, 2, 3, 6] -> '1-3, 6'."""
    out, start, prev = [], None, None
    for i in list(indices) + [None]:
        if start is not None and (i is None or i != prev + 1):
            out.append(f"{start}-{prev}" if prev > start else f"{start}")
            start = None
        if start is None and i is not None:
            start = i
        prev = i
    return ", ".join(out)


def judge(n, buffer, expected, shape, variants=(), *, name="OUT", dtype=torch.float32, tol=(1e-5, 1e-5),
           case="", past_end=None):
    """Compare the whole buffer (output and guard) with the expected one; stop with a verdict if it differs.

    ``variants`` holds ((cause, hint), buffer) pairs, the classic mistakes replayed; ``past_end`` the
    (cause, hint) of a store past the end that no variant names.
    """
    atol, rtol = tol
    got = buffer.detach().to("cpu", torch.float64)
    if matches(got, expected, atol, rtol):
        return
    numel, sentinel = math.prod(shape), float(SENTINEL[dtype])
    body, tail = got[:numel], got[numel:]
    if bool((body == sentinel).all()) and bool((tail == sentinel).all()):
        raise Stop(fail(n, f"your kernel wrote nothing to {name}",
                         hint="write its body in the cell above (the stub's is `pass`), run that cell, then this one"))
    cause, hint = first_cause(got, variants, atol, rtol) or (None, DEBUG_HINT)
    beyond = (tail != sentinel).nonzero().flatten().tolist()
    if beyond:
        if cause is None and past_end:
            cause, hint = past_end
        raise Stop(fail(n, f"your kernel wrote past the end of {name}{case}",
                         where=f"{name} is entries 0-{numel - 1} of its memory, and entries "
                               f"{runs([numel + i for i in beyond])}, past its end, changed",
                         cause=cause, hint=hint))
    exp = expected[:numel].view(shape)
    body = body.view(shape)
    close = ((body - exp).abs() <= atol + rtol * exp.abs()) & torch.isfinite(exp)
    wrong = ~(close | (body == exp) | (body.isnan() & exp.isnan()))
    index = tuple(int(i) for i in wrong.nonzero()[0])
    got_text = "never written" if body[index] == sentinel else fmt(body[index].item())
    rows = "" if len(shape) < 2 else f"; rows {runs(wrong.any(1).nonzero().flatten().tolist())} are wrong"
    unwritten = int((body == sentinel).sum())
    never = f", {unwritten} of them never written" if unwritten else ""
    raise Stop(fail(n, f"{int(wrong.sum())} of {numel} entries of {name} are wrong{never}{case}",
                     where=f"{name}[{', '.join(map(str, index))}] is {got_text}, expected "
                           f"{fmt(exp[index].item())}{rows}",
                     cause=cause, hint=hint))


class Writes:
    """A whole buffer after a replayed mistake, and which of its entries are certain.

    Where two lanes store different values at one address, which one lands is the machine's choice (the
    interpreter keeps the last, a GPU any): such an entry is not compared.
    """

    def __init__(self, shape, stores, dtype=torch.float32):
        """``stores``: (flat offsets, values) pairs, applied in order."""
        self.value = buffer_of(torch.full(shape, float(SENTINEL[dtype])), dtype)
        self.sure = torch.ones_like(self.value, dtype=torch.bool)
        written = torch.zeros_like(self.sure)
        for offsets, values in stores:
            offsets = torch.as_tensor(offsets).flatten().long()
            values = torch.as_tensor(values, dtype=torch.float64).flatten().expand(offsets.numel())
            keep = (offsets >= 0) & (offsets < self.value.numel())
            for offset, value in zip(offsets[keep].tolist(), values[keep].tolist()):
                if written[offset] and self.value[offset] != value:
                    self.sure[offset] = False
                self.value[offset], written[offset] = value, True


def first_cause(got, variants, atol, rtol):
    """The (cause, hint) of the first replayed mistake that ``got`` matches (a buffer, or Writes), or None."""
    for description, candidate in variants:
        if isinstance(candidate, Writes):
            if matches(got[candidate.sure], candidate.value[candidate.sure], 2 * atol, 2 * rtol):
                return description
        elif matches(got, candidate, 2 * atol, 2 * rtol):
            return description
    return None


def on_device(x: torch.Tensor) -> torch.Tensor:
    return x.to(runtime.DEVICE)



UNMASKED_LOAD = ("the load is not masked: OUT came out right because the store's mask kept those lanes out of "
                  "it, but the load still read past the end of X. There lies another tensor, or nothing: on a GPU "
                  "such a read returns someone else's data or faults",
                  "give the load the same mask as the store: tl.load(ptrs, mask=mask); other= says what the "
                  "masked lanes get instead (0 when left out)")


def unmasked_load_line(kernel) -> int | None:
    """The line (in its cell) of the kernel's first tl.load with no mask, from its source, or None."""
    lines, first = source(kernel)
    if lines is None:
        return None
    for node in ast.walk(ast.parse("\n".join(lines))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load"
                and len(node.args) < 2 and not any(k.arg == "mask" for k in node.keywords)):
            return first + node.lineno - 1
    return None


def reads_within(n: int, kernel, grid, args, meta, block: int) -> None:
    """Stop when the kernel's loads read X (``args[0]``) past its end, where the store's mask hides it.

    In the interpreter the kernel runs again with its loads recorded (probes.addresses_recorded: nothing is
    read or written) and every active lane is compared with X's entries. A GPU shows no address: there the
    kernel's source is read, and a tl.load without a mask is the finding.
    """
    x = args[0]
    size, count = x.element_size(), x.numel()
    if not runtime.INTERPRETER:
        line = unmasked_load_line(kernel)
        if line is not None:
            raise Stop(fail(n, "your kernel's load of X has no mask: the last program reads past X's end",
                             where=f"line {line} of the cell that defines {kernel.fn.__name__}",
                             cause=UNMASKED_LOAD[0], hint=UNMASKED_LOAD[1]))
        return
    from gqa_flash.course.lab.checks.probes import addresses_recorded

    with warnings.catch_warnings(), addresses_recorded() as seen:
        warnings.simplefilter("ignore")
        kernel[grid](*args, **meta)
    spans = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in args
             if isinstance(t, torch.Tensor)]
    past = set()
    for kind, addresses, mask in seen:
        active = addresses[mask].astype("int64")
        outside = [a for a in active.tolist() if not any(lo <= a < hi for lo, hi in spans)]
        if kind == "load":
            past.update((a - x.data_ptr()) // size for a in outside)
    if past:
        entries = sorted(past)
        owners = sorted({i // block for i in entries if i >= 0})
        read = ", ".join(f"X[{i}]" for i in entries)
        raise Stop(fail(n, f"your kernel reads X past its end: {read} (X has {count} entries, 0-{count - 1})",
                         where=f"the load of program{'s' * (len(owners) != 1)} "
                               f"{', '.join(map(str, owners)) or '?'}, whose block runs past entry {count - 1}",
                         cause=UNMASKED_LOAD[0], hint=UNMASKED_LOAD[1]))
