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
says first what is wrong and where (which case, row, head, token, position or
split), in words; then, on a second run of the check, the likely cause and its
fix: a part this one builds on failing its own check, or one of the usual
mistakes, replayed in float64 (decode_replays.py) and matched against your
output in all the cases at once. A part still holding its placeholder is
"not started", at once.
"""

import functools
import itertools
import math

import numpy as np
import torch
import triton

from gqa_flash.course import runtime, testing
from gqa_flash.course.lab.checks.cases import LOG2E
from gqa_flash.course.lab.checks.common import Verdict, at, fail, matches, prints_verdict, rel, what_of
from gqa_flash.course.lab.checks.decode_replays import (
    MERGE_MISTAKES, SPLIT_BLOCK_N, SPLIT_MISTAKES, STATE_TOL, merge64, merge_cases, partial64, split_cases,
    split_inputs,
)
from gqa_flash.course.lab.checks.probes import addresses_recorded, decode_parts, dev, launch_in

NAN = float("nan")
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


def _verdict(part, message, where, found):
    """A FAIL of ``part``: what is wrong and where; ``found`` is (cause, fix) or None, or, for the placeholder,
    (None, what it gives): then the part is not started, and the verdict says so at once."""
    if found is None:
        return fail("decode", part, message, where=where)
    cause, hint = found
    if cause is None:
        return fail("decode", part, f"not started: {hint}",
                    hint=f"replace the placeholder of Part {part} in {rel('decode')}, save, and re-run this cell")
    return fail("decode", part, message, where=where, cause=cause, hint=hint)


def _group_cause(heads, tokens, want_pairs, kv_head, group, n_kv, n_new):
    if (heads == 0).all() and (tokens == 0).all():
        return None, "every row is head 0, token 0 (the placeholder)"
    pairs = sorted(zip(heads.tolist(), tokens.tolist()))
    if len(set(pairs)) < len(pairs):
        if n_new > 1 and set(tokens.tolist()) == {0}:
            return ("every row is token 0: the token does not come from the row number",
                    "a row's token is its place within its run of N_Q rows")
        return ("two rows hold the same (query head, token) pair, so another pair has no row",
                "one row number gives two coordinates: whole runs of N_Q rows count the heads, the place within a "
                "run the token")
    got_heads, want_heads = {p[0] for p in pairs}, {p[0] for p in want_pairs}
    if got_heads == {kv_head + j * n_kv for j in range(group)} and got_heads != want_heads:
        return ("the group's heads are dealt out in turn (kv_head, kv_head + N_KV_HEADS, ...), as q_head % "
                "N_KV_HEADS maps them; naive.py's groups are runs of consecutive heads",
                "the group of KV head j is query heads j * group_size ... j * group_size + group_size - 1")
    if got_heads == set(range(group)) and got_heads != want_heads:
        return ("every group got the heads of group 0: the group's first head is missing",
                "start the group at its first head, kv_head_idx * group_size")
    return None


def _group_mismatch(name, got_q, heads, tokens, q, batch, group_rows, head_dim):
    """The first wrong row of a tile whose pairs are right: (where, (cause, fix) or None), or None."""
    for r in range(got_q.shape[0]):
        row = got_q[r]
        if r >= group_rows:
            if (row != 0).any():
                return (f"case \"{name}\": padding row {r} (the group has {group_rows} rows) is not 0",
                        ("a padding row was loaded: rows past the group's last pair must read nothing",
                         "mask the load with row_ok; masked lanes load as other=0"))
            continue
        h, i = int(heads[r]), int(tokens[r])
        want = q[batch, h, i]
        if torch.equal(row[:head_dim], want) and not (row[head_dim:] != 0).any():
            continue
        where = f"case \"{name}\": row {r} (query head {h}, token {i})"
        if torch.equal(row[:head_dim], want):
            return (f"{where}, padding column {head_dim + int((row[head_dim:] != 0).nonzero()[0])}: "
                    f"got {row[head_dim:][row[head_dim:] != 0][0].item():g}, expected 0",
                    ("the columns past HEAD_DIM (up to the power of two) were loaded: they read what lies beyond "
                     "the row; columns past HEAD_DIM load as 0",
                     "mask the load with offs_d < HEAD_DIM too"))
        c = int((row[:head_dim] != want).nonzero()[0])
        found = None
        if batch > 0 and torch.equal(row[:head_dim], q[0, h, i]):
            found = ("the values come from batch 0: the batch's offset is missing from the address",
                     "add batch_idx * stride_qb")
        elif row[c].item() == _SENTINEL:
            found = ("a value came from outside Q: Q here is a strided view inside a wider buffer, and the address "
                     "took it as contiguous", "address Q with its four strides, not its shape")
        return f"{where}, column {c}: got {row[c].item():g}, expected {want[c].item():g}", found
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
            return _verdict(1, "the rows do not hold each (query head, token) pair of the group once",
                            f"case \"{name}\", KV head {kv}: row {r} is (query head {int(heads[r])}, token "
                            f"{int(tokens[r])}); the group's pairs are query heads {kv * group}.."
                            f"{kv * group + group - 1} times tokens 0..{n_new - 1}",
                            _group_cause(heads, tokens, want_pairs, kv, group, n_kv, n_new))
        problem = _group_mismatch(name, got_q, heads, tokens, q, b, group_rows, head_dim)
        if problem is not None:
            return _verdict(1, "the tile does not hold Q's rows", *problem)
    return Verdict(True, what_of("decode", 1), f"every row holds its own (query head, token) of the group and its "
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
    """(cause, fix) of a wrong lookup, (None, what it gives) for the placeholder, or None."""
    p = torch.arange(n)
    if table is None:
        if not torch.equal(got_page, torch.full_like(p, b)):
            return ("contiguous cache: the page is not the sequence's own",
                    "each sequence is one long page of its own, number batch_idx")
        return "contiguous cache: the slot is not the position", "each position is its own slot"
    device_table, table = table, table.cpu()  # (a copy to the CPU may lose a strided table's layout)
    if (got_page == 0).all() and (got_slot == 0).all():
        return None, "every position is slot 0 of page 0 (the placeholder)"
    width, column, within = table.shape[1], p // page_size, p % page_size

    def read_at(index):
        """Does every page agree with the table's row b read at column index(p), where that column exists?"""
        seen = index < width
        return bool(seen.any()) and torch.equal(got_page[seen], table[b, index[seen].clamp(max=width - 1)].long())

    if torch.equal(got_page, table[b, column].long()):
        if torch.equal(got_slot, p):
            return ("the slot is the position itself, not its place within its page",
                    "the slot is the remainder of the position by PAGE_SIZE")
        return ("the slot is not the position's place within its page",
                "the slot is the remainder of the position by PAGE_SIZE")
    by_slot = read_at(within) and bool((p[within < width] >= page_size).any())  # positions past page 0 tell
    if by_slot and torch.equal(got_slot, column):
        return ("page and slot are swapped: the table was indexed by the slot (the place within the page), and "
                "the slot given is the page number",
                "the table's column is the position // PAGE_SIZE; the slot is the position % PAGE_SIZE")
    if by_slot:
        return ("the table was indexed by the slot (the place within the page); its columns count the "
                "sequence's pages", "look the page up at column position // PAGE_SIZE")
    if torch.equal(got_page, column):
        return ("the page is the logical page number, not the one the table gives: a sequence's pages lie "
                "anywhere in the pool", "look the logical page number up in the table's row of this sequence")
    if b > 0 and torch.equal(got_page, table[0, column].long()):
        return ("every sequence read row 0 of the table: the row's offset is missing",
                "add batch_idx * stride_tb")
    if device_table.stride(1) != 1:  # what a lookup that ignores the column stride, or the strides, reads
        count = device_table.untyped_storage().nbytes() // device_table.element_size()
        storage = torch.as_strided(device_table, (count,), (1,), 0).cpu()
        for row_start in (b * device_table.stride(0), b * device_table.shape[1]):
            flat = (row_start + column).clamp(max=storage.numel() - 1)
            if torch.equal(got_page, storage[flat].long()):
                return (f"the table's column stride was ignored ({_table_layout_words(device_table)}), so a "
                        "row's entries were taken as adjacent",
                        "entry (b, j) lies at batch_idx * stride_tb + j * stride_tp")
    if read_at(p):
        return ("the table was indexed by the position itself; its columns count the sequence's pages",
                "look the page up at column position // PAGE_SIZE")
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
            return _verdict(2, "a position is looked up in the wrong place",
                            f"case \"{name}\": position {i}: got (page {int(got_page[i])}, slot {int(got_slot[i])}), "
                            f"expected (page {int(want_page[i])}, slot {int(want_slot[i])})",
                            _pages_cause(table, page_size, b, n, got_page, got_slot))
        if table is None or not runtime.INTERPRETER:  # the addresses are seen only in the interpreter
            continue
        past = _table_reads_past_pages(probes, table, page_size, b, n, grid)
        if past:
            column, lane = past[0]
            entry = f"entry {column} of row {b}" if column is not None else f"an address outside row {b}"
            return fail("decode", 2, "the block table is read past the sequence's last page",
                        where=f"case \"{name}\": {entry} of the table was read, for a position past the sequence's "
                              f"end; its {n} positions use only entries 0..{-(-n // page_size) - 1}",
                        cause="the table load is not masked: past a sequence's last page the table holds anything "
                              "(a page far outside the pool), and its row may end there (a transposed table's "
                              "next entry lies outside it)",
                        hint="load the table with mask=key_ok (and other=0)")
    return Verdict(True, what_of("decode", 2), "every position finds its page and slot: shuffled pages of 16, of 5 "
                   "and of 8 through a transposed table, and the contiguous cache")


# --------------------------------------------------------------------------
# Part 3: one split's partial state
# --------------------------------------------------------------------------


def _split_cause(runs, first_wrong):
    """(cause, fix) for the runs of every case (got, want, replay), the first wrong one at ``first_wrong``;
    (None, what it gives) for the placeholder; None when no known mistake matches."""
    got, want, _ = runs[first_wrong]
    acc, l, m = got
    if torch.isneginf(m).all() and (l == 0).all() and (acc == 0).all():
        return None, "every split's state stays (0, 0, -inf): the chunk is never walked (the placeholder)"
    if any(torch.isnan(x).any() for x in got):
        nan_rows = torch.isnan(l) | torch.isnan(m) | torch.isnan(acc).any(-1)
        if torch.isneginf(want[2][nan_rows]).all():
            return ("NaN in a row that sees no key of the chunk: its maximum is -inf, and 2^(-inf - (-inf)) is NaN",
                    "exponentiate against a finite stand-in (0) where the maximum is -inf")
        return ("NaN: a position at or past seq_len was read (the cache holds NaN there, and 0 * NaN is NaN)",
                "load only the keys below the chunk's end, cut at seq_len")
    for mistake, zeros in itertools.product(SPLIT_MISTAKES, (False, True)):
        try:
            if all(matches(g, replay(mistake.bug, zeros), 2 * STATE_TOL["atol"], 2 * STATE_TOL["rtol"])
                   for g, _, replay in runs):
                return mistake.cause, mistake.hint
        except Exception:  # a mistake that cannot happen for these shapes
            continue
    return None


def _run_split(probes, c):
    """Your Part 3, every split of case ``c``: (got, want, replay) with got and want (acc, l, m) of [splits, rows]."""
    q, tokens, k, v = split_inputs(c)
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
           vd, seqlens.to(dev()), acc, l_out, m_out, c["b"], c["kv"], scale, c["chunk"], kd.shape[0], *k_strides,
           *v_strides, N_Q=c["n_new"], HEAD_DIM=c["head_dim"], HEAD_DIM_PAD=d_pad, BLOCK_M=block_m,
           BLOCK_N=SPLIT_BLOCK_N)
    got = (acc.cpu().view(splits, block_m, d_pad)[:, :rows, : c["head_dim"]],
           l_out.cpu().view(splits, block_m)[:, :rows], m_out.cpu().view(splits, block_m)[:, :rows])
    kb, vb = k[c["b"], c["kv"]], v[c["b"], c["kv"]]

    def replay(bug=None, zeros=False):
        states = [partial64(q, tokens, kb, vb, c, s, scale, bug, zeros) for s in range(splits)]
        return tuple(torch.stack(x) for x in zip(*states))

    return got, replay(), replay


def _split_mismatch(name, c, got, want):
    """Where the first wrong value of case ``c`` is, in words; None when the case is right."""
    labels = {"acc": ("split", "row", "column"), "l": ("split", "row"), "m": ("split", "row")}
    for label, i in (("m", 2), ("l", 1), ("acc", 0)):
        problem = testing.mismatch(label, got[i], want[i], labels=labels[label], **STATE_TOL)
        if problem is not None:
            break
    else:
        return None
    s, r = problem.index[:2]
    token = r % c["n_new"]
    first, last = s * c["chunk"], min(s * c["chunk"] + c["chunk"], c["seq_len"]) - 1
    held = (f"split {s} holds positions {first}..{last}" if first <= last else
            f"split {s} starts at {first}, past the sequence's {c['seq_len']} positions: it is empty")
    return (f"case \"{name}\": {problem.name}, {at(problem)} (row {r} is token {token}, at position "
            f"{c['seq_len'] - c['n_new'] + token}; {held})")


@prints_verdict
def check_decode_split():
    """decode.py Part 3, alone (with your Part 2 finding the keys): one split's partial state, every split."""
    dec, probes = decode_parts()
    if not check_decode_pages.verdict().ok:
        return fail("decode", 3, "not run yet: Part 2 (page_slots) fails its own check above, and the walk "
                    "finds its keys through it", hint="make Part 2's check pass first")
    runs, where, first_wrong = [], None, None
    for name, c in split_cases():  # every case, even past a wrong one: a mistake is named by all three
        runs.append(_run_split(probes, c))
        if where is None:
            where, first_wrong = _split_mismatch(name, c, *runs[-1][:2]), len(runs) - 1
    if where is not None:
        return _verdict(3, "the partial state (acc, l, m) does not match the float64 reference", where,
                        _split_cause(runs, first_wrong))
    return Verdict(True, what_of("decode", 3), "every split's (acc, l, m) matches the float64 reference: ragged and "
                   "empty chunks, new tokens that see none of a chunk, NaN past the sequence never read")


# --------------------------------------------------------------------------
# Part 4: the merge
# --------------------------------------------------------------------------


@prints_verdict
def check_decode_merge():
    """decode.py Part 4, alone: the log-sum-exp merge of the splits' partial states."""
    dec, probes = decode_parts()
    for name, acc, l, m in merge_cases():
        rows, splits, d = acc.shape
        o_out = torch.full((rows, d), NAN, device=dev())
        lse_out = torch.full((rows,), NAN, device=dev())
        launch(4, probes["merge_splits"], (1,), acc.contiguous().to(dev()), l.contiguous().to(dev()),
               m.contiguous().to(dev()), o_out, lse_out, BLOCK_R=rows, SPLITS_PAD=splits, HEAD_DIM_PAD=d)
        got = (o_out.cpu(), lse_out.cpu())
        want = merge64(acc, l, m)
        problem = (testing.mismatch("O", got[0], want[0], labels=("row", "column"), **STATE_TOL)
                   or testing.mismatch("LSE", got[1], want[1], labels=("row",), **testing.LSE_TOLERANCE))
        if problem is None:
            continue
        if matches(got, (torch.zeros(rows, d), torch.zeros(rows)), 0, 0):
            found = None, "O = 0 and LSE = 0 (the placeholder)"
        elif any(torch.isnan(x).any() for x in got):
            found = ("NaN from an empty split (0, 0, -inf), which must add nothing",
                     "its factor 2^(-inf - m) is 0 as long as the common maximum m is the largest of the splits' "
                     "maxima (finite: split 0 is never empty)")
        else:
            found = next(((mistake.cause, mistake.hint) for mistake in MERGE_MISTAKES
                          if matches(got, merge64(acc, l, m, mistake.bug), 2 * STATE_TOL["atol"],
                                     2 * STATE_TOL["rtol"])), None)
        return _verdict(4, "the merged row does not match the float64 reference",
                        f"case \"{name}\": {problem.name}, {at(problem)}", found)
    return Verdict(True, what_of("decode", 4), "O and the LSE match the float64 merge: random states, empty and "
                   "padding splits, maxima far apart")


PART_CHECKS = (check_decode_group_tile, check_decode_pages, check_decode_split, check_decode_merge)
