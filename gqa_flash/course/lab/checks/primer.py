"""Notebook 03b, the Triton primer: one check per puzzle (practice, nothing here is graded).

Each puzzle is a kernel of about five lines that you write in a notebook cell,
and its check takes that kernel as its argument: ``checks.check_primer_where(
causal_mask)``. The check launches it on tiny inputs (in the interpreter on a
CPU, compiled on a GPU) and compares what it wrote with PyTorch's answer.

Every output lives at the start of a larger buffer whose tail holds a
sentinel, so a store past the end is seen (and harmless) instead of spoiling
memory, and an entry your kernel never wrote is told from a wrong one. A kernel
that writes nothing at all (the stub's ``pass``) is "not written yet". A load
past the end leaves no trace in OUT when the store is masked, so puzzle 3 also
looks at what the kernel reads (``primer_launch.reads_within``). The launching
and the judging live in primer_launch.py; this module holds the puzzles.

A failure is told in two steps, as every check does (common.py): first what
is wrong and where (which entries of OUT, which line of your kernel), then,
when the same failure is checked again or on ``checks.explain()``, the likely
cause and a fix. The causes come from replaying each puzzle's classic mistakes
in PyTorch and seeing which one your output matches; a crash is read for the
usual ones (shapes that do not broadcast, tl.dot's two rules); and a call of
Python's own ``max``, ``min`` or ``sum`` in a kernel is named at once, because
on blocks they do not do what they say.
"""

from __future__ import annotations

import torch
import triton

from gqa_flash.course.lab.checks import primer_launch as run
from gqa_flash.course.lab.checks.common import Verdict

# --- the puzzles --------------------------------------------------------------------------------------------


@run.prints
def check_primer_program_ids(kernel):
    """Puzzle 1: on a (3, 4) grid, program (i, j) writes 10 * i + j to OUT[i, j] of a 3 x 4 OUT."""
    out, buffer = run.output((3, 4), torch.int32)
    run.launch(1, kernel, (3, 4), out, 4)
    programs = [(i, j) for i in range(3) for j in range(4)]

    def stores(address, value):
        return run.Writes((3, 4), [(address(i, j), value(i, j)) for i, j in programs], torch.int32)

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
    run.judge(1, buffer, right, (3, 4), variants, dtype=torch.int32,
           past_end=("a program's address lands past OUT's 12 entries: with i = tl.program_id(0) (0 to 2) and "
                     "j = tl.program_id(1) (0 to 3), OUT[i, j] is i * 4 + j entries past OUT",
                     "the address of OUT[i, j] is OUT + i * n_cols + j"))
    return Verdict(True, run.what_of(1), "every program of the (3, 4) grid wrote 10 * i + j to its own OUT[i, j]")


_OUTER_SHAPES = ("x and y are 1-D blocks of 4 and 8 values: side by side, their shapes do not fit. An [M, N] "
                 "tile comes from a column ([M, 1]) and a row ([1, N]); the pointers need the same shape as the "
                 "values they store",
                 "x[:, None] is [M, 1] and y[None, :] is [1, N]; x[:, None] + y[None, :] broadcasts to [M, N]. "
                 "Build the pointers the same way: OUT + i[:, None] * N + j[None, :]")


@run.prints
def check_primer_outer_sum(kernel):
    """Puzzle 2: one program writes OUT[i, j] = x[i] + y[j], with 4 x's and 8 y's (OUT is 4 x 8)."""
    M, N = 4, 8
    x, y = 100.0 * torch.arange(M), torch.arange(N, dtype=torch.float32)
    out, buffer = run.output((M, N))
    run.launch(2, kernel, (1,), run.on_device(x), run.on_device(y), out, M=M, N=N, crashes={"shape": _OUTER_SHAPES})
    i, j = torch.arange(M)[:, None], torch.arange(N)[None, :]
    value = x[:, None] + y[None, :]
    variants = [
        (("row i starts i * N entries into OUT (a row holds N values), not i * M: the rows overlap",
          "the address of OUT[i, j] is OUT + i * N + j: i[:, None] * N + j[None, :]"),
         run.Writes((M, N), [(i * M + j, value)])),
        (("OUT is stored column by column: the address of OUT[i, j] is i * N + j, and yours is i + j * M",
          "i[:, None] * N + j[None, :]"), run.Writes((M, N), [(i + j * M, value)])),
    ]
    run.judge(2, buffer, run.buffer_of(value), (M, N), variants, past_end=_OUTER_SHAPES)
    return Verdict(True, run.what_of(2), "OUT[i, j] = x[i] + y[j] for all 4 x 8 entries: a column plus a row")


@run.prints
def check_primer_masked(kernel):
    """Puzzle 3: OUT[k] = 2 * X[k] for the n = 10 entries, by 3 programs of BLOCK = 4 (the last one ragged)."""
    n, block = 10, 4
    x_buffer = torch.full((n + run.GUARD,), -1.0)  # what lies past the end of X: -1
    x_buffer[:n] = torch.arange(1, n + 1)
    out, buffer = run.output((n,))
    run.launch(3, kernel, (triton.cdiv(n, block),), run.on_device(x_buffer)[:n], out, n, BLOCK=block)
    lanes = torch.arange(block)
    doubled = 2 * x_buffer

    def programs(offsets, mask=lambda offs: offs < n):
        stores = []
        for pid in range(triton.cdiv(n, block)):
            offs = offsets(pid)
            keep = mask(offs)
            stores.append((offs[keep], doubled[offs[keep]]))
        return run.Writes((n,), stores)

    unmasked = ("the last program owns indices 8 to 11, and 10 and 11 are past the end: its store is not masked",
                "mask = offs < n, and pass it to tl.store (and to tl.load: a read past the end can fault on a GPU)")
    variants = [
        (unmasked, programs(lambda p: p * block + lanes, lambda offs: offs >= 0)),
        (unmasked, run.Writes((n,), [(torch.arange(12), torch.cat([doubled[:n], torch.zeros(2)]))])),
        (("the mask is off by one: index n = 10 is already past the end (the entries are 0 to n - 1)",
          "mask = offs < n"), programs(lambda p: p * block + lanes, lambda offs: offs <= n)),
        (("every program wrote the same first block: the offsets do not depend on the program id",
          "program p owns the BLOCK entries from p * BLOCK on: offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)"),
         programs(lambda p: lanes)),
        (("the programs' blocks overlap: program p starts at p, not at p * BLOCK",
          "offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)"), programs(lambda p: p + lanes)),
    ]
    run.judge(3, buffer, run.buffer_of(doubled[:n]), (n,), variants, past_end=unmasked)
    # OUT is right; the store's mask may still hide a load that read past X's end (its values were never stored)
    run.reads_within(3, kernel, (triton.cdiv(n, block),), (run.on_device(x_buffer)[:n], out, n), dict(BLOCK=block),
                  block)
    return Verdict(True, run.what_of(3), "3 programs doubled the 10 entries, and the last one read and wrote nothing "
                                      "past the end")


_SOFTMAX_SHAPES = ("a row's max (or sum) is a [M] vector, one value per row; against the [M, BLOCK_N] tile it "
                   "must stand as a column, [M, 1], and a reduction along axis 0 gives one value per column instead",
                   "tl.max(x, 1) reduces along axis 1 (along each row); tl.max(x, 1)[:, None] is a column")


@run.prints
def check_primer_softmax(kernel):
    """Puzzle 4: one program writes the softmax of each row of a 4 x 6 X, read as a 4 x 8 block (2 columns padding)."""
    M, n_cols, block_n = 4, 6, 8
    gen = torch.Generator().manual_seed(4)
    for case, x in (("", torch.randn(M, n_cols, generator=gen)),
                    (" (on rows of large scores, near 100)", 100 + torch.randn(M, n_cols, generator=gen))):
        out, buffer = run.output((M, n_cols))
        run.launch(4, kernel, (1,), run.on_device(x), out, n_cols, M=M, BLOCK_N=block_n, case=case,
                crashes={"shape": _SOFTMAX_SHAPES})
        x64 = x.double()

        def softmax(pad=float("-inf"), max_axis=1, sum_axis=1, shift=True):
            """A row softmax done the way a kernel might do it, on the padded [M, BLOCK_N] tile (float64)."""
            tile = torch.cat([x64, torch.full((M, block_n - n_cols), pad, dtype=torch.float64)], 1)
            p = torch.exp(tile - tile.amax(max_axis, keepdim=True)) if shift else torch.exp(tile.float()).double()
            return run.buffer_of((p / p.sum(sum_axis, keepdim=True))[:, :n_cols])

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
        run.judge(4, buffer, run.buffer_of(x64.softmax(1)), (M, n_cols), variants, case=case, tol=(1e-5, 1e-4),
               past_end=("the store is not masked: the padding columns 6 and 7 of a row are the next row's first "
                         "entries (and past the end of the last row)", "mask the store as you masked the load"))
    return Verdict(True, run.what_of(4), "every row of OUT is the softmax of its row of X, the padding ignored, "
                                      "and large scores do not overflow")


_DOT = {
    "dot_k": ("B is stored [N, K], one key per row; tl.dot(a, b) multiplies [M, K] by [K, N], so its inner "
              "dimensions must agree: b's tile has to be turned on its side first",
              "tl.dot(a, tl.trans(b)): tl.trans turns an [N, K] tile into [K, N]"),
    "shape": ("the product you store must be [M, N] = [16, 32]: elementwise a * b of [M, K] and [N, K] does not "
              "fit, and tl.dot(b, ...) with b first gives [N, M]",
              "tl.dot(a, tl.trans(b)) is [M, K] times [K, N]"),
}


@run.prints
def check_primer_dot(kernel):
    """Puzzle 5: OUT = A @ B^T, with A [16, 16] and B [32, 16] in fp16, OUT [16, 32] in fp32."""
    M, N, K = 16, 32, 16
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(M, K, generator=gen).half()
    b = torch.randn(N, K, generator=gen).half()
    out, buffer = run.output((M, N))
    run.launch(5, kernel, (1,), run.on_device(a), run.on_device(b), out, M=M, N=N, K=K, crashes=_DOT)
    a64, b64 = a.double(), b.double()
    variants = [
        (("B was read as if it were stored [K, N]: it is [N, K], and row n of B is key n",
          "load B's tile as [N, K] (n[:, None] * K + k[None, :]), then tl.trans"),
         run.buffer_of(a64 @ b64.flatten().view(K, N))),
    ]
    run.judge(5, buffer, run.buffer_of(a64 @ b64.T), (M, N), variants, tol=(1e-3, 1e-3),
           past_end=("the store's addresses run past OUT: it is [M, N], so OUT[m, n] is m * N + n entries in",
                     "OUT + m[:, None] * N + n[None, :]"))
    return Verdict(True, run.what_of(5), "OUT = A @ B^T: fp16 tiles, products summed in fp32")


@run.prints
def check_primer_where(kernel):
    """Puzzle 6: OUT = S where the key's position <= the query's, else -inf; S's 8 rows are queries ROW0.., its
    8 columns keys COL0.."""
    B = 8
    gen = torch.Generator().manual_seed(6)
    for row0, col0 in ((0, 0), (4, 0), (0, 4), (16, 8)):
        s = torch.randn(B, B, generator=gen)
        out, buffer = run.output((B, B))
        case = f" on the tile of queries {row0}-{row0 + B - 1} against keys {col0}-{col0 + B - 1}"
        run.launch(6, kernel, (1,), run.on_device(s), out, row0, col0, B=B, case=case)
        q, k = torch.arange(B)[:, None], torch.arange(B)[None, :]
        s64 = s.double()

        def masked(visible, fill=float("-inf")):
            return run.buffer_of(torch.where(visible, s64, torch.tensor(fill, dtype=torch.float64)))

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
        run.judge(6, buffer, masked(~future), (B, B), variants, case=case)
    return Verdict(True, run.what_of(6), "every future key is -inf and every other score kept, on the diagonal tile "
                                      "and off it, whichever tile starts first")


@run.prints
def check_primer_maximum(kernel):
    """Puzzle 7: OUT[i] = the larger of M_OLD[i] and the max of row i of S (8 rows of 16)."""
    BM, BN = 8, 16
    gen = torch.Generator().manual_seed(7)
    s = torch.randn(BM, BN, generator=gen)
    tile_max = s.amax(1)
    m_old = tile_max + torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.0, 0.0])
    m_old[6] = float("-inf")  # the first tile of a row: no old maximum yet
    out, buffer = run.output((BM,))
    run.launch(7, kernel, (1,), run.on_device(m_old), run.on_device(s), out, BM=BM, BN=BN,
            crashes={"shape": ("m_old is [BM], one value per row, and s is [BM, BN]: they do not compare "
                               "element by element until s is reduced to one value per row (along axis 1)",
                               "tl.maximum(m, tl.max(s, 1))")})
    m64, s64 = m_old.double(), s.double()
    variants = [
        (("the old maximum is dropped: OUT holds the tile's row max alone, so a row whose old maximum was larger "
          "loses it", "OUT[i] = tl.maximum(old, tile's row max)"), run.buffer_of(s64.amax(1))),
        (("the old maximum alone: the tile's scores never enter", "tl.maximum(m, tl.max(s, 1))"), run.buffer_of(m64)),
        (("tl.max(s) with no axis is the maximum of the whole tile, one number: each row needs its own, "
          "tl.max(s, 1)", "tl.maximum(m, tl.max(s, 1))"), run.buffer_of(torch.maximum(m64, s64.max()))),
    ]
    run.judge(7, buffer, run.buffer_of(torch.maximum(m64, s64.amax(1))), (BM,), variants)
    return Verdict(True, run.what_of(7), "OUT is the running maximum: the old one where it is larger, the tile's "
                                      "where that is, and the tile's in the row that had none (-inf)")


def _p_off_the_grid(gen, shape):
    """Probabilities 0.4 of an fp16 step above an fp16 number: rounding them to fp16 shows."""
    p16 = torch.rand(shape, generator=gen).half().float()
    step = torch.ldexp(torch.ones_like(p16), torch.frexp(p16).exponent - 11).clamp_min(2.0 ** -24)
    return p16 + 0.4 * step


@run.prints
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
        out, buffer = run.output((BM, D))
        run.launch(8, kernel, (1,), run.on_device(p), run.on_device(v), out, BM=BM, BN=BN, D=D, case=case,
                   crashes=crashes)
        p64, v64 = p.double(), v.double()
        variants = [
            (("V was brought up to fp32 instead of P down to fp16: the product runs in fp32, at a fraction of the "
              "tensor cores' fp16 speed, and is not the product the kernel is specified to compute",
              "p.to(v.dtype)"), run.buffer_of(p64 @ v64)),
        ]
        run.judge(8, buffer, run.buffer_of(p.to(dtype).double() @ v64), (BM, D),
                  variants if dtype == torch.float16 else (), tol=tol, case=case)
    return Verdict(True, run.what_of(8), "OUT = P @ V with P in V's dtype, for fp16 and fp32 V")


PRIMER_CHECKS = (check_primer_program_ids, check_primer_outer_sum, check_primer_masked, check_primer_softmax,
                 check_primer_dot, check_primer_where, check_primer_maximum, check_primer_cast)
