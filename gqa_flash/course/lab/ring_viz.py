"""Notebook 08's pictures and tables: the ring's schedule, causal work per rank, memory, time and bytes.

Everything here is computed from positions and the course's committed numbers, never from ring.py, so the
pictures are right before your parts are.
"""

from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from gqa_flash.course import context_parallel
from gqa_flash.course.lab.checks.ring import replayed_sources  # the ring, replayed block by block


def causal_work(world_size, layout, chunk=64):
    """work[step][rank]: query-key pairs rank computes at step under the causal mask (chunks of ``chunk``)."""
    held = replayed_sources(world_size)
    work = np.zeros((world_size, world_size))
    for step in range(world_size):
        for rank in range(world_size):
            q_chunks = context_parallel.chunk_ids(rank, world_size, layout)
            kv_chunks = context_parallel.chunk_ids(held[step][rank], world_size, layout)
            for qc in q_chunks:
                for kc in kv_chunks:
                    q = np.arange(qc * chunk, (qc + 1) * chunk)[:, None]
                    k = np.arange(kc * chunk, (kc + 1) * chunk)[None, :]
                    work[step, rank] += (k <= q).sum()
    return work


def plot_ring_schedule(world_size=4):
    """Which rank's K/V block each rank holds at each step, and where each goes next."""
    held = replayed_sources(world_size)
    fig, ax = plt.subplots(figsize=(1.3 * world_size + 2, 0.9 * world_size + 1.2))
    colours = plt.get_cmap("tab10")
    for step in range(world_size):
        for rank in range(world_size):
            src = held[step][rank]
            ax.add_patch(plt.Rectangle((rank, step), 0.92, 0.85, color=colours(src), alpha=0.75))
            ax.text(rank + 0.46, step + 0.42, f"K/V of\nrank {src}", ha="center", va="center", fontsize=8)
            if step + 1 < world_size:
                ax.annotate("", xy=((rank + 1) % world_size + 0.2, step + 1.05), xytext=(rank + 0.7, step + 0.85),
                            arrowprops=dict(arrowstyle="->", color="0.4", lw=0.8))
    ax.set_xlim(-0.1, world_size)
    ax.set_ylim(world_size, -0.2)
    ax.set_xticks([r + 0.46 for r in range(world_size)], [f"rank {r}" for r in range(world_size)])
    ax.set_yticks([s + 0.42 for s in range(world_size)], [f"step {s}" for s in range(world_size)])
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(f"the ring of {world_size} ranks: each step, every block moves one rank on\n"
                 f"(the last rank's goes to rank 0)", fontsize=9)
    fig.tight_layout()
    return fig


def plot_causal_work(world_size=4):
    """Causal work per rank and step under both layouts (the same total; the slowest rank sets the pace)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for ax, layout in zip(axes, context_parallel.LAYOUTS):
        chunk = 64 if layout == "contiguous" else 32  # the same sequence: zigzag's chunks are half as long
        work = causal_work(world_size, layout, chunk) / 1e3
        bottom = np.zeros(world_size)
        for step in range(world_size):
            ax.bar(range(world_size), work[step], bottom=bottom, color=plt.get_cmap("viridis")(step / world_size),
                   label=f"step {step}", edgecolor="white", lw=0.5)
            bottom += work[step]
        ax.set_xticks(range(world_size), [f"rank {r}" for r in range(world_size)])
        ax.set_title(f"layout={layout!r}: the slowest rank does {bottom.max() / bottom.mean():.2f}x the mean",
                     fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("score entries computed (thousands)")
    axes[1].legend(fontsize=8, loc="upper left")
    fig.suptitle(f"causal attention over {64 * world_size} positions on {world_size} ranks", fontsize=10)
    fig.tight_layout()
    return fig


def plot_block_pairs(world_size=2, rank=1, layout="zigzag", chunk=4):
    """Part 2 in pictures: at each step, the query chunks of ``rank`` against the key chunks of the block it
    holds, on the causal score matrix of the whole sequence; each pair is seen whole, in part (the diagonal
    pair: the causal mask), or not at all, found position by position as the check finds them."""
    held = replayed_sources(world_size)
    n_chunks = world_size * context_parallel.check_layout(layout)
    n = n_chunks * chunk
    owner = {c: r for r in range(world_size) for c in context_parallel.chunk_ids(r, world_size, layout)}
    visible = np.tril(np.ones((n, n), dtype=bool))  # query row q sees key column k <= q
    kinds = {"whole": ("tab:green", "seen whole (diagonal False)"),
             "diagonal": ("tab:orange", "seen in part: the causal mask (diagonal True)"),
             "none": ("0.45", "nothing to compute: left out")}
    fig, axes = plt.subplots(1, world_size, figsize=(4.3 * world_size, 5.0), squeeze=False)
    for step, ax in enumerate(axes[0]):
        source = held[step][rank]
        image = np.ones((n, n, 4))
        image[visible] = (0.86, 0.86, 0.86, 1.0)  # what a query may see, in the whole sequence
        outlines = []
        for i, qc in enumerate(context_parallel.chunk_ids(rank, world_size, layout)):
            for j, kc in enumerate(context_parallel.chunk_ids(source, world_size, layout)):
                rows, cols = slice(qc * chunk, (qc + 1) * chunk), slice(kc * chunk, (kc + 1) * chunk)
                seen = visible[rows, cols]
                kind = "whole" if seen.all() else "diagonal" if seen.any() else "none"
                rgb = matplotlib.colors.to_rgb(kinds[kind][0])
                tile = np.where(seen[..., None], (*rgb, 0.75), (*rgb, 0.12))
                image[rows, cols] = tile * tile[..., 3:] + image[rows, cols] * (1 - tile[..., 3:])
                image[rows, cols, 3] = 1.0
                outlines.append((kc, qc, kind))
                ax.text((kc + 0.5) * chunk, (qc + 0.5) * chunk, f"({i}, {j})", ha="center", va="center",
                        fontsize=9, fontweight="bold")
        ax.imshow(image, origin="upper", extent=(0, n, n, 0), interpolation="nearest")
        for kc, qc, kind in outlines:
            ax.add_patch(plt.Rectangle((kc * chunk, qc * chunk), chunk, chunk, fill=False, lw=1.4,
                                       edgecolor=kinds[kind][0], hatch="//" if kind == "none" else None))
        for b in range(1, n_chunks):
            ax.axhline(b * chunk, color="0.6", lw=0.6)
            ax.axvline(b * chunk, color="0.6", lw=0.6)
        ticks = [(c + 0.5) * chunk for c in range(n_chunks)]
        labels = [f"chunk {c}\n(rank {owner[c]})" for c in range(n_chunks)]
        ax.set_xticks(ticks, labels, fontsize=7)
        ax.set_yticks(ticks, labels, fontsize=7)
        ax.tick_params(length=0)
        ax.set_title(f"step {step}: rank {rank} holds the block of rank {source}", fontsize=9)
    axes[0][0].set_ylabel(f"queries (rank {rank}'s chunks: the marked rows)", fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=c, alpha=0.6, edgecolor=c, hatch="//" if k == "none" else None)
               for k, (c, _) in kinds.items()]
    fig.legend(handles, [label for _, label in kinds.values()], loc="lower center", ncol=3, fontsize=8,
               frameon=False)
    fig.suptitle(f"layout={layout!r}, {world_size} ranks, causal; keys across, queries down, grey: what a query "
                 f"may see\n(i, j) = (q_chunk, kv_chunk): the chunks' places in the two shards", fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def plot_merge_shares(n_keys=12, split=5, seed=0):
    """Part 3 in pictures: one row's softmax over two blocks of keys, each block's own softmax, and the whole
    row's, which is each block's scaled by that block's share of the row's sum."""
    scores = np.random.default_rng(seed).normal(0.0, 0.8, n_keys)
    e = np.exp(scores - scores.max())
    blocks = {"a": slice(0, split), "b": slice(split, n_keys)}
    colours = {"a": "tab:blue", "b": "tab:red"}
    share = {name: e[s].sum() / e.sum() for name, s in blocks.items()}
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.3), sharey=True)
    for ax, name in zip(axes[:2], blocks):
        s = blocks[name]
        keys = np.arange(n_keys)[s]
        ax.bar(keys, e[s] / e[s].sum(), color=colours[name], alpha=0.8)
        ax.set_title(f"block {name} alone: a softmax over its {len(keys)} keys (sums to 1)\n"
                     f"its O is the average of its V rows with these weights", fontsize=8)
    for name, s in blocks.items():
        axes[2].bar(np.arange(n_keys)[s], e[s] / e.sum(), color=colours[name], alpha=0.8,
                    label=f"block {name}: its own weights x {share[name]:.2f}")
    axes[2].set_title("the whole row: a softmax over all the keys\n"
                      "each block's weights, scaled by its share of the row's sum", fontsize=8)
    axes[2].legend(fontsize=8, loc="upper right")
    for ax in axes:
        ax.set_xticks(range(n_keys))
        ax.set_xlabel("key", fontsize=8)
        ax.set_xlim(-0.7, n_keys - 0.3)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("softmax weight")
    fig.tight_layout()
    return fig


def long_context_table(fast_tflops, layers=32, q_heads=32, kv_heads=8, head_dim=128, elem_bytes=2,
                       gpu_bytes=80 * 2**30):
    """Lines of text: for 128k to 1M tokens of one sequence, Llama 3 8B's attention: what a layer's Q, K, V and O
    take, what 32 layers' K and V take, and the causal forward's time at ``fast_tflops``."""
    lines = [f"{'tokens':>9s} {'Q,K,V,O a layer':>16s} {'K,V of 32 layers':>17s} {'of an 80 GiB GPU':>17s} "
             f"{'forward, 32 layers':>19s}"]
    for n in (131072, 262144, 524288, 1048576):
        per_layer = (2 * q_heads + 2 * kv_heads) * n * head_dim * elem_bytes
        kv_all = 2 * kv_heads * n * head_dim * elem_bytes * layers
        flops = 4 * q_heads * n * n * head_dim / 2 * layers  # causal: half the 4 N^2 D a head
        lines.append(f"{n // 1024:>8d}k {per_layer / 2**30:>13.1f} GiB {kv_all / 2**30:>14.1f} GiB "
                     f"{kv_all / gpu_bytes:>16.0%} {flops / (fast_tflops * 1e12):>17.1f} s")
    return lines


def bytes_per_step_table(n_tokens=1048576, world_size=8, head_dim=128, q_heads=32, elem_bytes=2):
    """Lines of text: the K and V bytes one rank sends at each step of the ring, MHA against GQA and MQA."""
    n_local = n_tokens // world_size
    lines = [f"{n_tokens // 1024}k tokens on {world_size} ranks ({n_local // 1024}k a rank), head_dim {head_dim}, "
             f"bf16, one layer:"]
    for name, kv_heads in (("MHA 32:32", 32), ("GQA 32:8", 8), ("MQA 32:1", 1)):
        sent = 2 * kv_heads * n_local * head_dim * elem_bytes
        lines.append(f"  {name:10s} K and V a step: {sent / 2**20:7.0f} MiB   ({kv_heads / q_heads:.3g} of MHA's)")
    return lines


def overlap_table(fast_tflops, link_gb_s=450, world_size=8, q_heads=32, kv_heads=8, head_dim=128, elem_bytes=2):
    """Lines of text: one zigzag step of one layer (after the first), its attention at ``fast_tflops`` against
    moving its K and V over a link of ``link_gb_s`` GB/s, for 32k to 1M tokens on ``world_size`` ranks."""
    lines = [f"{world_size} ranks, zigzag, one layer, a step after the first; the link at {link_gb_s} GB/s, the "
             f"attention at {fast_tflops:.0f} TFLOP/s",
             f"{'tokens':>9s} {'chunk':>7s} {'attention':>11s} {'transfer':>10s} {'attention / transfer':>21s}"]
    for n in (32768, 131072, 524288, 1048576):
        chunk = n // (2 * world_size)
        flops = 2 * 4 * q_heads * chunk * chunk * head_dim  # two whole chunk pairs a step
        sent = 2 * kv_heads * 2 * chunk * head_dim * elem_bytes  # K and V of a shard: two chunks
        compute_ms, transfer_ms = flops / (fast_tflops * 1e12) * 1e3, sent / (link_gb_s * 1e9) * 1e3
        lines.append(f"{n // 1024:>8d}k {chunk:>7d} {compute_ms:>8.2f} ms {transfer_ms:>7.3f} ms "
                     f"{compute_ms / transfer_ms:>20.0f}x")
    return lines
