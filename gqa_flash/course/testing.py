"""What the graded tests, the notebook checks and the grader share: inputs and verdicts.

* :func:`random_qkv` draws fresh inputs in any of several memory layouts, so a
  kernel that assumes contiguous tensors is caught.
* :func:`mismatch` compares an output with the float64 reference and, when
  they differ, says where first (batch, head, row, column), by how much, and
  how much of the output is wrong, in one line a student can act on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from gqa_flash.course import runtime
from gqa_flash.course.kernel_guard import PART_OF, KernelOnlyViolation, kernel_only  # noqa: F401 (importable from here)

# Tolerances against the float64 reference: |out - ref| <= atol + rtol * |ref|.
# fp32 runs with fp32 products (no tf32); fp16 and bf16 round each input and
# the probabilities p before p @ V, which dominates their error.
TOLERANCES = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=5e-3, rtol=5e-3),
    torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
}
# The LSE is float32 whatever the input dtype; its scores come from exact products.
LSE_TOLERANCE = dict(atol=1e-3, rtol=1e-4)

# Gradients against float64 autograd, as a relative error in the Frobenius
# norm: fp32 products are exact to ~1e-7; fp16 rounds P and dS before each
# product. The absolute floor (per entry, RMS) is for gradients that are
# exactly zero, as with a single key (N = 1).
GRAD_TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2}
GRAD_ABS_FLOOR = {torch.float32: 1e-6, torch.float16: 1e-4}


def gradient_error(got, ref, dtype):
    """(error, bound): the gradient ``got`` is right when error <= bound."""
    err = (got.detach().double().cpu() - ref).norm().item()
    return err, GRAD_TOLERANCE[dtype] * ref.norm().item() + GRAD_ABS_FLOOR[dtype] * ref.numel() ** 0.5


LAYOUTS = ("contiguous", "bnhd", "strided")
"""Memory layouts of the inputs:
contiguous  torch's default for [B, H, N, D];
bnhd        allocated as [B, N, H, D] (the layout of a QKV projection) and
            transposed: heads and sequence swap strides;
strided     every dimension strided: a view that takes every other batch,
            head, row and column of a larger tensor (last-dim stride 2).
One more layout is not in LAYOUTS (the shape matrix runs those), but any input
may take it:
padded      the first D columns of a [B, H, N, D + 16] tensor whose other 16
            columns hold NaN: rows D + 16 apart, and a kernel that reads past
            the head dim (an unmasked padded column) returns NaN."""

PADDED_COLUMNS = 16


def fresh_seed() -> int:
    """A new seed every run (fresh inputs), unless GQA_FLASH_SEED pins one."""
    pinned = os.environ.get("GQA_FLASH_SEED")
    return int(pinned) if pinned else int.from_bytes(os.urandom(4), "little")


# Each layout: the shape to allocate, and the view of it that is [B, H, N, D].
_LAYOUT_VIEWS = {
    "contiguous": (lambda b, h, n, d: (b, h, n, d), lambda t: t),
    "bnhd": (lambda b, h, n, d: (b, n, h, d), lambda t: t.transpose(1, 2)),
    "strided": (lambda b, h, n, d: (2 * b, 2 * h, 2 * n, 2 * d), lambda t: t[::2, ::2, ::2, ::2]),
    "padded": (lambda b, h, n, d: (b, h, n, d + PADDED_COLUMNS), lambda t: t[..., :-PADDED_COLUMNS]),
}


def _make(shape, dtype, layout, gen, device, shift_heads=False):
    if layout not in _LAYOUT_VIEWS:
        raise ValueError(f"layout must be one of {(*LAYOUTS, 'padded')}; got {layout!r}")
    alloc_shape, view = _LAYOUT_VIEWS[layout]
    storage = torch.randn(alloc_shape(*shape), generator=gen, dtype=torch.float32)
    if layout == "padded":  # drawn whole, then poisoned: the view's values do not depend on the layout
        storage[..., -PADDED_COLUMNS:] = float("nan")
    if shift_heads:  # in place, through the view, so the storage keeps the layout
        view(storage).add_(torch.arange(shape[1], dtype=torch.float32).view(1, -1, 1, 1))
    return view(storage.to(device=device, dtype=dtype))


def random_qkv(
    batch=1,
    n_q_heads=4,
    n_kv_heads=2,
    seq_len=64,
    head_dim=32,
    dtype=torch.float32,
    layout="contiguous",
    seed=0,
    device=None,
    v_layout=None,
):
    """Fresh ``q [B, Hq, N, D]`` and ``k, v [B, Hkv, N, D]`` with standard-normal entries.

    Every KV head also gets its own offset (head j's values are shifted by j),
    so reading the wrong KV head gives visibly wrong outputs. ``v_layout``
    (default: ``layout``) gives V a layout of its own, so a kernel that reads V
    with K's strides is caught.
    """
    device = device or runtime.DEVICE
    gen = torch.Generator().manual_seed(seed)
    q = _make((batch, n_q_heads, seq_len, head_dim), dtype, layout, gen, device)
    k = _make((batch, n_kv_heads, seq_len, head_dim), dtype, layout, gen, device)
    v = _make((batch, n_kv_heads, seq_len, head_dim), dtype, v_layout or layout, gen, device, shift_heads=True)
    return q, k, v


TABLE_LAYOUTS = ("contiguous", "transposed", "strided")
"""Memory layouts of a block table [B, max_pages]: contiguous; transposed (stored
[max_pages, B] and seen through .t(), so a row's entries are B apart); strided
(every other column of a [B, 2 * max_pages] table whose other columns are poison)."""


def poison_page(n_blocks: int) -> int:
    """A page index far past a pool of ``n_blocks`` pages: what a block table holds where no page is."""
    return n_blocks + 1000


def decode_inputs(seed=0, batch=2, n_q_heads=4, n_kv_heads=2, n_new=1, head_dim=32, seqlens=(1, 40), capacity=48,
                  page_size=None, dtype=torch.float32, layout="contiguous", device=None, q_layout=None,
                  table_layout="contiguous"):
    """Fresh ``(q, k_cache, v_cache, cache_seqlens, block_table)`` for ``flash_decode``.

    ``q`` is ``[B, Hq, n_new, D]`` in ``q_layout`` (default ``layout``; ``"padded"``: NaN past the head
    dim). Contiguous cache (``page_size`` None): ``[B, Hkv, capacity, D]`` in ``layout`` (one of LAYOUTS),
    block_table None. Paged: a pool of ``[num_blocks, page_size, Hkv, D]`` with three spare pages, each
    sequence given ``capacity / page_size`` pages of it, shuffled; the table in ``table_layout`` (one of
    TABLE_LAYOUTS). Every position at or past a sequence's length (the spare pages too) holds NaN, so a
    kernel that reads one returns NaN, and every table entry past a sequence's last page holds
    :func:`poison_page`, a page far outside the pool, so a kernel that follows one reads outside the
    cache. V of KV head j is shifted by j, so reading the wrong KV head gives visibly wrong outputs.
    """
    device = device or runtime.DEVICE
    if table_layout not in TABLE_LAYOUTS:
        raise ValueError(f"table_layout must be one of {TABLE_LAYOUTS}; got {table_layout!r}")
    gen = torch.Generator().manual_seed(seed)
    q = _make((batch, n_q_heads, n_new, head_dim), dtype, q_layout or layout, gen, device)
    table = None
    if page_size is None:
        k = _make((batch, n_kv_heads, capacity, head_dim), dtype, layout, gen, device)
        v = _make((batch, n_kv_heads, capacity, head_dim), dtype, layout, gen, device, shift_heads=True)
        for b, n in enumerate(seqlens):
            k[b, :, n:], v[b, :, n:] = float("nan"), float("nan")
    else:
        shift = torch.arange(n_kv_heads, dtype=torch.float32)
        max_pages = -(-capacity // page_size)
        n_blocks = batch * max_pages + 3
        k = torch.full((n_blocks, page_size, n_kv_heads, head_dim), float("nan"))
        v = torch.full_like(k, float("nan"))
        table = torch.randperm(n_blocks, generator=gen)[: batch * max_pages].view(batch, max_pages).to(torch.int32)
        for b, n in enumerate(seqlens):
            positions = torch.arange(n)
            pages, slots = table[b, positions // page_size].long(), positions % page_size
            k[pages, slots] = torch.randn((n, n_kv_heads, head_dim), generator=gen)
            v[pages, slots] = torch.randn((n, n_kv_heads, head_dim), generator=gen) + shift.view(1, -1, 1)
            table[b, -(-n // page_size):] = poison_page(n_blocks)
        k, v = k.to(device, dtype), v.to(device, dtype)
        table = _table_in_layout(table.to(device), table_layout, poison_page(n_blocks))
    return q, k, v, torch.tensor(seqlens, dtype=torch.int32, device=device), table


def _table_in_layout(table, table_layout, poison):
    """The same [B, max_pages] entries, stored as ``table_layout`` says."""
    if table_layout == "transposed":
        return table.t().contiguous().t()
    if table_layout == "strided":
        wide = torch.full((table.shape[0], 2 * table.shape[1]), poison, dtype=table.dtype, device=table.device)
        wide[:, ::2] = table
        return wide[:, ::2]
    return table


def peaked_qkv(seed=0, block=16, seq_len=None, batch=1, n_q_heads=4, n_kv_heads=2, head_dim=16, device=None):
    """Inputs whose attention is sharply peaked: the first ``block`` keys score
    about +100 against every query and all later keys about -100 (the default
    scale, head_dim 16), plus random noise. A softmax that lets its running max
    fall to a later block's max rescales by exp(200): float32 overflows.
    ``seq_len`` defaults to 2.5 blocks (a ragged tail)."""
    device = device or runtime.DEVICE
    seq_len = seq_len or block * 5 // 2
    gen = torch.Generator().manual_seed(seed)
    direction = torch.ones(head_dim) * (25.0 / head_dim**0.5) ** 0.5  # |direction|^2 * scale = 25
    sign = torch.where(torch.arange(seq_len) < block, 2.0, -2.0).view(1, 1, -1, 1)

    def noise(heads):
        return 0.5 * torch.randn(batch, heads, seq_len, head_dim, generator=gen)

    q = 2.0 * direction + noise(n_q_heads)
    k = sign * direction + noise(n_kv_heads)
    v = torch.randn(batch, n_kv_heads, seq_len, head_dim, generator=gen)
    v += torch.arange(n_kv_heads, dtype=torch.float32).view(1, -1, 1, 1)
    return tuple(t.to(device) for t in (q, k, v))


@dataclass
class Mismatch:
    """Where an output first differs from the reference, and by how much."""

    name: str  # the output's: "O", "the LSE", "dQ"...
    index: tuple
    got: float
    expected: float
    max_error: float
    wrong: int
    total: int
    labels: tuple = ("batch", "head", "row", "col")
    all_nan: bool = False  # every entry NaN: on the CPU, an output nothing was written to
    nans: int = 0  # entries that are NaN (their error counts as infinite)

    def __str__(self) -> str:
        where = ", ".join(f"{label} {i}" for label, i in zip(self.labels, self.index))
        text = (
            f"{self.name}: first wrong at {where}: got {self.got:.6g}, expected {self.expected:.6g} "
            f"({self.wrong} of {self.total} entries wrong"
            + (f", {self.nans} of them NaN" if 0 < self.nans < self.total else "")
            + f", max |error| {self.max_error:.3g})"
        )
        if self.all_nan:
            text += ("; every entry is NaN: was anything written? (in the interpreter outputs start as NaN, "
                     "so a placeholder left in place, or a store that never runs, shows this way) Or was 0 "
                     "divided by 0 in every row? A row whose every key is masked out (with one token, a causal "
                     "mask that hides a row's own key) sums no weight")
        return text


def mismatch(name, out, ref, *, atol, rtol, labels=("batch", "head", "row", "col")):
    """None when ``out`` matches ``ref`` within tolerance, else a :class:`Mismatch`.

    NaN or inf in ``out`` always counts as wrong. Shape and dtype problems are
    reported as a Mismatch with an empty index.
    """
    if type(out) is not torch.Tensor:  # a subclass could compute its values later, outside the graded call
        return _shape_problem(name, f"expected a plain torch.Tensor, got {type(out).__name__}")
    if tuple(out.shape) != tuple(ref.shape):
        return _shape_problem(name, f"expected shape {list(ref.shape)}, got {list(out.shape)}")
    got = out.detach().to("cpu", torch.float64)
    exp = ref.detach().to("cpu", torch.float64)
    err = (got - exp).abs()
    # NaN compares False, so NaN is bad; equal infinities (a masked -inf) match.
    # An infinite expectation is met only by the same infinity (|x - inf| <= rtol * inf would pass anything).
    bad = ~(((err <= atol + rtol * exp.abs()) & torch.isfinite(exp)) | (got == exp))
    if not bad.any():
        return None
    first = tuple(int(i) for i in bad.nonzero()[0])
    finite_err = torch.where(torch.isfinite(err), err, torch.full_like(err, float("inf")))
    return Mismatch(
        name=name,
        index=first,
        got=float(got[first]),
        expected=float(exp[first]),
        max_error=float(finite_err.max()),
        wrong=int(bad.sum()),
        total=bad.numel(),
        labels=labels,
        all_nan=bool(torch.isnan(got).all()),
        nans=int(torch.isnan(got).sum()),
    )


class _ShapeProblem(Mismatch):
    def __init__(self, name, message):
        super().__init__(name, (), float("nan"), float("nan"), float("inf"), 1, 1)
        self.message = message

    def __str__(self):
        return f"{self.name}: {self.message}"


def _shape_problem(name, message):
    return _ShapeProblem(name, message)


def assert_matches(name, out, ref, dtype, context=""):
    """Assert ``out`` matches the float64 ``ref`` within ``dtype``'s tolerance."""
    problem = mismatch(name, out, ref, **TOLERANCES[dtype])
    if problem is not None:
        raise AssertionError(f"{problem}{'; ' + context if context else ''}")


def assert_lse_matches(lse, ref_lse, context=""):
    if isinstance(lse, torch.Tensor) and lse.dtype != torch.float32:
        raise AssertionError(f"LSE must be float32, got {str(lse.dtype).replace('torch.', '')}")
    problem = mismatch("LSE", lse, ref_lse, labels=("batch", "head", "row"), **LSE_TOLERANCE)
    if problem is not None:
        raise AssertionError(f"{problem}{'; ' + context if context else ''}")


def assert_attention_matches(result, q, k, v, *, causal, sm_scale, return_lse, context=""):
    """The attention tests' verdict: O, and the LSE when asked for, against the float64 reference."""
    from gqa_flash.reference import reference_attention

    ref, ref_lse = reference_attention(q, k, v, causal=causal, sm_scale=sm_scale)
    if return_lse:
        assert isinstance(result, tuple) and len(result) == 2, "with return_lse=True, return (O, LSE)"
        out, lse = result
    else:
        out = result
    # O first: a wrong scale, mask or head mapping shows in O, and the message should not send the student to
    # the epilogue's LSE; an O that is right beside a wrong LSE is the LSE's own bug.
    assert isinstance(out, torch.Tensor) and out.dtype == q.dtype, f"O must be a tensor of q's dtype {q.dtype}"
    assert_matches("O", out, ref, q.dtype, context)
    if return_lse:
        assert_lse_matches(lse, ref_lse, context)


def assert_output_matches(lse, result, q, k, v, *, causal, sm_scale, context):
    """The graded tests' verdict on a call made with return_lse=True: on O alone, or with ``lse`` on O and then
    the LSE. O is the output every call uses; the LSE is of use only beside a right O (the backward pass and
    merges take both), so a right O beside a wrong LSE loses the LSE's tests alone."""
    assert isinstance(result, tuple) and len(result) == 2, "with return_lse=True, return (O, LSE)"
    assert_attention_matches(result if lse else result[0], q, k, v, causal=causal, sm_scale=sm_scale,
                             return_lse=lse, context=context)


def case_context(seed, q, k, causal, *details) -> str:
    """How a failing case names itself: seed, shape, KV heads, causal, dtype and the test's own details."""
    dtype = str(q.dtype).replace("torch.", "")
    return ", ".join([f"seed {seed}", f"shape {list(q.shape)} with {k.shape[1]} KV heads", f"causal={causal}",
                      dtype, *details])




def folder(root: Path, name: str, files: dict[str, str]) -> Path:
    """A new folder ``root/name`` holding ``files`` (relative path -> text), for tests that hand one in."""
    path = root / name
    path.mkdir()
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    return path
