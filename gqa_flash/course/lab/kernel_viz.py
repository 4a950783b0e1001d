"""The kernel's pictures (notebooks 04 and 05): the launch grid, which tiles a program visits,
the two query sub-tiles of the fast kernel, the Gluon kernel's loader and consumers on an
idealised clock, and where a kernel's output is wrong.

:func:`plot_error_map` and :func:`plot_bug_gallery` draw what ``checks.forward_error_map()``
and ``checks.simulated_error_map()`` measured; the rest is computed from the definitions.
The conventions are ``viz``'s: rows are queries, columns are keys.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch, Rectangle

from gqa_flash.course.lab.viz import VISITED, MASKED, SKIPPED, GOOD, KV_COLORS, tile_kinds, plot_tile_schedule


# --------------------------------------------------------------------------
# 04: the Triton kernel (05: the fast kernel's sub-tiles)
# --------------------------------------------------------------------------


def plot_launch_grid(seq_len=200, block_m=64, batch=2, n_q_heads=4, n_kv_heads=2):
    """One program per (query tile, batch x head); its colour is the KV head it reads."""
    n_qt = -(-seq_len // block_m)
    rows = batch * n_q_heads
    group = n_q_heads // n_kv_heads
    fig, ax = plt.subplots(figsize=(2.2 + 1.6 * n_qt, 0.55 * rows + 1.6))
    for pid1 in range(rows):
        b, h = pid1 // n_q_heads, pid1 % n_q_heads
        kv = h // group
        for pid0 in range(n_qt):
            ax.add_patch(Rectangle((pid0, pid1), 0.94, 0.9, facecolor=KV_COLORS[kv % 10], alpha=0.35 + 0.15 * b,
                                   edgecolor="k"))
            rows_txt = f"rows {pid0 * block_m}-{min((pid0 + 1) * block_m, seq_len) - 1}"
            ax.text(pid0 + 0.47, pid1 + 0.45, f"b{b} h{h} -> kv{kv}\n{rows_txt}", ha="center", va="center",
                    fontsize=7.5)
    ax.set_xlim(-0.05, n_qt)
    ax.set_ylim(rows, -0.05)
    ax.set_xticks(np.arange(n_qt) + 0.47)
    ax.set_xticklabels([str(i) for i in range(n_qt)])
    ax.set_yticks(np.arange(rows) + 0.45)
    ax.set_yticklabels([str(i) for i in range(rows)])
    ax.set_xlabel("tl.program_id(0): query tile")
    ax.set_ylabel("tl.program_id(1) = b * n_q_heads + h")
    ax.set_title(f"grid = (cdiv({seq_len}, {block_m}), {batch} x {n_q_heads}) = ({n_qt}, {rows}) programs; "
                 f"colour = KV head ({n_q_heads} query heads on {n_kv_heads})", fontsize=10)
    fig.tight_layout()
    return fig


def plot_kernel_schedule(seq_len=83, block_m=32, block_n=16, highlight=2, ask=True):
    """The kernel's two phases for every query tile: phase 1 (no mask), phase 2 (masked diagonal), skipped.

    With ``ask=True`` (notebook 04) it is a question: the tiles are blank and the rows of the
    ``highlight`` query tiles (one, or a tuple) hold a "?" in each key block, which Part 3's
    check answers. ``ask=False`` draws the answer: every tile in its phase's colour, and the
    highlighted tile's walk numbered.
    """
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 5.2))
    if ask:
        rows = np.atleast_1d(highlight).tolist()
        which = f"query tile {rows[0]}" if len(rows) == 1 else \
            "query tiles " + ", ".join(map(str, rows[:-1])) + f" and {rows[-1]}"
        titles = (f"causal: which key blocks does {which} visit?" if len(rows) == 1 else
                  f"causal: which key blocks do {which} visit?",
                  "no causal mask: and here?")
        head = (f"N = {seq_len}, BLOCK_M = {block_m}, BLOCK_N = {block_n}. Colour each ?: blue (phase 1, no mask), "
                f"orange (phase 2, mask_scores) or grey (never loaded)")
    else:
        titles = (f"causal, BLOCK_M = {block_m}, BLOCK_N = {block_n}",
                  "no causal mask: only the ragged last key block is masked")
        head = (f"N = {seq_len}: blue = phase 1 (no mask), orange = phase 2 (mask_scores), grey = never loaded; "
                f"numbers: query tile {highlight}'s walk")
    plot_tile_schedule(seq_len, block_m, block_n, True, highlight, ax=a, title=titles[0], ask=ask)
    plot_tile_schedule(seq_len, block_m, block_n, False, highlight, ax=b, title=titles[1], ask=ask)
    fig.suptitle(head, fontsize=10)
    fig.tight_layout()
    return fig


ALONE = "#C44E52"  # a diagonal tile the second query sub-tile finishes alone


def plot_pingpong(block_m=32, block_n=8, q_block=1):
    """The fast kernel's two query sub-tiles: which key tiles each half visits, and why the split helps."""
    half = block_m // 2
    q0 = q_block * block_m
    n_keys = q0 + block_m
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.6), gridspec_kw=dict(width_ratios=[1, 1.1]))
    # Left: one program's rows (two halves) against the key tiles it walks, numbered in loop order:
    # a number shared by both halves is one K/V tile load used twice. On the first half's diagonal only
    # the first half needs the mask: every row of the second half comes after those keys.
    for step, k0 in enumerate(range(0, n_keys, block_n), start=1):
        for h in (0, 1):
            rows0 = q0 + h * half
            if k0 > rows0 + half - 1:
                color = SKIPPED  # every key of this tile is in this half's future
            elif k0 + block_n - 1 < rows0:
                color = VISITED  # every key of this tile is in this half's past
            elif h == 0:
                color = MASKED
            else:
                color = ALONE
            a.add_patch(Rectangle((k0, rows0), block_n, half, facecolor=color, edgecolor="white", lw=1.5))
            if color != SKIPPED:
                a.text(k0 + block_n / 2, rows0 + half / 2, str(step), ha="center", va="center", color="white",
                       fontsize=9, weight="bold")
    a.plot([q0, n_keys], [q0, n_keys], color="k", lw=1, ls="--")
    a.axhline(q0 + half, color="k", lw=2)
    a.set_xlim(0, n_keys)
    a.set_ylim(q0 + block_m, q0)
    a.set_yticks([q0 + half / 2, q0 + 1.5 * half], ["first half\n(Q0)", "second half\n(Q1)"])
    a.set_xlabel("keys")
    a.set_title(f"one program: query rows {q0}-{q0 + block_m - 1} as two halves, key tiles of {block_n}",
                fontsize=10)
    a.legend(handles=[Patch(color=VISITED, label="no mask"),
                      Patch(color=MASKED, label="first half, masked"),
                      Patch(color=ALONE, label="second half alone, masked"),
                      Patch(color=SKIPPED, label="skipped")],
             loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=4, fontsize=8, frameon=False)
    # Right: an idealised timeline of one key tile's work for both halves, on the two kinds of units.
    serial = [(0, "S0", 0), (1, "exp 0", 1), (0, "P0 V", 2), (0, "S1", 3), (1, "exp 1", 4), (0, "P1 V", 5)]
    paired = [(0, "S0", 0), (0, "S1", 1), (1, "exp 0", 1), (0, "P0 V", 2), (1, "exp 1", 2), (0, "P1 V", 3)]
    rows = ((3.2, serial, "one half after\nthe other: 6"), (0.4, paired, "both halves\ninterleaved: 4"))
    for y_off, blocks, name in rows:
        for unit, text, t in blocks:
            y = y_off + (1.1 if unit == 0 else 0)
            b.add_patch(Rectangle((t, y), 1, 1, facecolor=VISITED if unit == 0 else MASKED, edgecolor="white", lw=2))
            b.text(t + 0.5, y + 0.5, text, ha="center", va="center", color="white", fontsize=9, weight="bold")
        b.text(-0.2, y_off + 1.05, name, ha="right", va="center", fontsize=9)
    b.set_xlim(-1.9, 6.1)
    b.set_ylim(0.2, 5.5)
    b.set_yticks([])
    b.set_xticks(range(7))
    b.set_xlabel("time in steps (idealised: the hardware decides the real overlap)")
    b.set_title("per key tile: the exponentials of one half hide behind the other's products", fontsize=10)
    b.legend(handles=[Patch(color=VISITED, label="tensor cores: S = Q K^T, O += P V"),
                      Patch(color=MASKED, label="exp2 units: the softmax")],
             loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize=8, frameon=False)
    for side in ("top", "right", "left"):
        b.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------
# 05: the Gluon kernel on Hopper (gqa_flash/fast/hopper_forward.py): who waits for whom
# --------------------------------------------------------------------------

LOADER_K, LOADER_V, WAITING = "#55A868", "#8172B2", "#C44E52"


def _ring_schedule(split, n_blocks, load, product, softmax, rescale):
    """An idealised schedule of one tile of ``hopper_forward.py``: a loader and two consumers, their
    waits on the rings' barriers, and one tensor-core queue that runs products in the order issued.
    ``split``: K in 3 slots freed after its score product, V in 2 freed after P V; otherwise K and V
    share 2 slots freed after P V. Returns bars by row: (start, end, label, kind)."""
    k_slots = 3 if split else 2
    times, bars = {}, {row: [] for row in ("K", "V", "c0", "c1", "tc")}

    def consumer(c):
        for j in range(-1, n_blocks):  # step j: S of block j+1 and P V of block j (j = -1: block 0's S alone)
            if j + 1 < n_blocks:
                yield "need", [("K", j + 1)]
                yield "tc", ("S", j + 1, c), f"S{j + 1}"
            if j >= 0:
                yield "need", [("V", j)]
                yield "tc", ("PV", j, c), f"PV{j}"
            if j + 1 < n_blocks:
                yield "need", [("S", j + 1, c)]
                if split:
                    times["Kfree", j + 1, c] = clock[c]
                yield "busy", softmax, f"softmax {j + 1}", "softmax"
            if j >= 0:
                yield "need", [("PV", j, c)]
                times["Vfree", j, c] = clock[c]
                if not split:
                    times["Kfree", j, c] = clock[c]
                if j + 1 < n_blocks:
                    yield "busy", rescale, "", "rescale"

    def loader():
        for b in range(n_blocks):
            for name, slots in (("K", k_slots), ("V", 2)):
                if b >= slots:  # the slot's previous tile must be released by both consumers
                    yield "need", [(name + "free", b - slots, 0), (name + "free", b - slots, 1)]
                yield "copy", (name, b), f"{name}{b}"

    clock = {0: 0.0, 1: 0.0, "L": 0.0}
    agents = {0: consumer(0), 1: consumer(1), "L": loader()}
    cmd = {a: next(g) for a, g in agents.items()}
    tc_free = 0.0
    while cmd:  # run the agent whose next action comes first: products reach the queue in time order
        ready = {a: max([clock[a]] + [times[k] for k in c[1]]) if c[0] == "need" else clock[a]
                 for a, c in cmd.items() if c[0] != "need" or all(k in times for k in c[1])}
        a = min(ready, key=lambda x: (ready[x], str(x)))
        at, (kind, what, *rest) = ready[a], cmd[a]
        if kind == "need" and at > clock[a] and a != "L":
            load_wait = any(k[0] in ("K", "V") for k in what)
            bars[f"c{a}"].append((clock[a], at, f"wait {what[0][0]}{what[0][1]}" if load_wait else "", "wait_load"
                                  if load_wait else "wait"))
        elif kind == "tc":
            start = max(at, tc_free)
            tc_free = times[what] = start + product
            bars["tc"].append((start, tc_free, rest[0], f"c{a}"))
        elif kind == "busy":
            bars[f"c{a}"].append((at, at + what, *rest))
            at += what
        elif kind == "copy":
            times[what] = at + load
            bars[what[0]].append((at, at + load, rest[0], what[1]))
        clock[a] = at
        try:
            cmd[a] = next(agents[a])
        except StopIteration:
            del cmd[a]
    frees = {(k[0][0], k[1]): max(times[k[0], k[1], 0], times[k[0], k[1], 1])
             for k in times if isinstance(k, tuple) and k[0] in ("Kfree", "Vfree") and k[2] == 0}
    return bars, frees


def plot_hopper_timeline(n_blocks=6, load=1.0, product=0.5, softmax=1.2, rescale=0.25):
    """The Gluon kernel's loader and consumers on an idealised clock, twice: K's slot freed after P V
    (as first built), and freed after its score product (as kept). Durations are made up."""
    fig, axes = plt.subplots(2, 1, figsize=(13, 8.6), sharex=True)
    titles = ("K released after P V (K and V share 2 slots): block j+2's copies start only when both consumers "
              "are done with block j's P V,\nso at every step the consumers wait for K and the tensor cores stand idle",
              "K released after its score product S (K in 3 slots, V in 2): each K lands before a consumer asks "
              "for it,\nso in the loop the tensor cores never wait, and each softmax runs under the other products")
    end = 0.0
    for ax, split, title in zip(axes, (False, True), titles):
        bars, frees = _ring_schedule(split, n_blocks, load, product, softmax, rescale)
        k_slots = 3 if split else 2
        lanes = [("K", s) for s in range(k_slots)] + [("V", s) for s in range(2)]
        y = {lane: 0.5 * i for i, lane in enumerate(lanes)}
        top = 0.5 * len(lanes) + 0.3
        y.update({"c0": top, "c1": top + 1.1, "tc": top + 2.2})
        for name in ("K", "V"):  # a slot: its copy in flight, then the tile held until both consumers free it
            for start, stop, label, b in bars[name]:
                row = y[name, b % (k_slots if name == "K" else 2)]
                color = LOADER_K if name == "K" else LOADER_V
                ax.add_patch(Rectangle((start, row), stop - start, 0.42, facecolor=color, edgecolor="white"))
                ax.text((start + stop) / 2, row + 0.21, f"TMA {label}", ha="center", va="center", color="white",
                        fontsize=7.5, weight="bold")
                freed = frees.get((name, b))
                if freed is not None:
                    ax.add_patch(Rectangle((stop, row + 0.13), freed - stop, 0.16, facecolor=color, alpha=0.3))
                    ax.plot([freed], [row + 0.21], marker="|", color="k", ms=9)
        for c in (0, 1):
            for start, stop, label, kind in bars[f"c{c}"]:
                style = dict(softmax=dict(facecolor=MASKED), rescale=dict(facecolor="#937860"),
                             wait=dict(facecolor="white", edgecolor="#999999", hatch="///", lw=0),
                             wait_load=dict(facecolor="white", edgecolor=WAITING, hatch="///", lw=0))[kind]
                ax.add_patch(Rectangle((start, y[f"c{c}"]), stop - start, 0.9, **style))
                if label and stop - start > 0.45:
                    ax.text((start + stop) / 2, y[f"c{c}"] + 0.45, label, ha="center", va="center", fontsize=8,
                            color=WAITING if kind == "wait_load" else ("white" if kind == "softmax" else "k"),
                            weight="bold", bbox=dict(facecolor="white", lw=0, pad=1) if kind == "wait_load" else None)
        busy = sorted(bars["tc"])
        for (start, stop, label, who), nxt in zip(busy, busy[1:] + [None]):
            ax.add_patch(Rectangle((start, y["tc"]), stop - start, 0.9, facecolor=VISITED, edgecolor="white",
                                   alpha=1.0 if who == "c0" else 0.6))
            ax.text((start + stop) / 2, y["tc"] + 0.45, label, ha="center", va="center", color="white", fontsize=7.5,
                    weight="bold")
            if nxt is not None and nxt[0] - stop > 0.05:  # the tensor cores idle
                ax.add_patch(Rectangle((stop, y["tc"]), nxt[0] - stop, 0.9, facecolor=WAITING, alpha=0.25, lw=0))
        end = max(end, busy[-1][1])
        ax.set_yticks([y[lane] + 0.21 for lane in lanes] + [y["c0"] + 0.45, y["c1"] + 0.45, y["tc"] + 0.45])
        ax.set_yticklabels([f"loader: {name} slot {s}" for name, s in lanes] +
                           ["consumer 0 (4 warps)", "consumer 1 (4 warps)", "tensor cores (wgmma)"], fontsize=8.5)
        ax.set_ylim(y["tc"] + 1.0, -0.15)
        ax.set_title(title, fontsize=9.5, loc="left")
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[1].set_xlim(0, end + 0.3)
    axes[1].set_xlabel(f"time (idealised: made-up durations, a product {product}, a softmax {softmax}, "
                       f"a rescale {rescale}, a TMA copy {load}; one tile of {n_blocks} key blocks)")
    fig.legend(handles=[Patch(color=LOADER_K, label="TMA copy of K in flight (faint: in its slot until freed, |)"),
                        Patch(color=LOADER_V, label="TMA copy of V in flight (faint: likewise)"),
                        Patch(color=VISITED, label="S = Q K^T or P V: consumer 0 (dark), 1 (light)"),
                        Patch(color=MASKED, label="softmax (exp2)"), Patch(color="#937860", label="rescale"),
                        Patch(facecolor="white", edgecolor=WAITING, hatch="///", label="waiting for a TMA copy"),
                        Patch(facecolor="white", edgecolor="#999999", hatch="///", label="waiting for a product"),
                        Patch(color=WAITING, alpha=0.25, label="tensor cores idle")],
               loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def _error_image(ax, err, tol, kinds, title, title_color="black"):
    cmap = plt.get_cmap("Reds").copy()
    cmap.set_under(GOOD)
    cmap.set_bad("#000000")
    values = np.where(np.isfinite(err), np.log10(np.maximum(err, 1e-30)), np.nan)
    vmin, vmax = math.log10(tol), 0.5
    im = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    n_qb, n_kb = err.shape
    for qb in range(n_qb):
        for kb in range(n_kb):
            if kinds is not None and kinds[qb, kb] == 0 and err[qb, kb] <= tol:
                ax.add_patch(Rectangle((kb - 0.5, qb - 0.5), 1, 1, facecolor=SKIPPED, edgecolor="white"))
            elif kinds is not None and kinds[qb, kb] == 2:
                ax.add_patch(Rectangle((kb - 0.46, qb - 0.46), 0.92, 0.92, fill=False, edgecolor=MASKED, lw=1.5))
            if not np.isfinite(err[qb, kb]):
                ax.text(kb, qb, "NaN", ha="center", va="center", color="white", fontsize=7)
    ax.set_xticks(range(n_kb))
    ax.set_yticks(range(n_qb))
    ax.set_xlabel("key block")
    ax.set_ylabel("query block")
    ax.set_title(title, fontsize=9, color=title_color)
    return im


def plot_error_map(emap, heads=None):
    """Your kernel's error per (query block, key block), one panel per query head.

    A cell is the largest error, over the block's rows, in the probability the
    rows put on that key block. Green: right. Red: wrong (darker is worse);
    black: NaN. Grey: a tile the causal kernel skips (and nothing leaked there).
    An orange frame marks a masked (diagonal) tile. A panel's title says which
    KV head the query head should read and which one it did read.
    """
    if emap.err is None:
        return _message_figure("No error map: the kernel did not run.\n" + (emap.message or ""))
    heads = range(emap.err.shape[0]) if heads is None else heads
    heads = list(heads)
    cols = min(4, len(heads))
    rows = -(-len(heads) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols + 1, 2.4 * rows + 0.8), squeeze=False,
                             constrained_layout=True)
    kinds = _block_kinds(emap)
    err = emap.err.numpy()
    im = None
    for ax, h in zip(axes.flat, heads):
        read, want = emap.kv_read[h], emap.kv_expected[h]
        ok = read == want
        read_txt = "?" if read is None else str(read)
        im = _error_image(ax, err[h], emap.tol, kinds, f"q head {h}: KV head {want}, read {read_txt}",
                          "black" if ok else "#C44E52")
    for ax in list(axes.flat)[len(heads):]:
        ax.axis("off")
    fig.colorbar(im, ax=axes, fraction=0.03, label="log10 of the largest error")
    worst = float(np.nan_to_num(err, nan=np.inf).max())
    verdict = "all right" if worst <= emap.tol and all(r == w for r, w in zip(emap.kv_read, emap.kv_expected)) \
        else "wrong where red"
    fig.suptitle(f"Error per (query block, key block); N = {emap.seq_len}, BLOCK_M = {emap.block_m}, "
                 f"BLOCK_N = {emap.block_n}: {verdict}", fontsize=10)
    return fig


def _message_figure(text: str):
    """A figure that only says why there is nothing to draw."""
    fig, ax = plt.subplots(figsize=(8, 1.2))
    ax.axis("off")
    ax.text(0, 0.5, text, fontsize=9, va="center", family="monospace")
    return fig


def _block_kinds(emap):
    """Kinds of (query block of BLOCK_M rows, key block of BLOCK_N keys), the grid of the error map."""
    return tile_kinds(emap.seq_len, emap.block_m, emap.block_n, emap.causal)


def plot_bug_gallery(maps: dict, head=1):
    """One query head's error map for each of several known bugs (from ``checks.simulated_error_map``)."""
    missing = next((emap for emap in maps.values() if emap.err is None), None)
    if missing is not None:  # no stored answers: say so, as plot_error_map does for a kernel that did not run
        return _message_figure("No gallery: " + (missing.message or "no error map"))
    fig, axes = plt.subplots(1, len(maps), figsize=(2.9 * len(maps) + 1, 3.2), squeeze=False,
                             constrained_layout=True)
    im = None
    for ax, (name, emap) in zip(axes.flat, maps.items()):
        kinds = _block_kinds(emap)
        read = emap.kv_read[head]
        title = f"{name}\nq head {head}: KV head {emap.kv_expected[head]}, read {'?' if read is None else read}"
        im = _error_image(ax, emap.err[head].numpy(), emap.tol, kinds, title)
    fig.colorbar(im, ax=axes, fraction=0.02, label="log10 of the largest error")
    first = next(iter(maps.values()))
    fig.suptitle(f"N = {first.seq_len}, BLOCK_M = {first.block_m}, BLOCK_N = {first.block_n}", fontsize=9)
    return fig


__all__ = ["plot_launch_grid", "plot_kernel_schedule", "plot_pingpong", "plot_hopper_timeline", "plot_error_map",
           "plot_bug_gallery"]
