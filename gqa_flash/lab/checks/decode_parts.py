"""Notebook 07 (bonus): the checks of decode.py's four parts, each on its own.

decode.py's four parts are ``@triton.jit`` helpers, and each is checked on
its own by a *probe*, as in notebook 04 (probes.py): a tiny kernel that calls
ONE of your helpers on chosen inputs and stores what it returns, which is then
compared with a float64 replay. So each part can be checked as soon as it is
written, before the others exist.

* Part 1, :func:`check_decode_group_tile`: the packed tile of a KV group, in
  four groups (GQA 8:2 with 3 new tokens, 32:8, MQA 32:1 over two row blocks,
  MHA), from a strided Q whose every (batch, head, token) holds other values;
* Part 2, :func:`check_decode_pages`: logical position -> (page, slot) through
  shuffled block tables (pages of 16, of 5, a transposed and a strided
  table) and for the contiguous cache; and in the interpreter, from the
  addresses its loads form, that no table entry past the sequence's last
  page is read;
* Part 3, :func:`check_decode_split`: one split's partial state (acc, l, m)
  for every split of a context, NaN past ``cache_seqlens``, with chunks that
  end ragged, chunks past the end, and new tokens that see none of a chunk;
* Part 4, :func:`check_decode_merge`: the log-sum-exp merge of partial
  states, empty splits and padding splits included.

The whole file, through the public API, is checked in decode.py. A failure
says where the first wrong value is and the likely cause: the placeholder, a
part this one builds on failing its own check, or one of the usual mistakes
replayed in float64 and matched against your output.
"""

import functools
import math

import numpy as np
import torch
import triton

from gqa_flash import runtime, testing
from gqa_flash.lab.checks.cases import LN2, LOG2E
from gqa_flash.lab.checks.probes import addresses_recorded, decode_parts, dev, launch_in
from gqa_flash.lab.checks.verdict import Verdict, at, fail, first_cause, matches, prints_verdict, what

NAN = float("nan")
NEG_INF = float("-inf")
launch = functools.partial(launch_in, "decode")  # a crash in your helper becomes a FAIL of its part


def _pad(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def _rows_block(group_rows: int) -> int:
    """The kernel's BLOCK_M for a group of ``group_rows`` packed rows: 16 to 64."""
    return min(_pad(group_rows), 64)


# --------------------------------------------------------------------------
# Part 1: the packed group tile
# --------------------------------------------------------------------------

_SENTINEL = 777.0  # what lies around Q in its buffer: a load outside Q shows it

# (batch, query heads, KV heads, new tokens, head dim, which batch, which KV head)
_GROUP_CASES = [
    ("GQA 8:2, 3 new tokens, head dim 24 (padded to 32)", (2, 8, 2, 3, 24, 1, 1)),
    ("Llama 3 8B's 32:8, one new token", (1, 32, 8, 1, 16, 0, 7)),
    ("MQA 32:1, 4 new tokens: 128 rows in two row blocks of 64", (2, 32, 1, 4, 16, 1, 0)),
    ("MHA 4:4, 5 new tokens", (1, 4, 4, 5, 16, 0, 2)),
]


def _strided_q(batch, n_q_heads, n_new, head_dim):
    """Q [B, Hq, Nq, D] as a view of a [B, Nq, Hq, D + 8] buffer full of the sentinel, with values that
    name their place: 1000 b + 10 h + i + (c + 1) / 64 (exact in fp32)."""
    buf = torch.full((batch, n_new, n_q_heads, head_dim + 8), _SENTINEL)
    q = buf.permute(0, 2, 1, 3)[..., :head_dim]
    b, h, i, c = torch.meshgrid(*(torch.arange(n) for n in q.shape), indexing="ij")
    q.copy_(1000.0 * b + 10.0 * h + i + (c + 1) / 64.0)
    return buf, q


def _group_cause(heads, tokens, want_pairs, kv_head, group, n_kv, n_new):
    if (heads == 0).all() and (tokens == 0).all():
        return "the placeholder is still there: every row is head 0, token 0"
    pairs = sorted(zip(heads.tolist(), tokens.tolist()))
    if len(set(pairs)) < len(pairs):
        if n_new > 1 and set(tokens.tolist()) == {0}:
            return "every row is token 0: a row's token is its place within its run of N_Q rows"
        return "some (query head, token) pair comes twice: each row of the tile holds a different pair"
    got_heads, want_heads = {p[0] for p in pairs}, {p[0] for p in want_pairs}
    if got_heads == {kv_head + j * n_kv for j in range(group)} and got_heads != want_heads:
        return ("the heads are dealt out in turn (kv_head + j * N_KV_HEADS): a group is made of the "
                "consecutive query heads kv_head * group_size ... kv_head * group_size + group_size - 1")
    if got_heads == set(range(group)) and got_heads != want_heads:
        return "every group got the heads of group 0: start the group at its first head, kv_head * group_size"
    return None


def _group_mismatch(name, got_q, heads, tokens, q, batch, group_rows, head_dim):
    """The first wrong row of a tile whose pairs are right: (where, cause), or None."""
    for r in range(got_q.shape[0]):
        row = got_q[r]
        if r >= group_rows:
            if (row != 0).any():
                return (f"case \"{name}\": padding row {r} (past group_size * N_Q = {group_rows}) is not 0",
                        "rows past the group's last pair load as 0: mask the load with row_ok")
            continue
        h, i = int(heads[r]), int(tokens[r])
        want = q[batch, h, i]
        if torch.equal(row[:head_dim], want) and not (row[head_dim:] != 0).any():
            continue
        where = f"case \"{name}\": row {r} (query head {h}, token {i})"
        if torch.equal(row[:head_dim], want):
            return (f"{where}, padding column {head_dim + int((row[head_dim:] != 0).nonzero()[0])}: "
                    f"got {row[head_dim:][row[head_dim:] != 0][0].item():g}, expected 0",
                    "columns past HEAD_DIM load as 0: mask the load with offs_d < HEAD_DIM")
        c = int((row[:head_dim] != want).nonzero()[0])
        cause = "the tile's values are not Q[batch, q_head, token, :]: address it with Q's four strides"
        if batch > 0 and torch.equal(row[:head_dim], q[0, h, i]):
            cause = "the values come from batch 0: add batch_idx * stride_qb"
        elif row[c].item() == _SENTINEL:
            cause = "a value came from outside Q: Q here is a strided view, so use its strides, not its shape"
        return f"{where}, column {c}: got {row[c].item():g}, expected {want[c].item():g}", cause
    return None


@prints_verdict
def check_decode_group_tile():
    """decode.py Part 1, alone: the packed group tile, its heads and its tokens."""
    dec, probes = decode_parts()
    for name, (batch, n_q_heads, n_kv, n_new, head_dim, b, kv) in _GROUP_CASES:
        group = n_q_heads // n_kv
        group_rows, block_m, d_pad = group * n_new, _rows_block(group * n_new), _pad(head_dim)
        row_blocks = -(-group_rows // block_m)
        buf, q = _strided_q(batch, n_q_heads, n_new, head_dim)
        q_dev = buf.to(dev()).permute(0, 2, 1, 3)[..., :head_dim]
        out = torch.full((row_blocks * block_m, d_pad), NAN, device=dev())
        heads = torch.full((row_blocks * block_m,), -1, dtype=torch.int64, device=dev())
        tokens = torch.full_like(heads, -1)
        launch(1, probes["group_tile"], (row_blocks,), q_dev, out, heads, tokens, b, kv, *q_dev.stride(),
                n_q_heads, n_kv, N_Q=n_new, HEAD_DIM=head_dim, HEAD_DIM_PAD=d_pad, BLOCK_M=block_m)
        got_q, heads, tokens = out.cpu(), heads.cpu()[:group_rows], tokens.cpu()[:group_rows]
        want_pairs = sorted((kv * group + j, i) for j in range(group) for i in range(n_new))
        if sorted(zip(heads.tolist(), tokens.tolist())) != want_pairs:
            r = next((r for r in range(group_rows) if (int(heads[r]), int(tokens[r])) not in want_pairs), None)
            r = 0 if r is None else r
            return fail("decode", 1, "the rows do not hold each (query head, token) pair of the group once",
                        where=f"case \"{name}\", KV head {kv}: row {r} is (query head {int(heads[r])}, token "
                              f"{int(tokens[r])}); the group's pairs are query heads {kv * group}.."
                              f"{kv * group + group - 1} times tokens 0..{n_new - 1}",
                        cause=_group_cause(heads, tokens, want_pairs, kv, group, n_kv, n_new))
        problem = _group_mismatch(name, got_q, heads, tokens, q, b, group_rows, head_dim)
        if problem is not None:
            return fail("decode", 1, "the tile does not hold Q's rows", where=problem[0], cause=problem[1])
    return Verdict(True, what("decode", 1), f"every row holds its own (query head, token) of the group and its "
                   f"row of Q, padding 0, in {len(_GROUP_CASES)} groups (GQA 8:2 with 3 new tokens, 32:8, "
                   "MQA over two row blocks, MHA)")


# --------------------------------------------------------------------------
# Part 2: the page-table lookup
# --------------------------------------------------------------------------

_PAGE_BLOCK = 16  # positions per probe program, the interpreter's BLOCK_N


_TABLE_POISON = 1_000_000  # what a strided table holds between its own entries


def _table(batch, max_pages, n_blocks, seed, layout="contiguous"):
    """A block table [batch, max_pages] of shuffled, distinct pages of a pool of n_blocks (int32, on the
    device): contiguous; "transposed" (stored [max_pages, batch]: a row's entries are batch apart); or
    "strided" (every other column of a [batch, 2 * max_pages] buffer that holds _TABLE_POISON between)."""
    g = torch.Generator().manual_seed(seed)
    pages = torch.randperm(n_blocks, generator=g)[: batch * max_pages].view(batch, max_pages).to(torch.int32)
    pages = pages.to(dev())
    if layout == "transposed":
        return pages.t().contiguous().t()
    if layout == "strided":
        wide = torch.full((batch, 2 * max_pages), _TABLE_POISON, dtype=torch.int32, device=dev())
        wide[:, ::2] = pages
        return wide[:, ::2]
    return pages


def _page_cases():
    """(name, block table or None for the contiguous cache, page size, which batch, sequence length)."""
    return [
        ("pages of 16 (one key block each), batch 2 of 3, 70 positions", _table(3, 6, 20, 1), 16, 2, 70),
        ("pages of 5 (not a divisor of a key block), batch 1, 37 positions", _table(2, 9, 24, 2), 5, 1, 37),
        ("pages of 8, a table stored transposed (a row's entries are 3 apart), batch 1, 37 of its 40 positions",
         _table(3, 5, 17, 3, layout="transposed"), 8, 1, 37),
        ("pages of 8, a strided table (every other column of a wider one), batch 1, 29 positions",
         _table(2, 5, 12, 4, layout="strided"), 8, 1, 29),
        ("the contiguous cache (no table): batch 2, 45 positions", None, 1, 2, 45),
    ]


def _table_layout_words(table):
    if table.stride(1) == 1:
        return "this one is contiguous"
    if table.stride(0) == 1:
        return f"this one is stored transposed: a row's entries are {table.stride(1)} apart"
    return f"this one is every other column of a wider table: a row's entries are {table.stride(1)} apart"


def _pages_cause(table, page_size, b, n, got_page, got_slot):
    p = torch.arange(n)
    if table is None:
        if not torch.equal(got_page, torch.full_like(p, b)):
            return "contiguous cache: every position of sequence b lives in page b (page = batch_idx)"
        return "contiguous cache: the slot of position p is p itself"
    device_table, table = table, table.cpu()  # (a copy to the CPU may lose a strided table's layout)
    if (got_page == 0).all() and (got_slot == 0).all():
        return "the placeholder is still there: every position is slot 0 of page 0"
    if torch.equal(got_page, table[b, p // page_size].long()):
        if torch.equal(got_slot, p):
            return "the slot is the position within its page, not the position itself"
        return "the slot of position p is its place within its page of PAGE_SIZE positions"
    swapped = table[b, (p % page_size).clamp(max=table.shape[1] - 1)].long()
    if torch.equal(got_slot, p // page_size) and torch.equal(got_page[p % page_size < table.shape[1]],
                                                             swapped[p % page_size < table.shape[1]]):
        return ("page and slot are swapped: the page is found through the table at p // PAGE_SIZE, the slot is "
                "p % PAGE_SIZE")
    if torch.equal(got_page, p // page_size):
        return ("the page is the logical page number: where that page lives in the pool is written in the "
                "table's row of this sequence; look it up")
    if b > 0 and torch.equal(got_page, table[0, p // page_size].long()):
        return "every sequence read row 0 of the table: offset by batch_idx * stride_tb"
    if device_table.stride(1) != 1:  # what a lookup that ignores the column stride, or the strides, reads
        count = device_table.untyped_storage().nbytes() // device_table.element_size()
        storage = torch.as_strided(device_table, (count,), (1,), 0).cpu()
        for row_start in (b * device_table.stride(0), b * device_table.shape[1]):
            flat = (row_start + p // page_size).clamp(max=storage.numel() - 1)
            if torch.equal(got_page, storage[flat].long()):
                return (f"the table's column stride was ignored ({_table_layout_words(device_table)}): entry "
                        "(b, j) lies at batch_idx * stride_tb + j * stride_tp")
    first = p[p < table.shape[1]]
    if len(first) > 1 and torch.equal(got_page[first], table[b, first].long()):
        return "the table was indexed by the position itself: it lists pages, so index it by the page number"
    return None


def _table_reads_past_pages(probes, table, page_size, b, n, grid):
    """The block-table entries the helper reads that no position of the sequence needs (past its last
    page; a transposed row may end there): [(column, position)], from the addresses of its loads."""
    with addresses_recorded() as seen:  # loads touch no memory here: an entry past the table is no crash
        launch(2, probes["page_slots"], (grid,), table, torch.full((grid * _PAGE_BLOCK,), -1, device=dev()),
               torch.full((grid * _PAGE_BLOCK,), -1, device=dev()), b, n, *table.stride(),
               BLOCK_N=_PAGE_BLOCK, PAGE_SIZE=page_size, PAGED=True)
    pages_used = -(-n // page_size)
    row = table.data_ptr() + table.element_size() * b * table.stride(0)
    allowed = {row + table.element_size() * j * table.stride(1) for j in range(pages_used)}
    past = []
    for kind, addresses, mask in seen:
        if kind != "load":
            continue
        lanes = np.nonzero(mask.reshape(-1))[0]
        for lane in lanes:
            address = int(addresses.reshape(-1)[lane])
            if address not in allowed:
                offset = (address - row) // table.element_size()
                column = offset // table.stride(1) if offset % table.stride(1) == 0 else None
                past.append((column, int(lane)))
        if past:
            return past
    return past


@prints_verdict
def check_decode_pages():
    """decode.py Part 2, alone: logical position -> (page, slot), paged and contiguous."""
    dec, probes = decode_parts()
    for name, table, page_size, b, n in _page_cases():
        grid = -(-n // _PAGE_BLOCK)
        pages = torch.full((grid * _PAGE_BLOCK,), -1, dtype=torch.int64, device=dev())
        slots = torch.full_like(pages, -1)
        if table is None:
            lookup, strides = torch.zeros(1, dtype=torch.int32, device=dev()), (0, 0)
        else:
            lookup, strides = table, table.stride()
        launch(2, probes["page_slots"], (grid,), lookup, pages, slots, b, n, *strides,
               BLOCK_N=_PAGE_BLOCK, PAGE_SIZE=page_size, PAGED=table is not None)
        got_page, got_slot = pages.cpu()[:n], slots.cpu()[:n]
        p = torch.arange(n)
        want_page = torch.full_like(p, b) if table is None else table.cpu()[b, p // page_size].long()
        want_slot = p if table is None else p % page_size
        wrong = (got_page != want_page) | (got_slot != want_slot)
        if wrong.any():
            i = int(wrong.nonzero()[0])
            return fail("decode", 2, "a position is looked up in the wrong place",
                        where=f"case \"{name}\": position {i}: got (page {int(got_page[i])}, slot "
                              f"{int(got_slot[i])}), expected (page {int(want_page[i])}, slot {int(want_slot[i])})",
                        cause=_pages_cause(table, page_size, b, n, got_page, got_slot))
        if table is None or not runtime.INTERPRETER:  # the addresses are seen only in the interpreter
            continue
        past = _table_reads_past_pages(probes, table, page_size, b, n, grid)
        if past:
            column, lane = past[0]
            entry = f"entry {column} of row {b}" if column is not None else f"an address outside row {b}"
            return fail("decode", 2, "the block table is read past the sequence's last page",
                        where=f"case \"{name}\": {entry} of the table was read (for a lane with key_ok False); "
                              f"its {n} positions use only entries 0..{-(-n // page_size) - 1}",
                        cause="the table load is not masked: past a sequence's last page the table holds anything "
                              "(a page far outside the pool), and its row may end there (a transposed table's "
                              "next entry lies outside it); load with mask=key_ok")
    return Verdict(True, what("decode", 2), "every position finds its page and slot: shuffled pages of 16, of 5 "
                   "and of 8 through a transposed table, and the contiguous cache")


# --------------------------------------------------------------------------
# Part 3: one split's partial state
# --------------------------------------------------------------------------

_SPLIT_BLOCK_N = 16


def _split_cases():
    """(name, dict of the case). Every cache holds NaN at and past the sequence's length."""
    return [
        ("1 new token, GQA 8:2, 45 positions in chunks of 32 (two key blocks; the last chunk ragged, a third "
         "past the end)", dict(batch=2, b=1, n_q_heads=8, n_kv=2, kv=1, n_new=1, head_dim=32, seq_len=45,
                               chunk=32, splits=3, capacity=112, layout="bhsd", seed=31)),
        ("16 new tokens at positions 29-44, GQA 4:2, chunks of 16: tokens 0-2 see none of the last chunk",
         dict(batch=1, b=0, n_q_heads=4, n_kv=2, kv=0, n_new=16, head_dim=16, seq_len=45, chunk=16, splits=4,
              capacity=80, layout="bhsd", seed=32)),
        ("5 new tokens at positions 35-39, GQA 8:2, head dim 24, a [B, S, H, D] cache: the causal rule inside "
         "a chunk", dict(batch=2, b=1, n_q_heads=8, n_kv=2, kv=1, n_new=5, head_dim=24, seq_len=40, chunk=32,
                         splits=2, capacity=72, layout="bshd", seed=33)),
    ]


def _split_inputs(c):
    g = torch.Generator().manual_seed(c["seed"])
    rows = (c["n_q_heads"] // c["n_kv"]) * c["n_new"]
    d = c["head_dim"]
    q = torch.randn(rows, d, generator=g)
    shape = (c["batch"], c["n_kv"], c["capacity"], d)
    k, v = (torch.randn(shape, generator=g) for _ in range(2))
    for x in (k, v):
        x[:, :, c["seq_len"]:] = NAN
    if c["layout"] == "bshd":
        k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (k, v))
    tokens = torch.arange(rows) % c["n_new"]
    return q, tokens, k, v


def _partial64(q, tokens, k, v, c, split, scale, bug=None):
    """One split's partial (acc, l, m) in float64, block by block as the kernel walks, with at most one bug.

    ``k``, ``v``: [capacity, D] of this batch and KV head; ``scale`` includes log2(e).
    """
    q, k, v = (x.to(torch.float64) for x in (q, k, v))
    n, n_new, chunk = c["seq_len"], c["n_new"], c["chunk"]
    position = n - n_new + tokens
    lo, hi = split * chunk, min(split * chunk + chunk, n)
    if bug == "whole_context":
        lo, hi = 0, n
    base = math.e if bug == "exp" else 2.0
    m = torch.full((q.shape[0],), NEG_INF, dtype=torch.float64)
    l, acc = torch.zeros_like(m), torch.zeros(q.shape, dtype=torch.float64)
    for first in range(lo, hi, _SPLIT_BLOCK_N):
        keys = torch.arange(first, min(first + _SPLIT_BLOCK_N, hi))
        s = (q @ k[keys].T) * scale
        if bug == "strict":
            seen = keys[None, :] < position[:, None]
        elif bug == "no_causal":
            seen = torch.ones_like(s, dtype=torch.bool)
        else:
            seen = keys[None, :] <= position[:, None]
        s = s.masked_fill(~seen, NEG_INF)
        top = torch.maximum(m, s.amax(dim=1))
        ref = torch.where(torch.isneginf(top), torch.zeros_like(top), top)
        shrink = base ** (m - ref)
        w = (math.e if bug == "exp_p" else base) ** (s - ref[:, None])
        l = l * shrink + w.sum(dim=1)
        acc = (acc if bug == "no_rescale" else acc * shrink[:, None]) + w @ v[keys]
        m = top
    if bug == "normalised":
        acc = torch.where(l[:, None] > 0, acc / l.clamp(min=1e-300)[:, None], acc)
    return acc, l, m


_SPLIT_MISTAKES = [
    ("no_causal", "the causal rule is missing: new token i sits at position cache_seqlens - N_Q + i and sees "
                  "no later position"),
    ("strict", "a row does not see its own position: the causal rule keeps positions up to and including it (<=)"),
    ("whole_context", "every split walked the whole context: split s owns only the positions "
                      "[s * CHUNK, (s + 1) * CHUNK), cut at the sequence's length"),
    ("exp", "e^x instead of 2^x: the scores are in log2 units (qk_scale holds log2(e)), so every exponential "
            "is a power of 2"),
    ("exp_p", "the probabilities use e^x: the scores are in log2 units (qk_scale holds log2(e)), so they are "
              "2^(score - m), like the rescale factor"),
    ("no_rescale", "acc is not rescaled when the running maximum rises: it must shrink by the same factor as l"),
    ("normalised", "the state was normalised (acc / l): leave it as it is, the merge needs acc, l and m"),
]


def _split_cause(got, want, c, variants):
    acc, l, m = got
    if torch.isneginf(m).all() and (l == 0).all() and (acc == 0).all():
        return "the placeholder is still there: the chunk is never walked, every state stays (0, 0, -inf)"
    if any(torch.isnan(x).any() for x in got):
        nan_rows = torch.isnan(l) | torch.isnan(m) | torch.isnan(acc).any(-1)
        if torch.isneginf(want[2][nan_rows]).all():
            return ("NaN in a row that sees no key of the chunk: its maximum is -inf, and 2^(-inf - (-inf)) is "
                    "NaN; exponentiate against a finite stand-in (0) where the maximum is -inf")
        return ("NaN: a position at or past cache_seqlens was read (the cache holds NaN there, and 0 * NaN is "
                "NaN): load only the keys below the end of the chunk, cut at the sequence's length")
    return first_cause(got, variants, **_STATE_TOL)


_STATE_TOL = dict(atol=1e-4, rtol=1e-4)


@prints_verdict
def check_decode_split():
    """decode.py Part 3, alone (with your Part 2 finding the keys): one split's partial state, every split."""
    dec, probes = decode_parts()
    if not check_decode_pages.verdict().ok:
        return fail("decode", 3, "not run yet", cause="Part 2 (_page_slots) fails its own check above: the walk "
                    "finds its keys through it, so fix it first")
    for name, c in _split_cases():
        q, tokens, k, v = _split_inputs(c)
        rows, block_m, d_pad = q.shape[0], _rows_block(q.shape[0]), _pad(c["head_dim"])
        q_tile = torch.zeros(block_m, d_pad)
        q_tile[:rows, : c["head_dim"]] = q
        all_tokens = torch.arange(block_m) % c["n_new"]
        kd, vd = (x.to(dev()) for x in (k, v))
        seqlens = torch.zeros(c["batch"], dtype=torch.int32)
        seqlens[c["b"]] = c["seq_len"]
        splits = c["splits"]
        acc = torch.full((splits * block_m, d_pad), NAN, device=dev())
        l_out, m_out = (torch.full((splits * block_m,), NAN, device=dev()) for _ in range(2))
        scale = LOG2E / math.sqrt(c["head_dim"])
        # [B, Hkv, S, D] read as [pages = B, slots = S, Hkv, D], as the launcher passes a contiguous cache
        k_strides = (kd.stride(0), kd.stride(2), kd.stride(1), kd.stride(3))
        v_strides = (vd.stride(0), vd.stride(2), vd.stride(1), vd.stride(3))
        launch(3, probes["split_partial"], (splits,), q_tile.to(dev()), all_tokens.to(torch.int32).to(dev()), kd,
                vd, seqlens.to(dev()), acc, l_out, m_out, c["b"], c["kv"], scale, c["chunk"], *k_strides,
                *v_strides, N_Q=c["n_new"], HEAD_DIM=c["head_dim"], HEAD_DIM_PAD=d_pad, BLOCK_M=block_m,
                BLOCK_N=_SPLIT_BLOCK_N)
        got = (acc.cpu().view(splits, block_m, d_pad)[:, :rows, : c["head_dim"]],
               l_out.cpu().view(splits, block_m)[:, :rows], m_out.cpu().view(splits, block_m)[:, :rows])
        kb, vb = k[c["b"], c["kv"]], v[c["b"], c["kv"]]

        def replay(bug=None, c=c, q=q, tokens=tokens, kb=kb, vb=vb, scale=scale):
            states = [_partial64(q, tokens, kb, vb, c, s, scale, bug) for s in range(c["splits"])]
            return tuple(torch.stack(x) for x in zip(*states))

        want = replay()
        labels = {"acc": ("split", "row", "column"), "l": ("split", "row"), "m": ("split", "row")}
        problem = None
        for label, i in (("m", 2), ("l", 1), ("acc", 0)):
            problem = testing.mismatch(label, got[i], want[i], labels=labels[label], **_STATE_TOL)
            if problem is not None:
                break
        if problem is None:
            continue
        s, r = problem.index[:2]
        first, last = s * c["chunk"], min(s * c["chunk"] + c["chunk"], c["seq_len"]) - 1
        held = (f"split {s} holds positions {first}..{last}" if first <= last else
                f"split {s} starts at {first}, past the sequence's {c['seq_len']} positions: it is empty")
        variants = [(text, (lambda bug=bug: replay(bug))) for bug, text in _SPLIT_MISTAKES]
        return fail("decode", 3, "the partial state (acc, l, m) does not match the float64 reference",
                    where=f"case \"{name}\": {problem.what}, {at(problem)} (row {r} is token {int(tokens[r])}, at "
                          f"position {c['seq_len'] - c['n_new'] + int(tokens[r])}; {held})",
                    cause=_split_cause(got, want, c, variants))
    return Verdict(True, what("decode", 3), "every split's (acc, l, m) matches the float64 reference: ragged and "
                   "empty chunks, new tokens that see none of a chunk, NaN past the sequence never read")


# --------------------------------------------------------------------------
# Part 4: the merge
# --------------------------------------------------------------------------


def _merge_cases():
    """(name, acc [R, S, D], l [R, S], m [R, S], splits in use). States in log2 units; empty = (0, 0, -inf)."""
    g = torch.Generator().manual_seed(41)

    def states(rows, splits, d, spread):
        m = torch.randn(rows, splits, generator=g) * spread
        l = 1 + 4 * torch.rand(rows, splits, generator=g)
        acc = torch.randn(rows, splits, d, generator=g) * l[..., None]
        return acc, l, m

    acc1, l1, m1 = states(8, 4, 16, 3.0)
    acc2, l2, m2 = states(8, 8, 16, 3.0)
    empty = torch.zeros(8, 8, dtype=torch.bool)
    empty[:, 5:] = True  # padding splits past num_splits = 5
    empty[1, 1:] = True  # a row that sees only split 0 (a new token early in a short sequence)
    empty[2, 3] = empty[4, 2] = empty[4, 4] = True  # chunks that start past the row's position
    acc2[empty], l2[empty], m2[empty] = 0.0, 0.0, NEG_INF
    acc3, l3, m3 = states(8, 4, 16, 60.0)  # maxima 100 apart: 2^100 overflows fp32 without the rescale
    return [("4 splits of random states", acc1, l1, m1),
            ("5 splits padded to 8, with empty splits (0, 0, -inf)", acc2, l2, m2),
            ("maxima that differ by up to 2^200", acc3, l3, m3)]


def _merge64(acc, l, m, bug=None):
    """The merged rows (O, LSE) in float64, with at most one of _MERGE_MISTAKES."""
    acc, l, m = (x.to(torch.float64) for x in (acc, l, m))
    top = m.amax(dim=1)
    if bug == "no_rescale":
        weight = torch.ones_like(m).masked_fill(torch.isneginf(m), 0.0)
    elif bug == "exp":
        weight = torch.exp(m - top[:, None])
    else:
        weight = torch.exp2(m - top[:, None])
    total = (l * weight).sum(dim=1)
    o = (acc * weight[..., None]).sum(dim=1)
    if bug != "unnormalised":
        o = o / total[:, None]
    lse = top + torch.log2(total)
    if bug == "lse_log2":
        return o, lse
    if bug == "lse_mixed":
        return o, top + torch.log(total)
    return o, lse * LN2


_MERGE_MISTAKES = [
    ("no_rescale", "the splits were added as they are: each one's acc and l are sums against its own maximum; "
                   "rescale each by 2^(m_s - m) to the row's common maximum m first"),
    ("exp", "the rescale uses e^x: m and the splits' maxima are in log2 units, so the factor is a power of 2"),
    ("unnormalised", "O is not normalised: divide the merged acc by the merged l"),
    ("lse_log2", "the LSE is in log2 units: the natural log is (m + log2 l) * ln 2"),
    ("lse_mixed", "the LSE mixes bases: m is in log2 units, so ln(2^m * l) = (m + log2 l) * ln 2"),
]


@prints_verdict
def check_decode_merge():
    """decode.py Part 4, alone: the log-sum-exp merge of the splits' partial states."""
    dec, probes = decode_parts()
    for name, acc, l, m in _merge_cases():
        rows, splits, d = acc.shape
        o_out = torch.full((rows, d), NAN, device=dev())
        lse_out = torch.full((rows,), NAN, device=dev())
        launch(4, probes["merge_splits"], (1,), acc.contiguous().to(dev()), l.contiguous().to(dev()),
                m.contiguous().to(dev()), o_out, lse_out, BLOCK_R=rows, SPLITS_PAD=splits, HEAD_DIM_PAD=d)
        got = (o_out.cpu(), lse_out.cpu())
        want = _merge64(acc, l, m)
        problem = (testing.mismatch("O", got[0], want[0], labels=("row", "column"), **_STATE_TOL)
                   or testing.mismatch("LSE", got[1], want[1], labels=("row",), **testing.LSE_TOLERANCE))
        if problem is None:
            continue
        if matches(got, (torch.zeros(rows, d), torch.zeros(rows)), 0, 0):
            cause = "the placeholder is still there: O = 0 and LSE = 0"
        elif any(torch.isnan(x).any() for x in got):
            cause = ("NaN: an empty split (0, 0, -inf) must add nothing; its factor 2^(-inf - m) is 0 as long "
                     "as the common maximum m is the largest of the splits' maxima (finite: split 0 is never empty)")
        else:
            cause = first_cause(got, [(text, (lambda bug=bug: _merge64(acc, l, m, bug)))
                                      for bug, text in _MERGE_MISTAKES], **_STATE_TOL)
        return fail("decode", 4, "the merged row does not match the float64 reference",
                    where=f"case \"{name}\": {problem.what}, {at(problem)}", cause=cause)
    return Verdict(True, what("decode", 4), "O and the LSE match the float64 merge: random states, empty and "
                   "padding splits, maxima far apart")


PART_CHECKS = (check_decode_group_tile, check_decode_pages, check_decode_split, check_decode_merge)
