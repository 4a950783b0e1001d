"""Pictures of the measured performance (notebook 05): read the benchmark CSVs, draw them.

The CSVs come from ``python -m gqa_flash.course.lab.bench`` on a GPU (bench/forward_sweep.sh);
the runs are committed under ``notebooks/data`` so that students without a GPU
see them too. ``gqa_flash.course.lab.results`` finds each by topic through
``notebooks/data/INDEX.csv``, and bench/RESULTS.md discusses them. Every picture's
title names the GPU its rows were measured on (:func:`gpu_of`, :func:`gpu`).

What a plot shows depends only on its arguments (the rows, and the ceilings
that :func:`read_ceilings` returns), never on which notebook cells ran before:
no function here changes the module's state.
"""

from __future__ import annotations

import csv
import math
from typing import NamedTuple

from gqa_flash.course import layout
from gqa_flash.course.lab import results

DATA_DIR = layout.DATA_DIR


class Ceilings(NamedTuple):
    """The roofline's two ceilings: a bf16 matrix product's TFLOP/s and a copy's TB/s (read + written)."""

    matmul_tflops: float
    copy_tbps: float


def read_ceilings(path) -> Ceilings:
    """The ceilings measured by ``python -m gqa_flash.course.lab.bench --ceilings`` (a CSV of one row)."""
    row = read(path)[0]
    return Ceilings(float(row["matmul_bf16_tflops"]), float(row["copy_tbps"]))


STYLE = {
    "course_fast": dict(color="tab:red", marker="o", label="course: fast kernel"),
    "course_graded": dict(color="tab:orange", marker="s", label="course: graded kernel (autotuned)"),
    "sdpa_default": dict(color="black", marker="^", label="SDPA default (cuDNN)"),
    "sdpa_cudnn": dict(color="tab:gray", marker="v", label="SDPA cuDNN backend", linestyle=":"),
    "sdpa_flash": dict(color="tab:blue", marker="D", label="SDPA FlashAttention-2 backend"),
    "flex": dict(color="tab:green", marker="x", label="FlexAttention"),
    "naive": dict(color="tab:purple", marker=".", label="naive PyTorch"),
}


def read(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def gpu_of(rows, gpu=None) -> str:
    """The GPU that measured ``rows``: their ``gpu`` column, which must name one GPU; ``gpu`` where the
    rows have no such column (an exploration CSV: :func:`gpu` reads the index instead)."""
    named = {r["gpu"] for r in rows if r.get("gpu")}
    if gpu is not None:
        if named - {gpu}:
            raise ValueError(f"gpu={gpu!r}, but the rows were measured on {sorted(named)}")
        return gpu
    if len(named) != 1:
        raise ValueError(f"rows measured on {sorted(named) or 'no named GPU'}: a picture names one GPU; "
                         "pass gpu= (the topic's GPU, perf_plots.gpu(topic))")
    return named.pop()


def gpu(topic) -> str:
    """The GPU a topic was measured on: its rows' ``gpu`` column where its file has one, else the index's."""
    rows = results.load(topic)
    listed = results.entry(topic)["gpu"]
    return gpu_of(rows, listed) if isinstance(rows, list) else listed


def attention_flops(batch, q_heads, seq_len, head_dim, causal=True) -> float:
    """4 * B * Hq * N^2 * D: two products (S = QK^T, O = PV) of 2 * N^2 * D each; half of it when causal."""
    f = 4.0 * batch * q_heads * seq_len**2 * head_dim
    return f / 2 if causal else f


def attention_min_bytes(batch, q_heads, kv_heads, seq_len, head_dim, elem_bytes=2) -> float:
    """The fewest bytes a forward pass moves: read Q, K, V once, write O once (and the fp32 LSE)."""
    qo = 2 * batch * q_heads * seq_len * head_dim * elem_bytes
    kv = 2 * batch * kv_heads * seq_len * head_dim * elem_bytes
    return qo + kv + batch * q_heads * seq_len * 4


def attention_program_bytes(batch, q_heads, kv_heads, seq_len, head_dim, block_m, causal=True,
                            elem_bytes=2) -> float:
    """A model of the bytes a tiled forward pass reads and writes if no tile is found in a cache.

    One program per BLOCK_M query rows of one query head: it reads its Q tile, reads K and V up to
    its diagonal (all of them without the causal mask), and writes its O tile and LSE. K and V are
    read once per query tile, so per query head that is about N^2 * D / BLOCK_M numbers of K and V
    when causal (N / BLOCK_M programs, each reading half of K and half of V on average), against
    2 * N * D for reading them once (:func:`attention_min_bytes`). ``kv_heads`` does not enter: every
    program reads its own copy, whichever KV head it shares with others.
    """
    del kv_heads  # the model counts no sharing between programs; L2 is what shares
    tiles = math.ceil(seq_len / block_m)
    keys = sum(min(seq_len, (t + 1) * block_m) if causal else seq_len for t in range(tiles))
    per_head = (2 * keys * head_dim + 2 * seq_len * head_dim) * elem_bytes + seq_len * 4  # K, V; Q, O; LSE
    return batch * q_heads * per_head


def plot_throughput(rows, ax, head_dim, matmul_tflops, gpu=None):
    """TFLOP/s against N, one line per provider, for one head dim, under the matmul ceiling (TFLOP/s);
    the title names the rows' GPU (:func:`gpu_of`)."""
    gpu = gpu_of(rows, gpu)
    for provider, style in STYLE.items():
        pts = sorted(
            (int(r["seq_len"]), float(r["tflops"]))
            for r in rows
            if r["provider"] == provider and int(r["head_dim"]) == head_dim and r["status"] == "ok"
        )
        if pts:
            ax.plot(*zip(*pts), **style)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length N (16k tokens per launch)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"{gpu}: bf16, causal, GQA 32:8, head_dim {head_dim}", fontsize=10)
    ax.axhline(matmul_tflops, color="gray", linewidth=0.8, linestyle="--")
    ax.text(1024, matmul_tflops * 0.97, f"bf16 matmul ceiling ({matmul_tflops:.0f})", va="top", fontsize=8,
            color="gray")
    ax.set_ylim(0, matmul_tflops * 1.05)
    ax.grid(alpha=0.3)


def plot_memory(rows, ax, gpu=None):
    """Peak memory of one forward call against N (log-log), until naive attention runs out; the title
    names the GPU (the rows' ``gpu`` column, or ``gpu``: the memory sweep's CSV has none)."""
    gpu = gpu_of(rows, gpu)
    for provider in ("course_graded", "course_fast", "naive"):
        pts = sorted(
            (int(r["seq_len"]), float(r["peak_mem_mib"]))
            for r in rows
            if r["provider"] == provider and r["status"] == "ok" and not math.isnan(float(r["peak_mem_mib"]))
        )
        if pts:
            ax.plot(*zip(*pts), **STYLE[provider])
        oom = [int(r["seq_len"]) for r in rows if r["provider"] == provider and r["status"] != "ok"]
        if oom:
            ax.axvline(min(oom), color=STYLE[provider]["color"], linestyle=":", linewidth=1)
            ax.text(min(oom), ax.get_ylim()[1] if ax.get_ylim()[1] > 1 else 1e5, " naive: out of memory",
                    color=STYLE[provider]["color"], fontsize=8, va="top")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length N (batch 1, 32 query heads, 8 KV heads, head_dim 128)")
    ax.set_ylabel("peak memory of one call (MiB)")
    ax.set_title(f"{gpu}: O(N) against O(N^2)")
    ax.grid(alpha=0.3, which="both")


def plot_roofline(rows, ax, matmul_tflops, copy_tbps, reread=(), gpu=None):
    """The roofline of the measured ceilings (TFLOP/s, TB/s) and where each provider's runs land on it.

    Each run sits at the intensity of the *minimum* traffic (:func:`attention_min_bytes`), far right of
    the ridge by construction. ``reread`` adds points placed instead at the intensity of the
    per-program traffic model (:func:`attention_program_bytes`): (label, FLOP per byte, TFLOP/s) each.
    The title names the GPU of the rows (:func:`gpu_of`), or ``gpu`` (the ceilings' and the points').
    """
    gpu = gpu_of(rows, gpu)
    xs = [10 ** (i / 20) for i in range(0, 81)]  # 1 .. 10^4 FLOP/byte
    roof = [min(matmul_tflops, x * copy_tbps) for x in xs]
    ax.plot(xs, roof, color="gray", linewidth=2, label="roofline (measured ceilings)")
    for provider, style in STYLE.items():
        pts = []
        for r in rows:
            if r["provider"] != provider or r["status"] != "ok":
                continue
            b, hq, hkv, n, d = (int(r[c]) for c in ("batch", "q_heads", "kv_heads", "seq_len", "head_dim"))
            causal = r["causal"] == "True"
            intensity = attention_flops(b, hq, n, d, causal) / attention_min_bytes(b, hq, hkv, n, d)
            pts.append((intensity, float(r["tflops"])))
        if pts:
            ax.scatter(*zip(*pts), color=style["color"], marker=style["marker"], label=style["label"], s=18)
    offsets = ((-112, 4), (10, -26), (10, 10))  # where each point's note goes, in points: apart from the others
    for (label, intensity, tflops), color, offset in zip(reread, ("tab:brown", "tab:olive", "tab:cyan"), offsets):
        ax.scatter([intensity], [tflops], color=color, marker="*", s=160, edgecolor="black", linewidth=0.5,
                   label=label, zorder=3)
        ax.annotate(f"{tflops:.0f} TFLOP/s measured;\nroof here {min(matmul_tflops, intensity * copy_tbps):.0f}",
                    (intensity, tflops), xytext=offset, textcoords="offset points", fontsize=7)
    ridge = matmul_tflops / copy_tbps
    ax.axvline(ridge, color="gray", linestyle=":", linewidth=1)
    ax.text(ridge, 0.03, f" ridge: {ridge:.0f} FLOP/byte", fontsize=8, color="gray", transform=ax.get_xaxis_transform())
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"{gpu} roofline, each run placed at its minimum traffic")
    ax.grid(alpha=0.3, which="both")


def ratio_table(rows, providers=("course_graded", "course_fast", "sdpa_flash", "sdpa_cudnn"),
                column="ratio_to_sdpa_default") -> str:
    """Ratio to SDPA's default backend (or another column, e.g. "tflops"), by head dim and N, as a text table."""
    cells = {(r["provider"], int(r["head_dim"]), int(r["seq_len"])): r for r in rows}
    dims = sorted({int(r["head_dim"]) for r in rows})
    lens = sorted({int(r["seq_len"]) for r in rows})
    lines = [f"{'provider':15s} {'D':>4s} " + " ".join(f"{'N=' + str(n):>8s}" for n in lens)]
    for p in providers:
        for d in dims:
            vals = []
            for n in lens:
                r = cells.get((p, d, n))
                vals.append(f"{results.two(r[column]):>8s}" if r and r["status"] == "ok" else f"{'-':>8s}")
            lines.append(f"{p:15s} {d:4d} " + " ".join(vals))
    return "\n".join(lines)


def case_label(r) -> str:
    """A short name for a benchmark row's case: dtype, mask, heads and head dim."""
    heads = {"32": "MHA 32:32", "1": "MQA 32:1"}.get(r["kv_heads"], f"GQA 32:{r['kv_heads']}")
    mask = "causal" if r["causal"] == "True" else "non-causal"
    return f"{r['dtype']:8s} {mask:10s} {heads:9s} D={int(r['head_dim']):3d}"


def case_table(rows, providers=("course_graded", "course_fast", "sdpa_flash")) -> str:
    """Ratio to SDPA's default for every case of a sweep, one line per (case, N)."""
    keys = sorted({(case_label(r), int(r["seq_len"])) for r in rows})
    cells = {(case_label(r), int(r["seq_len"]), r["provider"]): r for r in rows}
    lines = [f"{'case':42s} {'N':>6s} {'SDPA TFLOP/s':>13s} " + " ".join(f"{p:>14s}" for p in providers)]
    for label, n in keys:
        base = cells.get((label, n, "sdpa_default"))
        vals = []
        for p in providers:
            r = cells.get((label, n, p))
            ok = r and r["status"] == "ok"
            vals.append(f"{results.two(r['ratio_to_sdpa_default']):>14s}" if ok else f"{'-':>14s}")
        tf = f"{float(base['tflops']):13.0f}" if base and base["status"] == "ok" else f"{'-':>13s}"
        lines.append(f"{label:42s} {n:6d} {tf} " + " ".join(vals))
    return "\n".join(lines)


def launch_read_minimum(row, elem_bytes=2) -> float:
    """The fewest bytes a forward launch must *read*: Q, K and V once (a row of topic launch_order_traffic)."""
    b, hq, hkv, n, d = (int(row[c]) for c in ("batch", "q_heads", "kv_heads", "seq_len", "head_dim"))
    return b * (hq + 2 * hkv) * n * d * elem_bytes


def plot_launch_order_traffic(measured, model, axes):
    """DRAM bytes read by two launch orders: ncu's count beside a model's, one panel per head dim.

    ``measured`` holds the rows of topic ``launch_order_traffic``; ``model`` maps (setting label, order,
    head_dim) to the model's bytes (None or empty: the measurement alone). Each panel's dotted line is Q, K and
    V read once (:func:`launch_read_minimum`).
    """
    dims = sorted({int(r["head_dim"]) for r in measured})
    settings = list(dict.fromkeys(label for label, _, _ in (model or {})))
    colors = ("tab:blue", "tab:orange", "tab:green")
    for ax, d in zip(axes, dims):
        rows = [r for r in measured if int(r["head_dim"]) == d]
        orders = [r["order"] for r in rows]
        series = [("measured (ncu, DRAM bytes read)", [float(r["dram_read_bytes"]) for r in rows], "black")]
        series += [(f"model, {label}", [model[(label, o, d)] for o in orders], color)
                   for label, color in zip(settings, colors)]
        width = 0.8 / len(series)
        for i, (label, values, color) in enumerate(series):
            xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(orders))]
            bars = ax.bar(xs, [v / 1e6 for v in values], width, label=label, color=color,
                          alpha=1.0 if i == 0 else 0.75)
            ax.bar_label(bars, fmt="%.0f", fontsize=7, padding=1)
        ax.axhline(launch_read_minimum(rows[0]) / 1e6, color="gray", linestyle=":", linewidth=1.2,
                   label="Q, K and V read once")
        ax.set_xticks(range(len(orders)), orders)
        ax.set_title(f"head_dim {d}")
        ax.set_ylabel("DRAM bytes read (MB)")
        ax.set_ylim(0, 1.15 * max(max(v for _, vs, _ in series for v in vs) / 1e6, 1))
        ax.grid(alpha=0.3, axis="y")
