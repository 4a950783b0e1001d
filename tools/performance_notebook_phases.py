"""Notebook 05's subsection on the two-phase causal loop, in section 5 (tools/make_performance_notebook.py).

Its numbers come from the H200 run that merged the fast forward's two key loops into one (tried and removed;
commit 239abec has the code), rows `merged` of one file read by topic, and from the tile arithmetic of
gqa_flash.course.lab.viz.tile_kinds; the asserts below check the words around them, so a run that changes the story
stops here.
"""
from gqa_flash.course.lab import results
from gqa_flash.course.lab.viz import tile_kinds

TOPIC = "backward_flat_forward_merged"  # its rows of kind `merged`; those of kind `flat` are the backward's
TOPICS = (TOPIC,)
NUM = {}

H200 = NUM["gpu"] = "NVIDIA H200"
assert results.entry(TOPIC)["gpu"] == H200, "the text says the merged loop was timed on an H200"

# Tile arithmetic: how many of the key blocks one (batch, head)'s query tiles visit lie on the diagonal.
for n, key in ((1024, "1k"), (4096, "4k")):
    kinds = tile_kinds(n, 128, 64, causal=True)
    masked, visited = int((kinds == 2).sum()), int((kinds > 0).sum())
    assert masked == 2 * kinds.shape[0], "the text says each query tile masks its two diagonal blocks"
    NUM[f"diag{key}"], NUM[f"visited{key}"] = f"{masked:,}", f"{visited:,}"
    NUM[f"times{key}"] = f"{visited / masked:.1f}"
assert (tile_kinds(1024, 128, 64, causal=False) == 1).all(), "the text says no block is masked without causality"

# The measurement: each tile's merged loop against its two phases, in the same run.
ratio = {(r["provider"], int(r["d"]), int(r["n"])): float(r["ratio"]) for r in results.load(TOPIC)
         if r["kind"] == "merged"}
TILES = ("fast_256x64_w8_s3_sub2", "fast_128x64_w4_s3_sub2", "fast_128x64_w4_s2_sub2", "fast_64x64_w4_s3")
assert {p.removesuffix("_merged") for p, _, _ in ratio if p.endswith("_merged")} == set(TILES)
SHAPES = sorted({(d, n) for _, d, n in ratio})
assert SHAPES == [(64, 1024), (64, 4096), (128, 1024), (128, 4096)], "the text says N = 1k and 4k"
change = {(t, d, n): 100 * (ratio[(t + "_merged", d, n)] / ratio[(t, d, n)] - 1) for t in TILES for d, n in SHAPES}


def losses(tiles, ns=(1024, 4096)):
    """The merged loop's losses, in percent, at these tiles and lengths (both head dims)."""
    return [-change[(t, d, n)] for t in tiles for d, n in SHAPES if n in ns]


subtiled, plain = TILES[:3], TILES[3:]
assert min(losses(subtiled)) > 2, "the text says every sub-tiled tile lost, by more than the ±2% predicted"
NUM["slower"], NUM["pairs"] = str(len(losses(subtiled))), str(len(change))
NUM["loss256"], NUM["loss128"] = results.span(losses(subtiled[:1]), "{:.0f}"), results.span(losses(subtiled[1:]), "{:.0f}")
NUM["loss1k"], NUM["loss4k"] = results.span(losses(subtiled, (1024,)), "{:.0f}"), results.span(losses(subtiled, (4096,)), "{:.0f}")
assert all(change[(t, d, 4096)] < change[(t, d, 1024)] for t in subtiled for d in (64, 128)), \
    "the text says each sub-tiled tile lost more at 4k than at 1k"
assert all(change[(t, d, 1024)] > 1.5 for t in plain for d in (64, 128)), "the text says 64x64 gained at 1k"
NUM["gain64"] = results.span([change[(t, d, 1024)] for t in plain for d in (64, 128)], "{:.0f}")
NUM["flat64"] = f"{max(abs(change[(t, d, 4096)]) for t in plain for d in (64, 128)):.1f}"
assert float(NUM["flat64"]) <= 0.5, "the text says 64x64 moved by at most half a percent at 4k"


WHY_TWO_PHASES = r"""
### The two-phase causal loop: no mask below the diagonal

Your kernel of notebook 04 walks a query tile's keys in two phases, and so does the fast kernel. A tile
whose rows start at $q_0$ sees every key before $q_0$: those blocks, phase 1, need no mask. Only the
blocks of the diagonal, keys $q_0$ to $q_0 + \text{BLOCK\_M} - 1$, go through the mask (phase 2), and
the blocks past it are never loaded.

A mask is not free. To apply it to a block the kernel builds the block's key positions (`tl.arange`, an
*iota*), compares each key $j$ with each row $i$ ($j \le i$, and $j < N$), and selects $-\infty$ where
the comparison fails: a comparison and a select on every one of the $\text{BLOCK\_M} \times
\text{BLOCK\_N}$ scores, work for the ordinary arithmetic units that already carry most of the
softmax's, while the tensor cores make the whole tile of scores in a few instructions. Each phase is a
loop of its own (in the fast kernel, one function called twice, whether it masks a compile-time
constant, `tl.constexpr`), so the compiler builds two loop bodies, and phase 1's holds no trace of the
mask. With 128×64 tiles the 8 query tiles of one head visit <<visited1k>> key blocks at
$N$ = 1k, and <<diag1k>> of them are on the diagonal; at 4k, <<diag4k>> of <<visited4k>>. A kernel
that masked every block would do the mask's work <<times1k>> times over at 1k and <<times4k>> times over
at 4k. The picture draws the 1k case; the numbered row is one query tile's walk.
"""


SCHEDULE_CELL = r"""
from gqa_flash.course.lab import kernel_viz

kernel_viz.plot_kernel_schedule(seq_len=1024, block_m=128, block_n=64, highlight=5, ask=False)
plt.show()
"""


MERGED_EXPERIMENT = r"""
Every walk ends in its two diagonal blocks, whatever $N$, so the share that needs the mask falls as $N$
grows. (On the right, without the causal mask, no block at this length is ragged: nothing is masked.)

**One loop instead of two?** Triton pipelines each loop on its own, with a prologue that issues the first
loads ahead and an epilogue that drains them, so a program with two loops starts its pipeline twice.
The experiment (tried in the fast kernel and removed: its code is in the history of the course's
repository, commit 239abec, not in your copy) walked all of a tile's
key blocks in one loop and applied the mask under a test made at run time on every step: mask this block
if it starts at or past the diagonal. It masks the same blocks as the two phases do, so the mask's
arithmetic is unchanged; what is new is a branch inside the loop body. Predicted before the run
(`bench/RESULTS.md`, prediction 13): slower at 256×64, because ptxas, the assembler, warned that the
branch makes it *serialise* the `wgmma` instructions (Hopper's asynchronous matrix products: it waits
for each to finish before it issues anything more), and ±2% elsewhere.

Each tile ran in both forms in one run on an **<<gpu>>** (the index's `gpu` column): bf16, causal, 32
query heads on 8 KV heads, head_dim 64 and 128, $N$ = 1k and 4k, each beside SDPA's default
(<<file:backward_flat_forward_merged>>, rows `merged`). The table divides the merged loop's ratio to
SDPA by the two-phase loop's at the same tile (`sub2`: two query sub-tiles a program, change 6 below):
"""


MERGED_TABLE_CELL = r"""
merged = {(r["provider"], int(r["d"]), int(r["n"])): float(r["ratio"])
          for r in results.load("backward_flat_forward_merged") if r["kind"] == "merged"}
shapes = sorted({(d, n) for _, d, n in merged})
print(results.cite("backward_flat_forward_merged"))
print("one masked loop against two phases, same tile, same run: change in speed")
print(f"{'fast kernel, fixed tile':24s}" + "".join(f"{f'D{d} N{n // 1024}k':>11s}" for d, n in shapes))
for tile in ("fast_256x64_w8_s3_sub2", "fast_128x64_w4_s3_sub2", "fast_128x64_w4_s2_sub2", "fast_64x64_w4_s3"):
    label = tile[5:] if "sub2" in tile else tile[5:] + "_sub1"
    print(f"{label:24s}" + "".join(f"{merged[tile + '_merged', d, n] / merged[tile, d, n] - 1:+11.1%}"
                                   for d, n in shapes))
"""


LESSON = r"""
The merged loop was slower at every sub-tiled tile, <<slower>> of the <<pairs>> tile and shape pairs: by
<<loss256>>% at 256×64, as predicted, and by <<loss128>>% on the sub-tiled 128×64, where ±2% was
predicted. Only 64×64 without sub-tiles, whose products form a single chain, did not lose (<<gain64>>% faster at 1k,
within <<flat64>>% at 4k). And the sub-tiled tiles lost more at 4k (<<loss4k>>%) than at 1k
(<<loss1k>>%), although the diagonal is a smaller share of the blocks at 4k: what costs is the branch on every
step of the loop, not the mask on the diagonal (a reading of the numbers, not checked in the compiled
kernels). The lesson, prediction against outcome: the branch was expected to cost one tile and cost
every tile whose sub-tiles overlap their products, so what the two phases buy on Hopper is less the
comparisons they save than a loop body with no branch in it, which the compiler can pipeline.
"""


def cells(md, code):
    """The subsection's cells, in order; md and code are the generator's cell builders."""
    return [
        md(WHY_TWO_PHASES),
        code(SCHEDULE_CELL),
        md(MERGED_EXPERIMENT),
        code(MERGED_TABLE_CELL),
        md(LESSON),
    ]
