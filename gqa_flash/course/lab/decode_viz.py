"""Notebook 07's pictures: decoding over a KV cache. Each function draws one idea and returns the figure.

Nothing here runs your code: every picture is computed from the definitions
(shapes, the block table, the causal rule), so it draws before you have
written a line. :func:`plot_decode_bandwidth` draws measurements
(``python -m gqa_flash.course.lab.bench_decode``) from the rows it is given, and names their GPU.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.patches import FancyArrowPatch, Rectangle

from gqa_flash.course import decode_launch
from gqa_flash.course.lab.viz import KV_COLORS, MASKED, SKIPPED, VISITED

CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
PADDING = "#F4F4F4"  # rows of a tile that hold no query (tl.dot needs at least 16)


def _k(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 else str(n)


def _arrow(ax, start, end, color="k", lw=1.2, style="-|>"):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12, color=color, lw=lw))


def _box(ax, x, y, w, h, text="", color="white", edge="k", fontsize=8, lw=1.0, **kw):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor=edge, lw=lw, **kw))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize)


# --------------------------------------------------------------------------
# Bytes per token, and why decoding is bound by memory
# --------------------------------------------------------------------------


def decode_bytes(context, kv_heads=8, head_dim=128, layers=1, bytes_per=2):
    """Bytes of K and V that one generated token reads: every valid position, every KV head, every layer."""
    return 2 * layers * kv_heads * context * head_dim * bytes_per


def plot_decode_bytes(q_heads=32, kv_heads=8, head_dim=128, layers=32, weights_bytes=16.06e9, hbm_tb_s=4.8,
                      peak_tflops=989.0):
    """Left: the K/V bytes one generated token reads, a Llama-3-8B-like model, against the context; the
    model's weights beside it. Right: a roofline with decoding's arithmetic intensity, group size x new tokens."""
    n = np.array(CONTEXTS, dtype=float)
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.3))
    for kv, name, color in ((q_heads, f"MHA ({q_heads} KV heads)", "#C44E52"),
                            (kv_heads, f"GQA ({kv_heads} KV heads)", VISITED), (1, "MQA (1 KV head)", "#55A868")):
        per_token = decode_bytes(n, kv, head_dim, layers)
        a.loglog(n, per_token / 2**30, "o-", ms=4, color=color, label=f"K and V, {name}")
    a.axhline(weights_bytes / 2**30, color="k", ls="--", lw=1)
    a.text(n[0], weights_bytes / 2**30 * 1.2, "the weights (8B in bf16): read once a step for the whole batch",
           fontsize=8)
    a.set_xticks(n)
    a.set_xticklabels([_k(int(x)) for x in n])
    a.set_xlabel("context (tokens already in the cache)")
    a.set_ylabel("GiB read per generated token, per sequence")
    gqa_128k = decode_bytes(131072, kv_heads, head_dim, layers)
    a.set_title(f"{layers} layers, {q_heads} query heads, head dim {head_dim}, bf16\n"
                f"GQA at 128k: {gqa_128k / 2**30:.0f} GiB a token = {gqa_128k / (hbm_tb_s * 1e12) * 1e3:.1f} ms at "
                f"{hbm_tb_s} TB/s", fontsize=9.5)
    a.legend(fontsize=8, loc="lower right")
    a.grid(True, alpha=0.3, which="both")

    ridge = peak_tflops / hbm_tb_s
    x = np.logspace(-0.3, 3.3, 200)
    b.loglog(x, np.minimum(peak_tflops, hbm_tb_s * x), color="k", lw=2)
    b.axvline(ridge, color="k", ls=":", lw=1)
    b.text(ridge * 1.08, 250, f"ridge:\n{ridge:.0f} FLOP/byte", fontsize=8)
    points = [("MHA decode (group 1)", 1, "#C44E52"),
              (f"GQA {q_heads}:{kv_heads} decode", q_heads // kv_heads, VISITED),
              (f"GQA {q_heads}:{kv_heads}, 4 new tokens", 4 * q_heads // kv_heads, MASKED),
              (f"MQA {q_heads}:1 decode", q_heads, "#55A868")]
    for name, intensity, color in points:
        b.plot(intensity, hbm_tb_s * intensity, "o", ms=8, color=color, label=f"{name}: {intensity} FLOP/byte")
    # Causal prefill of N tokens: 2 * Hq * N^2 * D FLOPs over Q, K, V and O read or written once.
    n_prefill = 4096
    prefill = 2 * q_heads * n_prefill**2 * head_dim / (2 * n_prefill * head_dim * (2 * q_heads + 2 * kv_heads))
    b.plot(prefill, min(peak_tflops, hbm_tb_s * prefill), "s", ms=8, color="#8172B2",
           label=f"causal prefill of 4k tokens: {prefill:.0f} FLOP/byte")
    b.set_xlabel("arithmetic intensity (FLOP per byte of K and V read)")
    b.set_ylabel("attainable TFLOP/s")
    b.set_title(f"H200 roofline ({peak_tflops:.0f} TFLOP/s bf16, {hbm_tb_s} TB/s):\n"
                "decoding sits far left of the ridge: bound by memory", fontsize=9.5)
    b.legend(fontsize=8, loc="lower right")
    b.grid(True, alpha=0.3, which="both")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------
# Part 1: packing a group's query heads into one program
# --------------------------------------------------------------------------


def plot_group_packing(group=4, n_new=2, kv_head=1, shown=3):
    """One program per query head (each reads the group's K and V) against one program per KV head whose
    tile packs every (query head, new token) of the group: the K/V bytes read once. The tile's first
    ``shown`` rows say which pair they hold; the others ask (Part 1's check answers)."""
    rows = group * n_new
    block_m = max(16, 1 << (rows - 1).bit_length())
    color = KV_COLORS[kv_head % 10]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.6))
    for ax in (a, b):
        _box(ax, 0.5, 7.2, 9.0, 0.8, f"K and V of KV head {kv_head}: every position of the context", color=color,
             fontsize=9, alpha=0.45)
        ax.set_xlim(0, 10)
        ax.set_ylim(0.4, 8.4)
        ax.axis("off")

    width = 9.0 / group
    for j in range(group):
        h = kv_head * group + j
        x = 0.5 + j * width
        _box(a, x + 0.15, 2.2, width - 0.3, 2.6, "", color="#EEF3FA", edge=VISITED, lw=1.5)
        a.text(x + width / 2, 4.45, f"q head {h}", ha="center", fontsize=8.5, weight="bold")
        for i in range(n_new):
            _box(a, x + 0.35, 3.4 - 0.5 * i, width - 0.7, 0.45, f"token {i}", fontsize=7.5)
        _arrow(a, (x + width / 2, 7.15), (x + width / 2, 4.85), color=color, lw=1.6)
        a.text(x + width / 2, 1.8, "reads all of K, V", ha="center", fontsize=7.5)
    a.set_title(f"one program per query head: {group} programs read the group's\nK and V {group} times "
                "(from memory, or from L2 if they run together)", fontsize=10)

    cell = 5.6 / block_m
    top = 6.3
    _box(b, 2.0, top - block_m * cell - 0.15, 6.0, block_m * cell + 0.3, "", color="#EEF3FA", edge=VISITED, lw=1.5)
    for r in range(block_m):
        y = top - (r + 1) * cell
        if r < rows:
            pair = f"q head {kv_head * group + r // n_new}, token {r % n_new}" if r < shown else "q head ?, token ?"
            _box(b, 2.4, y, 5.2, cell, f"row {r}: {pair}", color="white", fontsize=6.5)
        else:
            _box(b, 2.4, y, 5.2, cell, "", color=PADDING, edge="#CCCCCC")
    b.text(5.0, top - rows * cell - (block_m - rows) * cell / 2, f"rows {rows}..{block_m - 1}: padding (0)",
           ha="center", va="center", fontsize=7.5, color="#777777")
    _arrow(b, (5.0, 7.15), (5.0, top + 0.2), color=color, lw=2.5)
    b.text(8.2, top - 1.0, f"one tile\n[{block_m} x D]:\none tl.dot\nper K/V block\nfor the\nwhole group",
           fontsize=8, va="top")
    b.set_title(f"one program per KV head: the group's {group} heads x {n_new} new tokens = {rows} rows\n"
                f"of one tile (padded to {block_m}, tl.dot's least): K and V read once.\n"
                f"Rows 0-{shown - 1} are filled in: which pair does row r hold?", fontsize=10)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------
# Part 2: the paged cache
# --------------------------------------------------------------------------


def block_table_example(seqlens=(10, 7, 13), page_size=4, spare=3, seed=7):
    """A small paged cache's bookkeeping: (block table [B, max_pages] with -1 past each sequence's pages,
    number of pages in the pool). Pages are dealt to the sequences in a shuffled order."""
    max_pages = max(-(-n // page_size) for n in seqlens)
    used = [-(-n // page_size) for n in seqlens]
    pool = sum(used) + spare
    order = torch.randperm(pool, generator=torch.Generator().manual_seed(seed)).tolist()
    table = torch.full((len(seqlens), max_pages), -1, dtype=torch.int32)
    taken = 0
    for b, n_pages in enumerate(used):
        table[b, :n_pages] = torch.tensor(order[taken:taken + n_pages], dtype=torch.int32)
        taken += n_pages
    return table, pool


def plot_block_table(seqlens=(10, 7, 13), page_size=4, spare=3, seed=7, follow=(0, 9)):
    """Logical pages of each sequence -> block table -> physical pages of the shuffled pool."""
    table, pool = block_table_example(seqlens, page_size, spare, seed)
    batch, max_pages = table.shape
    fig, ax = plt.subplots(figsize=(12, 5.2))
    cell = 0.32
    # Left: each sequence's positions, in logical pages.
    x0, row_h = 0.0, 1.3
    for b, n in enumerate(seqlens):
        y = 4.2 - b * row_h
        ax.text(x0 - 0.15, y + cell / 2, f"sequence {b}\n({n} positions)", ha="right", va="center", fontsize=8)
        for p in range(max_pages * page_size):
            filled = p < n
            color = KV_COLORS[b] if filled else "white"
            edge = "k" if p < -(-n // page_size) * page_size else "#DDDDDD"
            ax.add_patch(Rectangle((x0 + p * cell, y), cell, cell, facecolor=color, alpha=0.55 if filled else 1,
                                   edgecolor=edge, lw=0.6))
        for lp in range(-(-n // page_size)):
            ax.text(x0 + (lp + 0.5) * page_size * cell, y - 0.25, f"page {lp}", ha="center", fontsize=7)
            ax.plot([x0 + lp * page_size * cell] * 2, [y - 0.05, y + cell + 0.05], color="k", lw=1.5)
    ax.text(x0 + max_pages * page_size * cell / 2, 5.0, f"logical view: positions in pages of {page_size}",
            ha="center", fontsize=9, weight="bold")

    # Middle: the block table.
    tx = x0 + max_pages * page_size * cell + 1.2
    tw = 0.55
    for b in range(batch):
        y = 4.2 - b * row_h
        for lp in range(max_pages):
            v = int(table[b, lp])
            _box(ax, tx + lp * tw, y - 0.05, tw, 0.45, str(v) if v >= 0 else "-1",
                 color=KV_COLORS[b] if v >= 0 else "white", fontsize=8, alpha=0.55 if v >= 0 else 1)
        ax.text(tx - 0.1, y + 0.17, f"[{b}]", ha="right", va="center", fontsize=8, family="monospace")
    ax.text(tx + max_pages * tw / 2, 5.0, f"block_table [{batch}, {max_pages}]", ha="center", fontsize=9,
            weight="bold", family="monospace")
    for lp in range(max_pages):
        ax.text(tx + (lp + 0.5) * tw, 4.75, str(lp), ha="center", fontsize=7, color="#777777")

    # Right: the physical pool.
    px, ph = tx + max_pages * tw + 2.2, 4.9 / pool
    owner = {int(table[b, lp]): (b, lp) for b in range(batch) for lp in range(max_pages) if table[b, lp] >= 0}
    for page in range(pool):
        y = 4.65 - (page + 1) * ph
        b_lp = owner.get(page)
        color = KV_COLORS[b_lp[0]] if b_lp else "white"
        label = f"page {page}" + (f": seq {b_lp[0]}, page {b_lp[1]}" if b_lp else ": free")
        _box(ax, px, y, 2.4, ph * 0.9, label, color=color, fontsize=7, alpha=0.55 if b_lp else 1)
    ax.text(px + 1.2, 5.0, f"the pool k_cache [{pool}, {page_size}, Hkv, D]", ha="center", fontsize=9,
            weight="bold")
    for b in range(batch):
        for lp in range(max_pages):
            page = int(table[b, lp])
            if page < 0:
                continue
            start = (tx + max_pages * tw + 0.05, 4.2 - b * row_h + 0.17 + (1.5 - lp) * 0.1)
            end = (px, 4.65 - (page + 0.55) * ph)
            _arrow(ax, start, end, color=KV_COLORS[b], lw=0.8)

    # The position the caption asks about, framed in red; the lookup is left to the reader (Part 2's hints).
    b, p = follow
    ax.add_patch(Rectangle((x0 + p * cell, 4.2 - b * row_h), cell, cell, facecolor="none", edgecolor="#C44E52",
                           lw=2.5, zorder=5))
    ax.text(x0, -0.35, f"position {p} of sequence {b} (framed in red, counting from 0): which page of the pool "
            "holds its key and value, and at which slot of that page?", fontsize=9)
    ax.set_xlim(-1.6, px + 2.6)
    ax.set_ylim(-0.6, 5.3)
    ax.axis("off")
    ax.set_title("A paged KV cache (vLLM, FlashAttention): each sequence's pages live anywhere in one pool; "
                 "-1 = no page yet", fontsize=10)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------
# The causal rule for several new tokens
# --------------------------------------------------------------------------


def plot_new_token_mask(seq_len=13, n_new=4, capacity=16):
    """Which cache positions each of Nq new tokens sees: up to its own, cache_seqlens - Nq + i."""
    fig, ax = plt.subplots(figsize=(10, 2.9))
    for i in range(n_new):
        own = seq_len - n_new + i
        for p in range(capacity):
            if p >= seq_len:
                color, text = SKIPPED, "NaN"
            elif p <= own:
                color, text = (MASKED if p == own else VISITED), ""
            else:
                color, text = "white", "x"
            ax.add_patch(Rectangle((p, i), 0.95, 0.9, facecolor=color, edgecolor="#999999", alpha=0.8))
            if text:
                ax.text(p + 0.47, i + 0.45, text, ha="center", va="center", fontsize=7, color="#888888")
    for p in range(seq_len - n_new, seq_len):
        ax.text(p + 0.47, -0.25, "new", ha="center", fontsize=7, color=MASKED)
    ax.axvline(seq_len - 0.02, color="k", lw=1.5)
    ax.text(seq_len + 0.1, n_new + 0.35, f"cache_seqlens = {seq_len}", fontsize=8)
    ax.set_xlim(-0.1, capacity)
    ax.set_ylim(n_new + 0.6, -0.6)
    ax.set_xticks(np.arange(capacity) + 0.47)
    ax.set_xticklabels([str(p) for p in range(capacity)], fontsize=7)
    ax.set_yticks(np.arange(n_new) + 0.45)
    ax.set_yticklabels([f"new token {i} (pos {seq_len - n_new + i})" for i in range(n_new)], fontsize=8)
    ax.set_xlabel("cache position")
    ax.set_title(f"{n_new} new tokens, the last {n_new} positions of the cache: blue = seen, orange = its own "
                 "position (seen), x = its future, grey = past the end (never read)", fontsize=9)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------
# Parts 3 and 4: split-K and the merge
# --------------------------------------------------------------------------


H200_SMS = 132  # an H200's streaming multiprocessors


def split_counts(batch, context, kv_heads=8, sms=H200_SMS):
    """How ``gqa_flash/course/decode_launch.py`` splits a contiguous cache of one new token a sequence (4 rows or
    fewer a KV group: one row block) on a GPU of ``sms`` SMs: ``(wanted, launched)``.

    ``wanted`` is its ``default_num_splits`` at the GPU's key block (``SPLIT_BLOCK_N``): no split when
    ``batch * kv_heads`` programs fill the SMs, else as many as keep ``PROGRAMS_PER_SM`` programs a SM in
    one wave, and never more than key blocks. ``launched`` is what the launcher runs after rounding each
    chunk up to whole key blocks, which can leave a split fewer (33 wanted, 32 launched at batch 1, 32k).
    """
    wanted = decode_launch.default_num_splits(batch * kv_heads, context, decode_launch.SPLIT_BLOCK_N, sms=sms)
    return wanted, decode_launch.chunked(context, wanted, decode_launch.SPLIT_BLOCK_N)[1]


def sm_fill_title(programs, sms=H200_SMS, per_sm=None) -> str:
    """What ``programs`` programs do to ``sms`` SMs that run ``per_sm`` each at once: busy SMs, places
    left free, and how many waves the launch takes (a wave: every place filled once)."""
    per_sm = decode_launch.PROGRAMS_PER_SM if per_sm is None else per_sm
    places = sms * per_sm
    waves = math.ceil(programs / places)
    busy = min(programs, sms)
    text = f"{per_sm} a SM on {sms} SMs = {places} places: "
    if waves == 1:
        idle = f", {sms - busy} SMs idle" if busy < sms else ""
        return text + f"one wave, {places - programs} places free{idle}"
    return text + f"{waves} waves, the last of {programs - (waves - 1) * places} programs alone"


def plot_sm_fill(batch=1, kv_heads=8, context=32768, sms=H200_SMS):
    """Programs on the SMs of an H200, without a split (one program per sequence and KV head) and with the
    split count the launcher picks for ``context`` (:func:`split_counts`). Each SM is a square of
    ``PROGRAMS_PER_SM`` places; the GPU hands program ``i`` to SM ``i % sms``, then fills the second places."""
    per_sm = decode_launch.PROGRAMS_PER_SM
    _, splits = split_counts(batch, context, kv_heads, sms)
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.4))
    cols = 12
    for ax, n_split in zip(axes, (1, splits)):
        programs = batch * kv_heads * n_split
        for s in range(sms):
            r, c = divmod(s, cols)
            for place in range(per_sm):
                program = place * sms + s  # breadth first: one program on every SM, then a second
                on = program < programs
                kv = (program // n_split) % kv_heads  # the grid's split axis runs fastest
                ax.add_patch(Rectangle((c + place * 0.9 / per_sm, r), 0.9 / per_sm, 0.9,
                                       facecolor=KV_COLORS[kv % 10] if on else "white",
                                       edgecolor="#AAAAAA", alpha=0.7 if on else 1))
        ax.set_xlim(-0.2, cols)
        ax.set_ylim(math.ceil(sms / cols) + 0.1, -0.2)
        ax.axis("off")
        name = "no split" if n_split == 1 else f"{n_split} splits ({_k(context)} context)"
        ax.set_title(f"{name}: {batch} x {kv_heads} x {n_split} = {programs} programs\n"
                     + sm_fill_title(programs, sms, per_sm), fontsize=9.5)
    fig.suptitle(f"batch {batch}, {kv_heads} KV heads: each square is an SM of an H200 with {per_sm} places, "
                 "coloured by the KV head its program reads", fontsize=10)
    fig.tight_layout()
    return fig


def plot_split_merge(context=4096, n_splits=4):
    """A context cut into chunks, each walked by its own program into a partial state, merged with the
    log-sum-exp merge into the row of O and its LSE."""
    fig, ax = plt.subplots(figsize=(12, 4.4))
    width = 10.0 / n_splits
    chunk = -(-context // n_splits)
    colors = ["#4C72B0", "#55A868", "#8172B2", "#CCB974", "#64B5CD", "#C44E52"]
    for s in range(n_splits):
        x = 1 + s * width
        lo, hi = s * chunk, min((s + 1) * chunk, context) - 1
        _box(ax, x, 3.4, width - 0.05, 0.6, f"positions {lo}..{hi}", color=colors[s % 6], fontsize=8, alpha=0.5)
        state = rf"$(\mathrm{{acc}}_{s}, \ell_{s}, m_{s})$"
        _box(ax, x + 0.2, 1.9, width - 0.45, 0.8, f"program of split {s}:\n{state}", color="#EEF3FA", edge=VISITED,
             fontsize=8.5)
        _arrow(ax, (x + width / 2, 3.35), (x + width / 2, 2.75), color=colors[s % 6], lw=1.5)
        _arrow(ax, (x + width / 2, 1.85), (6.0, 1.05), color="#555555", lw=1.0)
    ax.text(6.0, 4.25, f"one sequence's context ({context} positions), cut into {n_splits} chunks of {chunk}",
            ha="center", fontsize=9, weight="bold")
    _box(ax, 3.0, 0.0, 6.0, 1.0, "", color="#FDF0E6", edge=MASKED, lw=1.5)
    ax.text(6.0, 0.5, "merge (Part 4: notebook 02's merge, for every split at once, in base 2)\n"
            r"to which common maximum $m$, and by what factor, is each $(\mathrm{acc}_s, \ell_s)$ rescaled?" "\n"
            r"then the row of $O$, and its LSE as a natural log?", ha="center", va="center", fontsize=9)
    ax.text(9.2, 0.5, "each split sees only its\nown chunk: its sums are\ntaken against its own\nmaximum $m_s$ "
            "(log2 units)", fontsize=8, va="center")
    ax.set_xlim(0.5, 11.5)
    ax.set_ylim(-0.2, 4.5)
    ax.axis("off")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------
# Measured on a GPU (rows of python -m gqa_flash.course.lab.bench_decode, their gpu column)
# --------------------------------------------------------------------------

STYLES = {
    ("sdpa_default", "contiguous"): dict(color="k", lw=3, alpha=0.35, label="SDPA (default backend)"),
    ("flash_decode", "contiguous"): dict(color=VISITED, marker="o", label="flash_decode, contiguous"),
    ("flash_decode", "paged"): dict(color=VISITED, marker="s", ls="--", label="flash_decode, paged (16)"),
    ("flex", "contiguous"): dict(color="#8172B2", marker="^", label="FlexAttention"),
    ("course_prefill_padded", "contiguous"): dict(color=MASKED, marker="x", label="prefill kernel, q padded"),
}


def _timed(rows, timing):
    """The ok rows timed ``timing`` way (files from before the plain rows: every row counts as a graph's)."""
    return [r for r in rows if r.get("status") == "ok" and r.get("timing", "cuda_graph") in (timing, "")]


def plot_decode_bandwidth(rows, batches=(1, 8, 64), timing="cuda_graph"):
    """Achieved K/V bandwidth (TB/s) against the context, one panel per batch, one line per provider and
    cache layout, with the measured read ceiling. ``rows``: the CSV rows (dicts of strings) of
    ``python -m gqa_flash.course.lab.bench_decode``; only ok rows timed ``timing`` way are drawn."""
    ok = _timed(rows, timing)
    ceilings = [float(r["read_ceiling_tbps"]) for r in ok if r.get("read_ceiling_tbps")]
    fig, axes = plt.subplots(1, len(batches), figsize=(4.2 * len(batches), 3.9), sharey=True)
    for ax, batch in zip(np.atleast_1d(axes), batches):
        mine = [r for r in ok if int(r["batch"]) == batch]
        for key in sorted({(r["provider"], r["cache"]) for r in mine}, key=lambda k: list(STYLES).index(k)
                          if k in STYLES else 99):
            pts = sorted((int(r["context"]), float(r["tbps"])) for r in mine if (r["provider"], r["cache"]) == key)
            style = dict(STYLES.get(key, dict(label=f"{key[0]}, {key[1]}")))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ms=5, **style)
        if ceilings:
            ax.axhline(max(ceilings), color="#C44E52", ls=":", lw=1.5,
                       label=f"read ceiling ({max(ceilings):.2f} TB/s)")
        ax.set_xscale("log", base=2)
        ax.set_xticks([1024, 8192, 32768, 131072])
        ax.set_xticklabels(["1k", "8k", "32k", "128k"])
        ax.set_xlabel("context (tokens)")
        ax.set_title(f"batch {batch}", fontsize=10)
        ax.grid(True, alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("K/V read (TB/s): bytes needed / time")
    np.atleast_1d(axes)[0].set_ylim(bottom=0)
    legend = {}  # every line of every panel, once (a provider may have rows in one panel only)
    for ax in np.atleast_1d(axes):
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=min(len(legend), 6), fontsize=8,
               frameon=False)
    gpus = sorted({r["gpu"] for r in ok if r.get("gpu")})
    fig.suptitle(f"{' and '.join(gpus) or 'GPU not recorded'}: bf16, 32 query heads on 8 KV heads, head dim 128, "
                 "one new token a sequence;\nbytes needed = K and V of every valid position", fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def bandwidth_table(rows, providers=(("flash_decode", "contiguous"), ("flash_decode", "paged"),
                                     ("flex", "contiguous"), ("course_prefill_padded", "contiguous"))) -> str:
    """SDPA's TB/s and each provider's ratio to it (above 1: faster), per batch and context; '-' where a
    provider has no ok row (its status says why)."""
    ok = {(r["provider"], r["cache"], int(r["batch"]), int(r["context"])): r for r in _timed(rows, "cuda_graph")}
    shapes = sorted({(int(r["batch"]), int(r["context"])) for r in rows})
    names = [f"{p} {c}" if p == "flash_decode" else p for p, c in providers]
    lines = [f"{'batch':>5s} {'context':>7s} {'SDPA TB/s':>9s} " + " ".join(f"{n:>23s}" for n in names)]
    for batch, context in shapes:
        sdpa = ok.get(("sdpa_default", "contiguous", batch, context))
        cells = []
        for p, c in providers:
            r = ok.get((p, c, batch, context))
            cells.append(f"{float(r['ratio_to_sdpa_default']):>23.2f}" if r else f"{'-':>23s}")
        base = f"{float(sdpa['tbps']):9.2f}" if sdpa else f"{'-':>9s}"
        lines.append(f"{batch:5d} {_k(context):>7s} {base} " + " ".join(cells))
    return "\n".join(lines)


def serving_table(rows) -> str:
    """flash_decode as a server calls it: its speed as a ratio to SDPA's, captured in a CUDA graph and
    called plainly (each against SDPA timed the same way), paged over contiguous, and the host's
    microseconds a call, per batch and context; '-' where a row is not ok."""
    def key(r):
        return r["provider"], r["cache"], r.get("timing") or "cuda_graph", int(r["batch"]), int(r["context"])

    ok = {key(r): r for r in rows if r.get("status") == "ok"}
    shapes = sorted({(int(r["batch"]), int(r["context"])) for r in rows})
    head = ("batch", "context", "graph: contig", "paged", "paged/contig", "plain: contig", "paged", "host us: ours",
            "SDPA")
    lines = [" ".join(f"{h:>13s}" if i > 1 else f"{h:>7s}" for i, h in enumerate(head))]
    for batch, context in shapes:
        def get(provider, cache, timing, column):
            r = ok.get((provider, cache, timing, batch, context))
            return float(r[column]) if r and r.get(column) not in (None, "") else None

        contig, paged = (get("flash_decode", c, "cuda_graph", "ms") for c in ("contiguous", "paged"))
        cells = [get("flash_decode", "contiguous", "cuda_graph", "ratio_to_sdpa_default"),
                 get("flash_decode", "paged", "cuda_graph", "ratio_to_sdpa_default"),
                 contig / paged if contig and paged else None,
                 get("flash_decode", "contiguous", "plain", "ratio_to_sdpa_default"),
                 get("flash_decode", "paged", "plain", "ratio_to_sdpa_default")]
        text = [f"{c:13.2f}" if c is not None else f"{'-':>13s}" for c in cells]
        for provider in ("flash_decode", "sdpa_default"):
            us = get(provider, "contiguous", "plain", "host_us")
            text.append(f"{us:13.0f}" if us is not None else f"{'-':>13s}")
        lines.append(f"{batch:7d} {_k(context):>7s} " + " ".join(text))
    return "\n".join(lines)
