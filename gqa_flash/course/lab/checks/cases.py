"""The inputs of the attention checks, and the GQA head mapping with its usual mistakes.

A :class:`Case` is one small input built to isolate an idea (GQA 8:2, a
ragged length, fp16, a strided layout...) and names the part it isolates, so
that a wrong answer there points at that part. :func:`kv_index` is the map
from query head to KV head, right or wrong in one of the ways students get it
wrong; the float64 replays of naive.py's mistakes use it (tiled.py's answers are stored: replays.py).
:func:`attention64` is attention with any set of hidden keys, for mistakes that hide the wrong ones.
:func:`run_torch` runs the student's PyTorch code as :func:`run_student` does, and names the mistake
behind the usual crashes (Python's ``max`` on tensors; a check's own ``diagnose`` for the others).
"""

import dataclasses
import linecache
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from gqa_flash.course import impl, testing
from gqa_flash.course.lab.checks.common import Stop, fmt, matches, part_code, run_student

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@dataclass
class Case:
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


def kv_of(h: int, case: Case) -> int:
    """The KV head that query head ``h`` reads: consecutive query heads share one."""
    return h // (case.n_q_heads // case.n_kv_heads)


def kv_index(n_q_heads, n_kv_heads, how="div"):
    """Every query head's KV head: right ("div"), or one of the usual mistakes."""
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


def head_mapping(out, q, k, v, causal, sm_scale, atol, rtol):
    """The KV head each query head of ``out`` read: a list with one KV head per query head, found by comparing
    each head of ``out`` with attention over each KV head in float64, or None when some head matches no KV head
    (the mistake is not the mapping alone)."""
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(q.shape):
        return None
    q, k, v = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
    got = out.detach().to("cpu", torch.float64)
    n = q.shape[2]
    hide = torch.ones(n, n, dtype=torch.bool).triu(1) if causal else torch.zeros(n, n, dtype=torch.bool)
    mapping = []
    for h in range(q.shape[1]):
        for j in range(k.shape[1]):
            s = (q[:, h] @ k[:, j].transpose(-1, -2) * sm_scale).masked_fill(hide, float("-inf"))
            if matches(got[:, h], torch.softmax(s, dim=-1) @ v[:, j], 2 * atol, 2 * rtol):
                mapping.append(j)
                break
        else:
            return None
    return mapping


def _heads(mapping) -> str:
    return ", ".join(str(j) for j in mapping)


# How a part's code may copy the KV heads so that they come out dealt in turn, and what it does.
_TILING = [
    (re.compile(r"\.repeat\s*\("), ".repeat", ".repeat copies the whole stack of KV heads, one stack after another"),
    (re.compile(r"\btile\s*\("), "tile", "tile copies the whole stack of KV heads, one stack after another"),
    (re.compile(r"\bcat\s*\("), "cat", "concatenating copies of the stack of KV heads puts one whole stack after "
                                     "another"),
    (re.compile(r"\.expand\s*\("), ".expand", "a new dimension expanded in front of the KV heads' dimension, then "
                                            "merged with it, puts one whole stack after another"),
]


def gqa_cause(module: str, part: int, mapping, n_q_heads: int, n_kv_heads: int):
    """(cause, hint) of a wrong head mapping found by :func:`head_mapping`, in words: which KV heads the query
    heads read, against which they should, and the likely mistake, named only by what the part's code holds
    (a ``%`` is blamed only where the code has one). None when the mapping is right."""
    group = n_q_heads // n_kv_heads
    right = [h // group for h in range(n_q_heads)]
    if mapping is None or list(mapping) == right:
        return None
    code = part_code(module, part)
    read = (f"query heads 0-{n_q_heads - 1} read KV heads {_heads(mapping)}; with {n_q_heads} query heads on "
            f"{n_kv_heads} KV heads they must read {_heads(right)} (each group of {group} consecutive query heads "
            "shares one KV head)")
    hint = (f"query head h reads KV head h // group, with group = n_q_heads // n_kv_heads ({group} here): print "
            "the KV head your code gives each query head and compare")
    if list(mapping) == [h % n_kv_heads for h in range(n_q_heads)]:
        if "%" in code:
            return f"% instead of //: {read}; h % n_kv_heads deals the query heads out to the KV heads in turn", hint
        tiling = next(((name, does) for pattern, name, does in _TILING if pattern.search(code)), None)
        if tiling:
            name, does = tiling
            return (f"the KV heads are copied in the wrong order: {read}. {does[0].upper() + does[1:]} "
                    f"({_heads(range(n_kv_heads))}, {_heads(range(n_kv_heads))}, ...), which deals the query heads "
                    "out to the KV heads in turn",
                    f"each KV head must be repeated in place, {group} times in a row, before the next "
                    f"(repeat_interleave does that, where {name} does not), or pick the KV heads with a tensor of "
                    "indices, one per query head")
        return f"the query heads are dealt out to the KV heads in turn: {read}", hint
    if all(j == 0 for j in mapping):
        return f"every query head reads KV head 0: {read}; the group size comes out as {n_q_heads} or more", hint
    sizes = [g for g in range(1, n_q_heads + 1) if list(mapping) == [h // g for h in range(n_q_heads)]]
    if sizes:
        wrong = "n_kv_heads" if sizes[0] == n_kv_heads else str(sizes[0])
        return (f"the group size is {wrong}, not n_q_heads // n_kv_heads = {group}: {read}", hint)
    return f"the head mapping is wrong: {read}", hint


def where_attention(problem, case: Case, with_tile=False) -> str:
    """Where an attention output is first wrong: the case, the heads, the row and column (and tile)."""
    b, h, i, c = problem.index
    text = f"case \"{case.name}\": batch {b}, query head {h} (should read KV head {kv_of(h, case)}), "
    if with_tile:
        t = i // case.block_m
        text += f"query tile {t} (rows {t * case.block_m}-{min((t + 1) * case.block_m, case.seq_len) - 1}), "
    return text + f"row {i}, column {c}: got {fmt(problem.got)}, expected {fmt(problem.expected)}"


def attention64(q, k, v, sm_scale, hide=None):
    """Attention in float64 (GQA heads mapped), with -inf where the [N, N] bool table ``hide`` is True."""
    q, k, v = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
    idx = kv_index(q.shape[1], k.shape[1])
    s = (q @ k[:, idx].transpose(-1, -2)) * sm_scale
    if hide is not None:
        s = s.masked_fill(hide, float("-inf"))
    return torch.softmax(s, dim=-1) @ v[:, idx]


# --- crashes of PyTorch code, named ---------------------------------------------------------------


def student_frame(exc: BaseException, module: str):
    """(locals, source line) of the deepest frame of ``module``'s file in ``exc``'s traceback, or (None, "")."""
    path = Path(getattr(impl.load(module), "__file__", "") or impl.path_of(module)).resolve()
    found, tb = (None, ""), exc.__traceback__
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename).resolve() == path:
            found = (tb.tb_frame.f_locals, linecache.getline(str(path), tb.tb_lineno).strip())
        tb = tb.tb_next
    return found


def builtin_on_tensors(exc: BaseException, line: str):
    """Python's ``max`` or ``min`` of two tensors: the fields that name it, or None."""
    names = re.findall(r"(?<![\w.])(max|min)\s*\(", line)
    if not names or "Boolean value of Tensor" not in str(exc):
        return None
    name = names[0]
    return dict(cause=f"Python's built-in {name} on tensors: {name}(a, b) compares a with b as a whole and needs "
                      "one True or False, which a tensor of many values does not have",
                hint=f"use torch.{name}imum(a, b), the elementwise {name}imum of two tensors "
                     f"(torch.a{name}(x, dim=...) reduces one tensor along a dimension)")


def run_torch(module: str, fn, *args, part=None, diagnose=None, **kwargs):
    """:func:`run_student`, with the mistake behind a crash named where it is a usual one.

    ``diagnose(exc, frame_locals, line)`` may return the fields of the verdict to change (``what``,
    ``message``, ``cause``, ``hint``...) for a crash it recognises, else None.
    """
    try:
        return run_student(module, fn, *args, part=part, **kwargs)
    except Stop as stop:
        exc = stop.__context__  # run_student raises its verdict from the exception, `from None`
        if exc is None or not stop.verdict.message.startswith("your code raised"):
            raise
        local, line = student_frame(exc, module)
        found = builtin_on_tensors(exc, line) or (diagnose and local is not None and diagnose(exc, local, line))
        if not found:
            raise
        raise Stop(dataclasses.replace(stop.verdict, **found)) from None
