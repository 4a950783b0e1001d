"""Notebook 05, the second half of section 2: what a program really reads, then launch order, L2 and the
practice exercise gqa_flash/traffic.py (a model of DRAM traffic) beside the H200's count.

Imported by tools/make_performance_notebook.py, which places :func:`cells` after the roofline. Its cells go
through the generator's builders, whose fill() puts in the generator's numbers (<<t64_tflops>>...) and this
module's (NUM, merged into the generator's); the numbers of the launch-order prose are computed here from the topic launch_order_traffic (ncu on an H200,
notebooks/data/INDEX.csv) and the ceilings, with asserts on the words around them. The model's numbers come
from running the solution of traffic.py at the measured shape (this script is the instructor's).
"""

from gqa_flash.course import impl
from gqa_flash.course.lab import perf_plots as pp
from gqa_flash.course.lab import results

TOPIC = "launch_order_traffic"
ROWS = {(r["order"], int(r["head_dim"])): r for r in results.load(TOPIC)}
assert set(ROWS) == {(o, d) for o in ("group_major", "head_major") for d in (64, 128)}, sorted(ROWS)
# The model's two guesses of (C, P), as the notebook's cell spells them.
SETTINGS = {"C = 50 MiB, P = 132": (50 * 2**20, 132), "C = 25 MiB, P = 264": (25 * 2**20, 264)}


def _f(row, column):
    return float(row[column])


def _shape(row):
    return tuple(int(row[c]) for c in ("batch", "q_heads", "kv_heads", "seq_len", "head_dim"))


CONFIG = dict(item.split("=") for item in ROWS[("head_major", 128)]["config"].split())
BLOCK_M, BLOCK_N = int(CONFIG["BLOCK_M"]), int(CONFIG["BLOCK_N"])
assert all(r["config"] == ROWS[("head_major", 128)]["config"] for r in ROWS.values()), "one tile for every row"
assert {_shape(r)[:4] for r in ROWS.values()} == {(1, 32, 8, 16384)}, "the text says one 16k sequence, 32:8 heads"
assert (CONFIG["SUBTILES"], CONFIG["num_warps"]) == ("2", "4"), "the text says two sub-tiles, 4 warps"

NUM = {"file": f"`{results.path(TOPIC).name}`", "bm": str(BLOCK_M), "bn": str(BLOCK_N)}
_, HQ, HKV, N, _ = _shape(ROWS[("head_major", 64)])
NUM["programs"] = f"{HQ * (N // BLOCK_M):,}"
NUM["blocks"] = str(N // BLOCK_M)
ratios, time_gaps = [], []
for d in (64, 128):
    gm, hm = ROWS[("group_major", d)], ROWS[("head_major", d)]
    minimum = pp.launch_read_minimum(hm)
    NUM[f"gm{d}"], NUM[f"hm{d}"] = (f"{_f(r, 'dram_read_bytes') / 1e6:.1f}" for r in (gm, hm))
    NUM[f"min{d}"] = f"{minimum / 1e6:.1f}"
    assert abs(_f(hm, "dram_read_bytes") / minimum - 1) < 0.01, "the text says head_major reads Q, K, V once"
    ratios.append(_f(gm, "dram_read_bytes") / _f(hm, "dram_read_bytes"))
    NUM[f"r{d}"] = f"{ratios[-1]:.1f}"
    NUM[f"t_gm{d}"], NUM[f"t_hm{d}"] = (results.two(r["ms"]) for r in (gm, hm))
    time_gaps.append(abs(_f(gm, "ms") / _f(hm, "ms") - 1))
    kv_head = 2 * N * d * 2  # one KV head's K and V, bf16
    NUM[f"kv_one{d}"], NUM[f"kv_all{d}"] = f"{kv_head / 1e6:.1f}", f"{HKV * kv_head / 1e6:.1f}"
assert max(time_gaps) < 0.01, "the text says the time changed by under 1%"
assert all(_f(ROWS[("group_major", d)], "ms") <= _f(ROWS[("head_major", d)], "ms") for d in (64, 128))
NUM["ratio_span"] = f"{min(ratios):.1f}–{max(ratios):.1f}"
assert NUM["ratio_span"] == "2.3–3.2", NUM["ratio_span"]
assert HKV * 2 * N * 128 * 2 > 50e6 > HKV * 2 * N * 64 * 2 > 25e6, "the text compares K/V with the L2's 50 MB"

matmul_tflops, copy_tbps = pp.read_ceilings(results.path("ceilings"))
gm128 = ROWS[("group_major", 128)]
moved = _f(gm128, "dram_read_bytes") + _f(gm128, "dram_write_bytes")
NUM["gm_rw128"] = f"{moved / 1e6:.0f}"
NUM["bw_share"] = f"{100 * moved / (_f(gm128, 'ms') * 1e-3) / (copy_tbps * 1e12):.1f}"
NUM["copy"] = f"{copy_tbps:g}"
NUM["tf128"] = f"{_f(gm128, 'tflops'):.0f}"
NUM["tf_share"] = f"{100 * _f(gm128, 'tflops') / matmul_tflops:.0f}"
NUM["matmul"] = f"{matmul_tflops:.0f}"
assert float(NUM["bw_share"]) < 5, "the text says under a twentieth of the copy ceiling"

# The model, by the solution, at the measured shape.
solution = impl.load("traffic", "solutions")
MODEL = {}
for (order, d), row in ROWS.items():
    programs = solution.launch_order(order, HQ, HKV, N // BLOCK_M)
    for label, (cache_bytes, concurrent) in SETTINGS.items():
        MODEL[(label, order, d)] = solution.dram_bytes(programs, HQ, HKV, d, cache_bytes=cache_bytes,
                                                       concurrent=concurrent, block_m=BLOCK_M, block_n=BLOCK_N)
big, half = SETTINGS
for key, label in (("m50", big), ("m25", half)):
    for d in (64, 128):
        for order in ("group_major", "head_major"):
            NUM[f"{key}_{order[0]}m{d}"] = f"{MODEL[(label, order, d)] / 1e6:.0f}"
assert MODEL[(big, "group_major", 64)] == MODEL[(big, "head_major", 64)], "the text says no difference there"
errors = [abs(MODEL[(half, order, d)] / _f(ROWS[(order, d)], "dram_read_bytes") - 1)
          for order in ("group_major", "head_major") for d in (64, 128)]
assert max(errors) < 0.10, errors
NUM["m25_err"] = f"{100 * max(errors):.0f}"
assert all(MODEL[(label, "group_major", d)] > MODEL[(label, "head_major", d)]
           for label in SETTINGS for d in (128,)), "the text says the model gets the direction"


READS = r"""
### What a program really reads

Notebook 03 counted the traffic of the tiled walk. A program owns BLOCK_M query rows of one query
head: it reads its $Q$ tile once, but it reads $K$ and $V$ from the first key up to its diagonal, and
every query tile does the same. So $K$ and $V$ are read once per query tile, not once in all: per query
head about $N^2 d / \text{BLOCK\_M}$ numbers under the causal mask ($N / \text{BLOCK\_M}$ programs,
each reading on average half of $K$ and half of $V$), against $2Nd$ to read them once. If every one of
those tile reads went to DRAM, the intensity would be about BLOCK_M FLOP per byte, below the ridge.
`pp.attention_program_bytes` is this model; the cell evaluates it for the main case at N = 16k,
head_dim 128, and sets beside it the graded kernel measured at two fixed tiles (<<file:graded_tiles>>).
"""

READS_CELL = r"""
b, hq, hkv, n, d = 1, 32, 8, 16384, 128
flops = pp.attention_flops(b, hq, n, d, causal=True)
print(f"model, N = {n}, head_dim {d}, GQA 32:8, causal, bf16: {flops / 1e12:.2f} TFLOP")
print(f"{'traffic':34s} {'GiB':>6s} {'FLOP/byte':>10s} {'TFLOP/s at most, from DRAM':>27s}")
traffic = [("minimum: Q, K, V, O once", pp.attention_min_bytes(b, hq, hkv, n, d))]
traffic += [(f"K, V once per tile, BLOCK_M = {bm}", pp.attention_program_bytes(b, hq, hkv, n, d, bm))
            for bm in (64, 128)]
for label, nbytes in traffic:
    intensity = flops / nbytes
    print(f"{label:34s} {nbytes / 2**30:6.2f} {intensity:10.0f} {min(matmul_tflops, intensity * copy_tbps):27.0f}")

print(f"\nmeasured: the graded kernel at fixed tiles, head_dim {d}, N = {n}")
print(results.cite("graded_tiles"))
reread = []
for tile, bm in (("64x64_w4_s3", 64), ("128x128_w8_s3", 128)):
    row = next(r for r in graded_tiles if r["provider"] == "graded_" + tile and int(r["d"]) == d and int(r["n"]) == n)
    intensity = flops / pp.attention_program_bytes(b, hq, hkv, n, d, bm)
    print(f"  {tile:14s} {float(row['tflops']):4.0f} TFLOP/s; with every K/V tile from DRAM at most "
          f"{intensity * copy_tbps:4.0f}")
    label = f"graded {tile.split('_')[0]}: measured, at the per-program traffic"
    reread.append((label, intensity, float(row["tflops"])))

gpu = pp.gpu("graded_tiles")  # the tiles' GPU, the ceilings' too
fig, ax = plt.subplots(figsize=(7, 4.5))
pp.plot_roofline([], ax, matmul_tflops, copy_tbps, reread=reread, gpu=gpu)
ax.set_xlim(10, 2000)
ax.set_ylim(50, 2500)
ax.set_title(f"{gpu}: the same roof, two graded tiles placed at their per-program traffic", fontsize=10)
ax.legend(fontsize=7, loc="upper left")
plt.show()
"""

READS_AFTER = r"""
The 64×64 tile ran at <<t64_tflops>> TFLOP/s, well above the <<bound64>> TFLOP/s that DRAM could feed
it if every $K$ and $V$ tile came from memory: its star sits *above* the roof. So a large share of those
reads never reached DRAM. They were served by the L2 cache, which programs running at the same time
share when they read the same $K$ and $V$: other query tiles of the same head, and the other query
heads of the same GQA group. The 128×128 tile re-reads half as much (at most <<bound128>> TFLOP/s from
DRAM alone) and sits under its roof. Attention on the H200 stays compute-bound, then, not by
construction but because the tiles are large and the $K$/$V$ tiles are reused through L2: that is why
the tile shape and GQA matter (section 5), and why the order in which programs launch decides how many
bytes reach DRAM (next).

How many bytes actually crossed DRAM is itself a measurement: Nsight Compute (`ncu`) counts them
(`dram__bytes_read.sum`). The model above is an estimate with no cache at all; the next subsection
models L2 and sets the model beside such a count, made for the fast kernel in two launch orders.
"""

INTRO = r"""
### Which programs run together: launch order, and L2 as the place K and V are reused

The star above the roof says that many $K$/$V$ reads never reached DRAM. Which ones did is decided by
*which programs are on the GPU at the same time*, and that is decided by the order in which they are
launched.

**Launch order.** A launch is a list of programs, here one per (query head, query block). The GPU
starts them in the order of their program ids, as many as fit at once, and starts the next one as soon
as one finishes (what GPUs are seen to do; CUDA does not promise it). So at any moment the running programs are a *window* of neighbours in that list. The
kernel decides what an id means (the fast kernel decodes `tl.program_id(0)` into a query head and a
query block) and so it chooses the order. Two orders of the fast kernel were measured:

* `group_major`, the fast kernel's own: for each query block, heaviest first; for each KV head; each of
  its 4 query heads;
* `head_major` (`group_major=False`; the graded kernel walks the heads this way): for each query head,
  every one of its query blocks, heaviest first.

*Heaviest first*: under the causal mask the last query block reads every key and the first only its
own, so the long programs start first and the short ones fill the gaps at the end.

**What runs at the same time.** The measured case is one sequence of 16k tokens, 32 query heads on 8 KV
heads, BLOCK_M = <<bm>> (two sub-tiles), BLOCK_N = <<bn>>: <<programs>> programs, <<blocks>> query blocks
per head. The H200 has 132 SMs, each running one program or more at a time, so the window is a few
hundred programs wide. In `group_major` order it holds the heaviest query blocks of *every* KV head. In
`head_major` order it holds every block of two or three neighbouring query heads, which read one KV head
(two, where the window crosses from one group to the next).

**L2 is where $K$ and $V$ are reused.** Every program reads the $K$ and $V$ tiles of its causal prefix,
from key 0 up to its diagonal. The 4 query heads of a KV head read the very same tiles, and so does
every query block of each of them. A read that finds its tile in the L2 cache (50 MB on the H200, in two
halves of 25 MB) costs no DRAM traffic. In `group_major` order the window reads all of $K$ and $V$:
<<kv_all128>> MB at head_dim 128, more than all of L2, and <<kv_all64>> MB at 64, which fits in L2 but
not in one of its 25 MB halves, so a tile can be evicted before the next block's programs come back to it. In `head_major` order the window reads one
KV head's $K$ and $V$: <<kv_one128>> MB at head_dim 128, which stays in L2 from the first program that
reads it to the last.

**A model.** Programs run in *waves* of $P$ programs, in launch order. Within a wave they move in step:
at step $j$ each reads its $j$-th $K$/$V$ tile, if its prefix has one (query block $b$ has
$(b+1) \cdot \text{BLOCK\_M} / \text{BLOCK\_N}$ tiles). L2 is a least-recently-used (LRU) cache of $C$
bytes whose entries are (KV head, key tile): one tile of $K$ and one of $V$, $\text{BLOCK\_N} \times d
\times 2$ bytes each in bf16. DRAM bytes are the misses times the entry's bytes, plus every program's $Q$
tile read once. It leaves a lot out: programs start one at a time and not in waves, L2 is neither one
LRU nor fully associative, writes are not counted. And $C$ and $P$ are guesses: all of L2 with one
program per SM ($C$ = 50 MiB, $P$ = 132), or one half of L2 with two programs per SM ($C$ = 25 MiB,
$P$ = 264). Which guess is right is for the measurement to say.
"""

EXERCISE = r"""
### Exercise (practice, not graded): `gqa_flash/traffic.py`

Open `gqa_flash/traffic.py`: its docstring states the model, and two parts are yours.

| part | function | what it returns |
| --- | --- | --- |
| 1 | `launch_order(order, n_q_heads, n_kv_heads, n_q_blocks)` | the list of (query head, query block) pairs in launch order, for `"group_major"` and `"head_major"` |
| 2 | `dram_bytes(programs, n_q_heads, n_kv_heads, head_dim, *, cache_bytes, concurrent, block_m=128, block_n=64)` | the DRAM bytes the model reads when `programs` run in that order |

This file is practice. It is not in the 100 points, the grader never reads it, and no later notebook
needs it. Each check runs your function on small launches against its own replay of the model. Part 2
is checked with launch lists of its own, so it does not depend on Part 1. A FAIL names the first
difference and the likely cause. Save the file and re-run the cell: no restart needed.
"""

COMPARE = r"""
### The model beside the measurement

The next cell runs your model at the measured shape, for both orders and both head dims, with the two
guesses of $(C, P)$. It sets the results beside what Nsight Compute counted on the H200
(`dram__bytes_read.sum`, one launch each, <<file>>), and beside the time of each launch
(`do_bench` median, the same file).
"""

LESSON = r"""
What the measurement says (<<file>>):

* **The order changed the bytes by <<ratio_span>>×.** `head_major` read <<hm64>> MB at head_dim 64 and
  <<hm128>> MB at 128: $Q$, $K$ and $V$ once (<<min64>> and <<min128>> MB), nothing twice.
  `group_major` read <<gm64>> MB and <<gm128>> MB, <<r64>>× and <<r128>>× as much.
* **The time changed by under 1%**: <<t_gm64>> against <<t_hm64>> ms at head_dim 64, <<t_gm128>>
  against <<t_hm128>> ms at 128. The kernel is compute-bound at this shape, either way. Even in
  `group_major` order at head_dim 128 it moved <<gm_rw128>> MB (read plus written) in <<t_gm128>> ms:
  <<bw_share>>% of the <<copy>> TB/s copy ceiling, while it ran at <<tf128>> TFLOP/s, <<tf_share>>% of
  the <<matmul>> TFLOP/s matrix ceiling. DRAM traffic that the kernel does not wait for costs it
  nothing.
* **The KV-group-major order was meant to help, and did not at this shape.** It is the fast kernel's
  order (`gqa_flash/fast/forward.py`, item 2 of its docstring). It was chosen so that the 4 query heads
  of a KV group, which read the same $K$/$V$ tiles, run side by side. They do. But the window of running
  programs then spans all 8 KV heads, whose $K$ and $V$ do not fit in L2 at head_dim 128, nor in one of
  its halves at 64. In head-major order the window
  reads one KV head, which does fit. The fast kernel still launches in its order, as fast as the
  other: what the order buys it is heaviest-first, which both orders share.

The model gets the direction, and it is sensitive to its guesses. With $C$ = 50 MiB and $P$ = 132 it
predicts <<m50_gm64>> MB for `group_major` at head_dim 64, no more than `head_major` (<<m50_hm64>> MB),
where the measurement shows <<r64>>×; at head_dim 128 it predicts <<m50_gm128>> MB. With $C$ = 25 MiB
and $P$ = 264 it predicts <<m25_gm64>> and <<m25_gm128>> MB, within <<m25_err>>% of every measured
count. So a model like this one explains a measurement, but it cannot replace one: the measurement
decides.
"""

MODEL_CELL = r"""
from gqa_flash.course import impl

measured = results.load("launch_order_traffic")  # ncu: one launch per order and head dim
print(results.cite("launch_order_traffic"))
config = dict(item.split("=") for item in measured[0]["config"].split())  # BLOCK_M=128 BLOCK_N=64 ...
block_m, block_n = int(config["BLOCK_M"]), int(config["BLOCK_N"])
settings = {"C = 50 MiB, P = 132": (50 * 2**20, 132),  # all of L2, one program per SM
            "C = 25 MiB, P = 264": (25 * 2**20, 264)}  # one half of L2, two programs per SM
model = {}
try:
    traffic_model = impl.load("traffic")  # your gqa_flash/traffic.py (the solution with GQA_FLASH_IMPL=solutions)
    for r in measured:
        hq, hkv, n, d = (int(r[c]) for c in ("q_heads", "kv_heads", "seq_len", "head_dim"))
        programs = traffic_model.launch_order(r["order"], hq, hkv, n // block_m)
        for label, (cache_bytes, concurrent) in settings.items():
            model[(label, r["order"], d)] = traffic_model.dram_bytes(
                programs, hq, hkv, d, cache_bytes=cache_bytes, concurrent=concurrent, block_m=block_m, block_n=block_n)
except NotImplementedError as e:
    model = {}
    print(f"no model yet ({e}): write gqa_flash/traffic.py (the exercise above), save, and re-run this cell")
except Exception as e:  # a bug in your model: the check cells above say where
    model = {}
    print(f"your traffic.py raised {type(e).__name__}: {e}; run the check cells above")

print(f"\n{'D':>4s} {'order':12s} {'time (ms)':>9s} {'minimum':>8s} {'measured':>9s}"
      + "".join(f"{'model, ' + label:>27s}" for label in settings) + "   (MB read)")
for r in measured:
    d = int(r["head_dim"])
    cols = "".join(f"{model[(label, r['order'], d)] / 1e6:27.1f}" if model else f"{'-':>27s}" for label in settings)
    print(f"{d:4d} {r['order']:12s} {results.two(r['ms']):>9s} {pp.launch_read_minimum(r) / 1e6:8.1f} "
          f"{float(r['dram_read_bytes']) / 1e6:9.1f}{cols}")
"""

FIGURE_CELL = r"""
fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
pp.plot_launch_order_traffic(measured, model, axes)
handles, labels = axes[0].get_legend_handles_labels()
fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
fig.suptitle(f"DRAM bytes read by the fast forward kernel, {pp.gpu_of(measured)}, bf16, causal, one 16k sequence, "
             "GQA 32:8")
plt.tight_layout(rect=(0, 0.08, 1, 1))
plt.show()
if not model:
    print("only the measurement: the model's bars appear once gqa_flash/traffic.py is written")
"""


def cells(md, code):
    """The section's cells, in order; md and code are the generator's cell builders."""
    return [
        md(READS),
        code(READS_CELL),
        md(READS_AFTER),
        md(INTRO),
        md(EXERCISE),
        code("# NBVAL_CHECK_OUTPUT\nfrom gqa_flash.course.lab import checks\n\nchecks.check_launch_order()"),
        code("# NBVAL_CHECK_OUTPUT\nchecks.check_traffic_model()"),
        md(COMPARE),
        code(MODEL_CELL),
        code(FIGURE_CELL),
        md(LESSON),
    ]
