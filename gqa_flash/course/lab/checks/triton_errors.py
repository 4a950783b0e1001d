"""Triton's usual errors, in words: what a check says when your kernel does not run (any checked file).

Triton's own messages name its internals: "Cannot make_shape_compatible: incompatible dimensions at index 1:
16 and 32", "Both operands must be same dtype. Got fp32 and fp16". :func:`triton_error` turns them, from the
interpreter or (by their text) from a GPU's compiler, into a verdict's three lines: what is wrong (the two
shapes; the two dtypes), the likely cause (a vector expanded on the wrong axis; which operand is in fp32),
and the fix. It also names Python's built-in ``max``, ``min`` and ``sum`` on Triton blocks: in the
interpreter ``max(a, b)`` of two blocks returns ``b`` whatever the values, a silent mistake that
:func:`python_builtins_called` finds in a helper's source.
"""

import ast
import inspect
import re
import textwrap
from pathlib import Path


def innermost_compile_error(exc: BaseException):
    """The innermost CompilationError (a GPU's compiler) in ``exc``'s chain, or None."""
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


def exception_chain(exc: BaseException) -> list:
    """``exc`` and the exceptions it was raised from or while handling (the interpreter and the compiler wrap)."""
    chain, e = [], exc
    while e is not None and all(e is not seen for seen in chain):
        chain.append(e)
        e = e.__cause__ or e.__context__
    return chain


def compile_error_line(path: Path, exc: BaseException):
    """On a GPU: the line of the file at ``path`` where the kernel did not compile, or None."""
    ce = innermost_compile_error(exc)
    src, node = getattr(ce, "src", None), getattr(ce, "node", None)
    if not src or not hasattr(node, "lineno"):
        return None
    try:
        text = path.read_text()
    except OSError:
        return None
    at_ = text.find(src)
    return text[:at_].count("\n") + node.lineno if at_ >= 0 else None


def source_line(path: Path, exc: BaseException, line) -> str:
    """The text of the line that failed: line ``line`` of the file at ``path``, or the compile error's own."""
    if line:
        try:
            return path.read_text().splitlines()[line - 1]
        except (OSError, IndexError):
            pass
    ce = innermost_compile_error(exc)
    src, node = getattr(ce, "src", None), getattr(ce, "node", None)
    if src and hasattr(node, "lineno") and 0 < node.lineno <= len(src.splitlines()):
        return src.splitlines()[node.lineno - 1]
    return ""


def _call_args(line: str, name: str) -> list[str]:
    """The argument texts of the first call ``name(...)`` (``tl.dot(p, v)``) in one line of source."""
    m = re.search(rf"(?<![\w]){re.escape(name)}\s*\(", line)
    if not m:
        return []
    args, depth, current = [], 0, ""
    for ch in line[m.end():]:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                return [a.strip() for a in args + [current] if a.strip()]
            depth -= 1
        elif ch == "," and depth == 0:
            args, current = args + [current], ""
            continue
        current += ch
    return [a.strip() for a in args + [current] if a.strip()]  # the call goes on on the next line


# ``x.to(tl.float16)``, ``(a * b).to(tl.bfloat16, ...)``: a cast to a fixed dtype; group 1 is what is cast.
_FIXED_CAST = re.compile(r"(.+?)\.to\(\s*(?:tl\.)?(float16|bfloat16|float32|float64|float8\w*)\s*(?:,[^()]*)?\)")


def _dot_dtypes(left: str, right: str, line: str):
    """tl.dot on two dtypes: (message, cause, hint), saying which operand to bring to which dtype.

    The operand computed in the kernel (probabilities, gradients: fp32) goes to the dtype of the one loaded from
    the inputs, never to a fixed dtype: the inputs may be fp16, bf16 or fp32. An operand that the line already
    casts to a fixed dtype (``p.to(tl.float16)``) is that mistake."""
    names = _call_args(line, "tl.dot") or _call_args(line, "dot")
    a, b = names[:2] if len(names) >= 2 else ("", "")
    what_a, what_b = (f"`{a}`", f"`{b}`") if a else ("the left operand", "the right operand")
    message = f"tl.dot gets operands of two dtypes, {left} and {right}"
    cause = f"{what_a} is {left} and {what_b} is {right}: tl.dot multiplies two blocks of one dtype"
    fixed = [(arg, m) for arg, m in ((a, _FIXED_CAST.fullmatch(a)), (b, _FIXED_CAST.fullmatch(b))) if m]
    if len(fixed) == 1:  # e.g. p.to(tl.float16) against v loaded in fp32
        arg, m = fixed[0]
        base, other = m.group(1), (b if arg == a else a)
        base_text = base if base.isidentifier() else f"({base})"
        target = f"{other}.dtype" if other.isidentifier() else "the other operand's dtype"
        cause = (f"`{arg}` casts to a fixed dtype, {_SHORT.get(m.group(2), m.group(2))}, and `{other}` is "
                 f"{right if arg == a else left}: the inputs may be fp16, bf16 or fp32, so a fixed dtype fits only "
                 "some of them")
        return message, cause, (f"bring `{base}` to the dtype of `{other}`, whatever it is: "
                                f"{base_text}.to({target})")
    if (left == "fp32") == (right == "fp32"):
        return message, cause, "cast one operand to the other's dtype with .to(...)"
    cast, keep, to, which = (a, b, right, what_a) if left == "fp32" else (b, a, left, what_b)
    how = ""
    if cast:
        target = f"{keep}.dtype" if keep.isidentifier() else f"tl.{_TL.get(to, to)}"
        how = f" ({cast if cast.isidentifier() else f'({cast})'}.to({target}))"
    return message, cause, (f"cast {which} down to {to}{how}: tl.dot still accumulates in fp32, and {to} operands "
                            "run on the tensor cores")


_TL = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
_SHORT = {v: k for k, v in _TL.items()}


def _block_shape(value):
    ty = getattr(value, "type", None)
    if ty is None or not hasattr(ty, "is_block"):
        return None
    return [int(getattr(s, "value", s)) for s in ty.shape] if ty.is_block() else []


def _broadcast_shapes(exc: BaseException):
    """The shapes of the two blocks that did not broadcast, read from Triton's own frames, or None.

    The caller's operands come first: broadcast_impl_value has already given a 1-D block a leading axis."""
    for e in exception_chain(exc):
        tb, caller = e.__traceback__, None
        while tb is not None:
            if tb.tb_frame.f_code.co_name == "broadcast_impl_value":
                for frame in (caller, tb.tb_frame):
                    names = frame.f_locals if frame is not None else {}
                    shapes = _block_shape(names.get("lhs")), _block_shape(names.get("rhs"))
                    if None not in shapes:
                        return shapes
            caller, tb = tb.tb_frame, tb.tb_next
    return None


_REDUCTIONS = ("tl.max", "tl.min", "tl.sum", "tl.argmax", "tl.argmin")


def _reduction_axis(line: str):
    """(the call's text, its axis) of the first reduction with an axis in ``line`` (``tl.max(s, 0)``), or None."""
    for name in _REDUCTIONS:
        args = _call_args(line, name)
        axis = next((a.split("=", 1)[1].strip() for a in args[1:] if a.replace(" ", "").startswith("axis=")),
                    args[1] if len(args) > 1 and "=" not in args[1] else None)
        if axis is not None and axis.lstrip("-").isdigit():
            return f"{name}({', '.join(args)})", int(axis)
    return None


def _reduction_cause(call: str, axis: int):
    """(cause, hint) of a reduction along the wrong axis: its result has the other axis's length."""
    per, wanted = ("column", "row") if axis in (0, -2) else ("row", "column")
    return (f"`{call}` reduces axis {axis}, the {wanted}s: it gives one value per {per}, where one value per "
            f"{wanted} is wanted: the reduction is along the wrong axis",
            "of a [rows, columns] block, axis 0 runs down the rows and axis 1 along a row (the keys, in a tile of "
            "scores): one value per row (a row's max or sum) reduces axis 1, one value per column axis 0")


def _broadcast(exc: BaseException, axis: int, x: int, y: int, line: str = ""):
    """Two blocks that do not broadcast: (message, cause, hint), naming their shapes."""
    shapes = _broadcast_shapes(exc)
    if shapes is None:
        return (f"two blocks do not broadcast together (axis {axis}: {x} against {y})",
                "a vector is expanded on the wrong axis, or not at all", _AXES)
    a, b = shapes
    message = f"two blocks of shapes {a} and {b} do not broadcast together (axis {axis}: {x} against {y})"
    reduction = _reduction_axis(line)
    if reduction is not None and len(a) == len(b) == 1:  # two vectors: one of them came out of the reduction
        return (message, *_reduction_cause(*reduction))
    vec, block = (a, b) if len(a) < len(b) or (len(a) == len(b) and 1 in a) else (b, a)
    cause = "a vector is expanded on the wrong axis, or not at all"
    if len(vec) == 1 and len(block) == 2 and vec[0] == block[0]:
        cause = (f"a 1-D block of {vec[0]} values, one per row of the {block} block, is used as it is, and a 1-D "
                 "block broadcasts as a row: its expansion to a column is missing")
    elif vec == [1, block[0]] and block[0] != block[1]:
        cause = (f"a vector of {block[0]} values, one per row of the {block} block, is expanded into a row, "
                 f"{vec}: it is expanded on the wrong axis")
    elif len(vec) == 2 and vec[1] == 1 and vec[0] == block[1] and block[0] != block[1]:
        cause = (f"a vector of {block[1]} values, one per column of the {block} block, is expanded into a column, "
                 f"{vec}: it is expanded on the wrong axis")
    elif len(a) == len(b) == 2 and a == b[::-1]:
        cause = "one block is the transpose of the other"
    return message, cause, _AXES


_AXES = ("a [:, None] or [None, :] is on the wrong axis or missing: x[:, None] makes a vector a column (one value "
         "per row), x[None, :] a row (one value per column)")

_BUILTIN_BLOCK_OPS = {"max": ("tl.maximum(a, b)", "tl.max(x, axis)"), "min": ("tl.minimum(a, b)", "tl.min(x, axis)"),
                      "sum": (None, "tl.sum(x, axis)")}


def python_builtins_called(fn) -> list[str]:
    """Python's built-ins max, min and sum called in a Triton helper's source (by their bare names)."""
    try:
        source = getattr(fn, "src", None) or inspect.getsource(getattr(fn, "fn", fn))
        tree = ast.parse(textwrap.dedent(source))
    except (OSError, TypeError, SyntaxError):
        return []
    found = [node.func.id for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _BUILTIN_BLOCK_OPS]
    return sorted(set(found), key=found.index)


def builtins_cause(names) -> str:
    """Why Python's ``names`` (max, min, sum) go wrong on Triton blocks."""
    said = []
    for name in names:
        if name == "sum":
            said.append("sum iterates over its argument as over a list, which a block is not, and fails")
        else:
            said.append(f"{name}(a, b) compares whole blocks, a block always counts as true, so it returns b, its "
                        "last argument, whatever the values (a GPU's compiler turns it into an elementwise "
                        f"{'maximum' if name == 'max' else 'minimum'}, with a deprecation warning)")
    return f"Python's built-in {' and '.join(names)} on Triton blocks: in the interpreter " + "; ".join(said)


def builtins_hint(names) -> str:
    uses = []
    for name in names:
        pair, reduce_ = _BUILTIN_BLOCK_OPS[name]
        uses.append((f"{pair} for the elementwise {name} of two blocks, " if pair else "") + f"{reduce_} to reduce "
                    "one block along an axis")
    return "use Triton's own: " + "; ".join(uses)


def _dot_shapes(exc: BaseException):
    """The shapes of tl.dot's two operands, read from Triton's own frame, or None."""
    for e in exception_chain(exc):
        tb = e.__traceback__
        while tb is not None:
            names = tb.tb_frame.f_locals
            if tb.tb_frame.f_code.co_name == "dot" and "a_shape" in names and "b_shape" in names:
                return [int(getattr(s, "value", s)) for s in names["a_shape"]], [
                    int(getattr(s, "value", s)) for s in names["b_shape"]]
            tb = tb.tb_next
    return None


def _dot_reduction(exc: BaseException, line: str):
    """tl.dot of [M, K] by [N, K] (the right operand not transposed): (message, cause, hint)."""
    shapes = _dot_shapes(exc)
    args = _call_args(line, "tl.dot") or _call_args(line, "dot")
    a, b = (f"`{x}`" for x in args[:2]) if len(args) >= 2 else ("the left operand", "the right operand")
    if shapes is None:
        return ("the two blocks of tl.dot do not fit: the left one's columns are not the right one's rows",
                f"tl.dot multiplies an [M, K] block by a [K, N] one, and {b} is not [K, N]: it may need transposing",
                "tl.trans(x) transposes a 2-D block")
    sa, sb = shapes
    message = (f"the two blocks of tl.dot do not fit: {sa} by {sb} (the left one's {sa[-1]} columns against the "
               f"right one's {sb[-2]} rows)")
    if len(sa) == len(sb) == 2 and sa[1] == sb[1]:  # q [BLOCK_M, D] against k [BLOCK_N, D]: a score tile
        cause = (f"{a} is [{sa[0]}, {sa[1]}] and {b} is [{sb[0]}, {sb[1]}]: both hold their rows' vectors along "
                 f"axis 1, so {b} must be transposed: the scores are q·kᵀ, and tl.dot multiplies [M, K] by [K, N]")
        hint = (f"take the dot with tl.trans({args[1]}), a [{sb[1]}, {sb[0]}] block" if len(args) >= 2 else
                "transpose the right operand with tl.trans")
        return message, cause, hint
    return (message, f"tl.dot multiplies an [M, K] block by a [K, N] one: {a} is {sa} and {b} is {sb}",
            "tl.trans(x) transposes a 2-D block, if that is what is missing")


def triton_error(exc: BaseException, line: str = ""):
    """(message, cause, hint) for Triton's usual errors, from the interpreter or a GPU's compiler, or None.

    ``line`` is the source line that failed, when known: it names a dot's operands, or a built-in."""
    text = " ".join(str(e) for e in exception_chain(exc)) + " " + " ".join(
        str(getattr(e, "error_message", "") or "") for e in exception_chain(exc))
    m = re.search(r"Both operands must be same dtype\. Got (\w+) and (\w+)", text)
    if m:
        return _dot_dtypes(m.group(1), m.group(2), line)
    if "input and other must have equal reduction dimensions" in text:
        return _dot_reduction(exc, line)
    m = re.search(r"Cannot make_shape_compatible: incompatible dimensions at index (\d+): (\d+) and (\d+)", text)
    if m:
        return _broadcast(exc, *(int(g) for g in m.groups()), line=line)
    m = re.search(r"Expected pointer argument to have shape (\[[^\n]*?\]) but got (\[[^\n]*?\])(?=[\s\"')]|$)", text)
    if m:  # a value of more dimensions than its pointers: a block never reduced
        pointers, value = (re.findall(r"\d+", g) for g in m.groups())
        if len(value) < len(pointers):  # whichever the message names first: the value has the more dimensions
            pointers, value = value, pointers
        if len(value) > len(pointers):
            return (f"the block stored has shape [{', '.join(value)}] where its pointers have shape "
                    f"[{', '.join(pointers)}]",
                    "one number per row is stored from a block that still has a column axis: a sum over that "
                    "axis (tl.sum(x, 1)) is missing, or was taken over the wrong axis",
                    "reduce the block to one number per row before the store: tl.sum(x, axis=1)")
    names = [n for n in _BUILTIN_BLOCK_OPS if re.search(rf"(?<![\w.]){n}\s*\(", line)]
    if names and (any(isinstance(e, TypeError) for e in exception_chain(exc)) or any(n in text for n in names)):
        return (f"Python's built-in {' and '.join(names)} is called on a Triton block", builtins_cause(names),
                builtins_hint(names))
    return None
