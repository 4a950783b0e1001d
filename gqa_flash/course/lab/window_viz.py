"""Notebook 04b's pictures and counts: sliding windows and attention sinks. Each function draws one idea.

Nothing here runs your code: the masks come from ``reference.visible``, the tiles a query tile needs from
the same rule, and the sink's pictures from ``reference.reference_attention``, so every picture draws
before you have written a line. The conventions are ``viz``'s: rows are queries, columns are keys.

* :func:`tile_kinds` and :func:`score_tiles` count the work: which key blocks a query tile must visit
  (some row of it sees some key of the block), and which of those need the mask (not every row sees
  every key). ``tile_kinds`` asks ``visible`` itself, for pictures; ``score_tiles`` counts from the
  rule's intervals, fast enough for 128k tokens.
* :func:`plot_masks`, :func:`plot_key_blocks`, :func:`plot_work` and :func:`plot_sink` draw them.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch, Rectangle

from gqa_flash.course.lab.viz import MASKED, SKIPPED, VISITED
from gqa_flash.reference import reference_attention, visible

HIDDEN = "#F2F2F2"  # a (query, key) pair the mask hides
SINK = "#55A868"  # the sink tokens' columns, or a learned sink's weight


def _k(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _cases(window, sink_tokens):
    """The three masks of the notebook: causal; a window of W; the window with S sink tokens."""
    return [(None, 0, "causal"), (window, 0, f"window W = {window}"),
            (window, sink_tokens, f"window W = {window}, S = {sink_tokens} sink tokens")]


# --------------------------------------------------------------------------
# Counting: the key blocks a query tile visits
# --------------------------------------------------------------------------


def tile_kinds(seq_len, block_m, block_n, window=None, sink_tokens=0):
    """[query tiles, key blocks] array from ``reference.visible``: 0 skipped (no row of the tile sees a key of
    the block), 1 visited with no mask (every real row sees every key, so the block holds no key past the
    sequence's end either), 2 visited with the mask (the rest). Rows past ``seq_len`` are never stored and do
    not count. An N x N mask: for pictures and tests, not for 128k tokens (:func:`score_tiles`)."""
    n_qt, n_kb = -(-seq_len // block_m), -(-seq_len // block_n)
    pos = torch.arange(n_kb * block_n)
    seen = visible(pos[:seq_len], pos, True, window, sink_tokens) & (pos < seq_len)  # padding keys: never seen
    kinds = np.zeros((n_qt, n_kb), dtype=int)
    for qt in range(n_qt):
        tile = seen[qt * block_m:(qt + 1) * block_m].view(-1, n_kb, block_n)  # [rows, key blocks, keys]
        anything, everything = tile.any(dim=2).any(dim=0), tile.all(dim=2).all(dim=0)
        kinds[qt] = np.where(everything.numpy(), 1, np.where(anything.numpy(), 2, 0))
    return kinds


def _blocks(lo, hi, block_n):
    """The key blocks that hold keys lo .. hi - 1, as a range (empty when hi <= lo)."""
    return range(lo // block_n, -(-hi // block_n)) if hi > lo else range(0)


def score_tiles(seq_len, block_m, block_n, window=None, sink_tokens=0):
    """Score tiles (key blocks visited) of each query tile, a list: the blocks holding a key that some row of the
    tile sees. Rows r0 .. r1 - 1 see, between them, keys max(r0 - W + 1, 0) .. r1 - 1 and the sink tokens
    0 .. S - 1 (up to r1 - 1): two runs of keys, whose blocks may overlap. Counted from those runs, so it runs
    at any length; :func:`tile_kinds` asks ``visible`` itself and agrees (tests/given/test_window_viz.py)."""
    counts = []
    for r0 in range(0, seq_len, block_m):
        r1 = min(r0 + block_m, seq_len)
        start = 0 if window is None else max(r0 - window + 1, 0)
        near = _blocks(start, r1, block_n)
        sinks = _blocks(0, min(sink_tokens, r1), block_n) if window is not None else range(0)
        overlap = max(0, min(near.stop, sinks.stop) - max(near.start, sinks.start))
        counts.append(len(near) + len(sinks) - overlap)
    return counts


def work_table(seq_lens=(4096, 32768, 131072), windows=(128, 4096), block_m=128, block_n=64, sink_tokens=0):
    """Lines of text: score tiles of one (batch, head) for causal attention and for each window, and their
    share of causal attention's, at each length. Computed, not timed."""
    head = f"{'tokens':>7s} {'causal':>10s}" + "".join(f" {f'W = {w}':>11s} {'of causal':>9s}" for w in windows)
    lines = [head]
    for n in seq_lens:
        causal = sum(score_tiles(n, block_m, block_n))
        row = f"{_k(n):>7s} {causal:>10,d}"
        for w in windows:
            tiles = sum(score_tiles(n, block_m, block_n, w, sink_tokens))
            row += f" {tiles:>11,d} {tiles / causal:>9.1%}"
        lines.append(row)
    return lines


# --------------------------------------------------------------------------
# Pictures
# --------------------------------------------------------------------------


def plot_masks(n=16, window=5, sink_tokens=2, row=12):
    """The three masks from ``reference.visible``: causal, a window of W, the window with S sink tokens.
    Row ``row`` is framed, and its keys listed in the panel's title."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.9))
    pos = torch.arange(n)
    for ax, (w, s, name) in zip(axes, _cases(window, sink_tokens)):
        seen = visible(pos, pos, True, w, s).numpy()
        colors = np.zeros(seen.shape, dtype=int)  # 0 hidden, 1 seen, 2 a sink token seen outside the window
        colors[seen] = 1
        if w is not None and s:
            colors[seen & ~visible(pos, pos, True, w, 0).numpy()] = 2
        ax.imshow(colors, cmap=ListedColormap([HIDDEN, VISITED, SINK]), vmin=0, vmax=2)
        ax.set_xticks(np.arange(-0.5, n, 1), minor=True)
        ax.set_yticks(np.arange(-0.5, n, 1), minor=True)
        ax.grid(which="minor", color="white", lw=0.8)
        ax.tick_params(which="minor", length=0)
        ax.set_xticks(range(0, n, 4))
        ax.set_yticks(range(0, n, 4))
        ax.add_patch(Rectangle((-0.5, row - 0.5), n, 1, fill=False, edgecolor="k", lw=2, zorder=5))
        keys = np.flatnonzero(seen[row])
        ax.set_title(f"{name}\n{int(seen.sum())} of {n * (n + 1) // 2} causal pairs; query {row} sees "
                     f"{_runs(keys)}", fontsize=9.5)
        ax.set_xlabel("keys")
        ax.set_ylabel("queries")
    fig.legend(handles=[Patch(color=VISITED, label="seen"), Patch(color=SINK, label="a sink token the "
                        "window alone would hide"), Patch(color=HIDDEN, label="hidden (score set to -inf)")],
               loc="lower center", ncol=3, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def _runs(keys):
    """'0-1 and 8-12' for the keys [0, 1, 8, 9, 10, 11, 12]."""
    runs, start = [], None
    for i, key in enumerate(keys):
        if start is None:
            start = key
        if i + 1 == len(keys) or keys[i + 1] != key + 1:
            runs.append(f"{start}-{key}" if key > start else f"{key}")
            start = None
    return "keys " + " and ".join(runs)


def plot_key_blocks(seq_len=192, block_m=32, block_n=16, window=64, sink_tokens=4, highlight=4):
    """The tiles of S that each mask needs: visited with no mask, visited with the mask, or skipped
    (:func:`tile_kinds`); the mask's edges drawn over them, each query tile's count of score tiles at its
    right, and query tile ``highlight``'s walk numbered."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 5.6))
    fill = {0: SKIPPED, 1: VISITED, 2: MASKED}
    totals = []
    for ax, (w, s, name) in zip(axes, _cases(window, sink_tokens)):
        kinds = tile_kinds(seq_len, block_m, block_n, w, s)
        counts = score_tiles(seq_len, block_m, block_n, w, s)
        assert counts == (kinds > 0).sum(axis=1).tolist()
        totals.append(sum(counts))
        for qt in range(kinds.shape[0]):
            y0, h = qt * block_m, min(block_m, seq_len - qt * block_m)
            step = 0
            for kb in range(kinds.shape[1]):
                x0, wd = kb * block_n, min(block_n, seq_len - kb * block_n)
                ax.add_patch(Rectangle((x0, y0), wd, h, facecolor=fill[kinds[qt, kb]], edgecolor="white", lw=1.5))
                if qt == highlight and kinds[qt, kb]:
                    step += 1
                    ax.text(x0 + wd / 2, y0 + h / 2, str(step), ha="center", va="center", color="white",
                            fontsize=9, weight="bold")
            ax.text(seq_len + 2, y0 + h / 2, str(counts[qt]), ha="left", va="center", fontsize=9)
        ax.add_patch(Rectangle((0, highlight * block_m), seq_len, min(block_m, seq_len - highlight * block_m),
                               fill=False, edgecolor="k", lw=2.2))
        ax.plot([0, seq_len], [0, seq_len], color="k", lw=1, ls="--")  # the diagonal: key = query
        if w is not None:
            ax.plot([0, seq_len - w + 1], [w - 1, seq_len], color="k", lw=1, ls=":")  # key = query - W + 1
        if s:
            ax.plot([s, s], [s, seq_len], color=SINK, lw=3)  # the sink tokens: keys left of this line
        ax.text(seq_len + 2, -2, "tiles", ha="left", va="bottom", fontsize=8.5, style="italic")
        ax.set_xlim(0, seq_len + 12)
        ax.set_ylim(seq_len, 0)
        ax.set_aspect("equal")
        ax.set_xticks(range(0, seq_len + 1, 2 * block_n))
        ax.set_yticks(range(0, seq_len + 1, block_m))
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        ax.set_xlabel("keys")
        ax.set_ylabel("queries")
        ax.set_title(f"{name}\n{totals[-1]} score tiles", fontsize=10, pad=14)
    fig.legend(handles=[Patch(color=VISITED, label="visited, no mask: every row sees every key"),
                        Patch(color=MASKED, label="visited with the mask: some rows see some keys"),
                        Patch(color=SKIPPED, label="skipped: no row sees any key, never loaded")],
               loc="lower center", ncol=3, fontsize=9, frameon=False)
    fig.suptitle(f"N = {seq_len}, tiles of {block_m} queries x {block_n} keys; at the right of each query tile, "
                 f"its score tiles; numbered: query tile {highlight}'s walk\ndashed: the diagonal (key = query); "
                 f"dotted: the window's lower edge (key = query - W + 1); green: the sink tokens' edge (key = S)",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def plot_work(windows=(512, 4096), block_m=128, block_n=64, seq_len=32768, max_len=131072):
    """Score tiles of one (batch, head), counted: left, per query tile at ``seq_len`` tokens (causal rises
    with the tile, a window stays flat once the tile is past it); right, in total against the length, from
    1k to ``max_len`` tokens, on log axes (causal grows as N^2 / 2, a window as N W)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.4))
    colors = ("#C44E52", VISITED, "#8172B3", "#55A868")
    tiles = np.arange(-(-seq_len // block_m))
    a.plot(tiles, score_tiles(seq_len, block_m, block_n), color="k", lw=2, label="causal")
    for w, color in zip(windows, colors[1:]):
        a.plot(tiles, score_tiles(seq_len, block_m, block_n, w), color=color, lw=2, label=f"window W = {w}")
    a.set_xlabel(f"query tile ({block_m} rows each)")
    a.set_ylabel(f"score tiles ({block_m} x {block_n}) it computes")
    a.set_title(f"Per query tile, N = {_k(seq_len)}: a window's work stops growing", fontsize=10)
    a.legend(fontsize=9)
    lengths = 2 ** np.arange(10, int(math.log2(max_len)) + 1)
    b.loglog(lengths, [sum(score_tiles(n, block_m, block_n)) for n in lengths], "o-", color="k", lw=2, ms=4,
             label="causal: about N^2 / (2 BM BN)")
    for w, color in zip(windows, colors[1:]):
        b.loglog(lengths, [sum(score_tiles(n, block_m, block_n, w)) for n in lengths], "o-", color=color, lw=2,
                 ms=4, label=f"W = {w}: about N (W + BM) / (BM BN)")
    b.set_xticks(lengths[::2])
    b.set_xticklabels([_k(int(n)) for n in lengths[::2]])
    b.set_xlabel("tokens N")
    b.set_ylabel("score tiles in all")
    b.set_title("In total: O(N^2 / 2) against O(N W)", fontsize=10)
    b.legend(fontsize=9)
    for ax in (a, b):
        ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    return fig


def _one_row(n_keys=8, head_dim=16, seed=0):
    """One query against ``n_keys`` keys in float64: q, k, v as [1, 1, n_keys, head_dim], the last query's row
    is the one that sees every key."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 1, n_keys, head_dim, generator=g, dtype=torch.float64) for _ in range(3)]


def plot_sink(sinks=(float("-inf"), 0.0, 3.0), n_keys=8, seed=0):
    """A learned sink, from ``reference_attention``. Left: one row's weights on its keys and on the sink for a
    few sink logits; the sink's weight is dropped before P @ V. Right: the row's output with a sink is its
    output without one times 1 - P_sink = sigmoid(LSE_keys - sink): a large sink lets the head attend to
    nothing."""
    q, k, v = _one_row(n_keys, seed=seed)
    plain, lse = reference_attention(q, k, v)  # the last row sees every key
    o_plain, lse_keys = plain[0, 0, -1], float(lse[0, 0, -1])
    scores = (q[0, 0, -1] @ k[0, 0].T) / math.sqrt(q.shape[-1])
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.6), gridspec_kw=dict(width_ratios=[1.25, 1]))
    width = 0.8 / len(sinks)
    for i, sink in enumerate(sinks):
        logits = torch.cat([scores, torch.tensor([sink], dtype=torch.float64)])
        p = torch.softmax(logits, 0).numpy()
        x = np.arange(n_keys + 1) + (i - (len(sinks) - 1) / 2) * width
        color = plt.get_cmap("Blues")(0.45 + 0.5 * i / max(len(sinks) - 1, 1))
        a.bar(x[:-1], p[:-1], width=width * 0.95, color=color, label=f"sink = {sink:g}: keys sum to "
              f"{p[:-1].sum():.2f}")
        a.bar(x[-1], p[-1], width=width * 0.95, color=SINK, alpha=0.45 + 0.5 * i / max(len(sinks) - 1, 1),
              hatch="//", edgecolor="white")
    a.axvline(n_keys - 0.5, color="k", lw=1, ls="--")
    top = a.get_ylim()[1]
    a.set_ylim(0, top * 1.2)
    a.text(n_keys, top * 1.02, "dropped\nbefore P @ V", ha="center", va="bottom", fontsize=8.5, color=SINK)
    a.set_xticks(range(n_keys + 1))
    a.set_xticklabels([str(j) for j in range(n_keys)] + ["sink"])
    a.set_xlabel("key (the sink's column: weighed in the softmax, dropped before P @ V)")
    a.set_ylabel("weight in the row's softmax")
    a.set_title(f"One row's softmax over {n_keys} keys and a sink (LSE of its keys alone: {lse_keys:.2f})",
                fontsize=10)
    a.legend(fontsize=8.5, loc="upper left")
    grid = np.linspace(lse_keys - 8, lse_keys + 8, 81)
    b.plot(grid, 1 / (1 + np.exp(grid - lse_keys)), color="k", lw=2, label="1 - P_sink = sigmoid(LSE_keys - sink)")
    marks = np.linspace(lse_keys - 6, lse_keys + 6, 9)
    ratios = []
    for sink in marks:
        o, _ = reference_attention(q, k, v, sinks=torch.tensor([sink], dtype=torch.float64))
        ratios.append(float(o[0, 0, -1].norm() / o_plain.norm()))
    b.plot(marks, ratios, "o", color=VISITED, ms=7, label="|O with the sink| / |O without it|")
    b.axvline(lse_keys, color="#999999", lw=1, ls=":")
    b.text(lse_keys + 0.2, 0.5, "sink = LSE of the keys:\nhalf the weight", fontsize=8.5, va="center")
    b.set_xlabel("sink logit")
    b.set_ylabel("how much of the row's output is left")
    b.set_title("A large sink scales the output to 0: the head attends to nothing", fontsize=10)
    b.legend(fontsize=8.5, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    b.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


__all__ = ["tile_kinds", "score_tiles", "work_table", "plot_masks", "plot_key_blocks", "plot_work", "plot_sink"]
