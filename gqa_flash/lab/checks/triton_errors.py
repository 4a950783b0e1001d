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


def _chain(exc: BaseException) -> list:
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


def _dot_dtypes(left: str, right: str, line: str):
    """tl.dot on two dtypes: (message, cause, hint), saying which operand to cast."""
    names = _call_args(line, "tl.dot") or _call_args(line, "dot")
    a, b = names[:2] if len(names) >= 2 else ("", "")
    what_a, what_b = (f"`{a}`", f"`{b}`") if a else ("the left operand", "the right operand")
    message = f"tl.dot gets operands of two dtypes, {left} and {right}"
    cause = f"{what_a} is {left} and {what_b} is {right}: tl.dot multiplies two blocks of one dtype"
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


def _block_shape(value):
    ty = getattr(value, "type", None)
    if ty is None or not hasattr(ty, "is_block"):
        return None
    return [int(getattr(s, "value", s)) for s in ty.shape] if ty.is_block() else []


def _broadcast_shapes(exc: BaseException):
    """The shapes of the two blocks that did not broadcast, read from Triton's own frames, or None.

    The caller's operands come first: broadcast_impl_value has already given a 1-D block a leading axis."""
    for e in _chain(exc):
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


def _broadcast(exc: BaseException, axis: int, x: int, y: int):
    """Two blocks that do not broadcast: (message, cause, hint), naming their shapes."""
    shapes = _broadcast_shapes(exc)
    if shapes is None:
        return (f"two blocks do not broadcast together (axis {axis}: {x} against {y})",
                "a vector is expanded on the wrong axis, or not at all", _AXES)
    a, b = shapes
    message = f"two blocks of shapes {a} and {b} do not broadcast together (axis {axis}: {x} against {y})"
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


def triton_error(exc: BaseException, line: str = ""):
    """(message, cause, hint) for Triton's usual errors, from the interpreter or a GPU's compiler, or None.

    ``line`` is the source line that failed, when known: it names a dot's operands, or a built-in."""
    text = " ".join(str(e) for e in _chain(exc)) + " " + " ".join(
        str(getattr(e, "error_message", "") or "") for e in _chain(exc))
    m = re.search(r"Both operands must be same dtype\. Got (\w+) and (\w+)", text)
    if m:
        return _dot_dtypes(m.group(1), m.group(2), line)
    m = re.search(r"Cannot make_shape_compatible: incompatible dimensions at index (\d+): (\d+) and (\d+)", text)
    if m:
        return _broadcast(exc, *(int(g) for g in m.groups()))
    names = [n for n in _BUILTIN_BLOCK_OPS if re.search(rf"(?<![\w.]){n}\s*\(", line)]
    if names and (any(isinstance(e, TypeError) for e in _chain(exc)) or any(n in text for n in names)):
        return (f"Python's built-in {' and '.join(names)} is called on a Triton block", builtins_cause(names),
                builtins_hint(names))
    return None
