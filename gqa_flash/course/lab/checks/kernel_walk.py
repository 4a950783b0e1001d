"""Notebook 04: the checks of forward.py's Parts 1-3, where a program is and what it walks.

* Part 1, :func:`check_program_ids`: every program of a launch grid reports
  its query tile, batch, query head and KV head;
* Part 2, :func:`check_load_tile`: one tile of a strided tensor, with ragged
  rows and padded columns, from the right batch and head; then, in the
  interpreter, two mistakes that only a GPU would show: masked lanes that
  read NaN when the load has no ``other``, and the addresses of a tile whose
  batch or head offset is past 2^31 elements (recorded, never touched);
* Part 3, :func:`check_key_loop`: which key blocks each query tile visits,
  and which of them go through the mask, then the scores it computes (your
  Parts 4 and 5 are replaced by recorders, so only the loop is judged; your
  Part 2 loads the tiles), with K and V in different layouts.

Each launches a probe (probes.py) and compares what came back with what the
kernel needs; on a wrong answer the verdict names the likely mistake in words.
"""

import torch
import triton

from gqa_flash.course import interpreter, testing
from gqa_flash.course.lab.checks.common import Mistake, Stop, Verdict, at, fail, matches, prints_verdict, what_of
from gqa_flash.course.lab.checks.probes import (
    addresses_recorded, dev, forward_parts, launch, masked_lanes_poisoned,
)

# --- Part 1 ------------------------------------------------------------------

# (query tiles, batch, query heads, KV heads): GQA, odd groups, MHA, MQA
_GRIDS = [(3, 2, 8, 2), (2, 3, 6, 3), (1, 1, 32, 8), (2, 2, 4, 4), (2, 1, 4, 1)]
_IDS = ("query tile", "batch", "query head", "KV head")


def _ids_cause(got, want, n_q, n_kv):
    """(cause, hint): the likely mistake behind a wrong set of ids, from the whole grid's answers."""
    if (got == 0).all():
        return ("the placeholder is still there: every program thinks it is the first tile of head 0",
                "read this program's place in the grid, on both axes")
    g_t, g_b, g_h, g_kv = got.unbind(-1)
    w_t, w_b, w_h, w_kv = want.unbind(-1)
    if torch.equal(g_t, w_b) or torch.equal(g_b, w_t):
        return ("the grid's axes are swapped",
                "axis 0 of the grid counts query tiles, axis 1 counts (batch, head) pairs")
    if torch.equal(g_b, w_h) and torch.equal(g_h, w_b):
        return ("batch and head are swapped: on axis 1 the head varies fastest",
                "the head is the remainder after dividing by the number of query heads, the batch the quotient")
    if not torch.equal(g_b, w_b) or not torch.equal(g_h, w_h):
        return "the batch or the query head is wrong", "axis 1 holds batch * N_Q_HEADS + head"
    if torch.equal(g_kv, w_h % n_kv):
        return ("the KV head is the query head modulo N_KV_HEADS: that deals the heads out in turn, but a group "
                "is made of *consecutive* query heads", "divide by the group size")
    if torch.equal(g_kv, w_h // n_kv):
        return ("the query head is divided by N_KV_HEADS, not by the group size",
                "the group size is the number of query heads per KV head")
    if n_kv > 1 and (g_kv == 0).all():
        return ("every query head reads KV head 0: the group size comes out as 0 (the division the wrong way "
                "round) or the KV head is never computed", "the group size is N_Q_HEADS // N_KV_HEADS")
    if torch.equal(g_kv, w_h):
        return ("the KV head is the query head itself: right only for MHA, where each group has one head",
                "a group of consecutive query heads shares one KV head")
    if bool(((g_kv < 0) | (g_kv >= n_kv)).any()):
        return f"a KV head outside 0..{n_kv - 1}", None
    return None, None


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
                    **dict(zip(("cause", "hint"), _ids_cause(got, want, n_q, n_kv))))
    return Verdict(True, what_of("forward", 1), f"every program finds its tile, batch, query head and KV head in "
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


def _sentinel_leaks(got, n_real, d):
    """{"rows": (i, j), "columns": (i, j)}: the tile's first sentinel read in a row past the tensor's (its first
    ``n_real`` rows are real) in a real column, and in a column past ``d`` in a real row. A mask on the rows alone
    still zeroes the columns past d, and the other way round: which part reads it tells which mask is missing."""
    n_real, found = max(0, n_real), {}
    for which, part, (di, dj) in (("rows", got[n_real:, :d], (n_real, 0)), ("columns", got[:n_real, d:], (0, d))):
        hits = (part == _SENTINEL).nonzero()
        if len(hits):
            found[which] = (int(hits[0, 0]) + di, int(hits[0, 1]) + dj)
    return found


def _unmasked_cause(leaks, n, d):
    """(cause, hint) for a tile that reads past the tensor's rows, its columns, or both (``_sentinel_leaks``)."""
    rows, cols = f"rows {n}.. (the ragged last tile)", f"columns {d}.. (the head dim's padding to a power of two)"
    if len(leaks) == 2:
        return (f"the load has no mask at all: neither the rows nor the columns are masked, so {rows} and {cols} "
                "are both loaded; they are not part of the tensor", "mask the load: rows < n_rows and columns < "
                "n_cols, broadcast into one 2-D mask (&), with other=0.0 so that the masked entries read 0")
    missing, masked, loaded, bound = ("rows", "columns", rows, "n_rows") if "rows" in leaks else ("columns", "rows",
                                                                                                   cols, "n_cols")
    return (f"{missing} past {bound} are loaded: the {masked} are masked but the {missing} are not, so {loaded} are "
            f"loaded; they are not part of the tensor", f"mask the {missing} too: {missing} < {bound}, combined (&) "
            f"with the {masked}' mask, so that they read 0")


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
        x_dev = _view_like(buf.to(dev()), x)
        out = torch.full((br, bc), float("nan"), device=dev())
        launch(2, probes["load_tile"], (1,), x_dev, out, b, h, *x.stride(), n, d, row0, **_LOAD_BLOCK)
        got = out.cpu()
        want = torch.zeros(br, bc)
        real = x[b, h, row0:row0 + br, :bc]
        want[: real.shape[0], : real.shape[1]] = real
        if torch.equal(got, want):
            continue
        at = [(got != want).nonzero()[0].tolist()]  # the entries "where" shows: those the cause is about
        leaks = _sentinel_leaks(got, n - row0, d)
        if (got == 0).all():
            cause, hint = "the placeholder is still there: the tile comes back all zeros", "load the tile"
        elif leaks:
            cause, hint = _unmasked_cause(leaks, n, d)
            at = list(leaks.values())
        elif (got[max(0, n - row0):] != 0).any() or (got[:, d:] != 0).any():
            cause, hint = ("the masked entries do not read 0, and they take part in every dot product",
                           "a masked load reads its `other` in the masked entries")
        else:
            cause, hint = _which_slice(got, x, row0, br, bc, b, h)
        return fail("forward", 2, "loads the wrong numbers", cause=cause, hint=hint,
                    where=f"case \"{name}\": " + "; ".join(
                        f"tile row {i} (sequence row {row0 + i}), column {j}: got {float(got[i, j]):.4g}, "
                        f"expected {float(want[i, j]):.4g}" for i, j in at))
    problem = interpreter.in_interpreter(f"{__name__}:load_tile_gpu_problem")
    if problem is not None:  # right on small tensors: the whole kernel may still run (kernel.py)
        return fail("forward", 2, **problem, extra=dict(safe_on_small_tensors=True))
    return Verdict(True, what_of("forward", 2), "the right tile of the right batch and head, in strided and "
                   "[B, N, H, D] layouts; ragged rows and padded columns read 0")


def _problem(verdict) -> dict:
    """A failed verdict as the JSON-able problem an interpreter-only probe returns."""
    return dict(message=verdict.message, where=verdict.where, cause=verdict.cause, hint=verdict.hint)


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
                          "the tile's own entries are wrong",
                    hint="see the check of Part 2 (checks.check_load_tile())")
    message = "masked lanes do not read 0 on a GPU"
    if torch.isnan(out).any() and torch.equal(out.nan_to_num(0.0), want):
        cause = ("the masked load has no `other`: the interpreter happens to read 0 in the masked lanes, but a "
                 "GPU leaves them undefined, whatever its registers held (NaN, here)")
        hint = "give tl.load other=0.0, or set those lanes to 0 yourself with tl.where"
    elif (out[n - row0:] == _SENTINEL).any() or (out[:, d:] == _SENTINEL).any():
        message = "loads rows or columns outside the tensor: the load is not masked"
        cause = (f"rows {n}.. or columns {d}.. are loaded with no mask: they read what lies past the tensor's rows "
                 f"and columns ({_SENTINEL:g}, here), and on a GPU past the end of its memory")
        hint = "mask the load: rows < n_rows and columns < n_cols, with other=0.0"
    else:
        cause = "the masked entries do not read 0, and they take part in every dot product"
        hint = "a masked load reads its `other` in the masked entries"
    return dict(message=message,
                where=f"strided tensor [{batch}, {heads}, {n}, {d}], rows {row0}..{row0 + br - 1} (rows {n}.. and "
                      f"columns {d}.. must be masked), with the masked lanes of a GPU simulated: tile row {i}, "
                      f"column {j} got {float(out[i, j]):.4g}, expected {float(want[i, j]):.4g}",
                cause=cause, hint=hint)


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
    """(cause, hint): why the ``which`` ("batch" or "head") offset ``index * stride`` went wrong, and ``fix``,
    the expression that mends it."""
    moved = "read from" if kind == "load" else "written to"
    return (f"the {which} offset is computed in 32-bit integers: {index} * {stride} = {index * stride} is past "
            f"2^31 and wraps around to {wrapped_int32(index * stride)}, so on a GPU {name} would be {moved} "
            "another part of memory (or fault) once a tensor holds 2^31 elements",
            f"convert the index to int64 before it meets its stride: {fix}")


def wrong_addresses_cause(which, name="the tile"):
    """(cause, hint) when the addresses past 2^31 elements match no known mistake."""
    return (f"the addresses of {name} are wrong once the {which} offset passes 2^31",
            "compute the batch and head offsets in int64 (index.to(tl.int64) * stride)")


def load_tile_offsets_problem():
    """Part 2 in the interpreter, with its loads recorded, not made: None when every element of the tile is
    read at its 64-bit address at batch and head offsets past 2^31 elements, else the problem (message, where,
    cause). Lanes read past the tile's rows and columns are the mask's business, not this probe's: the address
    check of every whole-kernel run and load_tile_masked_lanes_problem judge them (as epilogue_offsets_problem
    lets extra stores pass)."""
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
        if want <= got:
            continue
        if not got:
            return dict(message="loads nothing", where=f"batch {b}, head {h}, rows {row0}..{n - 1}",
                        cause="the placeholder is still there", hint="load the tile with tl.load")
        index, stride = (b, s_b) if which == "batch" else (h, s_h)
        wrapped = [o - index * stride + wrapped_int32(index * stride) for o in offsets]
        cause, hint = (overflow_cause(which, stride, index, f"{which}_idx.to(tl.int64) * stride_{which[0]}")
                       if address_set(x.data_ptr(), 4, wrapped) <= got else
                       wrong_addresses_cause(which))
        return dict(message="forms wrong addresses in a tensor past 2^31 elements",
                    where=f"batch {b}, head {h} of a tensor with batch stride {s_b} and head stride {s_h} "
                          f"(elements), rows {row0}..{n - 1}: {len(want - got)} of {len(want)} elements read at "
                          "the wrong address",
                    cause=cause, hint=hint)
    return None


def _view_like(buf, x):
    """``x``'s view (same offset and strides) of ``buf``, which may live on another device."""
    return buf.as_strided(x.shape, x.stride(), x.storage_offset())


def _which_slice(got, x, row0, br, bc, b, h):
    """(cause, hint): where the tile came from, if not from [b, h]: another batch or head, or swapped strides."""
    batch, heads, n, d = x.shape
    rows = min(br, n - row0)
    cols = min(bc, d)
    for bb in range(batch):
        for hh in range(heads):
            if (bb, hh) != (b, h) and torch.equal(got[:rows, :cols], x[bb, hh, row0:row0 + rows, :cols]):
                return (f"the tile of batch {bb}, head {hh} came back instead of batch {b}, head {h}: the batch "
                        "or head offset is wrong", "each offset is an index times its own stride")
    return ("the numbers come from the wrong addresses",
            "element [b, h, r, c] lies b, h, r and c strides past X, each with its own stride (the row stride for "
            "rows, the column stride for columns)")


# --- Part 3 ------------------------------------------------------------------

_LOOP = dict(BLOCK_M=32, BLOCK_N=16, HEAD_DIM=128)
_LOOP_SEQ_LEN = 72  # 3 query tiles, the last one ragged; 5 key blocks, the last one ragged
_LOOP_QK_SCALE = 0.3 * 1.4426950408889634  # the score probe's qk_scale: sm_scale 0.3, times log2(e)
_LN2 = 0.6931471805599453  # 1 / log2(e): the factor of a scale without log2(e)


def _phase_bounds(n, bm, bn, causal, tile):
    """Where query ``tile``'s phase 1 ends and its phase 2 ends (keys)."""
    if causal:
        return tile * bm, min((tile + 1) * bm, n)
    return (n // bn) * bn, n


def _expected_visits(n, bm, bn, causal, tile):
    """(unmasked, masked) visits of each key 0..n-1 by query ``tile``, and the key blocks it loads."""
    start, end = _phase_bounds(n, bm, bn, causal, tile)
    unmasked = torch.zeros(n)
    masked = torch.zeros(n)
    unmasked[:start] = 1
    masked[start:end] = 1
    return unmasked, masked, start // bn + triton.cdiv(end - start, bn)


def _keys(first, last) -> str:
    return f"key {first}" if first == last else f"keys {first}..{last}"


def _visits(unmasked, masked) -> str:
    """``visited once without the mask``, ``never visited``...: how one key was walked."""
    times = {1: "once", 2: "twice"}
    ways = [f"{times.get(count, f'{count} times')} {how}"
            for count, how in ((unmasked, "without the mask"), (masked, "through the mask")) if count]
    return "visited " + " and ".join(ways) if ways else "never visited"


def _what_tile_did(tile, n, bm, got, want, blocks, want_blocks):
    """Where a tile's walk differs: the first run of keys visited otherwise than expected, and the block count."""
    rows = f"query tile {tile} (rows {tile * bm}..{min((tile + 1) * bm, n) - 1})"
    wrong = [j for j in range(n) if got[j] != want[j]]
    loaded = f"{blocks} key blocks loaded, expected {want_blocks}"
    if not wrong:
        return f"{rows}: every key of the sequence is visited as expected, but {loaded}"
    first = last = wrong[0]
    while last + 1 < n and last + 1 in wrong and got[last + 1] == got[first] and want[last + 1] == want[first]:
        last += 1
    did = f"{rows}: {_keys(first, last)} {_visits(*got[first])} (expected: {_visits(*want[first])})"
    return did + (f"; {loaded}" if blocks != want_blocks else "")


def _loop_cause(unmasked, masked, blocks, want_u, want_m, want_blocks, tile, n, bm, bn, causal):
    """(cause, hint) of a wrong walk, from the keys each phase visited; (None, None) when none fits."""
    if blocks == 0:
        return "the placeholder is still there: no key block is ever visited", "write both phases' loops"
    start, end = _phase_bounds(n, bm, bn, causal, tile)
    past_end = triton.cdiv(n, bn) * bn  # the first key of a block that lies wholly past the sequence
    if (unmasked + masked > 1).any():
        j = int((unmasked + masked > 1).nonzero()[0])
        return (f"the two phases overlap: key {j} is visited twice",
                "each key goes through exactly one phase: phase 2 starts where phase 1 ends")
    if causal and blocks > want_blocks and (tile + 1) * bm > n:
        return (f"phase 2 runs past the end of the sequence: this tile's rows reach past SEQ_LEN ({n}), so its "
                f"diagonal ends there, but the loop goes on to the blocks from key {past_end} on, which lie wholly "
                "past the end of the sequence: they hold no key at all",
                "phase 2 stops at the end of the tile's own rows or at SEQ_LEN, whichever comes first")
    if causal and blocks > want_blocks:
        return (f"phase 2 runs past the diagonal: the blocks after the diagonal (keys {end} and up) hold only "
                "future keys, loaded and masked for nothing",
                "phase 2 stops at the end of the tile's own rows: a block past the diagonal is never loaded")
    if causal and (unmasked[start:end] > 0).any():
        j = start + int((unmasked[start:end] > 0).nonzero()[0])
        return (f"the unmasked phase runs into the diagonal: diagonal key {j} is visited without the mask, so the "
                "future leaks in", f"phase 1 stops where this tile's rows begin (key {start})")
    if not causal and (unmasked[start:end] > 0).any():
        return (f"phase 1's bound overshoots SEQ_LEN: phase 1 takes the ragged last block (keys {start}..{end - 1}) "
                f"whole and without the mask, so its keys past the end of the sequence ({end}..{start + bn - 1}, "
                "loaded as 0) are visited too, each with a score of 0: a real weight",
                "phase 1 ends at the last full block, SEQ_LEN rounded *down* to a multiple of BLOCK_N; the ragged "
                "block goes through phase 2, and its mask")
    if (masked[:start] > 0).any():
        j = int((masked[:start] > 0).nonzero()[0])
        return (f"phase 1 ends too early: key {j} goes through the mask although every row of the tile sees it",
                f"phase 1 covers keys 0..{start - 1}: the mask costs work where it is not needed")
    if (unmasked + masked < (want_u + want_m)).any():
        j = int((unmasked + masked < want_u + want_m).nonzero()[0])
        return (f"key {j} is never visited: " + ("phase 1 ends too early or phase 2 starts too late"
                                                 if j < start else "phase 2 ends too early"),
                f"every key below {end} goes through one phase: phase 2 starts where phase 1 ends and ends at key "
                f"{end}")
    if blocks > want_blocks:
        return (f"phase 2 runs past the end of the sequence: the blocks from key {past_end} on lie wholly past "
                f"SEQ_LEN ({n}): they hold no key at all", "phase 2 ends at SEQ_LEN")
    return None, None


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
    """The first query tile that walks the wrong key blocks, as (tile, what it did, cause, hint), or None."""
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
            return (tile, None, "the state that comes back is not the one the updates (Part 4) left",
                    "return acc, l_i and m_i as the last update leaves them")
        masked, unmasked = torch.div(counts, 1000, rounding_mode="floor"), counts.remainder(1000)
        want_u, want_m, want_blocks = _expected_visits(n, bm, bn, causal, tile)
        if torch.equal(unmasked, want_u) and torch.equal(masked, want_m) and int(got_blocks) == want_blocks:
            continue
        got, want = list(zip(unmasked.int().tolist(), masked.int().tolist())), list(zip(want_u.int().tolist(),
                                                                                          want_m.int().tolist()))
        did = _what_tile_did(tile, n, bm, got, want, int(got_blocks), want_blocks)
        return tile, did, *_loop_cause(unmasked, masked, int(got_blocks), want_u, want_m, want_blocks, tile, n,
                                       bm, bn, causal)
    return None


def _scores64(q, k, v, causal, variant=None):
    """What the score probe records, in float64: [row, key] holds the score if the row's tile visits the key.

    ``variant`` replays a mistake: "unscaled" (no qk_scale), "unscaled 1" or "unscaled 2" (in one phase only),
    "v" (the scores taken against V's tile)."""
    bm, bn = _LOOP["BLOCK_M"], _LOOP["BLOCK_N"]
    n = k.shape[0]
    s = q[:n].double() @ (v if variant == "v" else k).double().T
    bounds = torch.tensor([_phase_bounds(n, bm, bn, causal, i // bm) for i in range(n)])
    key = torch.arange(n)[None, :]
    phase1, visited = key < bounds[:, :1], key < bounds[:, 1:]
    scale = torch.full((n, n), _LOOP_QK_SCALE, dtype=torch.float64)
    if variant in ("unscaled", "unscaled 1"):
        scale[phase1] = 1.0
    if variant in ("unscaled", "unscaled 2"):
        scale[~phase1] = 1.0
    return torch.where(visited, s * scale, torch.zeros_like(s)), phase1


_SCORE_MISTAKES = [  # each bug is the variant of _scores64 that replays it
    Mistake("unscaled", "the scores are not multiplied by qk_scale: they are plain dot products q·k, not the scaled "
                        "scores in log2 units that Part 4 expects",
            "multiply q·kᵀ by qk_scale (sm_scale and log2(e) folded together), in both phases"),
    Mistake("unscaled 1", "phase 1's scores are not multiplied by qk_scale (phase 2's are)",
            "multiply q·kᵀ by qk_scale in phase 1 too"),
    Mistake("unscaled 2", "phase 2's scores are not multiplied by qk_scale (phase 1's are)",
            "multiply q·kᵀ by qk_scale in phase 2 too"),
    Mistake("v", "the scores are taken against the V tile: a score is a query row against a key row, from K",
            "the scores are q·kᵀ, with the K tile of the same block"),
]


def _score_problem(probes, q, k, v, causal, b, h):
    """The first wrong score the key loop computed, as (where, cause, hint), or None."""
    bm, d = _LOOP["BLOCK_M"], _LOOP["HEAD_DIM"]
    n = k.shape[2]
    acc = torch.full((q.shape[0], d), float("nan"), device=dev())
    launch(3, probes["key_scores"], (q.shape[0] // bm,), q.to(dev()), k, v, acc, n, b, h, _LOOP_QK_SCALE,
           *k.stride(), *v.stride(), CAUSAL=causal, **_LOOP)
    got = acc.cpu()[:n, :n]
    k_bh, v_bh = k[b, h].cpu(), v[b, h].cpu()
    want, phase1 = _scores64(q, k_bh, v_bh, causal)
    atol = rtol = 1e-2  # loose enough for a tf32 product on a GPU, tight enough for any mistake below
    problem = testing.mismatch("scores", got, want, labels=("query row", "key"), atol=atol, rtol=rtol)
    if problem is None:
        return None
    i, j = problem.index
    where = f"{at(problem)} (phase {1 if phase1[i, j] else 2} of query tile {i // bm})"
    for mistake in _SCORE_MISTAKES:
        if matches(got, _scores64(q, k_bh, v_bh, causal, mistake.bug)[0], atol, rtol):
            return where, mistake.cause, mistake.hint
    return (where, *_scale_factor_cause(got, want, phase1))


def _scale_factor_cause(got, want, phase1):
    """(cause, hint) when one phase's scores (or both) are the right ones times a constant, else (None, None)."""
    wrong = {}
    for phase, region in ((1, phase1), (2, ~phase1)):
        sel = region & (want.abs() > 1e-3)
        if not sel.any():
            continue
        ratio = got[sel].double() / want[sel]
        factor = float(ratio.median())
        if not torch.allclose(ratio, torch.full_like(ratio, factor), rtol=1e-2, atol=1e-3):
            return None, None  # not a constant factor
        if abs(factor - 1) > 1e-2:
            wrong[phase] = factor
    if not wrong:
        return None, None
    phases = "both phases" if len(wrong) == 2 else f"phase {next(iter(wrong))}"
    factor = next(iter(wrong.values()))
    if all(abs(f - _LN2) < 1e-2 for f in wrong.values()):
        return (f"log2(e) is missing from the scale in {phases}: the scores there are q·k times sm_scale alone "
                "(qk_scale times ln 2), not in the log2 units that Part 4 expects",
                f"multiply q·kᵀ by qk_scale, which holds sm_scale and log2(e) together, in {phases}")
    return (f"the scores of {phases} are the right ones times {factor:.4g}: a constant factor too many in their "
            "scale", "multiply q·kᵀ by qk_scale alone, in both phases")


def _part2_problem():
    """Part 2's failing verdict when its mistake shows in small tensors (so in Part 3's probe too), else None."""
    verdict = check_load_tile.verdict()
    return None if verdict.ok or verdict.extra.get("safe_on_small_tensors") else verdict


@prints_verdict
def check_key_loop():
    """forward.py Part 3: which key blocks each query tile visits, which go through the mask, and the scores.

    K is contiguous and V a [B, N, H, D] tensor seen as [B, H, N, D]: each has strides of its own."""
    fwd, probes = forward_parts()
    bm, bn, d = _LOOP["BLOCK_M"], _LOOP["BLOCK_N"], _LOOP["HEAD_DIM"]
    n = _LOOP_SEQ_LEN
    g = torch.Generator().manual_seed(61)
    batch, heads, b, h = 2, 2, 1, 1
    k = torch.randn(batch, heads, n, d, generator=g).to(dev())
    v = _unit_values(batch, heads, n, d, b, h, "bnhd").to(dev())  # .to keeps the strides
    q = torch.zeros(triton.cdiv(n, bm) * bm, d)
    q[:n] = 0.5 * torch.randn(n, d, generator=g)
    for causal in (True, False):
        name = (f"{'causal' if causal else 'no causal mask'}, SEQ_LEN {n}, BLOCK_M {bm}, BLOCK_N {bn}, K contiguous, "
                "V in the [B, N, H, D] layout")
        problem = _walk_problem(probes, k, v, causal, b, h)
        scores = None if problem else _score_problem(probes, q, k, v, causal, b, h)
        if problem is None and scores is None:
            continue
        part2 = _part2_problem()
        if scores is not None:
            where, cause, hint = scores
            message, where = "computes the wrong scores", f"case \"{name}\": {where}"
        else:
            tile, did, cause, hint = problem
            like_k = _unit_values(batch, heads, n, d, b, h, "contiguous").to(dev())
            if part2 is None and _walk_problem(probes, k, like_k, causal, b, h) is None:
                return fail("forward", 3, "reads V at the wrong addresses",
                            where=f"case \"{name}\": query tile {tile}; with V laid out as K is, the walk is right",
                            cause="V is loaded with K's strides, and here V's differ from K's",
                            hint="V has strides of its own (stride_vb, stride_vh, stride_vn, stride_vd): load V "
                                 "with them")
            message = "walks the wrong key blocks" if did else "the key loop does not return the state it was given"
            where = f"case \"{name}\": {did or f'query tile {tile}'}"
        if part2 is not None:  # the loop loads its tiles with Part 2: its mistake may be what shows here
            cause = (f"{part2.what} fails its own check, and the key loop loads its tiles with it: what this check "
                     "sees may be Part 2's mistake, not this part's")
            hint = "make Part 2's check (checks.check_load_tile()) pass first, then re-run this one"
        return fail("forward", 3, message, where=where, cause=cause, hint=hint)
    return Verdict(True, what_of("forward", 3), "each query tile visits its key blocks once: the ones before the "
                   "diagonal unmasked, the diagonal masked, none after it; without the causal mask every full "
                   "block unmasked and the ragged last one masked; the scores are q·kᵀ times qk_scale")
