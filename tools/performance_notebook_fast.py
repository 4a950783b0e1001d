"""Notebook 05, section 5: the fast forward kernel, its six changes and what each bought (one summary table).

Imported by tools/make_performance_notebook.py. The numbers come from the H200 runs of the fast kernel, read by
topic (notebooks/data/INDEX.csv); the asserts below check the words around them, so a run that changes the
story stops here. The tables behind the summary, file by file, go to docs/performance.md (the record:
tools/performance_notebook_record.py), not into the notebook.
"""
import re

from gqa_flash.course.lab import results

# The files of the fast kernel's story, and the sweeps beside which their SDPA baselines are compared.
TOPICS = ("fast_forward_tiles", "forward_first", "fast_subtiles", "lazy_rescaling")
SPREAD_TOPICS = ("forward_main", "forward_main_fast_shipped", "forward_first", "graded_tiles",
                 "fast_forward_tiles", "fast_subtiles", "lazy_rescaling")
NUM = {}


def explore_table(topic, kind="fwd", column="ratio"):
    """A `bench/explore_*.py` CSV as {(provider, head_dim, N): value}."""
    return {(r["provider"], int(r["d"]), int(r["n"])): float(r[column])
            for r in results.load(topic) if r.get("kind", "fwd") == kind}


def sdpa_tflops(topic, d=128, n=16384):
    """SDPA's default forward, TFLOP/s, at one shape of one file (a sweep's or an exploration's columns)."""
    for r in results.load(topic):
        if (r["provider"] == "sdpa_default" and r.get("kind", "fwd") == "fwd"
                and int(r.get("head_dim", r.get("d"))) == d and int(r.get("seq_len", r.get("n"))) == n):
            return float(r["tflops"])
    raise KeyError(f"{topic}: no SDPA row at head_dim {d}, N = {n}")


speeds = [sdpa_tflops(t) for t in SPREAD_TOPICS]
NUM["sdpa_spread"] = results.span(speeds, "{:.0f}")
NUM["spread_pct"] = f"{100 * (max(speeds) / min(speeds) - 1):.0f}"
NUM["spread_files"] = str(len(SPREAD_TOPICS))

first = {(int(r["head_dim"]), int(r["seq_len"])): float(r["ratio_to_sdpa_default"])
         for r in results.load("forward_first") if r["provider"] == "course_fast"}
fast = explore_table("fast_forward_tiles")
NUM["desc_first"], NUM["desc_host"] = results.two(first[(64, 1024)]), results.two(fast[("fast_autotuned", 64, 1024)])
assert first[(64, 1024)] < fast[("fast_autotuned", 64, 1024)], "the text says host descriptors fixed N = 1k"
ws = [fast[(f"fast_128x128_w8_s{s}_ws", 128, n)] / fast[(f"fast_128x128_w8_s{s}", 128, n)] - 1
      for s in (2, 3) for n in (1024, 4096, 16384)]
assert min(ws) > -0.005 and max(ws) < 0.05, ws
NUM["ws"] = results.span([100 * x for x in ws], "{:.0f}")

sub = explore_table("fast_subtiles")
NUM["sub256"] = results.two(sub[("fast_256x64_w8_s3_sub2", 128, 16384)])
NUM["plain128"] = results.two(sub[("fast_128x128_w8_s3", 128, 16384)])
NUM["sub128"] = results.two(sub[("fast_128x64_w4_s3_sub2", 64, 16384)])
plain_tiles = [p for p, d, n in sub if d == 64 and n == 16384 and re.fullmatch(r"fast_\d+x\d+_w\d_s\d", p)]
best64 = max(plain_tiles, key=lambda p: sub[(p, 64, 16384)])
bm, bn, warps = re.fullmatch(r"fast_(\d+)x(\d+)_w(\d)_s\d", best64).groups()
NUM["plain64"], NUM["plain64_tile"] = results.two(sub[(best64, 64, 16384)]), f"{bm}×{bn} on {warps} warps"
assert sub[("fast_128x64_w4_s3_sub2", 64, 16384)] > sub[(best64, 64, 16384)], "the text says sub-tiles won at 64"
assert max(v for (p, dd, nn), v in sub.items() if dd == 128 and nn == 16384 and "sub2" not in p
           and p.startswith("fast_1")) == sub[("fast_128x128_w8_s3", 128, 16384)], "128x128 is the best plain tile"
ws_sub = [sub[("fast_256x64_w8_s3_ws_sub2", dd, nn)] - sub[("fast_256x64_w8_s3_sub2", dd, nn)]
          for dd in (64, 128) for nn in (1024, 4096, 16384)]
assert sum(abs(x) < 0.005 for x in ws_sub) == 5, ws_sub

lazy = explore_table("lazy_rescaling")
NUM["early"] = results.two(lazy[("fast_256x64_w8_s3_sub2", 128, 16384)])
plain = ("fast_128x128_w8_s3", "fast_128x64_w8_s3")  # the best 128-row tiles of that run
for d in (64, 128):
    NUM[f"nosplit{d}"] = results.two(lazy[("fast_256x64_w8_s3", d, 16384)])
    NUM[f"best{d}"] = results.two(max(lazy[(p, d, 16384)] for p in plain))
    assert lazy[("fast_256x64_w8_s3", d, 16384)] <= max(lazy[(p, d, 16384)] for p in plain) + 0.01, \
        "the text says a 256-row tile without the split is no faster than the best 128-row tile"


def lazy_loss(names):
    losses = [100 * (1 - lazy[(p + "_lazy", dd, nn)] / lazy[(p, dd, nn)])
              for p in names for dd in (64, 128) for nn in (1024, 4096, 16384)]
    assert min(losses) > 0, "the text says lazy rescaling was slower everywhere"
    return results.span(losses, "{:.0f}")


NUM["lazy_plain"] = lazy_loss(("fast_128x128_w8_s3", "fast_128x64_w8_s3"))
NUM["lazy_sub"] = lazy_loss(("fast_256x64_w8_s3_sub2", "fast_128x64_w4_s3_sub2"))


CHANGES = r"""
### The fast kernel, one change at a time

*On a first read, take in the six changes and the table that follows, and skip the optional Hopper
subsection after it.*

`gqa_flash/fast/forward.py` keeps the maths of the graded kernel and changes how it runs on the GPU:

1. **Tensor descriptors and the TMA**: on Hopper, the Tensor Memory Accelerator (TMA) is a unit on each
   SM that moves whole tiles between global and shared memory asynchronously, given a descriptor of the
   tensor (its shape and strides). It pads ragged tails with zeros, instead of every thread computing
   addresses and issuing its own loads. (It is not one of the GPU's copy engines: those are DMA units
   for copies between host and device memory.)
2. **Launch order**: the heaviest causal tiles (the last query blocks, which see the most keys) run first,
   and the query heads of one KV group run back to back, meant to share their K/V tiles through L2.
   Section 2 measured that this order reads <<order_bytes>>× the DRAM bytes of the head-major order at the
   main shape, in the same time: the sharing did not help there; heaviest-first is what the order buys.
3. **One fused multiply-add per score**, and `tl.dot(p, v, acc)` accumulating in place.
4. **Descriptors built once on the host** and passed to the kernel. The first version built them inside
   the kernel (`tl.make_tensor_descriptor`), which costs every program a write to global memory and a
   fence before its first load: thousands of programs at N = 1024.
5. **A warp-specialised key loop** (`tl.range(..., warp_specialize=True)`): Triton splits the loop
   into warps that only load and warps that only compute. On Hopper with Triton 3.6 it compiled only
   with 8 warps, and measured within the noise, so it was taken out of the kernel.
6. **Two query sub-tiles a program** (a software "ping-pong"): each program owns two halves of its query
   rows that share every K/V tile. Both halves' score products are issued before either softmax, so the
   tensor cores work on one half while the exponential units work on the other. On the causal diagonal
   the first half stops at its own last row and the second finishes alone (the picture, left). On the
   diagonal steps the halves share, only the first needs the mask: the second's rows all come later.
"""

PINGPONG_CELL = r"""
from gqa_flash.course.lab import kernel_viz

kernel_viz.plot_pingpong()
plt.show()
"""

BOUGHT = r"""
On Hopper a matrix product is an asynchronous instruction: a warp can start the next one, or the
exponentials, before the last has finished. With one tile of rows every step waits on the one before
(the scores feed the softmax, the softmax feeds $PV$); two independent halves give the hardware
something to do while it waits (the picture, right, is the idealised schedule; how much really overlaps
is for the measurements to say).

### What each change bought

Each entry is a ratio to SDPA's default (cuDNN) timed in the same run as the kernel, on the <<gpu>>:
1.00 is a tie. Changes 1 to 4 came together; the table isolates what could be measured apart. A ratio
compares two kernels of one run; between runs the machine itself changes (its clocks, or another GPU of the
same kind): SDPA's own speed at head_dim 128, N = 16k, was <<sdpa_spread>> TFLOP/s in the <<spread_files>>
files of this section, a spread of <<spread_pct>>%. So where a line's two columns come from two files, read
a few hundredths between them as noise.

| change | measured at | without it | with it |
| --- | --- | --- | --- |
| 4. descriptors built on the host | fast kernel, autotuned, head_dim 64, N = 1k | <<desc_first>> (built in the kernel, <<file:forward_first>>) | <<desc_host>> (<<file:fast_forward_tiles>>) |
| 2. KV groups launched together | DRAM bytes and time, N = 16k (section 2) | head-major order | <<order_bytes>>× the bytes, the same time within 1% |
| 5. warp-specialised key loop | fixed 128×128 tiles, head_dim 128 | the same tile | <<ws>>% faster, within the noise: taken out |
| 6. two query sub-tiles | head_dim 128, N = 16k | <<plain128>> (128×128, the best plain tile) | <<sub256>> (256×64, two halves of 128 rows) |
| 6. two query sub-tiles | head_dim 64, N = 16k | <<plain64>> (<<plain64_tile>>, the best plain tile) | <<sub128>> (128×64, two halves of 64 rows on 4 warps) |
| 6. the first half leaves the diagonal early | 256×64 in two halves, head_dim 128, N = 16k | <<early>> (both halves walk the diagonal, <<file:lazy_rescaling>>) | <<sub256>> (<<file:fast_subtiles>>) |
| lazy rescaling (tried, removed) | every fixed tile, head_dim 64 and 128, N = 1k to 16k | the same tile | <<lazy_plain>>% slower on plain tiles, <<lazy_sub>>% on split ones |

**Why the sub-tiles won.** Two details matter. Each half should fill whole warp groups (a Hopper `wgmma`
instruction works on 64 rows per group of 4 warps), so 64-row halves go with 4 warps and 128-row halves
with 8. And on the diagonal the first half must stop at its own last row (it sees no later key). The size
alone does not do it: in one run, at N = 16k, a 256-row tile without the split reached <<nosplit128>> at
head_dim 128 and <<nosplit64>> at 64, against <<best128>> and <<best64>> for the best 128-row tile. The
win is the overlap, not the size.

**Lazy rescaling** (keep the running maximum until it grows by more than $2^8$, so most tiles skip
`acc *= alpha`) was slower everywhere: the skipped multiply is cheap, and the branch around the
accumulator probably keeps Triton from pipelining the loop (a reading of the code, not checked in the
compiled kernel). It is not in the kernel.

Every table behind these lines (each fixed tile at every shape, with and without each change, file by
file) is in `docs/performance.md`, in its section *Notebook 05's record*; `bench/RESULTS.md` adds the
prediction written down before each run.
"""


def cells(md, code):
    """The subsection's cells, in order; md and code are the generator's cell builders."""
    return [md(CHANGES), code(PINGPONG_CELL), md(BOUGHT)]
