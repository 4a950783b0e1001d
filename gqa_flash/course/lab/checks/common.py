"""What every check shares: the verdict, running your code safely, and comparing tensors.

A check never raises for a wrong answer, and never lets your code's exception
through: whatever happens, it comes back with a :class:`Verdict`. A failure is
told in two steps: first what is wrong and where (which rows, heads, tokens or
output), with no code in it; the likely cause and its fix come when the same
failure is checked a second time (re-run the cell), or at once from
``checks.explain()``, which shows the last check's verdict in full, a pass
included. Looking first is how the lesson is learnt. A failure that none of
the replayed mistakes explains says so plainly on the second look, and what
to compare next (``Verdict.compare``). Inside a
check, the way out is ``raise Stop(verdict)``; :func:`run_student` turns a
``NotImplementedError`` or a crash in your file into such a verdict, naming
the part whose STUDENT IMPLEMENTATION banner holds the line that failed.
:func:`prints_verdict` makes a check body into the ``check_*`` function that a
notebook calls: it prints the verdict.

The comparisons at the end are the ones every lesson uses: within tolerance
of the float64 reference, and :func:`first_cause`, which replays the usual
mistakes and says which one your output matches.
"""

import contextlib
import io
import re
import tokenize
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gqa_flash.course import impl, integrity, layout, testing
from gqa_flash.course.lab.checks.triton_errors import (
    compile_error_line, innermost_compile_error, source_line, triton_error,
)

# Every checked file's parts, numbered as the banners in the file number them, and the files beyond the 100
# points (notebooks 04b, 06, 07 and 08): the registry's (gqa_flash/course/layout.py).
PARTS = layout.PARTS
BONUS = layout.BONUS_MODULES

# The part a Triton kernel or helper belongs to, for compile errors (which
# carry the kernel's source, not a line of your file).
KERNEL_PARTS = {
    "forward": {name: part for part, name in PARTS["forward"].items()},
    "windows": {name: part for part, name in PARTS["windows"].items()},
    "backward": {"backward_preprocess": 1, "backward_dkdv": 2, "group_query_head": 3, "backward_dq": 4},
    "decode": {name: part for part, name in PARTS["decode"].items()},
}


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
    compare: str | None = None  # what to compare next when no likely cause is known (cause and hint None)
    extra: dict = field(default_factory=dict, repr=False)

    @property
    def bonus(self) -> bool:
        """True for a bonus file's verdict (windows.py, backward.py, decode.py, ring.py): beyond the 100 points."""
        return self.what.split(".py")[0] in BONUS

    def headline(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'} {self.what}: {self.message}"

    @property
    def unexplained(self) -> bool:
        """A failure with neither a likely cause nor a hint: none of the usual mistakes gives this result."""
        return not self.ok and not self.cause and not self.hint

    @property
    def placeholder(self) -> bool:
        """A failure whose cause is the stub's placeholder, still there: told at once, as nothing is to be found."""
        return not self.ok and PLACEHOLDER in (self.cause or "")

    def lines(self, reveal: bool = True) -> list[str]:
        """The verdict's lines; with ``reveal=False`` a failure's cause and hint are held back (step one).

        A failure no known mistake explains holds back, in the same way, the plain word that no likely
        cause is known and what to compare next.
        """
        out = [self.headline()]
        held = not reveal and (self.unexplained or (not self.ok and self.cause)) and not self.placeholder
        if held:
            shown = (("where", self.where),)
        elif self.unexplained:
            shown = (("where", self.where), ("likely cause", _unknown(self, NO_KNOWN_CAUSE)),
                     ("compare next", self.compare or _compare_next(self)))
        else:
            shown = (("where", self.where), ("likely cause", self.cause), ("hint", self.hint))
        for label, text in shown:
            if text:
                out.append(f"    {label}: {text}")
        if held and self.unexplained:
            look = "look where it points first" if self.where else "think it over first"
            out.append(f"    {_unknown(self, STEP_TWO_UNKNOWN.format(look=look))}")
        elif held:
            out.append(f"    {STEP_TWO if self.where else STEP_TWO_NOWHERE}")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


PLACEHOLDER = "placeholder is still there"  # in the cause of a part not written yet (its stub's placeholder)
# What step one ends with. A failure with no cause but a hint (a part not started, not run yet) shows it at once.
STEP_TWO = "cause: look where it points first; re-run this cell for the likely cause and a fix (or checks.explain())"
STEP_TWO_NOWHERE = "cause: think it over first; re-run this cell for the likely cause and a fix (or checks.explain())"
STEP_TWO_UNKNOWN = ("cause: none of the usual mistakes gives this result; {look}, then re-run this cell for what "
                    "to compare next (or checks.explain())")
NO_KNOWN_CAUSE = "none known: none of the usual mistakes that this check replays gives this result"
_UNEXPLAINED = "(no known cause)"  # what _SEEN keeps for an unexplained failure


def _crashed(verdict: Verdict) -> bool:
    return verdict.message.startswith(("your code raised", "your kernel does not run"))


def _unknown(verdict: Verdict, text: str) -> str:
    """``text`` about a result, said of an error where the failure is a crash."""
    return text.replace("gives this result", "raises this error") if _crashed(verdict) else text


def _compare_next(verdict: Verdict) -> str:
    """What to compare next, for a failure whose check gave no ``compare`` of its own."""
    if _crashed(verdict):
        return ("the shapes of the tensors on the line that raised (print them) with the shapes the part's "
                "banner gives: the first that differs is where the mistake is")
    return ("your part's tensors, on the case named under where, with what the part's banner says they hold "
            "(shapes and invariants): print them one step after another; the first that is not what the "
            "banner says is where the mistake is")


_SEEN: dict[str, str] = {}  # what -> the cause last shown for it (step one)
_LAST: list = []  # the verdict of the last check printed, a pass included


def staged(verdict: Verdict) -> str:
    """What a notebook's check prints: step one the first time a failure is seen, everything the second.

    A failure is the same when its file, part and cause are (its values may differ: the inputs are fresh).
    Every verdict printed, a pass included, becomes the one :func:`explain` shows.
    """
    _LAST[:] = [verdict]
    key = verdict.cause or (_UNEXPLAINED if verdict.unexplained else None)
    if verdict.ok or key is None:
        return str(verdict)
    second = _SEEN.get(verdict.what) == key
    _SEEN[verdict.what] = key
    return "\n".join(verdict.lines(reveal=second))


def explain() -> None:
    """Print the last check's verdict in full: a failure's likely cause and hint too (or, when none is
    known, what to compare next); a pass as it was printed."""
    if not _LAST:
        print("no check has failed yet in this session: none has run. Run a check cell, then checks.explain() "
              "shows its verdict in full")
        return
    print(_LAST[0])
    if _LAST[0].ok:
        print("    the last check passed: there is nothing to explain")


def what_of(module: str, part=None) -> str:
    """A verdict's ``what``: ``naive.py``, ``tiled.py Parts 1-5`` or ``naive.py Part 1 (GQA head mapping)``."""
    if part is None:
        return f"{module}.py"
    if isinstance(part, tuple):
        return f"{module}.py Parts {part[0]}-{part[-1]}"
    return f"{module}.py Part {part} ({PARTS[module][part]})"


def fail(module, part, message, **kw) -> Verdict:
    return Verdict(False, what_of(module, part), message, **kw)


class Stop(Exception):
    """Raised inside a check to end it with this verdict."""

    def __init__(self, verdict: Verdict):
        super().__init__(str(verdict))
        self.verdict = verdict


def verdict_of(body, *args, **kwargs) -> Verdict:
    """Run a check body; whatever happens, come back with a Verdict."""
    try:
        return body(*args, **kwargs)
    except Stop as stop:
        return stop.verdict


def prints_verdict(body):
    """The notebook's check from a check body: it prints the body's verdict and returns nothing.

    ``check.verdict(...)`` runs the same body and returns its Verdict instead
    (what :func:`gqa_flash.course.lab.checks.verdicts` collects).
    """

    def check() -> None:
        print(staged(verdict_of(body)))

    check.__name__, check.__qualname__ = body.__name__, body.__qualname__
    check.__doc__, check.__module__ = body.__doc__, body.__module__
    check.verdict = lambda *args, **kwargs: verdict_of(body, *args, **kwargs)
    return check


# --------------------------------------------------------------------------
# Running your code
# --------------------------------------------------------------------------


def rel(module: str) -> str:
    """``gqa_flash/naive.py`` (or the completed file, as the switch says): the file the check runs."""
    path = impl.path_of(module)
    try:
        return str(path.relative_to(layout.COURSE_DIR))
    except ValueError:
        return str(path)


def load(module: str):
    """The graded module, re-imported if it changed; a broken file becomes a verdict."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return impl.load(module)
    except Exception as e:  # a syntax error, an import error...
        raise Stop(fail(module, None, f"{rel(module)} does not import: {describe_exception(e)}",
                        hint="fix the error, save the file, and re-run this cell")) from None


def run_student(module: str, fn, *args, part=None, **kwargs):
    """Call student code; NotImplementedError and crashes become verdicts (raised as Stop).

    ``part`` is the part to blame when the failing line is in no part of the file. A call of the student's
    code itself (not a probe the checks built) runs under :class:`gqa_flash.course.integrity.own_work`, as in the
    graded tests: an answer that comes from the course's kernels, reference or checks is a FAIL here too.
    """
    lab = Path(__file__).resolve().parent.parent
    code = getattr(fn, "__code__", None)
    probe = code is not None and lab in Path(code.co_filename).resolve().parents
    try:
        with warnings.catch_warnings(), (contextlib.nullcontext() if probe else _own_work(module)):
            warnings.simplefilter("ignore")
            return fn(*args, **kwargs)
    except Stop:
        raise
    except AssertionError as e:
        if not integrity.is_violation(e):
            raise _failure(module, e, part) from None
        raise Stop(fail(module, part, str(integrity.unwrap(e)).removeprefix(integrity.PREFIX),
                        hint="the graded tests score this part 0 while it does")) from None
    except NotImplementedError as e:
        m = re.search(r"Part (\d+)", str(e))
        p = int(m.group(1)) if m else (_part_from_traceback(module, e)[0] or part)
        p = p if p in PARTS[module] else part
        raise Stop(fail(module, p, f"Part {p} is not implemented yet" if p else "not implemented yet",
                        hint=f"open {rel(module)}, fill in Part {p}, save, and re-run this cell")) from None
    except Exception as e:
        raise _failure(module, e, part) from None


def _own_work(module: str):
    """The integrity guard for the module the checks loaded (already imported: no import runs unguarded)."""
    loaded = getattr(impl.load(module), "__file__", None)
    return integrity.own_work(module, file=loaded)


def _failure(module: str, e: Exception, part) -> Stop:
    """A crash as a verdict: Triton's usual errors in words (triton_error), any other as raised."""
    p, line = _part_from_traceback(module, e)
    line = line or compile_error_line(file_of(module), e)
    p = p or _part_of_compile_error(module, e) or part
    where = f"{rel(module)}, line {line}" if line else None
    known = triton_error(e, source_line(file_of(module), e, line))
    if known is not None:
        message, cause, hint = known
        return Stop(fail(module, p, message, where=where, cause=cause, hint=hint))
    return Stop(fail(module, p, f"your code raised {describe_exception(e)}", where=where))


def file_of(module: str) -> Path:
    """The file of the module the checks run (impl.load's: a file of its own for a mutant in the tests)."""
    try:
        return Path(getattr(impl.load(module), "__file__", None) or impl.path_of(module)).resolve()
    except Exception:  # it does not import: the configured file
        return impl.path_of(module).resolve()


def part_regions(path: Path) -> list[tuple[int, int, int]]:
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


def part_code(module: str, part: int) -> str:
    """The code of ``part`` in the file the checks run, comments left out: what a diagnosis may look for
    before it names an operator (never blame a ``%`` the part does not hold)."""
    path = file_of(module)
    try:
        text = path.read_text()
        comments = [tok.start for tok in tokenize.generate_tokens(io.StringIO(text).readline)
                    if tok.type == tokenize.COMMENT]
    except (OSError, tokenize.TokenError, SyntaxError):
        return ""
    lines = text.splitlines()
    for row, col in comments:
        lines[row - 1] = lines[row - 1][:col]
    return "\n".join(line.rstrip() for first, last, p in part_regions(path) if p == part
                     for line in lines[first - 1:last] if line.strip())


def _part_from_traceback(module: str, exc: BaseException):
    """The part whose banner holds the deepest line of ``module``'s file in the traceback."""
    path = file_of(module)
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
    for first, last, part in part_regions(path):
        if first <= line <= last:
            return part, line
    return None, line


def _unwrap(exc: BaseException) -> BaseException:
    """The exception student code raised, out of the wrappers of Triton's interpreter."""
    while type(exc).__name__ == "InterpreterError" and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def _part_of_compile_error(module: str, exc: BaseException):
    """The part of the kernel or helper that did not compile (on a GPU), when one can tell."""
    ce = innermost_compile_error(exc)
    if ce is None or not getattr(ce, "src", None):
        return None
    m = re.search(r"def\s+(\w+)\s*\(", ce.src)
    return KERNEL_PARTS.get(module, {}).get(m.group(1)) if m else None


def describe_exception(exc: BaseException) -> str:
    """``TypeError: message``, one line, short; for Triton compile errors the error and its line."""
    ce = innermost_compile_error(exc)
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


# --------------------------------------------------------------------------
# Comparing tensors
# --------------------------------------------------------------------------


def tol(dtype):
    """The graded tests' tolerance (atol, rtol) for outputs of this dtype."""
    return testing.TOLERANCES.get(dtype, testing.TOLERANCES[torch.float32])


def fmt(x: float) -> str:
    return f"{x:.4g}"


def at(problem) -> str:
    """``row 3, column 5: got 0.1, expected 0.2``: where a testing.Mismatch is, and what is there."""
    index = ", ".join(f"{label} {i}" for label, i in zip(problem.labels, problem.index))
    return f"{index}: got {fmt(problem.got)}, expected {fmt(problem.expected)}"


def _close(got, exp, atol, rtol):
    """Elementwise: within tolerance of a finite expected value, or exactly the expected +-inf."""
    close = ((got - exp).abs() <= atol + rtol * exp.abs()) & torch.isfinite(exp)
    return close | (got == exp)


def matches(out, candidate, atol, rtol) -> bool:
    """True when ``out`` equals ``candidate`` within tolerance; NaN matches NaN, inf matches inf.

    Tuples compare element by element: every one must match.
    """
    if isinstance(candidate, tuple):
        return (isinstance(out, tuple) and len(out) == len(candidate)
                and all(matches(o, c, atol, rtol) for o, c in zip(out, candidate)))
    if candidate is None or not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(candidate.shape):
        return False
    got = out.detach().to("cpu", torch.float64)
    exp = candidate.detach().to("cpu", torch.float64)
    return bool((_close(got, exp, atol, rtol) | (torch.isnan(got) & torch.isnan(exp))).all())


@dataclass(frozen=True)
class Mistake:
    """One of the usual mistakes a check replays, and what a check tells of it when an answer matches.

    ``bug`` is how the check replays it: a name its float64 model switches on, keyword arguments of that
    model, or a function that gives the mistake's answer. ``cause`` is the mistake in words (step two),
    ``hint`` its fix (None: none of its own), and ``part`` the part it is made in, where one check covers
    several parts.
    """

    bug: object
    cause: str
    hint: str | None = None
    part: int | None = None


def first_cause(out, variants, atol, rtol):
    """The description (a :class:`Mistake`) of the first known mistake whose output ``out`` matches.

    ``variants`` holds (description, output) pairs; an output may be a function
    that computes it (called only if needed), or a tuple of tensors.
    """
    for description, candidate in variants:
        try:
            value = candidate() if callable(candidate) else candidate
        except Exception:  # a variant that cannot happen for these shapes
            continue
        if matches(out, value, 2 * atol, 2 * rtol):
            return description
    return None


def shape_problem(out, ref_shape, name="the output"):
    if not isinstance(out, torch.Tensor):
        return f"{name} should be a tensor, got {type(out).__name__}"
    if tuple(out.shape) != tuple(ref_shape):
        return f"{name} has shape {list(out.shape)}; expected {list(ref_shape)}"
    return None
