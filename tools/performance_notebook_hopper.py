"""Notebook 05's last subsection of section 5, optional: the Gluon forward on Hopper (tools/make_performance_notebook.py).

Its numbers come from the H100 runs of bench/explore_hopper.py and the public sweep after the route, read by
topic; the asserts below check the words around them, so a run that changes the story stops here. The notebook
gets the ideas, a picture, one summary table and the kernel as users call it; the ratios of every step at both
head dims and the detailed account (:data:`DETAIL`) go to docs/performance.md (performance_notebook_record.py).
"""
from gqa_flash.course.lab import results

TOPICS = ("hopper_forward_one_program_a_tile", "hopper_forward_persistent", "hopper_forward_variants",
          "hopper_forward_split_release", "forward_main_h100_gluon_route")
NUM = {}

# The Gluon kernel on Hopper (section 5's last subsection): one H100 run a step, bench/explore_hopper.py.
H100 = NUM["hopper_gpu"] = "NVIDIA H100 80GB HBM3"
NUM["hopper_short"] = H100.split()[1]  # "H100", for headings
HOPPER = ("hopper_forward_one_program_a_tile", "hopper_forward_persistent", "hopper_forward_variants",
          "hopper_forward_split_release")
for topic in HOPPER + ("forward_main_h100_gluon_route",):
    assert {r["gpu"] for r in results.load(topic)} == {H100}, f"the text says {topic} ran on an H100"
for topic in HOPPER:
    assert all(r["verdict"] == "ok" for r in results.load(topic) if r["part"] == "check"), topic


def hopper(topic, provider, d):
    """{N: ratio to SDPA's default} of one provider's timed rows in one bench/explore_hopper.py CSV."""
    return {int(r["seq_len"]): float(r["ratio_to_sdpa_default"]) for r in results.load(topic)
            if r["part"] == "time" and r["provider"] == provider and int(r["head_dim"]) == d}


def change(new, old, ns=None):
    """new - old, N by N (all N, or those in ns), in signed hundredths (results.two: the ratios have three
    decimals, so their differences are exact at three)."""
    diffs = [round(new[n] - old[n], 3) for n in sorted(new) if ns is None or n in ns]
    lo, hi = results.two(min(diffs), sign=True), results.two(max(diffs), sign=True)
    return lo if lo == hi else f"{lo} to {hi}"


one, per, var, rel = HOPPER
assert all(hopper(one, "gluon", d)[n] < hopper(one, "course_fast", d)[n] for d in (64, 128)
           for n in hopper(one, "gluon", d)), "the text says the first version was behind everywhere"
NUM["behind1"] = change(hopper(one, "gluon", 128), hopper(one, "course_fast", 128))
NUM["persist1k128"], NUM["persist1k64"] = (change(hopper(per, "gluon", d), hopper(per, "gluon_one_tile", d), {1024})
                                           for d in (128, 64))
NUM["persist16k"] = change({(d, 0): hopper(per, "gluon", d)[16384] for d in (64, 128)},
                           {(d, 0): hopper(per, "gluon_one_tile", d)[16384] for d in (64, 128)})
NUM["pp128"], NUM["pp64"] = (change(hopper(var, "gluon_pp", d), hopper(var, "gluon", d)) for d in (128, 64))
assert max(hopper(var, "gluon_pp", 64)[n] - hopper(var, "gluon", 64)[n] for n in hopper(var, "gluon", 64)) < 0
NUM["split128"] = change(hopper(rel, "gluon", 128), hopper(var, "gluon", 128))
NUM["k2v2_128"] = change(hopper(rel, "gluon_n128_k2v2", 128), hopper(var, "gluon", 128))
assert min(hopper(rel, "gluon", 128)[n] - hopper(var, "gluon", 128)[n] for n in hopper(rel, "gluon", 128)) > 0.06
long_n = {8192, 16384}  # where the fast kernel ran Triton's kernel in both runs
assert not any(r["tiles"].startswith("gluon") for topic in (var, rel) for r in results.load(topic)
               if r["provider"] == "course_fast" and int(r["head_dim"]) == 128 and int(r["seq_len"]) in long_n)
moved = [abs(round(hopper(rel, "course_fast", 128)[n] - hopper(var, "course_fast", 128)[n], 3)) for n in long_n]
NUM["triton_moved"] = results.two(max(moved))
NUM["split64"] = results.two(max(abs(round(new - hopper(var, "gluon", 64)[n], 3))
                                 for n, new in hopper(rel, "gluon", 64).items()))
assert all(hopper(rel, "gluon", 64)[n] < hopper(rel, "course_fast", 64)[n] for n in (1024, 2048, 4096))
route_rows = results.load("forward_main_h100_gluon_route")
assert all(r["tiles"].startswith("gluon") == (int(r["head_dim"]) == 128) for r in route_rows
           if r["provider"] == "course_fast"), "the text says head_dim 128 runs the Gluon kernel, 64 the Triton one"


ROLES_AND_RINGS = r"""
### Optional, for Hopper owners: warp specialisation by hand, measured on an <<hopper_short>>

*Skip this subsection on a first read, and on a laptop: it goes one level below Triton, and its numbers come
from another GPU, an <<hopper_gpu>>. Section 6 follows it.*

**A loader, two consumers, and who waits for whom.** Everything above is Triton: you write what one program computes, and the compiler decides where each load
and each product is waited for. Read in the compiled kernels (`bench/RESULTS.md`, "Open"), its rule on
Hopper is strict: a product that does not accumulate across the loop, such as the scores $S = QK^\top$, is
waited for right after it is issued, by a wait with `pendings = 0`, and such a wait waits for *every*
product in flight, the last $PV$ included. So within one chain of products the softmax never runs under a
product of that chain; change 6's two sub-tiles are two chains, so that one's exponentials can hide
behind the other's products.

**Gluon** (`triton.experimental.gluon`, Triton's lower-level dialect) has you write what the compiler
decided. On an H100 with Triton 3.6 the fast forward hands causal calls at head dims 65–128 from
$N$ = 1k to a kernel written in it, `gqa_flash/fast/hopper_forward.py`, arranged as FlashAttention-3 is.
Everywhere else, an H200 included, `forward.py`'s Triton kernel runs: the Gluon kernel was timed and tested
on the H100 only. What it says that Triton could not be told:

- **Roles** (`gl.warp_specialize`): a *loader* of one warp that only issues TMA copies of K and V tiles,
  and two *consumer* warpgroups of 4 warps (the unit one `wgmma` works on), each owning 64 query rows:
  the same rows of two query heads of one KV group, so both use every tile the loader brings (where a
  group has an odd number of heads, two blocks of 64 rows of one head). The loader keeps 24 registers a
  thread so that the consumers can have 240.
- **Rings of shared-memory slots**: at head_dim 128, with 128 keys a tile, K's tiles take turns in 3
  slots and V's in 2 (224 of the SM's 227 KiB, with Q and O).
- **mbarriers**, which say when a slot is full and when it is free again.
- **Asynchronous products and a partial wait**: `warpgroup_mma(..., is_async=True)` issues a product and
  returns at once; `warpgroup_mma_wait(n)` waits until at most `n` are still in flight (they complete in
  the order issued). At step $j$ a consumer issues block $j{+}1$'s $S$, then block $j$'s $PV$, and waits
  with `n = 1`: $S$ is ready while $PV$ may still run, and block $j{+}1$'s softmax runs under it. Then it
  waits for $PV$, rescales the accumulator and frees V's slot.

**The ring.** Count the key blocks a program consumes over all its tiles: block `it` goes to slot
`it % STAGES`, on that slot's pass `p = it // STAGES`. Each slot has two barriers. On `k_ready[slot]` the
loader announces the bytes it expects (`mbarrier.expect`), and the TMA copy completes the barrier when
they have landed; the consumers wait on it. `k_empty[slot]` is set up with a count of 2: each consumer
arrives once when it is done with the tile, and the loader waits for both before it refills the slot.
A barrier has no counter you read: it has a *phase*, which completes when its arrivals (and expected
bytes) are all in, and then the next phase begins. `mbarrier.wait(bar, parity)` waits until the phase of
that parity, 0 or 1, has completed. On pass $p$ the consumers wait on `ready` with parity `p & 1` (the
slot's $p$-th fill) and the loader on `empty` with parity `(p & 1) ^ 1`. On the first pass that is parity
1, and a fresh barrier counts its phase 1, the one before phase 0, as complete: a slot's first fill
waits on nothing. On the second pass the loader waits for parity 0, the consumers' first release.

**Who frees K, and when.** As first built, a block's K and V shared one slot (2 slots at head_dim 128),
freed after $PV$. At the end of step $j$ both consumers free block $j$'s slot, the loader copies block
$j{+}2$ into it, and at the start of step $j{+}1$, the very next step, they ask for $K_{j+2}$: the copy's
whole latency lay in between, at every step. Yet K is finished with as soon as its scores are computed.
The kept kernel gives K and V rings of their own and frees K's slot as soon as `warpgroup_mma_wait(1)` has
returned the scores (`k_empty`), V's after $PV$ (`v_empty`), so the loader can work a step ahead. The
picture runs both versions on an idealised clock: a small simulation of the barriers with made-up
durations, not a measurement.
"""


TIMELINE_CELL = r"""
kernel_viz.plot_hopper_timeline()
plt.show()
"""


READING_THE_TIMELINE = r"""
Top: the red hatching is a copy's latency that nothing hides. Bottom: K's copy waits in the loader
only behind V's, and still lands before a consumer asks for it; each consumer's softmax lies under
products, its own $PV$ and the other consumer's $S$ and $PV$. The two consumers are not told to take
turns: in the picture they drift a product or two apart because they share the tensor cores from the
first product on. (On the GPU that interleaving is the hardware's business.)

**Four steps, each predicted before it ran.** The kernel was built in four steps, each one device call on
an **<<hopper_gpu>>** (the files' `gpu` column): bf16, causal, 32 query heads on 8 KV heads, 16k tokens
a launch, 5 interleaved rounds, every variant checked first against float64, and the Triton fast kernel
timed in the same run. Each measured entry is a change in the ratio to SDPA's default at $N$ = 1k to 16k:
against the Triton kernel for step 1, and against the Gluon kernel of the step before for the others, in the
same run but for step 4:

| step | predicted before the run | measured | kept |
| --- | --- | --- | --- |
| 1. one program a tile | level with the Triton kernel from 8k, ahead at 1k–4k | behind the Triton kernel at every length (<<behind1>> at head_dim 128) | replaced by step 2 |
| 2. persistent: one program an SM, tiles taken in turn | the short sequences gain most | <<persist1k128>> at head_dim 128 and <<persist1k64>> at 64 for $N$ = 1k; <<persist16k>> at 16k | yes |
| 3. turns: each consumer waits for the other before its products (FlashAttention-3's ping-pong) | +3–8% from 8k at head_dim 128 | <<pp128>> at head_dim 128, <<pp64>> at 64 | no |
| 4. K's slot freed right after its scores | +3–6% at head_dim 128 | <<split128>> at head_dim 128, against step 3's run (the Triton kernel moved by at most <<triton_moved>> between the two); at most <<split64>> either way at 64 | yes |

The idea taken whole from the paper (step 3) bought nothing here, and the change that moved the number
most (step 4) was one barrier arrival moved a few lines up, found by asking who waits for whom. The
prediction written before each run is what shows which was which. (The ratios of every step at both head
dims, and the account of each, are in `docs/performance.md`, *Notebook 05's record*.)

Through the functions a user calls (`fast_attention_forward`; one more run on the same kind of
<<hopper_short>>, beside SDPA's default), the fast kernel now runs the Gluon kernel at head_dim 128 at
every length, and the Triton kernel at 64 (<<file:forward_main_h100_gluon_route>>):
"""


STEPS = [  # (topic, step, [(provider, label)]): each run's Gluon rows; the record adds the fast kernel's
    ("hopper_forward_one_program_a_tile", "1. one program a tile", [("gluon", "Gluon")]),
    ("hopper_forward_persistent", "2. persistent", [("gluon", "Gluon, persistent"),
                                                    ("gluon_one_tile", "Gluon, one program a tile")]),
    ("hopper_forward_variants", "3. turns (not kept)", [("gluon_pp", "Gluon, consumers take turns"),
                                                        ("gluon", "Gluon, no turns (step 2's)")]),
    ("hopper_forward_split_release", "4. K freed after S", [("gluon", "Gluon, K in 3 slots (kept)"),
                                                            ("gluon_n128_k2v2", "Gluon, K and V 2 slots each")]),
]
assert tuple(topic for topic, _, _ in STEPS) == HOPPER


DETAIL = r"""
What each step gave, against what was written down before it (`bench/RESULTS.md`, "The Gluon forward";
the Gluon kernel uses 128-key tiles; before step 4 K and V shared 2 slots at head_dim 128 and 3 at 64;
step 4's kept kernel has K in 3 slots and V in 2, 3 at 64):

1. **One program a tile.** Predicted: level with the Triton kernel from 8k, ahead at 1k–4k. It came out
   behind everywhere. A program fills an SM's shared memory, so each SM runs one, and nothing overlaps
   a program's start (Q's load, the first K and V) or its end (the output's store).
2. **Persistent**: one program an SM, taking tiles in turn, heaviest first, the next tile's Q loaded
   under the last $PV$. Predicted: the short sequences gain most. They did: against one program a tile
   in the same run, <<persist1k128>> at head_dim 128 and <<persist1k64>> at 64 for $N$ = 1k,
   <<persist16k>> at 16k.
3. **Turns** (FlashAttention-3's ping-pong: each consumer waits on the other's mbarrier before it issues
   its two products). Predicted: +3–8% from 8k at head_dim 128. It gave <<pp128>> at 128 and <<pp64>> at
   64 against the same kernel without turns: not kept. A reading, not checked: the two consumers already
   interleave without being told, and the extra wait costs more than the order it enforces.
4. **K freed after its scores.** Predicted: +3–6% at head_dim 128. It gave <<split128>> over step 3's
   kernel (two runs; at 8k and 16k, where the Triton kernel ran in both, it moved by at most
   <<triton_moved>>), and K and V in 2 slots each, as many as before, already gave <<k2v2_128>>: what
   counts is freeing K early, not the third slot. At head_dim 64 the change was at most <<split64>> either
   way, as the explanation says it should be: there the shared ring already had 3 slots, so block
   $j{+}3$'s copy had a whole step to land. The Gluon kernel stays behind the Triton kernel at 64 from 1k
   to 4k, and head_dim 64 stays with Triton.
"""


ROUTE_CELL = r"""
route = results.load("forward_main_h100_gluon_route")
seq_lens = sorted({int(r["seq_len"]) for r in route})
print(results.cite("forward_main_h100_gluon_route"))
print(f"{'head_dim':>8s} {'kernel':14s}" + "".join(f"{f'N={n // 1024}k':>8s}" for n in seq_lens))
for d in (64, 128):
    at = {(r["provider"], int(r["seq_len"])): r for r in route if int(r["head_dim"]) == d}
    print(f"{d:8d} {'SDPA, TFLOP/s':14s}" + "".join(f"{float(at['sdpa_default', n]['tflops']):8.0f}"
                                              for n in seq_lens))
    for provider in ("course_graded", "course_fast"):
        print(f"{'':8s} {provider:14s}" + "".join(f"{results.two(at[provider, n]['ratio_to_sdpa_default']):>8s}"
                                              for n in seq_lens))
    ran = sorted({"Gluon" if at["course_fast", n]["tiles"].startswith("gluon") else "Triton" for n in seq_lens})
    print(f"{'':8s} course_fast ran the {' and the '.join(ran)} kernel")
"""


def cells(md, code):
    """The subsection's cells, in order; md and code are the generator's cell builders."""
    return [
        md(ROLES_AND_RINGS),
        code(TIMELINE_CELL),
        md(READING_THE_TIMELINE),
        code(ROUTE_CELL),
    ]
