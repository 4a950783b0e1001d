"""Write notebooks/05_performance.ipynb and its record in docs/performance.md (then run the notebook with the
solutions to store its outputs).

    .venv/bin/python tools/make_performance_notebook.py
    GQA_FLASH_IMPL=solutions .venv/bin/jupyter nbconvert --to notebook --execute --inplace \
        --ExecutePreprocessor.record_timing=False notebooks/05_performance.ipynb

(record_timing=False keeps nbconvert's timestamps out of the cells' metadata.) With ``--check`` it writes
nothing and fails when the notebook's cells or the record differ from what it would write.

The notebook is a lesson, readable on a laptop; the tables behind section 5 (every fixed tile, every step of
the Gluon kernel) are a lab's record, and go to the section of docs/performance.md between the markers of
tools/performance_notebook_record.py.

The measurements are files in notebooks/data/, listed by topic in notebooks/data/INDEX.csv (what, command,
date, GPU) and discussed in bench/RESULTS.md. This script and its notebook ask gqa_flash.course.lab.results for a
topic, never for a file name. The narrative's numbers are computed below from those files, each sentence
names its file, and asserts check the words around the numbers: a run that changes the story stops here.
"""

import sys
import textwrap
from pathlib import Path

import nbformat as nbf

import performance_notebook_fast as fast_section  # tools/: the fast kernel's changes and what they bought
import performance_notebook_hopper as hopper_section  # tools/: the Gluon kernel's subsection
import performance_notebook_phases as phases_section  # tools/: the two-phase causal loop's subsection
import performance_notebook_record as record  # tools/: the tables behind section 5, for docs/performance.md
import performance_notebook_traffic as traffic_section  # tools/: the launch-order exercise's cells
from performance_notebook_fast import explore_table
from gqa_flash.course.lab import perf_plots as pp
from gqa_flash.course.lab import results

# The topics this notebook reads (notebooks/data/INDEX.csv), in the order it reads them.
TOPICS = ("forward_main", "forward_main_fast_shipped", "forward_other_shapes", "memory", "ceilings",
          "graded_tiles") + phases_section.TOPICS + fast_section.TOPICS + ("environment", "launch_order_traffic")
MAIN_TOPICS = TOPICS  # sections 1 to 5 up to the Gluon kernel: one GPU, which the text names
TOPICS += hopper_section.TOPICS
problems = results.unindexed()
assert not problems, "notebooks/data and INDEX.csv disagree:\n" + "\n".join(problems)
FILE = {topic: results.path(topic).name for topic in TOPICS}  # a KeyError names a topic missing from the index
TOPICS_CODE = "(" + textwrap.fill(", ".join(f'"{t}"' for t in TOPICS), width=104, initial_indent=" " * 14,
                                  subsequent_indent=" " * 14, break_on_hyphens=False).lstrip() + ")"
NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "05_performance.ipynb"


def bench_values(topic, provider, d=None, n=None, column="ratio_to_sdpa_default"):
    """A column of a `python -m gqa_flash.course.lab.bench` CSV for one provider (and head dim, sequence length)."""
    return [float(r[column]) for r in results.load(topic) if r["provider"] == provider and r["status"] == "ok"
            and (d is None or int(r["head_dim"]) == d) and (n is None or int(r["seq_len"]) == n)]


# The GPUs: sections 1 to 5 on one (the text names it, and its short name, "H200"), the Gluon kernel on another.
GPU = {topic: pp.gpu(topic) for topic in TOPICS}
assert {GPU[t] for t in MAIN_TOPICS} == {phases_section.H200}, {t: GPU[t] for t in MAIN_TOPICS}
assert {GPU[t] for t in hopper_section.TOPICS} == {hopper_section.H100}
# The numbers the narrative quotes, each from the topic named beside it.
NUM = {"gpu_main": phases_section.H200}
main = "forward_main"
NUM["g64"], NUM["g128"] = (results.span(bench_values(main, "course_graded", d)) for d in (64, 128))
NUM["f64"], NUM["f128"] = (results.span(bench_values(main, "course_fast", d)) for d in (64, 128))
NUM["f4k"], NUM["f16k"] = (results.span(bench_values(main, "course_fast", n=n)) for n in (4096, 16384))
NUM["shipped16k"] = results.span(bench_values("forward_main_fast_shipped", "course_fast", n=16384))
NUM["cudnn"] = results.span(bench_values(main, "sdpa_cudnn"))
NUM["fa2"] = results.span(bench_values(main, "sdpa_flash"))
(sdpa128,) = bench_values(main, "sdpa_default", 128, 16384, "tflops")
NUM["sdpa128"] = f"{sdpa128:.0f}"
graded, flash, flex = (bench_values(main, p) for p in ("course_graded", "sdpa_flash", "flex"))
NUM["g_vs_fa2"] = results.span([g / f for g, f in zip(graded, flash)], "{:.1f}")
assert all(g > x for g, x in zip(graded, flex)), "the text says the graded kernel beats FlexAttention everywhere"
assert float(NUM["f16k"].split("–")[0]) >= 0.97, "the text says the fast kernel is level with cuDNN at 16k"

other_rows = results.load("forward_other_shapes")


def other_ratio(provider, n, **case):
    return [float(r["ratio_to_sdpa_default"]) for r in other_rows if r["provider"] == provider
            and int(r["seq_len"]) == n and all(str(r[k]) == str(v) for k, v in case.items())]


NUM["mqa"] = results.span(other_ratio("course_fast", 4096, kv_heads=1) + other_ratio("course_fast", 16384, kv_heads=1))
NUM["fp16"] = results.span(other_ratio("course_fast", 16384, dtype="float16"))
NUM["d96"] = results.span(other_ratio("course_fast", 16384, head_dim=96))
NUM["mha4k"] = results.span(other_ratio("course_fast", 4096, kv_heads=32))
NUM["noncausal"] = results.span(other_ratio("course_fast", 4096, causal=False) + other_ratio("course_fast", 16384, causal=False))
NUM["d256"] = results.span(other_ratio("course_fast", 4096, head_dim=256) + other_ratio("course_fast", 16384, head_dim=256))
NUM["sdpa_d96"] = results.span([float(r["tflops"]) for r in other_rows if r["provider"] == "sdpa_default"
                        and r["head_dim"] == "96"], "{:.0f}")

memory = {(r["provider"], int(r["seq_len"])): r for r in results.load("memory")}
NUM["m1k"], NUM["m64k"] = (f'{float(memory[("course_graded", nn)]["peak_mem_mib"]):g}' for nn in (1024, 65536))
NUM["naive16k"] = f"{float(memory[('naive', 16384)]['peak_mem_mib']) / 1024:.1f}"
assert memory[("naive", 32768)]["status"] == "out of memory"
env = results.load("environment").read_text().splitlines()[1]  # "NVIDIA H200, driver, 143771 MiB"
NUM["h200_mib"] = f"{int(env.split(',')[-1].split()[0]):,}"

tiles = explore_table("graded_tiles")
NUM["w4_128"] = results.span([tiles[("graded_128x64_w4_s3", 128, n)] for n in (1024, 4096, 16384)])
tiles_tf = explore_table("graded_tiles", column="tflops")
NUM["t64_tflops"] = f"{tiles_tf[('graded_64x64_w4_s3', 128, 16384)]:.0f}"
b, hq, hkv, n, d = 1, 32, 8, 16384, 128
flops = pp.attention_flops(b, hq, n, d)
matmul_tflops, copy_tbps = pp.read_ceilings(results.path("ceilings"))
for bm in (64, 128):
    NUM[f"bound{bm}"] = f"{flops / pp.attention_program_bytes(b, hq, hkv, n, d, bm) * copy_tbps:.0f}"
assert tiles_tf[("graded_64x64_w4_s3", 128, 16384)] > float(NUM["bound64"]), "the text says the 64x64 star is above"
assert tiles_tf[("graded_128x128_w8_s3", 128, 16384)] < float(NUM["bound128"]), "the text says 128x128 is below"

NUM["order_bytes"] = traffic_section.NUM["ratio_span"]
for section in (traffic_section, phases_section, fast_section, hopper_section):  # their numbers, by fill()
    clash = NUM.keys() & section.NUM.keys()
    assert not clash, f"{section.__name__} and this script both name {sorted(clash)}"
    NUM.update(section.NUM)


def fill(text):
    """Put the numbers (<<name>>) and the file names (<<file:topic>>) into a markdown cell."""
    for topic, name in FILE.items():
        text = text.replace(f"<<file:{topic}>>", f"`{name}`")
    for key, value in NUM.items():
        text = text.replace(f"<<{key}>>", str(value))
    assert "<<" not in text, text[text.index("<<"):][:60]
    return text


md = lambda s: nbf.v4.new_markdown_cell(fill(s.strip()))  # noqa: E731
code = lambda s: nbf.v4.new_code_cell(s.strip())  # noqa: E731
cells = []
cells.append(md(r"""
# 05 · Making it fast: measuring the kernel on a GPU

Your kernel from notebook 04 is correct. Is it fast? This notebook answers with numbers measured on an
<<gpu_main>>, each kernel beside PyTorch's own attention timed in the same run on the same inputs. (One
optional subsection of section 5, on a kernel written for Hopper GPUs, was measured on an <<hopper_gpu>>;
every table names its file and the GPU it ran on.)

1. **Two numbers first**: how much arithmetic attention does, and how few bytes it must move.
   Their ratio says which of the GPU's two ceilings (matrix math or memory) could limit a kernel.
2. **The roofline** of the GPU, where each kernel lands on it, and how many bytes a kernel really moves;
   then a practice exercise: a small model of L2 that predicts the DRAM bytes of two launch orders, set
   beside what the GPU measured.
3. **The measured curves**: TFLOP/s against sequence length for the course's kernels, cuDNN and
   FlashAttention-2; other shapes (MHA, MQA, non-causal, fp16, head_dim 96 and 256); and where
   FlashAttention-2, FlashAttention-3 and cuDNN stand.
4. **Memory**: O(N) for FlashAttention against O(N²) for the naive version, until it runs out.
5. **What each optimisation bought**: tile shapes, warps and pipeline stages, and the causal loop's two
   phases, all choices of your kernel; then the separate fast kernel (`gqa_flash/fast/forward.py`), its
   six changes and what each bought.
6. A **live run** of the benchmark, when this machine has a GPU.

### On a laptop: a path through this notebook

Every cell runs on a CPU. The tables and pictures read measurements committed in `notebooks/data/`, and
nothing is timed unless the machine has a GPU. Nothing in this notebook is graded. What to read first, and
what to leave for later:

| part | on a first read | on a CPU |
| --- | --- | --- |
| 1. FLOPs and bytes; 2. the roofline | read it all: the two numbers every later section uses | runs |
| 2. exercise: `gqa_flash/traffic.py` | optional practice, not graded: a model of L2 in plain Python | write it and check it here, in seconds |
| 3. throughput; 4. memory | read it all: your kernel against PyTorch's, and why FlashAttention fits where naive attention does not | runs |
| 5. tiles, warps, stages; the two-phase loop | read: both are choices your kernel of notebook 04 makes | runs |
| 5. the fast kernel | read its six changes and the table of what each bought | runs |
| 5. warp specialisation on Hopper | skip: optional, one level below Triton, measured on another GPU | runs (a picture and one table) |
| 6. a live run | skip | prints one line: it needs a GPU |

The measurements were made on the GPU by `python -m gqa_flash.course.lab.bench` and the scripts in `bench/`. One
index, `notebooks/data/INDEX.csv`, lists every file by topic with what was measured, the command that
made it, the date and the GPU; the notebook asks `gqa_flash.course.lab.results` for a topic, and every table
prints the file it comes from. `bench/RESULTS.md` discusses all of them, and `docs/performance.md` keeps
the full record behind section 5, every table of it.
"""))
cells.append(code(f"""
import matplotlib.pyplot as plt

import gqa_flash
from gqa_flash.course.lab import perf_plots as pp
from gqa_flash.course.lab import results

print(gqa_flash.describe())
bench = results.load("forward_main")  # every provider: head_dim 64 and 128, N = 1k to 16k
extra = results.load("forward_other_shapes")  # MHA, MQA, non-causal, fp16, head_dim 96 and 256
memory = results.load("memory")  # peak memory of one forward call
matmul_tflops, copy_tbps = pp.read_ceilings(results.path("ceilings"))  # the roofline's two ceilings
graded_tiles = results.load("graded_tiles")  # the graded kernel at fixed tiles
print("topics cited here, and their files in notebooks/data/ (INDEX.csv):")
for topic in {TOPICS_CODE}:
    print(f"  {{topic:33s}} {{results.path(topic).name:48s}} {{results.entry(topic)['gpu']}}")
r = bench[0]
print(f"main sweep: {{r['date']}} on {{r['gpu']}} (driver {{r['driver']}}), torch {{r['torch']}}, triton {{r['triton']}}")
"""))
cells.append(md(r"""
## 1. FLOPs and bytes

Per query head, attention does two matrix products: $S = QK^\top$ ($N \times D$ by $D \times N$, so
$2N^2D$ FLOPs) and $O = PV$ (another $2N^2D$). With a batch of $B$ and $H_q$ query heads that is
$4BH_qN^2D$ FLOPs, and half of it under the causal mask (the kernel skips the upper triangle).
The exponentials and the online-softmax bookkeeping are $O(N^2)$ too, but run on slower units:
they are why nobody reaches the matrix ceiling exactly.

The fewest bytes it must move: read $Q$, $K$, $V$ once and write $O$ once (and the fp32 LSE). With
GQA, $K$ and $V$ have only $H_{kv}$ heads. Everything else (the $N \times N$ scores!) stays on chip:
that is FlashAttention. This is the *minimum* traffic; section 2 counts what a kernel really moves.
"""))
cells.append(code(r"""
for n in (1024, 4096, 16384):
    b, hq, hkv, d = 16384 // n, 32, 8, 128
    flops = pp.attention_flops(b, hq, n, d, causal=True)
    bytes_ = pp.attention_min_bytes(b, hq, hkv, n, d)
    print(f"N={n:6d}: {flops / 1e12:6.2f} TFLOP, {bytes_ / 2**20:6.1f} MiB moved at least, "
          f"{flops / bytes_:6.0f} FLOP per byte")
ridge = matmul_tflops / copy_tbps
print(f"{pp.gpu('ceilings')} ridge point: {matmul_tflops:.0f} TFLOP/s / {copy_tbps} TB/s = {ridge:.0f} FLOP per byte")
print(results.cite("ceilings"))
"""))
cells.append(md(r"""
The ratio (the *arithmetic intensity*) grows with $N$, and at every length here it is far above the
H200's *ridge point*, where the time to do the math equals the time to move the bytes. That says: *if*
a kernel moved only these bytes, memory could never be its limit. The naive version is the opposite
case: it writes and reads the whole $N \times N$ matrix, which makes it memory-bound and slow.

## 2. The roofline, at the minimum traffic

The two ceilings were measured on the same GPU by `python -m gqa_flash.course.lab.bench --ceilings`
(<<file:ceilings>>): an 8192³ bf16 matrix product through PyTorch, and a 1 GiB device-to-device copy
(bytes read plus bytes written). A kernel can sit anywhere under the roof; the gap to the roof is what
is left to win.

Each measured run of the main sweep (<<file:forward_main>>) is placed at the intensity of the minimum
traffic above. Read the picture with that in mind: with the minimum bytes every point lands right of
the ridge *by construction*, whatever the kernel does, so this picture cannot show that attention is
compute-bound. It shows how close each kernel comes to the arithmetic ceiling; the next subsection
asks how many bytes a kernel really moves.
"""))
cells.append(code(r"""
fig, ax = plt.subplots(figsize=(7, 4.5))
pp.plot_roofline(bench, ax, matmul_tflops, copy_tbps)
ax.legend(fontsize=7, loc="upper left")
plt.show()
print(results.cite("forward_main"))
"""))
cells += traffic_section.cells(md, code)  # what a program reads; launch order, L2 and the exercise
cells.append(md(r"""
## 3. Throughput against sequence length

Every launch processes 16k tokens (batch $= 16384 / N$), 32 query heads on 8 KV heads (Llama 3 8B's
ratio), bf16, causal. Each provider's output was checked against SDPA's before it was timed; times are
medians of `triton.testing.do_bench`.
"""))
cells.append(code(r"""
fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
for ax, d in zip(axes, (64, 128)):
    pp.plot_throughput(bench, ax, d, matmul_tflops)
handles, labels = axes[1].get_legend_handles_labels()
fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
plt.tight_layout(rect=(0, 0.1, 1, 1))
plt.show()
print(results.cite("forward_main"))
print(pp.ratio_table(bench, providers=("course_graded", "course_fast", "sdpa_flash", "sdpa_cudnn", "flex")))
"""))
cells.append(md(r"""
Read the table as "how fast, compared with PyTorch's default" (cuDNN's kernel on this GPU; 1.00 is a
tie). All of it comes from one sweep, <<file:forward_main>>.

- The **graded kernel** (the one you wrote, plus the autotuner) reaches <<g64>>× at head_dim 64 and
  <<g128>>× at head_dim 128. It is <<g_vs_fa2>> times as fast as PyTorch's own FlashAttention-2 backend
  (`sdpa_flash`) and faster than FlexAttention (`flex`, compiled by `torch.compile`) at every point.
- The **fast kernel** (`gqa_flash/fast/forward.py`, section 5) reaches <<f64>>× at head_dim 64 and
  <<f128>>× at 128: level with cuDNN at N = 16k (<<f16k>>; <<shipped16k>> in a second sweep with the
  6 autotuner candidates it shipped then, <<file:forward_main_fast_shipped>>), short of it at 4k (<<f4k>>).
- Short sequences are harder: with N = 1024 a launch has few key blocks per query tile, and the fixed
  costs (loading Q, the epilogue, the masked diagonal block) weigh more.
- `sdpa_cudnn` is the same cuDNN kernel pinned by hand: its ratio (<<cudnn>>) is the noise of the
  measurement itself.

**Where FlashAttention-2, FlashAttention-3 and cuDNN stand.** `sdpa_flash` is FlashAttention-2 (Dao,
2023) as PyTorch ships it, a design for NVIDIA's Ampere generation (the A100): it runs on Hopper but
uses neither Hopper's asynchronous warpgroup matrix instructions (`wgmma`) nor its Tensor Memory
Accelerator (TMA, section 5), and here it stays at <<fa2>>× of cuDNN. FlashAttention-3 (Shah et al.,
2024) is the Hopper design: `wgmma` and TMA, warp specialisation (producer warps that only load,
consumer warps that only compute) and ping-pong scheduling (two warpgroups take turns, so that one's
softmax runs while the other's matrix products do). Its paper's forward-speed figures (arXiv:2407.08608)
show about 615–650 TFLOP/s for the 16-bit forward pass at head_dim 128 and 16k tokens (the lower figure
with the causal mask), measured on an H100 SXM5 and not here: FlashAttention-3 is not among this notebook's providers.
`sdpa_default`, the 1.00 of every ratio, is PyTorch's cuDNN backend, which PyTorch picks on this GPU:
it calls the fused attention kernels of NVIDIA's cuDNN library, whose source is not public, so they can
be timed but not read; in this sweep it ran at <<sdpa128>> TFLOP/s at head_dim 128, N = 16k. The fast
kernel's two query sub-tiles (section 5) are the course's way, in plain Triton, towards the overlap
that FlashAttention-3's ping-pong schedules by hand.
"""))
cells.append(md(r"""
### Other shapes

The same comparison at N = 4096 and 16384 for the shapes around the course's main case
(<<file:forward_other_shapes>>): every KV head its own (MHA, 32:32), one KV head for all (MQA, 32:1),
no causal mask, fp16, and head_dim 96 (padded to 128 inside the kernels) and 256.
"""))
cells.append(code(r"""
print(results.cite("forward_other_shapes"))
print(pp.case_table(extra, providers=("course_graded", "course_fast", "sdpa_flash")))
"""))
cells.append(md(r"""
The fast kernel is level with cuDNN where $K$ and $V$ are shared across many query heads and the
sequence is long: MQA (one KV head for 32 query heads) <<mqa>>×, fp16 <<fp16>>× and head_dim 96
<<d96>>× at 16k. Where each query head has its own KV head (MHA, 32:32) it falls to <<mha4k>>× at 4k.
Do not credit the launch order for the difference: at the main shape it changed the DRAM bytes by
<<order_bytes>>× and the time by under 1% (section 2). Without the causal mask it reaches <<noncausal>>×: there is no diagonal to skip, and cuDNN's
lead on full tiles shows. head_dim 96 is padded to 128 inside the kernels (cuDNN itself reaches only
<<sdpa_d96>> TFLOP/s there). At head_dim 256 the largest tiles, the 256×64 sub-tiled one among them,
do not fit in shared memory (the autotuner could not compile them; `fits()` now leaves them out
beforehand), and the kernel stays at <<d256>>×.

## 4. Memory: O(N) against O(N²)
"""))
cells.append(code(r"""
fig, ax = plt.subplots(figsize=(7, 4.5))
pp.plot_memory(memory, ax, gpu=pp.gpu("memory"))
ax.legend(fontsize=8, loc="upper left")
plt.show()
print(results.cite("memory"))
for r in memory:
    if r["provider"] in ("course_graded", "naive"):
        print(f"N={int(r['seq_len']):6d} {r['provider']:14s} {r['peak_mem_mib']:>10s} MiB  {r['status']}")

n, hq = 16384, 32  # what notebook 00's 16 GiB counts: S alone, all 32 query heads, one sequence, one layer
scores = hq * n * n
naive = next(float(r["peak_mem_mib"]) / 1024 for r in memory if r["provider"] == "naive" and int(r["seq_len"]) == n)
print(f"\nthe scores S at N = {n}, {hq} query heads, batch 1: {2 * scores / 2**30:.0f} GiB in bf16 (notebook 00), "
      f"{4 * scores / 2**30:.0f} GiB in fp32")
print(f"two fp32 matrices of that size alive at once: {8 * scores / 2**30:.0f} GiB; "
      f"naive attention's measured peak: {naive:.1f} GiB (the rest: fp32 copies of Q, K, V and the mask)")
"""))
cells.append(md(r"""
The course's kernels allocate only their outputs, O and the LSE: the line grows as $N$ (<<m1k>> MiB
at 1k, <<m64k>> MiB at 64k: 32 query heads of head_dim 128 in bf16, batch 1). The naive version
(notebook 01's) computes in fp32, and at its peak holds two $32 \times N \times N$ fp32 matrices at
once (the scores, and what it computes from them: the masked scores, then their softmax $P$): 2 × 32
GiB at $N$ = 16k, and <<naive16k>> GiB measured with the buffers around them (<<file:memory>>). At 32k
it needs four times that, more than the H200's <<h200_mib>> MiB (<<file:environment>>), and runs out of
memory. (The benchmark calls each kernel once before it measures, so the autotuner's trial buffers do
not count.)

Notebook 00 counts the same scores differently and gets 16 GiB at 16k tokens: $S$ alone, one matrix,
2 bytes a score (bf16), for all 32 query heads of one layer and one sequence. Both numbers are for
batch 1 and all 32 heads; the <<naive16k>> GiB here is 4-byte scores, two matrices alive at once, and
the smaller buffers on top (the last lines above print each step).

## 5. What each optimisation bought

### Tiles, warps and pipeline stages

The same graded kernel, with different compile-time tile shapes (`BLOCK_M x BLOCK_N`), warps per program
(`w`) and software-pipelining depth (`s`), each against SDPA in the same run (<<file:graded_tiles>>).
The table sets the best tile of each shape beside one fixed tile, 128×64 on 4 warps, to show what a
single fixed choice costs.
"""))
cells.append(code(r"""
def best_and_fixed(rows, d, n, fixed="graded_128x64_w4_s3"):
    here = [r for r in rows if int(r["d"]) == d and int(r["n"]) == n and r["provider"].startswith("graded_")]
    best = max(here, key=lambda r: float(r["ratio"]))
    return best, next(r for r in here if r["provider"] == fixed)

print(results.cite("graded_tiles"))
print(f"{'D':>4s} {'N':>6s}  {'fixed 128x64 w4':>15s}  {'best config':>22s}")
for d in (64, 128):
    for n in (1024, 4096, 16384):
        best, one = best_and_fixed(graded_tiles, d, n)
        fixed, top = results.two(one["ratio"]), results.two(best["ratio"])
        print(f"{d:4d} {n:6d}  {fixed:>14s}x  {best['provider'][7:]:>16s} {top:>4s}x")
"""))
cells.append(md(r"""
Two lessons. First, **8 warps** for a 128-row tile: with 4 warps each warp holds 32 rows of a
128×128 fp32 accumulator in registers and the kernel spills or stalls (<<w4_128>>× at head_dim 128);
8 warps halve that. Second, the best tile depends on head_dim and N, which is why the graded
kernel's launcher hands a short list of candidates to `triton.autotune` on a GPU.
"""))
cells += phases_section.cells(md, code)  # the key loop's two phases, and the experiment that merged them
cells += fast_section.cells(md, code)  # the six changes, the ping-pong picture, what each bought
cells += hopper_section.cells(md, code)  # the Gluon kernel on Hopper: roles, rings, and what each step bought
cells.append(md(r"""
## 6. A live run

With a GPU, this cell benchmarks the course's kernels against SDPA on one shape right here. On a CPU
there is nothing to time: the interpreter measures Python, not the kernel.
"""))
cells.append(code(r"""
from gqa_flash.course import runtime

if runtime.DEVICE.type == "cuda":
    import tempfile
    from pathlib import Path
    from gqa_flash.course.lab import bench as gb

    live_csv = Path(tempfile.mkdtemp(prefix="gqa_flash_bench_")) / "live_bench.csv"  # your own folder
    rows = gb.run([gb.Case(runtime.default_dtype(), True, 128, 4096)],
                  ["course_graded", "course_fast", "sdpa_default", "sdpa_flash"], live_csv)
    print(f"written to {live_csv}")
else:
    print("No GPU here: every number above comes from notebooks/data, and each table names its GPU. "
          "Run `python -m gqa_flash.course.lab.bench` on a GPU for your own.")
"""))
cells.append(md(r"""
## Check

The benchmark checks every provider's output against SDPA before it times it. This cell confirms that
every timed row of the three sweeps whose tables this notebook prints (the main sweep, the other shapes,
and the fast kernel through its public function on the <<hopper_short>>) was checked and correct.
"""))
cells.append(code(r"""
# NBVAL_CHECK_OUTPUT
sweeps = ("forward_main", "forward_other_shapes", "forward_main_h100_gluon_route")
rows = [r for topic in sweeps for r in results.load(topic)]
wrong = [r for r in rows if r["status"] == "wrong result"]
course = [r for r in rows if r["provider"].startswith("course_")]
print(f"PASS: every course-kernel row of the {len(sweeps)} sweeps printed above was checked against SDPA before timing"
      if course and not wrong and all(r["status"] == "ok" for r in course) else "FAIL: a timed row was not correct")
"""))
for i, c in enumerate(cells):
    c["id"] = f"05-{i:02d}"  # stable ids: regenerating changes only what changed
nb = nbf.v4.new_notebook()
nb["cells"] = cells
nb["metadata"]["kernelspec"] = {"display_name": "Python 3 (gqa-flash)", "language": "python", "name": "python3"}
nb["metadata"]["gqa_flash"] = {"generated_by": "tools/make_performance_notebook.py",
                               "note": "edit the generator, run it, then execute the notebook (its docstring)"}
docs = record.updated(record.DOCS.read_text(), record.section(fill, hopper_section))


def stale() -> list[str]:
    """The files that differ from what this script writes: the notebook's cells (their outputs aside) and
    docs/performance.md."""
    written = nbf.read(str(NOTEBOOK), as_version=4)
    out = []
    if ([(c.cell_type, c.get("id"), c.source) for c in written.cells] != [(c.cell_type, c.id, c.source) for c in cells]
            or written.metadata.get("gqa_flash") != nb["metadata"]["gqa_flash"]):
        out.append(str(NOTEBOOK.relative_to(NOTEBOOK.parents[1])))
    if record.DOCS.read_text() != docs:
        out.append(str(record.DOCS.relative_to(NOTEBOOK.parents[1])))
    return out


if __name__ == "__main__":
    if "--check" in sys.argv[1:]:
        if stale():
            sys.exit(f"out of date with tools/make_performance_notebook.py: {', '.join(stale())}; run it, then "
                     "execute the notebook as its docstring says")
        print("notebooks/05_performance.ipynb and docs/performance.md are what tools/make_performance_notebook.py "
              "writes")
    else:
        nbf.write(nb, str(NOTEBOOK))
        record.DOCS.write_text(docs)
