"""Notebook 04: the checks of forward.py's Parts 1-3, where a program is and what it walks.

* Part 1, :func:`check_program_ids`: every program of a launch grid reports
  its query tile, batch, query head and KV head;
* Part 2, :func:`check_load_tile`: one tile of a strided tensor, with ragged
  rows and padded columns, from the right batch and head; then, in the
  interpreter, two mistakes that only a GPU would show: masked lanes that
  read NaN when the load has no ``other``, and the addresses of a tile whose
  batch or head offset is past 2^31 elements (recorded, never touched);
* Part 3, :func:`check_key_loop`: which key blocks each query tile visits,
  and which of them go through the mask (your Parts 4 and 5 are replaced by
  recorders, so only the loop is judged; your Part 2 loads the tiles), with
  K and V in different layouts.

Each launches a probe (probes.py) and compares what came back with what the
kernel needs; on a wrong answer the verdict names the likely mistake in words.
"""

import torch
import triton

from gqa_flash.lab.checks.probes import (
    addresses_recorded, dev, forward_parts, in_interpreter, launch, masked_lanes_poisoned,
)
from gqa_flash.lab.checks.verdict import Stop, Verdict, fail, prints_verdict, what

# --- Part 1 ------------------------------------------------------------------

# (query tiles, batch, query heads, KV heads): GQA, odd groups, MHA, MQA
_GRIDS = [(3, 2, 8, 2), (2, 3, 6, 3), (1, 1, 32, 8), (2, 2, 4, 4), (2, 1, 4, 1)]
_IDS = ("query tile", "batch", "query head", "KV head")


def _ids_cause(got, want, n_q, n_kv):
    """The likely mistake behind a wrong set of ids, from the whole grid's answers."""
    if (got == 0).all():
        return "the placeholder is still there: every program thinks it is the first tile of head 0"
    g_t, g_b, g_h, g_kv = got.unbind(-1)
    w_t, w_b, w_h, w_kv = want.unbind(-1)
    if torch.equal(g_t, w_b) or torch.equal(g_b, w_t):
        return "the axes are swapped: axis 0 of the grid counts query tiles, axis 1 counts (batch, head) pairs"
    if torch.equal(g_b, w_h) and torch.equal(g_h, w_b):
        return ("batch and head are swapped: on axis 1 the head varies fastest, so the head is the remainder "
                "after dividing by the number of query heads, and the batch is the quotient")
    if not torch.equal(g_b, w_b) or not torch.equal(g_h, w_h):
        return "the batch or the query head is wrong: axis 1 holds batch * N_Q_HEADS + head"
    if torch.equal(g_kv, w_h % n_kv):
        return ("the KV head is the query head modulo N_KV_HEADS: that deals the heads out in turn, but a group "
                "is made of *consecutive* query heads, so divide by the group size")
    if torch.equal(g_kv, w_h // n_kv):
        return "divided by N_KV_HEADS: divide by the group size, the number of query heads per KV head"
    if torch.equal(g_kv, w_h):
        return "the KV head is the query head itself: right only for MHA, where each group has one head"
    if bool(((g_kv < 0) | (g_kv >= n_kv)).any()):
        return f"a KV head outside 0..{n_kv - 1}"
    return None


@prints_verdict
def check_program_ids():
    """forward.py Part 1, alone: every program of five launch grids reports who it is."""
    fwd, probes = forward_parts()
    for tiles, batch, n_q, n_kv in _GRIDS:
        out = torch.full((tiles, batch * n_q, 4), -1, dtype=torch.int32, device=dev())
        launch(1, probes["program_ids"], (tiles, batch * n_q), out, n_q, n_kv)
        got = out.cpu().long()
        t, bh = torch.meshgrid(torch.arange(tiles), torch.arange(batch * n_q), indexing="ij")
        want = torch.stack([t, bh // n_q, bh % n_q, (bh % n_q) // (n_q // n_kv)], dim=-1)
        if torch.equal(got, want):
            continue
        i, j = (got != want).any(-1).nonzero()[0].tolist()
        wrong = [f"{name} {int(got[i, j, k])} (expected {int(want[i, j, k])})"
                 for k, name in enumerate(_IDS) if got[i, j, k] != want[i, j, k]]
        return fail("forward", 1, "a program does not know which work is its own",
                    where=f"grid ({tiles}, {batch} * {n_q}) for batch {batch}, {n_q} query heads on {n_kv} KV heads: "
                          f"program ({i}, {j}) got {', '.join(wrong)}",
                    cause=_ids_cause(got, want, n_q, n_kv))
    return Verdict(True, what("forward", 1), f"every program finds its tile, batch, query head and KV head in "
                   f"{len(_GRIDS)} grids (GQA 8:2, 6:3, 32:8; MHA; MQA)")


# --- Part 2 ------------------------------------------------------------------

_SENTINEL = 777.0  # what lies outside the tensor's rows and columns: a load there shows it
_LOAD_BLOCK = dict(BLOCK_R=16, BLOCK_C=32)


def _strided_tensor(batch, heads, n, d, layout, g):
    """A [batch, heads, n, d] view into a larger buffer full of the sentinel, in one of three layouts.

    Rows past n and columns past d exist in the buffer (so a missing mask reads
    the sentinel, not another program's memory) but are not part of the tensor.
    """
    rows, cols = n + 32, 2 * d + 64
    if layout == "bnhd":  # a [B, N, H, D] tensor seen as [B, H, N, D]
        buf = torch.full((batch, rows, heads, cols), _SENTINEL)
        view = buf.permute(0, 2, 1, 3)[:, :, :n, :d]
    else:  # "strided": every dimension strided, the head dim too
        buf = torch.full((batch, heads, rows, cols), _SENTINEL)
        view = buf[:, :, :n, : 2 * d : 2]
    view.copy_(torch.randn(batch, heads, n, d, generator=g))
    return buf, view


@prints_verdict
def check_load_tile():
    """forward.py Part 2, alone: one tile of a strided tensor with ragged rows and padded columns."""
    fwd, probes = forward_parts()
    g = torch.Generator().manual_seed(51)
    br, bc = _LOAD_BLOCK["BLOCK_R"], _LOAD_BLOCK["BLOCK_C"]
    for layout, (batch, heads, n, d), (b, h), row0 in (("strided", (2, 3, 21, 20), (1, 2), 16),
                                                       ("bnhd", (2, 2, 40, 32), (1, 0), 0),
                                                       ("bnhd", (3, 2, 37, 24), (2, 1), 32)):
        buf, x = _strided_tensor(batch, heads, n, d, layout, g)
        name = (f"{layout} tensor [{batch}, {heads}, {n}, {d}], batch {b}, head {h}, rows {row0}..{row0 + br - 1}, "
                f"columns 0..{bc - 1}")
        buf = buf.to(dev())
        x_dev = _view_like(buf, x)
        out = torch.full((br, bc), float("nan"), device=dev())
        launch(2, probes["load_tile"], (1,), x_dev, out, b, h, *x.stride(), n, d, row0, **_LOAD_BLOCK)
        got = out.cpu()
        want = torch.zeros(br, bc)
        real = x[b, h, row0:row0 + br, :bc]
        want[: real.shape[0], : real.shape[1]] = real
        if torch.equal(got, want):
            continue
        if (got == 0).all():
            cause = "the placeholder is still there: the tile comes back all zeros"
        elif (got[max(0, n - row0):] == _SENTINEL).any():
            cause = (f"rows past n_rows are loaded: rows {n}.. are not part of the tensor (the ragged last tile); "
                     "mask them, and let them read 0")
        elif (got[:, d:] == _SENTINEL).any():
            cause = (f"columns past n_cols are loaded: columns {d}.. are the head dim's padding to a power of two; "
                     "mask them, and let them read 0")
        elif (got[max(0, n - row0):] != 0).any() or (got[:, d:] != 0).any():
            cause = "masked entries must read 0 (the load's `other`): they take part in every dot product"
        else:
            cause = _which_slice(got, x, row0, br, bc, b, h)
        i, j = (got != want).nonzero()[0].tolist()
        return fail("forward", 2, "loads the wrong numbers",
                    where=f"case \"{name}\": tile row {i} (sequence row {row0 + i}), column {j}: "
                          f"got {float(got[i, j]):.4g}, expected {float(want[i, j]):.4g}",
                    cause=cause)
    problem = in_interpreter(f"{__name__}:load_tile_gpu_problem")
    if problem is not None:  # right on small tensors: the whole kernel may still run (kernel.py)
        return fail("forward", 2, **problem, extra=dict(safe_on_small_tensors=True))
    return Verdict(True, what("forward", 2), "the right tile of the right batch and head, in strided and "
                   "[B, N, H, D] layouts; ragged rows and padded columns read 0")


def _problem(verdict) -> dict:
    """A failed verdict as the JSON-able problem an interpreter-only probe returns."""
    return dict(message=verdict.message, where=verdict.where, cause=verdict.cause)


def load_tile_masked_lanes_problem():
    """Part 2 in the interpreter, where a masked lane with no ``other`` reads NaN for the length of the probe
    (a GPU leaves such a lane undefined): None when the ragged rows and padded columns read 0, else the
    problem (message, where, cause)."""
    fwd, probes = forward_parts()
    g = torch.Generator().manual_seed(52)
    br, bc = _LOAD_BLOCK["BLOCK_R"], _LOAD_BLOCK["BLOCK_C"]
    (batch, heads, n, d), (b, h), row0 = (2, 3, 21, 20), (1, 2), 16
    buf, x = _strided_tensor(batch, heads, n, d, "strided", g)
    out = torch.full((br, bc), 0.5)
    try:
        with masked_lanes_poisoned():
            launch(2, probes["load_tile"], (1,), x, out, b, h, *x.stride(), n, d, row0, **_LOAD_BLOCK)
    except Stop as stop:
        return _problem(stop.verdict)
    want = torch.zeros(br, bc)
    want[: n - row0, :d] = x[b, h, row0:, :bc]
    if torch.equal(out, want):
        return None
    i, j = (out != want).nonzero()[0].tolist()
    if not torch.equal(out[: n - row0, :d], want[: n - row0, :d]):
        return dict(message="loads the wrong numbers",
                    where=f"strided tensor [{batch}, {heads}, {n}, {d}], batch {b}, head {h}, rows {row0}..{n - 1}",
                    cause="the placeholder is still there: the tile comes back all zeros" if (out == 0).all() else
                          "the tile's own entries are wrong: see the check of Part 2 (checks.check_load_tile())")
    if torch.isnan(out).any() and torch.equal(out.nan_to_num(0.0), want):
        cause = ("the masked load has no `other`: the interpreter happens to read 0 in the masked lanes, but a "
                 "GPU leaves them undefined, whatever its registers held (NaN, here). Give tl.load other=0.0, "
                 "or set those lanes to 0 yourself with tl.where")
    else:
        cause = "masked entries must read 0 (the load's `other`): they take part in every dot product"
    return dict(message="masked lanes do not read 0 on a GPU",
                where=f"strided tensor [{batch}, {heads}, {n}, {d}], rows {row0}..{row0 + br - 1} (rows {n}.. and "
                      f"columns {d}.. are masked), a masked load with no `other` reading NaN: tile row {i}, "
                      f"column {j} got {float(out[i, j]):.4g}, expected {float(want[i, j]):.4g}",
                cause=cause)


def load_tile_gpu_problem():
    """Part 2's two interpreter-only probes in turn (one child Python on a GPU machine): the first problem, or None."""
    return load_tile_masked_lanes_problem() or load_tile_offsets_problem()


# A stride that fits in int32 (so Triton passes it as a 32-bit integer), and 2 or 3 of it that do not.
_BIG_STRIDE = 2**30 + 2**20


def wrapped_int32(x: int) -> int:
    """``x`` as int32 arithmetic leaves it: wrapped around into -2^31..2^31-1."""
    return (x + 2**31) % 2**32 - 2**31


def offset_cases():
    """(which offset, batch, head, batch stride, head stride): each case puts one offset past 2^31."""
    return [("batch", 2, 0, _BIG_STRIDE, 4096), ("head", 0, 3, 4096, _BIG_STRIDE)]


def address_set(ptr: int, size: int, offsets) -> set:
    """The byte addresses of the elements at ``offsets`` past ``ptr`` (the 64-bit arithmetic of a GPU)."""
    return {(ptr + size * int(o)) % 2**64 for o in offsets}


def recorded(seen, kind) -> set:
    """The addresses of the ``kind`` lanes ("load" or "store") that were not masked, from addresses_recorded."""
    return {int(a) for k, addresses, mask in seen if k == kind for a in addresses[mask].tolist()}


def overflow_cause(which, stride, index, fix, name="the tile", kind="load"):
    """Why the ``which`` ("batch" or "head") offset ``index * stride`` went wrong, and ``fix``, the expression
    that mends it."""
    moved = "read from" if kind == "load" else "written to"
    return (f"the {which} offset is computed in 32-bit integers: {index} * {stride} = {index * stride} is past "
            f"2^31 and wraps around to {wrapped_int32(index * stride)}, so on a GPU {name} would be {moved} "
            f"another part of memory (or fault) once a tensor holds 2^31 elements. Convert the index to int64 "
            f"before it meets its stride: {fix}")


def load_tile_offsets_problem():
    """Part 2 in the interpreter, with its loads recorded, not made: None when the tile's addresses are the
    64-bit ones at batch and head offsets past 2^31 elements, else the problem (message, where, cause)."""
    fwd, probes = forward_parts()
    br, bc = _LOAD_BLOCK["BLOCK_R"], _LOAD_BLOCK["BLOCK_C"]
    n, d, row0, s_row = 21, 20, 16, 64
    x = torch.zeros(1)  # never read: the recorder touches no memory
    out = torch.zeros(br, bc)
    for which, b, h, s_b, s_h in offset_cases():
        try:
            with addresses_recorded() as seen:
                launch(2, probes["load_tile"], (1,), x, out, b, h, s_b, s_h, s_row, 1, n, d, row0, **_LOAD_BLOCK)
        except Stop as stop:
            return _problem(stop.verdict)
        rows, cols = torch.meshgrid(torch.arange(row0, n), torch.arange(d), indexing="ij")
        offsets = (b * s_b + h * s_h + rows * s_row + cols).flatten().tolist()
        got, want = recorded(seen, "load"), address_set(x.data_ptr(), 4, offsets)
        if got == want:
            continue
        if not got:
            return dict(message="loads nothing", where=f"batch {b}, head {h}, rows {row0}..{n - 1}",
                        cause="the placeholder is still there: load the tile with tl.load")
        index, stride = (b, s_b) if which == "batch" else (h, s_h)
        wrapped = [o - index * stride + wrapped_int32(index * stride) for o in offsets]
        cause = (overflow_cause(which, stride, index, f"{which}_idx.to(tl.int64) * stride_{which[0]}")
                 if got == address_set(x.data_ptr(), 4, wrapped) else
                 f"the addresses are wrong once the {which} offset passes 2^31: compute the batch and head "
                 "offsets in int64 (index.to(tl.int64) * stride)")
        return dict(message="forms wrong addresses in a tensor past 2^31 elements",
                    where=f"batch {b}, head {h} of a tensor with batch stride {s_b} and head stride {s_h} "
                          f"(elements), rows {row0}..{n - 1}: {len(want - got)} of {len(want)} elements read at "
                          "the wrong address",
                    cause=cause)
    return None


def _view_like(buf, x):
    """``x``'s view (same offset and strides) of ``buf``, which may live on another device."""
    return buf.as_strided(x.shape, x.stride(), x.storage_offset())


def _which_slice(got, x, row0, br, bc, b, h):
    """Where the tile came from, if not from [b, h]: another batch or head, or swapped strides."""
    batch, heads, n, d = x.shape
    rows = min(br, n - row0)
    cols = min(bc, d)
    for bb in range(batch):
        for hh in range(heads):
            if (bb, hh) != (b, h) and torch.equal(got[:rows, :cols], x[bb, hh, row0:row0 + rows, :cols]):
                return (f"the tile of batch {bb}, head {hh} came back instead of batch {b}, head {h}: check the "
                        "batch and head offsets (each is an index times its own stride)")
    return ("the numbers come from the wrong addresses: element [b, h, r, c] lies b, h, r and c strides past X, "
            "each with its own stride (the row stride for rows, the column stride for columns)")


# --- Part 3 ------------------------------------------------------------------

_LOOP = dict(BLOCK_M=32, BLOCK_N=16, HEAD_DIM=128)
_LOOP_SEQ_LEN = 72  # 3 query tiles, the last one ragged; 5 key blocks, the last one ragged


def _expected_visits(n, bm, bn, causal, tile):
    """(unmasked, masked) visits of each key 0..n-1 by query ``tile``, and the key blocks it loads."""
    unmasked = torch.zeros(n)
    masked = torch.zeros(n)
    if causal:
        start, end = tile * bm, min((tile + 1) * bm, n)
    else:
        start, end = (n // bn) * bn, n
    unmasked[:start] = 1
    masked[start:end] = 1
    return unmasked, masked, start // bn + triton.cdiv(end - start, bn)


def _loop_cause(unmasked, masked, blocks, want_u, want_m, want_blocks, tile, n, bm, bn, causal):
    if blocks == 0:
        return "the placeholder is still there: no key block is ever visited"
    start = tile * bm if causal else (n // bn) * bn
    end = min((tile + 1) * bm, n) if causal else n
    if (unmasked + masked > 1).any():
        j = int((unmasked + masked > 1).nonzero()[0])
        return f"key {j} is visited twice: the two phases overlap (each key goes through exactly one)"
    if causal and blocks > want_blocks:
        return (f"it loads {blocks} key blocks where {want_blocks} are needed: the blocks after the diagonal "
                f"(keys {end} and up) hold only future keys; phase 2 must stop at the end of the tile's own rows")
    if causal and (unmasked[start:end] > 0).any():
        j = start + int((unmasked[start:end] > 0).nonzero()[0])
        return (f"diagonal key {j} is visited without the mask: the unmasked phase must stop where this tile's "
                f"rows begin (key {start}), or the future leaks in")
    if (masked[:start] > 0).any():
        j = int((masked[:start] > 0).nonzero()[0])
        return (f"key {j} goes through the mask although every row of the tile sees it: phase 1 must cover "
                f"keys 0..{start - 1} (the mask costs work where it is not needed)")
    if (unmasked + masked < (want_u + want_m)).any():
        j = int((unmasked + masked < want_u + want_m).nonzero()[0])
        return (f"key {j} is never visited: " + ("phase 1 ends too early or phase 2 starts too late"
                                                 if j < start else "phase 2 ends too early"))
    if not causal and blocks > want_blocks:
        return f"it loads {blocks} key blocks where {want_blocks} are needed: keys past SEQ_LEN are not there"
    return None


def _unit_values(batch, heads, n, d, b, h, layout):
    """V with key j's value the unit vector e_j in [b, h] (zero elsewhere), in its own layout:
    "bnhd" (a [B, N, H, D] tensor seen as [B, H, N, D]) or "contiguous"."""
    if layout == "bnhd":
        v = torch.zeros(batch, n, heads, d).transpose(1, 2)
    else:
        v = torch.zeros(batch, heads, n, d)
    v[b, h, torch.arange(n), torch.arange(n)] = 1.0
    return v


def _walk_problem(probes, k, v, causal, b, h):
    """The first query tile that walks the wrong key blocks, as (tile, what it did, cause), or None."""
    bm, bn, d = _LOOP["BLOCK_M"], _LOOP["BLOCK_N"], _LOOP["HEAD_DIM"]
    n = k.shape[2]
    tiles = triton.cdiv(n, bm)
    acc = torch.full((tiles * bm, d), float("nan"), device=dev())
    blocks = torch.full((tiles * bm,), float("nan"), device=dev())
    launch(3, probes["key_loop"], (tiles,), k, v, acc, blocks, n, b, h, *k.stride(), *v.stride(),
           CAUSAL=causal, **_LOOP)
    acc, blocks = acc.cpu(), blocks.cpu()
    for tile in range(tiles):
        row = tile * bm  # every row of a tile sees the same blocks: read its first row
        counts, got_blocks = acc[row, :n], blocks[row]
        if not torch.isfinite(counts).all() or not torch.isfinite(got_blocks):
            return tile, None, "return acc, l_i and m_i as the updates (Part 4) leave them"
        masked, unmasked = torch.div(counts, 1000, rounding_mode="floor"), counts.remainder(1000)
        want_u, want_m, want_blocks = _expected_visits(n, bm, bn, causal, tile)
        if torch.equal(unmasked, want_u) and torch.equal(masked, want_m) and int(got_blocks) == want_blocks:
            continue
        did = (f"query tile {tile} (rows {row}..{min(row + bm, n) - 1}) visited {int(got_blocks)} key blocks, "
               f"expected {want_blocks}")
        return tile, did, _loop_cause(unmasked, masked, int(got_blocks), want_u, want_m, want_blocks, tile, n, bm,
                                      bn, causal)
    return None


@prints_verdict
def check_key_loop():
    """forward.py Part 3: which key blocks each query tile visits, and which go through the mask.

    K is contiguous and V a [B, N, H, D] tensor seen as [B, H, N, D]: each has strides of its own."""
    fwd, probes = forward_parts()
    bm, bn, d = _LOOP["BLOCK_M"], _LOOP["BLOCK_N"], _LOOP["HEAD_DIM"]
    n = _LOOP_SEQ_LEN
    g = torch.Generator().manual_seed(61)
    batch, heads, b, h = 2, 2, 1, 1
    k = torch.randn(batch, heads, n, d, generator=g).to(dev())
    v = _unit_values(batch, heads, n, d, b, h, "bnhd").to(dev())  # .to keeps the strides
    for causal in (True, False):
        name = (f"{'causal' if causal else 'no causal mask'}, SEQ_LEN {n}, BLOCK_M {bm}, BLOCK_N {bn}, K contiguous, "
                "V in the [B, N, H, D] layout")
        problem = _walk_problem(probes, k, v, causal, b, h)
        if problem is None:
            continue
        tile, did, cause = problem
        like_k = _unit_values(batch, heads, n, d, b, h, "contiguous").to(dev())
        if _walk_problem(probes, k, like_k, causal, b, h) is None:
            return fail("forward", 3, "reads V at the wrong addresses",
                        where=f"case \"{name}\": query tile {tile}; with V laid out as K is, the walk is right",
                        cause="V is loaded with K's strides: V has strides of its own (stride_vb, stride_vh, "
                              "stride_vn, stride_vd), and here they differ from K's")
        if did is None:
            return fail("forward", 3, "the key loop does not return the state it was given",
                        where=f"case \"{name}\": query tile {tile}", cause=cause)
        return fail("forward", 3, "walks the wrong key blocks", where=f"case \"{name}\": {did}",
                    cause=cause, hint="this check loads tiles with your Part 2: make its check pass first")
    return Verdict(True, what("forward", 3), "each query tile visits its key blocks once: the ones before the "
                   "diagonal unmasked, the diagonal masked, none after it; without the causal mask every full "
                   "block unmasked and the ragged last one masked")

