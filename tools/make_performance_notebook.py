import nbformat as nbf
nb = nbf.v4.new_notebook()
md = lambda s: nbf.v4.new_markdown_cell(s.strip())
code = lambda s: nbf.v4.new_code_cell(s.strip())
cells = []
cells.append(md(r"""
# 05 · Making it fast: measuring the kernel on an H200

Your kernel from notebook 04 is correct. Is it fast? This notebook answers with numbers measured
on an NVIDIA H200, side by side with PyTorch's own attention, in one run:

1. **Two numbers first**: how much arithmetic attention does, and how few bytes it must move.
   Their ratio says which of the GPU's two ceilings (matrix math or memory) limits us.
2. **The roofline** of the H200, and where each kernel lands on it.
3. **The measured curves**: TFLOP/s against sequence length for the course's kernels, cuDNN,
   FlashAttention-2 and naive PyTorch.
4. **Memory**: O(N) for FlashAttention against O(N²) for the naive version, until it runs out.
5. **What each optimisation bought**: tile shapes, warps and pipeline stages; then the
   separate fast kernel (`gqa_flash/fast_forward.py`).
6. A **live run** of the benchmark, when this machine has a GPU.

The measurements live in `notebooks/data/` (made by `python -m gqa_flash.bench` on the GPU), so
this notebook runs the same on a laptop: only section 6 needs a GPU.
"""))
cells.append(code(r"""
import matplotlib.pyplot as plt

import gqa_flash
from gqa_flash import perf_plots as pp

print(gqa_flash.describe())
bench = pp.read(pp.DATA_DIR / "h200_bench_forward_main_2026-12-02.csv")
memory = pp.read(pp.DATA_DIR / "h200_bench_memory_2026-12-02.csv")
explore = pp.read(pp.DATA_DIR / "h200_explore_forward_2026-12-02.csv")
r = bench[0]
print(f"measured {r['date']} on {r['gpu']} (driver {r['driver']}), torch {r['torch']}, triton {r['triton']}")
"""))
cells.append(md(r"""
## 1. FLOPs and bytes

Per query head, attention does two matrix products: $S = QK^\top$ ($N \times D$ by $D \times N$, so
$2N^2D$ FLOPs) and $O = PV$ (another $2N^2D$). With a batch of $B$ and $H_q$ query heads that is
$4BH_qN^2D$ FLOPs, and half of it under the causal mask (the kernel skips the upper triangle).
The exponentials and the online-softmax bookkeeping are $O(N^2)$ too, but run on slower units:
they are why nobody reaches the matrix ceiling exactly.

The fewest bytes it must move: read $Q$, $K$, $V$ once and write $O$ once. With GQA, $K$ and $V$
have only $H_{kv}$ heads. Everything else (the $N \times N$ scores!) stays on chip: that is
FlashAttention.
"""))
cells.append(code(r"""
for n in (1024, 4096, 16384):
    b, hq, hkv, d = 16384 // n, 32, 8, 128
    flops = pp.attention_flops(b, hq, n, d, causal=True)
    bytes_ = pp.attention_min_bytes(b, hq, hkv, n, d)
    print(f"N={n:6d}: {flops / 1e12:6.2f} TFLOP, {bytes_ / 2**20:6.1f} MiB moved at least, "
          f"{flops / bytes_:6.0f} FLOP per byte")
ridge = pp.H200_MATMUL_TFLOPS / pp.H200_COPY_TBPS
print(f"H200 ridge point: {pp.H200_MATMUL_TFLOPS:.0f} TFLOP/s / {pp.H200_COPY_TBPS} TB/s = {ridge:.0f} FLOP per byte")
"""))
cells.append(md(r"""
The ratio (the *arithmetic intensity*) grows with $N$: at every length we care about it is far above
the H200's *ridge point*, where the time to do the math equals the time to move the bytes. So attention
is **compute-bound**: the goal is to keep the tensor cores busy, and memory traffic (as long as it
stays $O(N)$) is not the limit. The naive version is different: it writes and reads the whole
$N \times N$ matrix, which makes it memory-bound and slow.

## 2. The roofline

The two ceilings were measured on the same kind of machine (an 8192³ bf16 matrix product through
PyTorch, and a large device-to-device copy). A kernel can sit anywhere under the roof; the gap to
the roof is what is left to win.
"""))
cells.append(code(r"""
fig, ax = plt.subplots(figsize=(7, 4.5))
pp.plot_roofline(bench, ax)
ax.legend(fontsize=7, loc="lower right")
plt.show()
"""))
cells.append(md(r"""
## 3. Throughput against sequence length

Every launch processes 16k tokens (batch $= 16384 / N$), 32 query heads on 8 KV heads (Llama 3 8B's
ratio), bf16, causal. Each provider's output was checked against SDPA's before it was timed; times are
medians of `triton.testing.do_bench`.
"""))
cells.append(code(r"""
fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
for ax, d in zip(axes, (64, 128)):
    pp.plot_throughput(bench, ax, d)
handles, labels = axes[1].get_legend_handles_labels()
fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
plt.tight_layout(rect=(0, 0.1, 1, 1))
plt.show()
print(pp.ratio_table(bench))
"""))
cells.append(md(r"""
Read the table as "how fast, compared with PyTorch's default" (cuDNN's kernel on this GPU; 1.00 is a tie).

- The **graded kernel** (the one you wrote, plus the autotuner) reaches about 0.9× at head_dim 64 and
  0.82–0.84× at head_dim 128 for N ≥ 4096, and is 1.3–1.5× faster than PyTorch's own
  FlashAttention-2 backend everywhere.
- Short sequences are harder: with N = 1024 a launch has few query tiles per head, and the fixed costs
  (loading Q, the epilogue, the masked diagonal block) weigh more.
- cuDNN's kernel is written for Hopper by hand: warp-specialised (some warps only load, others only
  multiply), with two tiles in flight so that the exponentials of one overlap the matrix products of
  the other. Triton 3.6 does not let us express that on Hopper, and that is most of the remaining gap.

## 4. Memory: O(N) against O(N²)
"""))
cells.append(code(r"""
fig, ax = plt.subplots(figsize=(7, 4.5))
pp.plot_memory(memory, ax)
ax.legend(fontsize=8, loc="upper left")
plt.show()
for r in memory:
    if r["provider"] in ("course_graded", "naive"):
        print(f"N={int(r['seq_len']):6d} {r['provider']:14s} {r['peak_mem_mib']:>10s} MiB  {r['status']}")
"""))
cells.append(md(r"""
The course's kernel allocates only its outputs, O and the LSE: the line grows as $N$. The naive version
materialises the $32 \times N \times N$ scores in fp32 (and their softmax): 65 GiB at $N$ = 16k, and
out of the H200's 141 GB at 32k. (At 32k and beyond the course kernel's first call also includes the
autotuner's trial buffers, so those three points sit above the line; the benchmark now warms up first.)

## 5. What each optimisation bought

### Tiles, warps and pipeline stages

The same graded kernel, with different compile-time tile shapes (`BLOCK_M x BLOCK_N`), warps per program
(`w`) and software-pipelining depth (`s`). The seed's choice was 128×64 with 4 warps.
"""))
cells.append(code(r"""
def best_and_seed(rows, d, n):
    here = [r for r in rows if int(r["d"]) == d and int(r["n"]) == n and r["provider"].startswith("graded_")]
    best = max(here, key=lambda r: float(r["ratio"]))
    seed = next(r for r in here if r["provider"] == "graded_128x64_w4_s3")
    return best, seed

print(f"{'D':>4s} {'N':>6s}  {'seed 128x64 w4':>15s}  {'best config':>22s}")
for d in (64, 128):
    for n in (1024, 4096, 16384):
        best, seed = best_and_seed(explore, d, n)
        print(f"{d:4d} {n:6d}  {float(seed['ratio']):14.2f}x  {best['provider'][7:]:>16s} {float(best['ratio']):4.2f}x")
"""))
cells.append(md(r"""
Two lessons. First, **8 warps** for a 128-row tile: with 4 warps each warp holds 32 rows of a
128×128 fp32 accumulator in registers and the kernel spills or stalls (0.44–0.53× at head_dim 128);
8 warps halve that. Second, the best tile depends on head_dim and N, which is why the graded
kernel's launcher hands a short list of candidates to `triton.autotune` on a GPU.

### The fast kernel

`gqa_flash/fast_forward.py` keeps the maths of the graded kernel and changes how it runs on the GPU:
tensor descriptors (the Hopper copy engine moves whole tiles, and pads ragged tails by itself), a launch
order that runs the query heads of one KV group back to back (their K/V tiles come from L2) with the
heaviest causal tiles first, one fused multiply-add per score, and 128×128 tiles.
"""))
cells.append(code(r"""
print(f"{'D':>4s} {'N':>6s} {'graded':>8s} {'fast':>8s}")
cells_ = {(r["provider"], int(r["head_dim"]), int(r["seq_len"])): float(r["ratio_to_sdpa_default"]) for r in bench}
for d in (64, 128):
    for n in (1024, 2048, 4096, 8192, 16384):
        print(f"{d:4d} {n:6d} {cells_[('course_graded', d, n)]:8.2f} {cells_[('course_fast', d, n)]:8.2f}")
"""))
cells.append(md(r"""
The fast kernel wins at long sequences (0.96× at head_dim 64, 0.87× at 128 for N = 16k) and loses at
short ones, where its bigger tiles leave too few programs to fill 132 SMs. Neither reaches cuDNN: the
course's target of 1.0× is not met yet, and the gap is the Hopper-specific scheduling described in
section 3.

## 6. A live run

With a GPU, this cell benchmarks the course's kernels against SDPA on one shape right here. On a CPU
there is nothing to time: the interpreter measures Python, not the kernel.
"""))
cells.append(code(r"""
from gqa_flash import runtime

if runtime.DEVICE.type == "cuda":
    from pathlib import Path
    from gqa_flash import bench as gb

    rows = gb.run([gb.Case(runtime.default_dtype(), True, 128, 4096)],
                  ["course_graded", "course_fast", "sdpa_default", "sdpa_flash"], Path("/tmp/live_bench.csv"))
else:
    print("No GPU here: the numbers above are the H200's. Run `python -m gqa_flash.bench` on a GPU for your own.")
"""))
cells.append(md(r"""
## Check

The benchmark checks every provider's output against SDPA before it times it. This cell confirms that
every timed row of the committed run was checked and correct.
"""))
cells.append(code(r"""
# NBVAL_CHECK_OUTPUT
wrong = [r for r in bench if r["status"] == "wrong result"]
course = [r for r in bench if r["provider"].startswith("course_")]
print("PASS: every course-kernel row was checked against SDPA before timing"
      if course and not wrong and all(r["status"] == "ok" for r in course) else "FAIL: a timed row was not correct")
"""))
nb["cells"] = cells
nb["metadata"]["kernelspec"] = {"display_name": "Python 3 (gqa-flash)", "language": "python", "name": "python3"}
nbf.write(nb, "/work/main/notebooks/05_performance.ipynb")
