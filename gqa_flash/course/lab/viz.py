"""The course's pictures. Each function draws one idea and returns the figure.

Nothing here runs your code: every picture is computed from the definitions
(or from the float64 reference), so it draws even before you have written a
line. The kernel's pictures (notebooks 04 and 05) are in ``kernel_viz``.

Conventions: in every matrix, rows are queries (query 0 at the top) and
columns are keys (key 0 on the left), as in ``S = Q K^T``.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from gqa_flash.reference import reference_softmax

VISITED = "#4C72B0"  # a tile computed with no mask
MASKED = "#DD8452"  # a tile computed with the causal mask (the diagonal)
SKIPPED = "#E8E8E8"  # a tile never loaded
GOOD = "#D9F0D3"  # no error
KV_COLORS = plt.get_cmap("tab10").colors

GIB = 2**30

# Attention shapes of a few open models (from their published configs).
MODELS = [
    # name, layers, query heads, KV heads, head dim
    ("Llama 2 7B (MHA)", 32, 32, 32, 128),
    ("Llama 3 8B (GQA)", 32, 32, 8, 128),
    ("Mistral 7B (GQA)", 32, 32, 8, 128),
    ("Llama 3 70B (GQA)", 80, 64, 8, 128),
    ("Falcon 7B (MQA)", 32, 71, 1, 64),
]


def _human_bytes(x: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if x >= size:
            return f"{x / size:.3g} {unit}"
    return f"{x:.0f} B"


def _bytes_axis(ax):
    ticks = [2**k for k in range(20, 50, 3)]
    ax.set_yticks(ticks)
    ax.set_yticklabels([_human_bytes(t) for t in ticks])


# --------------------------------------------------------------------------
# 00: why
# --------------------------------------------------------------------------


def plot_attention_cost(n_heads=32, n_kv_heads=8, head_dim=128, bytes_per=2, hbm_tb_s=4.8, tflops=989.0,
                        gpu_gib=141):
    """Memory and time of one attention layer (one sequence) as the context grows, naive vs fused.

    Naive: S = Q K^T and P = softmax(S) are N x N per query head, written to GPU
    memory (HBM) and read back. Fused (FlashAttention): only Q, K, V and O travel,
    Q and O with ``n_heads`` heads, K and V with ``n_kv_heads`` (GQA).
    Time is estimated from the bytes at ``hbm_tb_s`` and the FLOPs at ``tflops``
    (an H200 in bf16), whichever is slower.
    """
    n = np.logspace(np.log2(512), np.log2(131072), 40, base=2)
    naive_mem = n * n * n_heads * bytes_per  # S (and P, which can overwrite it)
    fused_mem = 2 * n * (n_heads + n_kv_heads) * head_dim * bytes_per  # Q and O, K and V
    flops = 4 * n * n * head_dim * n_heads / 2  # causal: half the matrix
    naive_bytes = fused_mem + 4 * n * n * n_heads * bytes_per  # write S, read S, write P, read P
    naive_t = np.maximum(naive_bytes / (hbm_tb_s * 1e12), flops / (tflops * 1e12)) * 1e3
    fused_t = np.maximum(fused_mem / (hbm_tb_s * 1e12), flops / (tflops * 1e12)) * 1e3

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.loglog(n, naive_mem, color="#C44E52", lw=2, label="naive: the N x N scores")
    a.loglog(n, fused_mem, color=VISITED, lw=2, label=f"FlashAttention: Q, K, V, O only ({n_kv_heads} KV heads)")
    a.axhline(gpu_gib * 1e9, color="k", ls="--", lw=1)
    a.text(n[0], gpu_gib * 1e9 * 1.3, f"all of an H200's memory ({gpu_gib} GB)", fontsize=9)
    _bytes_axis(a)
    a.set_ylim(2**20, 2**45)
    a.set_xlabel("context length N (tokens)")
    a.set_ylabel("memory for one layer, one sequence")
    a.set_title(f"Memory: {n_heads} query heads, bf16")
    a.legend(loc="lower right", fontsize=9)

    b.loglog(n, naive_t, color="#C44E52", lw=2, label="naive: limited by memory traffic")
    b.loglog(n, fused_t, color=VISITED, lw=2, label="fused: limited by arithmetic")
    b.set_xlabel("context length N (tokens)")
    b.set_ylabel("estimated time (ms)")
    b.set_title(f"Time on an H200 (causal, head dim {head_dim})")
    b.legend(loc="upper left", fontsize=9)
    for ax in (a, b):
        ax.set_xticks([1024, 4096, 16384, 65536])
        ax.set_xticklabels(["1k", "4k", "16k", "64k"])
        ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_course_map():
    """The four notebooks with exercises, the file each one fills in, and how each builds on the last."""
    steps = [
        ("01 naive attention", "naive.py", "softmax(QK^T) V,\ncausal mask, GQA"),
        ("02 online softmax", "online_softmax.py", "running max and sum,\nmerging two states"),
        ("03 tiled attention", "tiled.py", "FlashAttention in PyTorch:\ntiles, O and LSE"),
        ("04 Triton kernel", "forward.py", "the same walk on a GPU:\nprograms, pointers, exp2"),
    ]
    fig, ax = plt.subplots(figsize=(11, 2.6))
    for i, (title, file, idea) in enumerate(steps):
        x = i * 2.8
        ax.add_patch(Rectangle((x, 0), 2.3, 1.6, facecolor="#EEF3FA", edgecolor=VISITED, lw=1.5))
        ax.text(x + 1.15, 1.3, title, ha="center", va="center", fontsize=10, weight="bold")
        ax.text(x + 1.15, 0.75, idea, ha="center", va="center", fontsize=8.5)
        ax.text(x + 1.15, 0.2, f"you write gqa_flash/{file}", ha="center", va="center", fontsize=8, family="monospace")
        if i:
            ax.add_patch(FancyArrowPatch((x - 0.5, 0.8), (x - 0.02, 0.8), arrowstyle="-|>", mutation_scale=14))
    ax.set_xlim(-0.1, 3 * 2.8 + 2.4)
    ax.set_ylim(-0.1, 1.7)
    ax.axis("off")
    ax.set_title("The course: each notebook explains one idea; you write it in one file; a check cell grades it",
                 fontsize=10)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------
# 01: naive attention
# --------------------------------------------------------------------------


def plot_attention_matrix(n=8, head_dim=16, seed=0):
    """Scores S with the causal mask, and the probabilities P = softmax(S) row by row."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(n, head_dim, generator=g, dtype=torch.float64)
    s = (q @ k.T) / math.sqrt(head_dim)
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    p = reference_softmax(s.masked_fill(future, float("-inf")))

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4.4))
    shown = np.ma.masked_array(s.numpy(), mask=future.numpy())
    cmap_s = plt.get_cmap("RdBu_r").copy()
    cmap_s.set_bad(SKIPPED)
    lim = float(s.abs().max())
    im = a.imshow(shown, cmap=cmap_s, vmin=-lim, vmax=lim)
    for i, j in zip(*np.nonzero(future.numpy())):
        a.text(j, i, "-inf", ha="center", va="center", fontsize=7, color="#888888")
    a.set_title("scores S = Q K^T / sqrt(d), causal mask")
    fig.colorbar(im, ax=a, fraction=0.046)

    cmap_p = plt.get_cmap("Blues").copy()
    im = b.imshow(p.numpy(), cmap=cmap_p, vmin=0, vmax=1)
    for i in range(n):
        for j in range(n):
            if j <= i:
                b.text(j, i, f"{float(p[i, j]):.2f}", ha="center", va="center", fontsize=7,
                       color="white" if p[i, j] > 0.5 else "black")
    b.set_title("P = softmax(S) over each row (rows sum to 1)")
    fig.colorbar(im, ax=b, fraction=0.046)
    for ax in (a, b):
        ax.set_xlabel("key j")
        ax.set_ylabel("query i")
        ax.set_xticks(range(n))
        ax.set_yticks(range(n))
    fig.tight_layout()
    return fig


def plot_head_map(n_q_heads=8, kv_options=(8, 2, 1)):
    """Which KV head each query head reads: MHA, GQA and MQA side by side."""
    fig, axes = plt.subplots(1, len(kv_options), figsize=(4 * len(kv_options), 3.2))
    for ax, n_kv in zip(np.atleast_1d(axes), kv_options):
        group = n_q_heads // n_kv
        name = "MHA" if n_kv == n_q_heads else ("MQA" if n_kv == 1 else "GQA")
        xs_q = np.arange(n_q_heads)
        xs_kv = (np.arange(n_kv) + 0.5) * n_q_heads / n_kv - 0.5
        for h in range(n_q_heads):
            g = h // group
            ax.plot([xs_q[h], xs_kv[g]], [1, 0], color=KV_COLORS[g % 10], lw=1.5, alpha=0.8)
        ax.scatter(xs_q, np.ones(n_q_heads), s=260, c=[KV_COLORS[(h // group) % 10] for h in range(n_q_heads)],
                   edgecolors="k", zorder=3)
        ax.scatter(xs_kv, np.zeros(n_kv), s=420, marker="s", c=[KV_COLORS[g % 10] for g in range(n_kv)],
                   edgecolors="k", zorder=3)
        for h in range(n_q_heads):
            ax.text(xs_q[h], 1, str(h), ha="center", va="center", fontsize=8, zorder=4)
        for g in range(n_kv):
            ax.text(xs_kv[g], 0, str(g), ha="center", va="center", fontsize=8, zorder=4)
        ax.set_title(f"{name}: {n_q_heads} query heads, {n_kv} KV head{'s' if n_kv > 1 else ''}\n"
                     + ("one query head per KV head" if group == 1 else
                        f"all {n_q_heads} query heads share it" if n_kv == 1 else
                        f"{group} consecutive query heads per KV head"), fontsize=10)
        ax.set_yticks([0, 1])
        ax.set_yticklabels(["KV heads", "query heads"])
        ax.set_xticks([])
        ax.set_ylim(-0.4, 1.4)
        ax.set_xlim(-0.8, n_q_heads - 0.2)
        for side in ("top", "right", "bottom"):
            ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def plot_kv_cache(context=8192, bytes_per=2):
    """KV-cache size: MHA vs GQA vs MQA as the context grows, and real models at one length."""
    n = np.array([1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072])
    layers, n_q, d = 32, 32, 128
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for n_kv, name, color in ((32, "MHA, 32 KV heads", "#C44E52"), (8, "GQA, 8 KV heads", VISITED),
                              (1, "MQA, 1 KV head", "#55A868")):
        size = 2 * layers * n_kv * d * bytes_per * n  # K and V, every layer
        a.loglog(n, size / GIB, "o-", color=color, label=name, ms=4)
    a.axhline(141e9 / GIB, color="k", ls="--", lw=1)
    a.text(n[0], 141e9 / GIB * 1.15, "H200 memory (141 GB)", fontsize=9)
    a.set_xticks([1024, 8192, 65536])
    a.set_xticklabels(["1k", "8k", "64k"])
    a.set_xlabel("context length (tokens)")
    a.set_ylabel("KV cache per sequence (GiB)")
    a.set_title(f"{layers} layers, {n_q} query heads, head dim {d}, bf16")
    a.legend(fontsize=9)
    a.grid(True, alpha=0.3)

    names = [m[0] for m in MODELS]
    sizes = [2 * L * kv * hd * bytes_per * context / GIB for _, L, _, kv, hd in MODELS]
    bars = b.barh(names, sizes, color=["#C44E52" if "MHA" in x else "#55A868" if "MQA" in x else VISITED
                                       for x in names])
    for bar, size, (_, L, hq, kv, hd) in zip(bars, sizes, MODELS):
        b.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {size:.2f} GiB  ({hq} q / {kv} kv heads)",
               va="center", fontsize=8.5)
    b.set_xlim(0, max(sizes) * 1.9)
    b.invert_yaxis()
    b.set_xlabel(f"KV cache per sequence at {context} tokens (GiB, bf16)")
    b.set_title(f"Real models at {context} tokens")
    fig.tight_layout()
    return fig


def plot_scores_memory(n_heads=32, bytes_per=4, devices=(("laptop GPU", 8), ("A100 / H100", 80), ("H200", 141))):
    """Bytes of the N x N score matrix as N grows: for one head, and for every head of a layer."""
    n = np.logspace(np.log2(256), np.log2(131072), 40, base=2)
    one = n * n * bytes_per
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.loglog(n, one, color="#C44E52", lw=2, label="one head")
    ax.loglog(n, one * n_heads, color="#8C1C13", lw=2, label=f"{n_heads} heads (one layer, one sequence)")
    ax.loglog(n, 4 * n * 128 * 2 * n_heads, color=VISITED, lw=2, ls="-.",
              label="what FlashAttention keeps: Q, K, V, O (bf16, d=128)")
    for i, (name, gib) in enumerate(devices):
        ax.axhline(gib * 1e9, color="k", ls=":", lw=1)
        above = i % 2 == 0 or i == len(devices) - 1
        ax.text(n[0], gib * 1e9 * (1.15 if above else 0.87), f"{name}: {gib} GB", fontsize=8,
                va="bottom" if above else "top")
    _bytes_axis(ax)
    ax.set_ylim(2**20, 2**46)
    ax.set_xticks([256, 1024, 4096, 16384, 65536])
    ax.set_xticklabels(["256", "1k", "4k", "16k", "64k"])
    ax.set_xlabel("sequence length N")
    ax.set_ylabel(f"memory of S (fp32, {bytes_per} bytes each)")
    ax.set_title("The N x N scores grow as N^2")
    ax.legend(fontsize=8.5, loc="lower right")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------
# 02: online softmax
# --------------------------------------------------------------------------


def plot_online_softmax(x=None, block_size=8, seed=3):
    """One row read block by block: the running max m, and the running sum l before and after the rescale."""
    if x is None:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(40, generator=g, dtype=torch.float64) * 1.5
        x[13] += 3.0  # the maximum jumps in block 1...
        x[35] += 5.0  # ...and again in block 4
    x = x.to(torch.float64)
    n = x.numel()
    starts = list(range(0, n, block_size))
    m, l = float("-inf"), 0.0
    ms, l_before, l_after = [], [], []
    for s in starts:
        blk = x[s:s + block_size]
        m_new = max(m, float(blk.max()))
        kept = l * math.exp(m - m_new) if l > 0 else 0.0
        l_before.append(l)
        l = kept + float(torch.exp(blk - m_new).sum())
        m = m_new
        ms.append(m)
        l_after.append(l)
    true_l = float(torch.exp(x - x.max()).sum())

    fig, (a, b) = plt.subplots(2, 1, figsize=(10, 6), sharex=False)
    for i, s in enumerate(starts):
        e = min(s + block_size, n)
        a.axvspan(s - 0.5, e - 0.5, color="#F2F2F2" if i % 2 else "white", zorder=0)
        a.bar(range(s, e), x[s:e].numpy(), color=KV_COLORS[i % 10], width=0.8, zorder=2)
        a.hlines(ms[i], s - 0.5, e - 0.5, color="k", lw=2.5, zorder=3)
        a.text((s + e - 1) / 2, ms[i] + 0.3, f"m = {ms[i]:.2f}", ha="center", fontsize=8)
    a.set_xlim(-0.5, n - 0.5)
    a.set_ylim(float(x.min()) - 0.5, float(x.max()) + 1.5)
    a.set_xlabel("position in the row")
    a.set_ylabel("x")
    a.set_title(f"A row read in blocks of {block_size}: the black line is the running max m after each block")

    idx = np.arange(len(starts))
    rescaled = [l_before[i] * math.exp(ms[i - 1] - ms[i]) if i else 0.0 for i in idx]
    b.bar(idx - 0.3, l_before, width=0.28, color="#BBBBBB", label="l before the block (against the old max)")
    b.bar(idx, rescaled, width=0.28, color="#8172B3", label="the same sum, brought to the new max")
    b.bar(idx + 0.3, l_after, width=0.28, color="k", label="after the block: that sum + the block's own")
    for i in idx:
        if i and ms[i] > ms[i - 1]:
            b.annotate("max rose:\nrescale", (i, rescaled[i]), xytext=(i, max(l_after) * 0.75), ha="center",
                       fontsize=8, arrowprops=dict(arrowstyle="->", color="#8172B3"))
    b.axhline(true_l, color="#C44E52", ls="--", label=f"two-pass softmax denominator ({true_l:.3f})")
    b.set_xticks(idx)
    b.set_xticklabels([f"block {i}" for i in idx])
    b.set_ylabel("l")
    b.set_ylim(0, max(l_after + l_before) * 1.15)
    b.set_title("The running sum l: rescaled whenever the max rises; after the last block it is exact")
    b.legend(fontsize=8.5, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------
# 03 and 04: tiles
# --------------------------------------------------------------------------


def tile_kinds(seq_len, block_m, block_n, causal=True):
    """[query tiles, key tiles] array: 0 skipped, 1 visited with no mask, 2 visited with the mask.

    As the kernel walks them: a key tile is masked when it crosses the causal
    diagonal (or, without the causal mask, holds the ragged end of the keys).
    """
    n_qt, n_kt = -(-seq_len // block_m), -(-seq_len // block_n)
    kinds = np.zeros((n_qt, n_kt), dtype=int)
    for qt in range(n_qt):
        q_start, q_end = qt * block_m, min((qt + 1) * block_m, seq_len)
        for kt in range(n_kt):
            k_start, k_end = kt * block_n, min((kt + 1) * block_n, seq_len)
            if causal:
                if k_start >= q_end:
                    continue
                kinds[qt, kt] = 2 if k_end - 1 > q_start else 1
            else:
                kinds[qt, kt] = 2 if k_end - k_start < block_n else 1
    return kinds


def plot_tile_schedule(seq_len=96, block_m=16, block_n=16, causal=True, highlight=None, ax=None, title=None,
                       ask=False):
    """The tiles of S: which are computed with no mask, with the mask, or skipped; one query tile's walk.

    ``highlight`` is a query tile, or a tuple of them. With ``ask=True`` the picture
    is a question: the tiles are drawn blank, the highlighted rows hold a "?" in every
    key tile, for the reader to colour in with the legend's three colours, and the
    axes are ticked at the tile boundaries.
    """
    kinds = tile_kinds(seq_len, block_m, block_n, causal)
    n_qt, n_kt = kinds.shape
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(5.5, 5.5 * seq_len / max(seq_len, 1)))
    fill = {0: SKIPPED, 1: VISITED, 2: MASKED}
    for qt in range(n_qt):
        for kt in range(n_kt):
            y0, x0 = qt * block_m, kt * block_n
            h, w = min(block_m, seq_len - y0), min(block_n, seq_len - x0)
            if ask:
                ax.add_patch(Rectangle((x0, y0), w, h, facecolor="white", edgecolor="#AAAAAA", lw=1))
            else:
                ax.add_patch(Rectangle((x0, y0), w, h, facecolor=fill[kinds[qt, kt]], edgecolor="white", lw=1.5))
    if causal:
        ax.plot([0, seq_len], [0, seq_len], color="k", lw=1, ls="--")
    for row in () if highlight is None else np.atleast_1d(highlight):
        y0 = row * block_m
        h = min(block_m, seq_len - y0)
        ax.add_patch(Rectangle((0, y0), seq_len, h, fill=False, edgecolor="k", lw=2.5))
        step = 0
        for kt in range(n_kt):
            x_mid = kt * block_n + min(block_n, seq_len - kt * block_n) / 2
            if ask:
                ax.text(x_mid, y0 + h / 2, "?", ha="center", va="center", color="k", fontsize=10, weight="bold")
            elif kinds[row, kt]:
                step += 1
                ax.text(x_mid, y0 + h / 2, str(step), ha="center", va="center", color="white", fontsize=10,
                        weight="bold")
    if ask:  # tick the tile boundaries: the answer is read off them
        for set_ticks, block in ((ax.set_xticks, block_n), (ax.set_yticks, block_m)):
            starts = list(range(0, seq_len, block))
            set_ticks(starts + ([seq_len] if seq_len - starts[-1] >= block / 2 else []))  # N, unless it crowds
        ax.tick_params(labelsize=8)
    ax.set_xlim(0, seq_len)
    ax.set_ylim(seq_len, 0)
    ax.set_aspect("equal")
    ax.set_xlabel("keys")
    ax.set_ylabel("queries")
    ax.set_title(title or f"N = {seq_len}, tiles of {block_m} queries x {block_n} keys"
                 + (", causal" if causal else ""), fontsize=10)
    handles = [Patch(color=VISITED, label="computed, no mask"), Patch(color=MASKED, label="computed with the mask"),
               Patch(color=SKIPPED, label="skipped: never loaded")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.11), ncol=3, fontsize=7.5, frameon=False,
              handlelength=1.5, columnspacing=1.2)
    if own:
        fig.tight_layout()
        return fig
    return ax.figure


def plot_tile_schedules(seq_len=96, block_m=16, block_n=16, highlight=3):
    """Causal and not, side by side, with one query tile's walk numbered."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 5.4))
    plot_tile_schedule(seq_len, block_m, block_n, True, highlight, ax=a,
                       title=f"causal: query tile {highlight} visits its past, then its diagonal")
    plot_tile_schedule(seq_len, block_m, block_n, False, highlight, ax=b,
                       title=f"no mask: query tile {highlight} visits every key tile")
    total = tile_kinds(seq_len, block_m, block_n, False).size
    visited = int((tile_kinds(seq_len, block_m, block_n, True) > 0).sum())
    fig.suptitle(f"causal attention computes {visited} of {total} tiles", fontsize=11)
    fig.tight_layout()
    return fig


def plot_on_chip(block_m=64, block_n=64, head_dim=128):
    """What lives where during one query tile's walk: HBM (large, slow) and on-chip memory (small, fast)."""
    fig, ax = plt.subplots(figsize=(11, 4.6))
    ax.add_patch(Rectangle((0, 0), 4.2, 4.2, facecolor="#F4F4F4", edgecolor="k"))
    ax.text(2.1, 3.95, "GPU memory (HBM): 141 GB, ~4.8 TB/s", ha="center", fontsize=10, weight="bold")
    hbm = [("Q  [N, d]", 3.2, "read once per tile"), ("K  [N, d]", 2.5, "streamed, tile by tile"),
           ("V  [N, d]", 1.8, "streamed, tile by tile"), ("O  [N, d]", 1.1, "written once"),
           ("LSE  [N]", 0.4, "written once (for backward)")]
    for name, y, note in hbm:
        ax.add_patch(Rectangle((0.3, y), 1.6, 0.5, facecolor="white", edgecolor="#555555"))
        ax.text(1.1, y + 0.25, name, ha="center", va="center", family="monospace", fontsize=9)
        ax.text(2.0, y + 0.25, note, va="center", fontsize=8.5, color="#444444")
    ax.text(2.1, -0.35, "never here: S or P [N, N]", ha="center", fontsize=9.5, color="#C44E52", weight="bold")

    ax.add_patch(Rectangle((6.0, 0), 5.2, 4.2, facecolor="#EEF3FA", edgecolor=VISITED, lw=1.5))
    ax.text(8.6, 3.95, "on chip: registers and shared memory", ha="center", fontsize=10, weight="bold")
    ax.text(8.6, 3.65, "a few hundred KB per SM, ~10x the bandwidth", ha="center", fontsize=8.5)
    chip = [(f"Q tile [{block_m}, {head_dim}]", 6.3, 2.8, "kept for the whole walk"),
            (f"K tile [{block_n}, {head_dim}]", 6.3, 2.0, "replaced each step"),
            (f"V tile [{block_n}, {head_dim}]", 6.3, 1.2, "replaced each step"),
            (f"m, l [{block_m}]", 8.8, 2.8, "running max and sum"),
            (f"S, P tile [{block_m}, {block_n}]", 8.8, 2.0, "made and used each step"),
            (f"acc [{block_m}, {head_dim}]", 8.8, 1.2, "running P @ V")]
    for name, x, y, note in chip:
        ax.add_patch(Rectangle((x, y), 2.1, 0.55, facecolor="white", edgecolor=VISITED))
        ax.text(x + 1.05, y + 0.35, name, ha="center", va="center", family="monospace", fontsize=8.5)
        ax.text(x + 1.05, y + 0.11, note, ha="center", va="center", fontsize=7.5, color="#444444")
    for y_from, y_to in ((3.45, 3.07), (2.75, 2.27), (2.05, 1.47)):
        ax.add_patch(FancyArrowPatch((4.25, y_from), (6.28, y_to), arrowstyle="-|>", mutation_scale=12,
                                     color="#555555"))
    for y_to in (1.35, 0.65):
        ax.add_patch(FancyArrowPatch((9.85, 1.18), (4.25, y_to), arrowstyle="-|>", mutation_scale=12,
                                     color="#C44E52", connectionstyle="arc3,rad=-0.15"))
    ax.text(7.6, 0.25, "epilogue, once: normalise, write O and the LSE", ha="center", fontsize=8.5,
            color="#C44E52")
    ax.set_xlim(-0.2, 11.4)
    ax.set_ylim(-0.6, 4.4)
    ax.axis("off")
    fig.tight_layout()
    return fig


__all__ = [
    "plot_attention_cost",
    "plot_course_map",
    "plot_attention_matrix",
    "plot_head_map",
    "plot_kv_cache",
    "plot_scores_memory",
    "plot_online_softmax",
    "tile_kinds",
    "plot_tile_schedule",
    "plot_tile_schedules",
    "plot_on_chip",
]
