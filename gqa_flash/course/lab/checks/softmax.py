"""Notebook 02: the checks of online_softmax.py, one per part.

* Part 1, :func:`check_block_state`: the state (m, l) of one block, on rows
  that break an unsafe softmax (+-1000, wholly and partly masked rows);
* Part 2, :func:`check_merge_states`: merging two states, empty parts
  (m = -inf, l = 0) included;
* Part 3, :func:`check_online_softmax`: the streaming softmax, for block
  sizes from one column to wider than the row. When it fails and Part 1 or 2
  fails its own check, the verdict says to fix that part first.
"""

import torch

from gqa_flash.course import api, testing
from gqa_flash.course.lab.checks.cases import run_torch
from gqa_flash.course.lab.checks.common import (
    Mistake, Stop, Verdict, fail, first_cause, fmt, load, matches, prints_verdict, shape_problem, tol, what_of,
)
from gqa_flash.reference import reference_softmax

_STATE_TOL = dict(atol=1e-5, rtol=1e-5)  # m and l are compared in float32 against float64


def _state64(x):
    """(m, l) of the rows of ``x`` in float64, as block_state must compute them."""
    x = x.to(torch.float64)
    m = x.amax(dim=-1)
    m0 = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    return m, torch.exp(x - m0[..., None]).sum(dim=-1)


def _where_row(case_name, index, label, got, expected):
    idx = ", ".join(str(i) for i in index)
    return f"case \"{case_name}\": {label}[{idx}]: got {fmt(got)}, expected {fmt(expected)}"


def _state_mismatch(part, case_name, got_pair, ref_pair, cause_of, compare=None):
    """Compare (m, l) with the float64 (m, l); on the first wrong one, stop with a FAIL for ``part``.

    ``cause_of(label, got)`` says the likely cause of a wrong ``label`` ("m" or "l"): a text, or a pair
    (cause, hint); ``compare`` what to compare next when it knows none.
    """
    for label, got, ref in zip(("m", "l"), got_pair, ref_pair):
        problem = testing.mismatch(label, got, ref, labels=("row",) * ref.dim(), **_STATE_TOL)
        if problem is not None:
            cause = cause_of(label, got)
            cause, hint = cause if isinstance(cause, tuple) else (cause, None)
            raise Stop(fail("online_softmax", part, "does not match the float64 reference",
                            where=_where_row(case_name, problem.index, label, problem.got, problem.expected),
                            cause=cause, hint=hint, compare=compare))


def _pair(result, name, part):
    if not (isinstance(result, tuple) and len(result) == 2):
        raise Stop(fail("online_softmax", part, f"{name} must return the pair (m, l)"))
    return result


# --- Part 1 ------------------------------------------------------------------


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


def _block_state_cause(x, m_ref, l_ref):
    def cause(label, got):
        got64 = got.detach().to(torch.float64)
        if label == "l" and torch.isnan(got64).any() and torch.isneginf(m_ref[torch.isnan(got64)]).all():
            return ("a row that is all -inf gives NaN: its m is -inf and exp(-inf - (-inf)) is NaN; "
                    "subtract 0 where m is -inf (torch.where(torch.isneginf(m), 0, m))")
        if label == "l" and matches(got, torch.exp(x.double()).sum(-1), **_STATE_TOL):
            return ("not a safe softmax: subtract the row maximum before exp "
                    "(exp(1000) is inf, exp(-1000) is 0 in float32)")
        if label == "l" and not torch.isfinite(got64[torch.isfinite(l_ref)]).all():
            return "l overflowed or became NaN: compute exp(x - m), not exp(x)"
        if label == "m" and matches(got, x.double().amin(-1), **_STATE_TOL):
            return "m is the row minimum: it must be the maximum"
        return None

    return cause


@prints_verdict
def check_block_state():
    """online_softmax.py Part 1: the state (m, l) of one block."""
    mod = load("online_softmax")
    for name, x in _softmax_rows():
        m, l = _pair(run_torch("online_softmax", mod.block_state, x.clone(), part=1), "block_state", 1)
        m_ref, l_ref = _state64(x)
        for label, got, ref in (("m", m, m_ref), ("l", l, l_ref)):
            shape = shape_problem(got, ref.shape, label)
            if shape:
                raise Stop(fail("online_softmax", 1, shape, where=f"case \"{name}\"",
                                hint="reduce over the last dimension only (dim=-1)"))
        _state_mismatch(1, name, (m, l), (m_ref, l_ref), _block_state_cause(x, m_ref, l_ref),
                        compare="for the row named under where, its maximum and the sum of exp(x - m) over the "
                                "last dimension, by hand, with your m and l")
    return Verdict(True, what_of("online_softmax", 1),
                   "(m, l) match the float64 reference, huge and fully masked rows included")


# --- Part 2 ------------------------------------------------------------------


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
    m = torch.maximum(m_b, m_a)
    m0 = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    if how == "no_rescale":
        return m, l_a + l_b
    if how == "inverted":
        return m, l_a * torch.exp(m0 - m_a) + l_b * torch.exp(m0 - m_b)
    if how == "nan_empty":
        return m, l_a * torch.exp(m_a - m) + l_b * torch.exp(m_b - m)
    if how == "only_a":
        return m, l_a * torch.exp(m_a - m0) + l_b
    if how == "only_b":
        return m, l_a + l_b * torch.exp(m_b - m0)
    return m, l_a * torch.exp(m_a - m0) + l_b * torch.exp(m_b - m0)


_MERGE_MISTAKES = [  # each bug is the `how` of _merge64 that replays it
    Mistake("no_rescale", "the sums are added without rescaling: l equals l_a + l_b, but l_a was taken against m_a "
                          "and l_b against m_b, so their terms are on different scales",
            "bring each sum to the common max m before adding: l_x times exp(m_x - m), for x = a and b"),
    Mistake("inverted", "the rescale is inverted: l_a is multiplied by exp(m - m_a) (>= 1), which grows it",
            "exp(m_a - m) (<= 1) shrinks l_a to the new maximum"),
    Mistake("nan_empty", "two empty parts (m = -inf on both sides) give NaN: exp(-inf - (-inf)) is NaN",
            "subtract 0 where the new maximum is -inf"),
    Mistake("only_a", "only l_a is rescaled: l_b is added as it is, but it was taken against m_b, not against the "
                      "common max m", "bring both sums to m before adding: l_b times exp(m_b - m) too"),
    Mistake("only_b", "only l_b is rescaled: l_a is added as it is, but it was taken against m_a, not against the "
                      "common max m", "bring both sums to m before adding: l_a times exp(m_a - m) too"),
]
_MERGE_COMPARE = ("for the row named under where, each sum brought to the common max by hand (l_a times "
                  "exp(m_a - m), l_b times exp(m_b - m)) with what your code adds; then an empty side (m = -inf, "
                  "l = 0), which must add nothing")


@prints_verdict
def check_merge_states():
    """online_softmax.py Part 2: merging the states of two parts of the same rows."""
    load("online_softmax")
    for name, state in _merge_cases():
        m, l = _pair(run_torch("online_softmax", api.merge_softmax_states, *state, part=2), "merge_states", 2)

        def cause(label, got, state=state):
            if label == "m":
                return ("m is not the larger of the two maxima",
                        "m is the elementwise maximum of the two (torch.maximum), not either one alone")
            found = first_cause(got, [(mistake, _merge64(*state, mistake.bug)[1]) for mistake in _MERGE_MISTAKES],
                                **_STATE_TOL)
            return (found.cause, found.hint) if found else None

        _state_mismatch(2, name, (m, l), _merge64(*state), cause, compare=_MERGE_COMPARE)
    return Verdict(True, what_of("online_softmax", 2),
                   "merged states match the float64 reference, empty parts included")


# --- Part 3 ------------------------------------------------------------------


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


def _softmax_reading(x64, read):
    """The softmax that pass 2 computes from the state of the columns ``read`` (a [n] bool) alone."""
    m, l = _state64(x64[..., read])
    return torch.exp(x64 - m[..., None]) / l[..., None]


def _blockwise(x64, block):
    """(the max of the last block, the sum of every block's l each taken against its own block's max) of each
    row: what a first pass leaves when it replaces m by each block's, or adds the sums without rescaling."""
    n = x64.shape[-1]
    states = [_state64(x64[..., start:start + block]) for start in range(0, n, block)]
    return states[-1][0], sum(l for _, l in states)


def _normalised(x64, m, l):
    """Pass 2 with the state (m, l) it was given: exp(x - m) / l."""
    return torch.exp(x64 - m[..., None]) / l[..., None]


def _online_cause(out, x, block):
    """(part, cause, hint): Part 1 or 2 failing its own check, else the usual mistakes of the block loop."""
    for part, check in ((1, check_block_state), (2, check_merge_states)):
        verdict = check.verdict()
        if not verdict.ok:
            return part, f"{what_of('online_softmax', part)} fails its own check: {verdict.cause or verdict.message}", \
                verdict.hint or f"run Part {part}'s check and fix it first"
    x64, n = x.to(torch.float64), x.shape[-1]
    cols = torch.arange(n)
    tail = (n // block) * block if n % block else n - block
    m_row, l_row = _state64(x64)
    m_last, l_unscaled = _blockwise(x64, block)
    # Each bug is a function that replays the mistake's softmax in float64.
    mistakes = [Mistake(lambda: _softmax_reading(x64, cols >= tail),
                        "only the last block's state is used: the running (m, l) is replaced by each block's, not "
                        "merged with it", "merge every block's state into the running (m, l) with merge_states"),
                Mistake(lambda: _normalised(x64, m_row, l_unscaled),
                        "the blocks' states are merged without the rescale: l ends as the sum of every block's l, "
                        "each taken against its own block's max, not against the row's max",
                        "fold each block in with merge_states (Part 2), which brings both sums to the common max "
                        "before adding them"),
                Mistake(lambda: _normalised(x64, m_last, l_unscaled),
                        "the blocks' sums are added without the rescale, and m is the last block's max: the running "
                        "(m, l) is not merged, only its sums are added",
                        "fold each block in with merge_states (Part 2): it keeps the larger max and rescales both "
                        "sums"),
                Mistake(lambda: _normalised(x64, m_last, l_row),
                        "pass 2 normalises with the last block's max, not the row's: l was summed against the row's "
                        "max m, and exp(x - m) must use that same m",
                        "in pass 2 use the running m that pass 1 ends with, the max of the whole row, not a variable "
                        "left over from the loop")]
    if tail > 0 and n % block:
        mistakes.append(Mistake(lambda: _softmax_reading(x64, cols < tail),
                                "the last, shorter block is skipped: its columns are never read",
                                "loop with range(0, n, block_size): the last block may be shorter"))
    for short in range(1, min(block, n - 1) + 1):
        unread = f"the last column ({n - 1})" if short == 1 else f"the last {short} columns ({n - short}-{n - 1})"
        verb = "is" if short == 1 else "are"
        mistakes.append(Mistake(lambda short=short: _softmax_reading(x64, cols < n - short),
                                f"{unread} of the row {verb} never read: the first pass stops before the row's end",
                                "the loop must start a block at every multiple of block_size below n, the row's "
                                "length"))
    if block > 1:
        one_short = (cols % block != block - 1) | (cols >= n // block * block)  # the columns such a walk reads
        mistakes.append(Mistake(lambda: _softmax_reading(x64, one_short),
                                f"each block misses its last column (columns {block - 1}, {2 * block - 1}, ... are "
                                "never read): a block's slice is one column short",
                                "a block is the block_size columns from its start: x32[..., start:start + block_size]"))
    found = first_cause(out, [(mistake, mistake.bug) for mistake in mistakes], **tol(x.dtype))
    return (3, found.cause, found.hint) if found else (3, None, None)


_ONLINE_COMPARE = ("for the row named under where, the (m, l) your first pass ends with (print them) with "
                   "block_state of the whole row at once: if they agree, the second pass is wrong; if not, print "
                   "(m, l) after each block and find the first block where they go wrong")


@prints_verdict
def check_online_softmax():
    """online_softmax.py Part 3: the streaming softmax, block after block."""
    load("online_softmax")
    for name, x, block in _online_cases():
        out = run_torch("online_softmax", api.online_softmax, x.clone(), block, part=3)
        ref = reference_softmax(x)
        shape = shape_problem(out, ref.shape)
        if shape:
            raise Stop(fail("online_softmax", 3, shape, where=f"case \"{name}\""))
        if out.dtype != x.dtype:
            raise Stop(fail("online_softmax", 3, f"returns {out.dtype} for {x.dtype} input",
                            where=f"case \"{name}\"", hint="return probs.to(x.dtype)"))
        problem = testing.mismatch("softmax", out, ref, labels=("row", "column"), **tol(x.dtype))
        if problem is None:
            continue
        part, cause, hint = _online_cause(out, x, block)
        raise Stop(fail("online_softmax", part, "does not match the float64 reference",
                        where=f"case \"{name}\": row {problem.index[0]}, column {problem.index[1]}: "
                              f"got {fmt(problem.got)}, expected {fmt(problem.expected)}",
                        cause=cause, hint=hint, compare=_ONLINE_COMPARE))
    return Verdict(True, what_of("online_softmax", 3),
                   "matches the float64 softmax for every block size, masked blocks and fp16 included")
