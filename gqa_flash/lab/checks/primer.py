"""Notebook 03b, the Triton primer: one check per puzzle (practice, nothing here is graded).

Each puzzle is a kernel of about five lines that you write in a notebook cell,
and its check takes that kernel as its argument: ``checks.check_primer_where(
causal_mask)``. The check launches it on tiny inputs (in the interpreter on a
CPU, compiled on a GPU) and compares what it wrote with PyTorch's answer.

Every output lives at the start of a larger buffer whose tail holds a
sentinel, so a store past the end is seen (and harmless) instead of spoiling
memory, and an entry your kernel never wrote is told from a wrong one. A kernel
that writes nothing at all (the stub's ``pass``) is "not written yet".

A failure is told in two steps, as every check does (verdict.py): first what
is wrong and where (which entries of OUT, which line of your kernel), then,
when the same failure is checked again or on ``checks.explain()``, the likely
cause and a fix. The causes come from replaying each puzzle's classic mistakes
in PyTorch and seeing which one your output matches; a crash is read for the
usual ones (shapes that do not broadcast, tl.dot's two rules); and a call of
Python's own ``max``, ``min`` or ``sum`` in a kernel is named at once, because
on blocks they do not do what they say.
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

from gqa_flash import runtime
from gqa_flash.lab.checks.verdict import Stop, Verdict, describe_exception, matches, staged, verdict_of

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
_DEBUG_HINT = ("print a block inside your kernel to see it (in the interpreter print('x', x) works; "
               "on a GPU, tl.device_print('x', x)), and compare it with the spec above")


def _what(n: int) -> str:
    return f"primer puzzle {n} ({PUZZLES[n]})"


def _fail(n: int, message: str, **kw) -> Verdict:
    return Verdict(False, _what(n), message, **kw)


def _prints(body):
    """The notebook's check: run the body on the student's kernel and print its verdict (two steps)."""

    def check(kernel) -> None:
        print(staged(verdict_of(body, kernel)))

    check.__name__, check.__qualname__, check.__doc__ = body.__name__, body.__qualname__, body.__doc__
    check.verdict = lambda kernel: verdict_of(body, kernel)
    return check


# --- launching your kernel ----------------------------------------------------------------------------------


def _source(kernel):
    """(source lines, line of the def's first decorator in its cell or file), or (None, 0)."""
    fn = getattr(kernel, "fn", None)
    try:
        return textwrap.dedent(inspect.getsource(fn)).splitlines(), fn.__code__.co_firstlineno
    except (TypeError, OSError, AttributeError):
        return None, 0


_BUILTINS = {
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


def _no_builtins(n: int, kernel) -> None:
    """Stop at the first call of Python's max, min or sum in the kernel: they do not work on blocks."""
    lines, first = _source(kernel)
    if lines is None:
        return
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _BUILTINS:
            name = node.func.id
            cause, hint = _BUILTINS[name]
            raise Stop(_fail(n, f"your kernel calls Python's built-in {name}() on Triton values",
                             where=f"line {first + node.lineno - 1} of the cell that defines {kernel.fn.__name__}",
                             cause=cause, hint=hint))


def _kernel_line(kernel, exc: BaseException):
    """The line of the kernel that raised: `code`, from the traceback (interpreter) or the compile error."""
    lines, _ = _source(kernel)
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


def _chain_text(exc: BaseException) -> str:
    texts, e, seen = [], exc, set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        texts.append(f"{type(e).__name__}: {e}")
        e = e.__cause__ or e.__context__
    return "\n".join(texts)


# What a crash says, and the kind of mistake it is: each check says what that kind means in its puzzle.
_CRASHES = (
    ("shape", r"make_shape_compatible|incompatible dimensions|[Ss]hape mismatch|must have the same shape"),
    ("dot_k", r"equal reduction dimensions|reduction dimension"),
    ("dot_dtype", r"same dtype|must have the same dtype|Both operands must be"),
)


def _launch(n: int, kernel, grid, *args, crashes=None, case="", **meta) -> None:
    """Run the student's kernel; a crash becomes a verdict that names the cause when the puzzle knows it."""
    if not isinstance(kernel, triton.runtime.jit.KernelInterface):
        raise Stop(_fail(n, f"{getattr(kernel, '__name__', kernel)!r} is not a Triton kernel",
                         hint="put @triton.jit on the line above its def, run that cell, then this one"))
    _no_builtins(n, kernel)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kernel[grid](*args, **meta)
    except NotImplementedError:
        raise Stop(_fail(n, "your kernel is not written yet",
                         hint="write its body in the cell above, run that cell, then this one")) from None
    except Exception as e:  # a shape error, a dtype error, a typo...
        line = _kernel_line(kernel, e)
        text = _chain_text(e)
        kind = next((k for k, pattern in _CRASHES if re.search(pattern, text)), None)
        cause, hint = (crashes or {}).get(kind, (None, None))
        raise Stop(_fail(n, f"your kernel does not run{case}: {describe_exception(e)}",
                         where=f"in `{line}`" if line else None, cause=cause,
                         hint=hint or "read the error, fix the line it names, re-run the kernel's cell")) from None


def _out(shape, dtype=torch.float32):
    """An output of this shape at the start of a buffer with GUARD sentinel entries after it: (out, buffer)."""
    numel = math.prod(shape)
    buffer = torch.full((numel + GUARD,), SENTINEL[dtype], dtype=dtype, device=runtime.DEVICE)
    return buffer[:numel].view(shape), buffer


def _buffer(values, dtype=torch.float32) -> torch.Tensor:
    """What a whole output buffer holds when its first entries are ``values`` (float64, on the CPU)."""
    flat = torch.as_tensor(values, dtype=torch.float64).flatten()
    return torch.cat([flat, torch.full((GUARD,), float(SENTINEL[dtype]), dtype=torch.float64)])


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e6 else f"{x:.4g}"


def _runs(indices) -> str:
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


def _judge(n, buffer, expected, shape, variants=(), *, name="OUT", dtype=torch.float32, tol=(1e-5, 1e-5),
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
        raise Stop(_fail(n, f"your kernel wrote nothing to {name}",
                         hint="write its body in the cell above (the stub's is `pass`), run that cell, then this one"))
    cause, hint = _first_cause(got, variants, atol, rtol) or (None, _DEBUG_HINT)
    beyond = (tail != sentinel).nonzero().flatten().tolist()
    if beyond:
        if cause is None and past_end:
            cause, hint = past_end
        raise Stop(_fail(n, f"your kernel wrote past the end of {name}{case}",
                         where=f"{name} is entries 0-{numel - 1} of its memory, and entries "
                               f"{_runs([numel + i for i in beyond])}, past its end, changed",
                         cause=cause, hint=hint))
    exp = expected[:numel].view(shape)
    body = body.view(shape)
    close = ((body - exp).abs() <= atol + rtol * exp.abs()) & torch.isfinite(exp)
    wrong = ~(close | (body == exp) | (body.isnan() & exp.isnan()))
    index = tuple(int(i) for i in wrong.nonzero()[0])
    got_text = "never written" if body[index] == sentinel else _fmt(body[index].item())
    rows = "" if len(shape) < 2 else f"; rows {_runs(wrong.any(1).nonzero().flatten().tolist())} are wrong"
    unwritten = int((body == sentinel).sum())
    never = f", {unwritten} of them never written" if unwritten else ""
    raise Stop(_fail(n, f"{int(wrong.sum())} of {numel} entries of {name} are wrong{never}{case}",
                     where=f"{name}[{', '.join(map(str, index))}] is {got_text}, expected "
                           f"{_fmt(exp[index].item())}{rows}",
                     cause=cause, hint=hint))


class _Writes:
    """A whole buffer after a replayed mistake, and which of its entries are certain.

    Where two lanes store different values at one address, which one lands is the machine's choice (the
    interpreter keeps the last, a GPU any): such an entry is not compared.
    """

    def __init__(self, shape, stores, dtype=torch.float32):
        """``stores``: (flat offsets, values) pairs, applied in order."""
        self.value = _buffer(torch.full(shape, float(SENTINEL[dtype])), dtype)
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


def _first_cause(got, variants, atol, rtol):
    """The (cause, hint) of the first replayed mistake that ``got`` matches (a buffer, or _Writes), or None."""
    for description, candidate in variants:
        if isinstance(candidate, _Writes):
            if matches(got[candidate.sure], candidate.value[candidate.sure], 2 * atol, 2 * rtol):
                return description
        elif matches(got, candidate, 2 * atol, 2 * rtol):
            return description
    return None


def _on_device(x: torch.Tensor) -> torch.Tensor:
    return x.to(runtime.DEVICE)


# --- the puzzles --------------------------------------------------------------------------------------------


@_prints
def check_primer_program_ids(kernel):
    """Puzzle 1: on a (3, 4) grid, program (i, j) writes 10 * i + j to OUT[i, j] of a 3 x 4 OUT."""
    out, buffer = _out((3, 4), torch.int32)
    _launch(1, kernel, (3, 4), out, 4)
    programs = [(i, j) for i in range(3) for j in range(4)]

    def stores(address, value):
        return _Writes((3, 4), [(address(i, j), value(i, j)) for i, j in programs], torch.int32)

    variants = [
        (("the axes are swapped: i is the program's index along axis 0, tl.program_id(0), and j along axis 1",
          "i = tl.program_id(0), j = tl.program_id(1)"), stores(lambda i, j: j * 4 + i, lambda i, j: 10 * j + i)),
        (("the value's i and j are swapped: the value is 10 * i + j, with i from axis 0",
          "store 10 * i + j"), stores(lambda i, j: i * 4 + j, lambda i, j: 10 * j + i)),
        (("row i of OUT starts i * 4 entries in (a row holds 4 entries, one per program along axis 1), "
          "not i * 3: the rows overlap", "the address of OUT[i, j] is OUT + i * n_cols + j"),
         stores(lambda i, j: i * 3 + j, lambda i, j: 10 * i + j)),
        (("the address leaves out the row: OUT[i, j] is i * 4 + j entries past OUT, not j",
          "the address of OUT[i, j] is OUT + i * n_cols + j"), stores(lambda i, j: j, lambda i, j: 10 * i + j)),
        (("the address adds i and j without the row length: OUT[i, j] is i * 4 + j entries past OUT",
          "the address of OUT[i, j] is OUT + i * n_cols + j"), stores(lambda i, j: i + j, lambda i, j: 10 * i + j)),
    ]
    right = stores(lambda i, j: i * 4 + j, lambda i, j: 10 * i + j).value
    _judge(1, buffer, right, (3, 4), variants, dtype=torch.int32,
           past_end=("a program's address lands past OUT's 12 entries: with i = tl.program_id(0) (0 to 2) and "
                     "j = tl.program_id(1) (0 to 3), OUT[i, j] is i * 4 + j entries past OUT",
                     "the address of OUT[i, j] is OUT + i * n_cols + j"))
    return Verdict(True, _what(1), "every program of the (3, 4) grid wrote 10 * i + j to its own OUT[i, j]")


_OUTER_SHAPES = ("x and y are 1-D blocks of 4 and 8 values: side by side, their shapes do not fit. An [M, N] "
                 "tile comes from a column ([M, 1]) and a row ([1, N]); the pointers need the same shape as the "
                 "values they store",
                 "x[:, None] is [M, 1] and y[None, :] is [1, N]; x[:, None] + y[None, :] broadcasts to [M, N]. "
                 "Build the pointers the same way: OUT + i[:, None] * N + j[None, :]")


@_prints
def check_primer_outer_sum(kernel):
    """Puzzle 2: one program writes OUT[i, j] = x[i] + y[j], with 4 x's and 8 y's (OUT is 4 x 8)."""
    M, N = 4, 8
    x, y = 100.0 * torch.arange(M), torch.arange(N, dtype=torch.float32)
    out, buffer = _out((M, N))
    _launch(2, kernel, (1,), _on_device(x), _on_device(y), out, M=M, N=N, crashes={"shape": _OUTER_SHAPES})
    i, j = torch.arange(M)[:, None], torch.arange(N)[None, :]
    value = x[:, None] + y[None, :]
    variants = [
        (("row i starts i * N entries into OUT (a row holds N values), not i * M: the rows overlap",
          "the address of OUT[i, j] is OUT + i * N + j: i[:, None] * N + j[None, :]"),
         _Writes((M, N), [(i * M + j, value)])),
        (("OUT is stored column by column: the address of OUT[i, j] is i * N + j, and yours is i + j * M",
          "i[:, None] * N + j[None, :]"), _Writes((M, N), [(i + j * M, value)])),
    ]
    _judge(2, buffer, _buffer(value), (M, N), variants, past_end=_OUTER_SHAPES)
    return Verdict(True, _what(2), "OUT[i, j] = x[i] + y[j] for all 4 x 8 entries: a column plus a row")


@_prints
def check_primer_masked(kernel):
    """Puzzle 3: OUT[k] = 2 * X[k] for the n = 10 entries, by 3 programs of BLOCK = 4 (the last one ragged)."""
    n, block = 10, 4
    x_buffer = torch.full((n + GUARD,), -1.0)  # what lies past the end of X: -1
    x_buffer[:n] = torch.arange(1, n + 1)
    out, buffer = _out((n,))
    _launch(3, kernel, (triton.cdiv(n, block),), _on_device(x_buffer)[:n], out, n, BLOCK=block)
    lanes = torch.arange(block)
    doubled = 2 * x_buffer

    def programs(offsets, mask=lambda offs: offs < n):
        stores = []
        for pid in range(triton.cdiv(n, block)):
            offs = offsets(pid)
            keep = mask(offs)
            stores.append((offs[keep], doubled[offs[keep]]))
        return _Writes((n,), stores)

    unmasked = ("the last program owns indices 8 to 11, and 10 and 11 are past the end: its store is not masked",
                "mask = offs < n, and pass it to tl.store (and to tl.load: a read past the end can fault on a GPU)")
    variants = [
        (unmasked, programs(lambda p: p * block + lanes, lambda offs: offs >= 0)),
        (unmasked, _Writes((n,), [(torch.arange(12), torch.cat([doubled[:n], torch.zeros(2)]))])),
        (("the mask is off by one: index n = 10 is already past the end (the entries are 0 to n - 1)",
          "mask = offs < n"), programs(lambda p: p * block + lanes, lambda offs: offs <= n)),
        (("every program wrote the same first block: the offsets do not depend on the program id",
          "program p owns the BLOCK entries from p * BLOCK on: offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)"),
         programs(lambda p: lanes)),
        (("the programs' blocks overlap: program p starts at p, not at p * BLOCK",
          "offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)"), programs(lambda p: p + lanes)),
    ]
    _judge(3, buffer, _buffer(doubled[:n]), (n,), variants, past_end=unmasked)
    return Verdict(True, _what(3), "3 programs doubled the 10 entries, and the last one stopped at the end")


_SOFTMAX_SHAPES = ("a row's max (or sum) is a [M] vector, one value per row; against the [M, BLOCK_N] tile it "
                   "must stand as a column, [M, 1], and a reduction along axis 0 gives one value per column instead",
                   "tl.max(x, 1) reduces along axis 1 (along each row); tl.max(x, 1)[:, None] is a column")


@_prints
def check_primer_softmax(kernel):
    """Puzzle 4: one program writes the softmax of each row of a 4 x 6 X, read as a 4 x 8 block (2 columns padding)."""
    M, n_cols, block_n = 4, 6, 8
    gen = torch.Generator().manual_seed(4)
    for case, x in (("", torch.randn(M, n_cols, generator=gen)),
                    (" (on rows of large scores, near 100)", 100 + torch.randn(M, n_cols, generator=gen))):
        out, buffer = _out((M, n_cols))
        _launch(4, kernel, (1,), _on_device(x), out, n_cols, M=M, BLOCK_N=block_n, case=case,
                crashes={"shape": _SOFTMAX_SHAPES})
        x64 = x.double()

        def softmax(pad=float("-inf"), max_axis=1, sum_axis=1, shift=True):
            """A row softmax done the way a kernel might do it, on the padded [M, BLOCK_N] tile (float64)."""
            tile = torch.cat([x64, torch.full((M, block_n - n_cols), pad, dtype=torch.float64)], 1)
            p = torch.exp(tile - tile.amax(max_axis, keepdim=True)) if shift else torch.exp(tile.float()).double()
            return _buffer((p / p.sum(sum_axis, keepdim=True))[:, :n_cols])

        variants = [
            (("the padding columns 6 and 7 were loaded as 0 (a masked load with no other=, or other=0): they "
              "count in the row's max and sum. A padding lane must never win a max or add to a sum",
              "load with other=float('-inf'): e^-inf = 0"), softmax(pad=0.0)),
            (("e^x overflows in fp32 once x passes about 88: the scores are exponentiated before the row's max "
              "is taken away (softmax is the same with any constant taken away from a row)",
              "p = tl.exp(x - row_max[:, None]) with row_max = tl.max(x, 1)"), softmax(shift=False)),
            (("the max was taken along axis 0, down each column: every row needs its own max, along axis 1 "
              "(and a padding column's max is -inf, so -inf - -inf = NaN)", "tl.max(x, 1)[:, None]"),
             softmax(max_axis=0)),
            (("the sum was taken along axis 0, down each column: every row is divided by its own sum, along axis 1",
              "tl.sum(p, 1)[:, None]"), softmax(sum_axis=0)),
        ]
        _judge(4, buffer, _buffer(x64.softmax(1)), (M, n_cols), variants, case=case, tol=(1e-5, 1e-4),
               past_end=("the store is not masked: the padding columns 6 and 7 of a row are the next row's first "
                         "entries (and past the end of the last row)", "mask the store as you masked the load"))
    return Verdict(True, _what(4), "every row of OUT is the softmax of its row of X, the padding ignored, "
                                   "and large scores do not overflow")


_DOT = {
    "dot_k": ("B is stored [N, K], one key per row; tl.dot(a, b) multiplies [M, K] by [K, N], so its inner "
              "dimensions must agree: b's tile has to be turned on its side first",
              "tl.dot(a, tl.trans(b)): tl.trans turns an [N, K] tile into [K, N]"),
    "shape": ("the product you store must be [M, N] = [16, 32]: elementwise a * b of [M, K] and [N, K] does not "
              "fit, and tl.dot(b, ...) with b first gives [N, M]",
              "tl.dot(a, tl.trans(b)) is [M, K] times [K, N]"),
}


@_prints
def check_primer_dot(kernel):
    """Puzzle 5: OUT = A @ B^T, with A [16, 16] and B [32, 16] in fp16, OUT [16, 32] in fp32."""
    M, N, K = 16, 32, 16
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(M, K, generator=gen).half()
    b = torch.randn(N, K, generator=gen).half()
    out, buffer = _out((M, N))
    _launch(5, kernel, (1,), _on_device(a), _on_device(b), out, M=M, N=N, K=K, crashes=_DOT)
    a64, b64 = a.double(), b.double()
    variants = [
        (("B was read as if it were stored [K, N]: it is [N, K], and row n of B is key n",
          "load B's tile as [N, K] (n[:, None] * K + k[None, :]), then tl.trans"),
         _buffer(a64 @ b64.flatten().view(K, N))),
    ]
    _judge(5, buffer, _buffer(a64 @ b64.T), (M, N), variants, tol=(1e-3, 1e-3),
           past_end=("the store's addresses run past OUT: it is [M, N], so OUT[m, n] is m * N + n entries in",
                     "OUT + m[:, None] * N + n[None, :]"))
    return Verdict(True, _what(5), "OUT = A @ B^T: fp16 tiles, products summed in fp32")


@_prints
def check_primer_where(kernel):
    """Puzzle 6: OUT = S where the key's position <= the query's, else -inf; S's 8 rows are queries ROW0.., its
    8 columns keys COL0.."""
    B = 8
    gen = torch.Generator().manual_seed(6)
    for row0, col0 in ((0, 0), (4, 0), (0, 4), (16, 8)):
        s = torch.randn(B, B, generator=gen)
        out, buffer = _out((B, B))
        case = f" on the tile of queries {row0}-{row0 + B - 1} against keys {col0}-{col0 + B - 1}"
        _launch(6, kernel, (1,), _on_device(s), out, row0, col0, B=B, case=case)
        q, k = torch.arange(B)[:, None], torch.arange(B)[None, :]
        s64 = s.double()

        def masked(visible, fill=float("-inf")):
            return _buffer(torch.where(visible, s64, torch.tensor(fill, dtype=torch.float64)))

        future = col0 + k > row0 + q
        variants = [
            (("the mask hides the diagonal: a query sees its own key (key == query is visible)",
              "visible where key <= query"), masked(col0 + k < row0 + q)),
            (("the mask is reversed: it keeps the future keys and hides the past ones",
              "visible where the key's position <= the query's"), masked(col0 + k >= row0 + q)),
            (("the mask is reversed: it keeps the future keys and hides the past ones",
              "visible where the key's position <= the query's"), masked(col0 + k > row0 + q)),
            (("hidden scores are 0, not -inf (a product with the mask gives 0 too): after the softmax a score of "
              "0 still weighs e^(0 - max), so the future leaks in", "tl.where(visible, s, float('-inf'))"),
             masked(~future, 0.0)),
            (("the mask compares lane numbers (0 to 7), not positions: a lane's position is ROW0 + lane for a query "
              "and COL0 + lane for a key, and the two tiles need not start together",
              "compare (COL0 + j)[None, :] with (ROW0 + i)[:, None]"), masked(k <= q)),
        ]
        _judge(6, buffer, masked(~future), (B, B), variants, case=case)
    return Verdict(True, _what(6), "every future key is -inf and every other score kept, on the diagonal tile "
                                   "and off it, whichever tile starts first")


@_prints
def check_primer_maximum(kernel):
    """Puzzle 7: OUT[i] = the larger of M_OLD[i] and the max of row i of S (8 rows of 16)."""
    BM, BN = 8, 16
    gen = torch.Generator().manual_seed(7)
    s = torch.randn(BM, BN, generator=gen)
    tile_max = s.amax(1)
    m_old = tile_max + torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.0, 0.0])
    m_old[6] = float("-inf")  # the first tile of a row: no old maximum yet
    out, buffer = _out((BM,))
    _launch(7, kernel, (1,), _on_device(m_old), _on_device(s), out, BM=BM, BN=BN,
            crashes={"shape": ("m_old is [BM], one value per row, and s is [BM, BN]: they do not compare "
                               "element by element until s is reduced to one value per row (along axis 1)",
                               "tl.maximum(m, tl.max(s, 1))")})
    m64, s64 = m_old.double(), s.double()
    variants = [
        (("the old maximum is dropped: OUT holds the tile's row max alone, so a row whose old maximum was larger "
          "loses it", "OUT[i] = tl.maximum(old, tile's row max)"), _buffer(s64.amax(1))),
        (("the old maximum alone: the tile's scores never enter", "tl.maximum(m, tl.max(s, 1))"), _buffer(m64)),
        (("tl.max(s) with no axis is the maximum of the whole tile, one number: each row needs its own, "
          "tl.max(s, 1)", "tl.maximum(m, tl.max(s, 1))"), _buffer(torch.maximum(m64, s64.max()))),
    ]
    _judge(7, buffer, _buffer(torch.maximum(m64, s64.amax(1))), (BM,), variants)
    return Verdict(True, _what(7), "OUT is the running maximum: the old one where it is larger, the tile's "
                                   "where that is, and the tile's in the row that had none (-inf)")


def _p_off_the_grid(gen, shape):
    """Probabilities 0.4 of an fp16 step above an fp16 number: rounding them to fp16 shows."""
    p16 = torch.rand(shape, generator=gen).half().float()
    step = torch.ldexp(torch.ones_like(p16), torch.frexp(p16).exponent - 11).clamp_min(2.0 ** -24)
    return p16 + 0.4 * step


@_prints
def check_primer_cast(kernel):
    """Puzzle 8: OUT = P @ V with P [16, 16] in fp32 brought to V's dtype first; V [16, 16] in fp16, then fp32."""
    BM, BN, D = 16, 16, 16
    gen = torch.Generator().manual_seed(8)
    p = _p_off_the_grid(gen, (BM, BN))
    for dtype, tol in ((torch.float16, (1e-4, 1e-4)), (torch.float32, (1e-2, 1e-2))):  # fp32: TF32 on a GPU
        v = (0.5 + torch.rand(BN, D, generator=gen)).to(dtype)
        case = f" (V in {str(dtype).removeprefix('torch.')})"
        crashes = {"dot_dtype": (
            ("P is fp32 and V fp16: tl.dot takes two operands of one dtype, and Triton does not convert "
             "either one for you", "p.to(v.dtype): P comes to V's dtype, the dtype of the tensor cores' inputs")
            if dtype == torch.float16 else
            ("P was brought to a fixed dtype, fp16, but here V is fp32: name V's dtype, whatever it is",
             "p.to(v.dtype)"))}
        out, buffer = _out((BM, D))
        _launch(8, kernel, (1,), _on_device(p), _on_device(v), out, BM=BM, BN=BN, D=D, case=case, crashes=crashes)
        p64, v64 = p.double(), v.double()
        variants = [
            (("V was brought up to fp32 instead of P down to fp16: the product runs in fp32, at a fraction of the "
              "tensor cores' fp16 speed, and is not the product the kernel is specified to compute",
              "p.to(v.dtype)"), _buffer(p64 @ v64)),
        ]
        _judge(8, buffer, _buffer(p.to(dtype).double() @ v64), (BM, D), variants if dtype == torch.float16 else (),
               tol=tol, case=case)
    return Verdict(True, _what(8), "OUT = P @ V with P in V's dtype, for fp16 and fp32 V")


PRIMER_CHECKS = (check_primer_program_ids, check_primer_outer_sum, check_primer_masked, check_primer_softmax,
                 check_primer_dot, check_primer_where, check_primer_maximum, check_primer_cast)
