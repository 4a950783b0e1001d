"""Writes notebooks/06_backward_and_training.ipynb. Run it from the top of the course, then execute the
notebook in place with the solutions, so that its stored outputs (the check cells' PASS lines) are real:

    .venv/bin/python tools/make_backward_notebook.py
    GQA_FLASH_IMPL=solutions .venv/bin/jupyter nbconvert --to notebook --execute --inplace \
        --ExecutePreprocessor.record_timing=False notebooks/06_backward_and_training.ipynb

(record_timing=False keeps nbconvert's timestamps out of the cells' metadata, so a re-run's diff is
only what changed.)

The numbers the text quotes (the backward's H200 measurements and the tiny model's training) are computed in
tools/backward_notebook_numbers.py from notebooks/data, with asserts on the words around them.
"""
import nbformat as nbf

from backward_notebook_numbers import NUM  # tools/: the measured numbers its text quotes


md = lambda s: nbf.v4.new_markdown_cell(s.strip())  # noqa: E731
code = lambda s: nbf.v4.new_code_cell(s.strip())  # noqa: E731


def hints(title, nudge, idea, maths):
    """A part's heading and its three layered hints, each collapsed (a <details> block): the answer stays hidden."""
    names = ("a nudge", "the idea", "pseudo-code, in maths")
    blocks = [f"<details><summary>Hint {i}: {name}</summary>\n\n{text.strip()}\n\n</details>"
              for i, (name, text) in enumerate(zip(names, (nudge, idea, maths)), start=1)]
    return md(f"### {title}\n\n" + "\n\n".join(blocks))


cells = [
md(r"""
# 06 · Bonus: the backward pass, and a model that trains with your kernels

The forward kernel stored one number per row that it did not need itself: the log-sum-exp (LSE). This
notebook spends it. You will derive the gradients of attention, see why the LSE and one more number per
row, $D$, make the backward pass cheap, write the backward kernels with GQA, and train a tiny transformer
with them, side by side with PyTorch's attention.

| part | what | where |
| --- | --- | --- |
| 1 | $D$, one number per query row | `backward.py`, `backward_preprocess` |
| 2 | $dK$ and $dV$ for one block of keys: which query blocks to visit, what to load, and each block's share | `backward.py`, `backward_dkdv` |
| 3 | the GQA sum: which query heads a KV head's gradient adds up | `backward.py`, `group_query_head` |
| 4 | $dQ$ for one block of queries: which key blocks to visit, and each block's share | `backward.py`, `backward_dq` |

The kernels are yours from the program's place in the grid to the store: the bounds of each walk under
the causal mask, every load and its mask, the units of the exponential and where the softmax scale goes.
`gqa_flash/fast/backward.py`, the course's fast backward, ships complete and answers these parts: finish
yours before you read it, as you would a published solution.

This is a bonus (20 points beyond the 100). Its graded tests start from the reference's $O$ and LSE, so
they score your backward alone; the training at the end needs a working `forward.py` too.
"""),
code(r"""
import matplotlib.pyplot as plt
import torch

import gqa_flash
from gqa_flash.course import runtime
from gqa_flash.course.lab import checks, tiny_model

torch.manual_seed(0)
print(gqa_flash.describe())
"""),
md(r"""
## The gradients of attention

For one head, with $s$ the softmax scale:

$$S = s\,QK^\top, \qquad P = \mathrm{softmax}(S) \text{ (row by row)}, \qquad O = PV.$$

Given $dO = \partial L / \partial O$, the chain rule backwards through each line:

* $O = PV$ is a matrix product: $\;dV = P^\top dO,\quad dP = dO\,V^\top$.
* The softmax of a row $p = \mathrm{softmax}(x)$ has Jacobian $\mathrm{diag}(p) - pp^\top$, so
  $dS_{ij} = P_{ij}\,(dP_{ij} - \sum_{j'} P_{ij'} dP_{ij'})$. The sum is one number per row; call it $D_i$.
* $S = s\,QK^\top$: $\;dQ = s\, dS\,K,\quad dK = s\, dS^\top Q$.

**$D$ without $P$.** $D_i = \sum_j P_{ij} dP_{ij} = \sum_j P_{ij} (dO_i \cdot v_j) = dO_i \cdot \sum_j P_{ij} v_j = dO_i \cdot O_i$.
So $D = \mathrm{rowsum}(dO \circ O)$: one pass over $O$ and $dO$, both $N \times d$, before any tile of
$P$ exists. That is Part 1. A quick numerical check of the identity:
"""),
code(r"""
S = torch.randn(6, 6, dtype=torch.float64)
V, dO = torch.randn(6, 4, dtype=torch.float64), torch.randn(6, 4, dtype=torch.float64)
P = torch.softmax(S, dim=-1)
O, dP = P @ V, dO @ V.T
print("sum_j P*dP :", (P * dP).sum(-1)[:3])
print("rowsum(dO*O):", (dO * O).sum(-1)[:3])
"""),
md(r"""
**$P$ without storing it.** The forward pass saved $\mathrm{LSE}_i = \log \sum_j e^{S_{ij}}$. Then
$P_{ij} = e^{S_{ij} - \mathrm{LSE}_i}$ exactly: no running maximum, no rescaling, because the LSE already *is*
the row's normaliser. The backward kernels recompute each tile of $S$ from $Q$ and $K$ (one more matrix
product) instead of reading an $N \times N$ matrix from memory. Recomputing is cheaper than remembering.
"""),
code(r"""
q, k, v = (torch.randn(1, 1, 8, 16, dtype=torch.float64) for _ in range(3))
_, lse = gqa_flash.reference_attention(q, k, v, causal=True)
S = (q @ k.transpose(-1, -2)) / 4.0
S = S.masked_fill(torch.ones(8, 8, dtype=torch.bool).triu(1), float("-inf"))
print("max |exp(S - LSE) - softmax(S)| =", float((torch.exp(S - lse[..., None]) - torch.softmax(S, -1)).abs().max()))
"""),
md(r"""
## GQA: a KV head's gradient is a sum

With GQA, KV head $j$ is read by the $g = H_q/H_{kv}$ query heads $jg, \dots, jg+g-1$. In the forward pass
that is a copy (each of them reads the same $K$ and $V$); in the backward pass a copy becomes a **sum**: $dK_j$
and $dV_j$ add up what each of those query heads sends back. The picture shows, for 8 query heads on 2 KV
heads, the size of each query head's contribution to each KV head's $dK$ (by autograd on the reference):
exactly one block of four per column.
"""),
code(r"""
hq, hkv, n, d = 8, 2, 16, 16
q = torch.randn(1, hq, n, d, dtype=torch.float64)
k, v = (torch.randn(1, hkv, n, d, dtype=torch.float64) for _ in range(2))
contrib = torch.zeros(hq, hkv)
for h in range(hq):  # the gradient that query head h alone sends to each KV head
    do = torch.zeros(1, hq, n, d, dtype=torch.float64)
    do[:, h] = torch.randn(n, d, dtype=torch.float64)
    _, dk, _ = gqa_flash.reference_gradients(q, k, v, do, causal=True)
    contrib[h] = dk[0].flatten(1).norm(dim=1)
fig, ax = plt.subplots(figsize=(3.2, 4))
ax.imshow(contrib, cmap="Blues")
ax.set_xticks(range(hkv), [f"KV {j}" for j in range(hkv)])
ax.set_yticks(range(hq), [f"q head {h}" for h in range(hq)])
ax.set_title("|contribution to dK|")
plt.show()
"""),
md(r"""
How to add them up in a kernel? One program per block of keys of one KV head walks **all** the query heads
of its group and accumulates into the same `dk` and `dv` registers. No atomics (whose order of additions
would make the result vary from run to run), no second pass, and the $K$ and $V$ tiles are loaded once for the
whole group. $dQ$ has no such sum (each query head has its own $Q$), so it gets its own kernel, one program per
block of queries, like the forward.

## Exercise: `gqa_flash/backward.py`

Fill in Parts 1 to 4. Each check below runs your kernels on exact forward results (from the float64 reference, so your
forward kernel's bugs cannot show up here) and compares with float64 autograd. A failing check first says what is
wrong and where (which gradient, which keys or rows, which heads); run the cell again, or call `checks.explain()`, for
the likely cause and a fix. Try to find the cause yourself first: that is the lesson.

Three questions to answer on paper before you write a line. Draw the $N \times N$ grid of (query, key) pairs under the
causal mask, cut into blocks of `BLOCK_M` queries and `BLOCK_N` keys.

* A program of `backward_dkdv` owns key block $j$. **Which query blocks does it need?** Which is the first? Which is
  the last?
* A program of `backward_dq` owns query block $t$. **Which key blocks does it need?**
* The forward stored the LSE as a natural log, and the kernels recompute $P$ with `tl.exp2`. **In what units is each
  number of the exponent, and where does $s$ (`sm_scale`) appear in each gradient?**

The checks answer all three for your code, and the hints below in words, then in maths. Parts 2 and 4's checks count
each program's score tiles, as the graded tests do: a walk over every block, the mask zeroing the rest, fails.
"""),
hints("Part 1: $D$",
      r"""Two masked loads and one reduction. The loads are `forward.py` Part 2's, written out in the kernel.""",
      r"""Broadcast a column of row indices against a row of column indices, for the addresses and for the mask alike: rows
below `SEQ_LEN`, columns below `HEAD_DIM`, masked lanes reading 0. Convert both tiles to fp32 before you multiply them
elementwise, then sum along the head dim (axis 1): one number per row.""",
      r"""For each row $i$ of the block with $i < N$: $D_i = \sum_{c < d} O_{ic}\, dO_{ic}$, each product and the sum in fp32.
Rows past $N$ and columns past the head dim $d$ read 0."""),
code(r"""
# NBVAL_CHECK_OUTPUT
checks.check_delta()
"""),
hints("Part 2: $dK$ and $dV$ for a block of keys",
      r"""Load this block's $K$ and $V$ once. Then two loops: over the query heads of the group (Part 3 names each) and, inside,
over the query blocks that can see these keys. Each query block brings its $Q$ and $dO$ tiles and its rows of the LSE
and of $D$; the derivation above says what it adds to $dK$ and $dV$, on the tile transposed.""",
      r"""*The walk.* Under the causal mask the first query that sees key $k$ is query $k$ itself, so the first query block to
visit is the one that holds this key block's first key: its index rounded down to a multiple of `BLOCK_M`. (Starting
one block later skips the diagonal, where the first queries that see these keys are.) Without the mask, every query
block. Either way the walk runs to `SEQ_LEN`.

*The units.* The forward computed its exponentials as $2^{x}$ with the scores times `qk_scale` $= s \log_2 e$. Here
the LSE comes in natural units: convert it once as you load it (times $\log_2 e$), so that both terms of the exponent
are in log2 units.

*The scale.* $dK = s\, dS^\top Q$: multiply `dk` by $s$ once, after both loops. Inside the loop over heads it would
scale the earlier heads' shares again; $dV$ carries no scale at all.

*The sums.* `dk` and `dv` add every block's share (`+=`) over every query block and every head of the group.""",
      r"""Write $j_0$ for the key block's first key, $B_M$ and $B_N$ for the block sizes, $N$ for the length, $s$ for
`sm_scale`, and $c = s \log_2 e$.

* $a = \lfloor j_0 / B_M \rfloor\, B_M$ with the causal mask, $a = 0$ without it
* for each query head $h$ of the group, for each query block starting at $m = a, a + B_M, \dots < N$:
  * for each key $j$ of the block and query $i$ of the query block: $p^\top_{ji} = 2^{\,c\,(k_j \cdot q_i) - \log_2 e
    \cdot \mathrm{LSE}_i}$ if $j < N$, $i < N$ and (causal) $j \le i$; else $p^\top_{ji} = 0$
  * $dV_j \mathrel{+}= \sum_i p^\top_{ji}\, dO_i$
  * $dS^\top_{ji} = p^\top_{ji}\,(v_j \cdot dO_i - D_i)$
  * $dK_j \mathrel{+}= \sum_i dS^\top_{ji}\, q_i$
* then $dK_j \leftarrow s\, dK_j$"""),
code(r"""
# NBVAL_CHECK_OUTPUT
checks.check_dkdv()
"""),
hints("Part 3: the GQA sum",
      r"""One line: `forward.py` Part 1 maps a query head to its KV head; this part runs that map backwards.""",
      r"""With $g = H_q / H_{kv}$, the query heads of KV head $j$ are consecutive: $g$ of them, starting at the first head of
group $j$. Not every $H_{kv}$-th head: that deals the heads out in turn, which is not how GQA groups them.""",
      r"""The $h$-th query head of KV head $j$'s group is $j\,g + h$, for $0 \le h < g$."""),
code(r"""
# NBVAL_CHECK_OUTPUT
checks.check_gqa_sum()
"""),
hints("Part 4: $dQ$ for a block of queries",
      r"""Part 2 seen the other way round: queries down the rows, one KV head, one loop, over the key blocks these queries can
see. Load the query block's $Q$, $dO$, LSE and $D$ once, before the loop.""",
      r"""*The walk.* Under the causal mask the last key a row sees is its own, so the walk stops after the key block that holds
this query block's last row: at $(t + 1)\,$`BLOCK_M`, or at `SEQ_LEN` if that comes first. (Stopping one block early
drops part of the diagonal.) Without the mask, every key block. The keys of the last block may run past `SEQ_LEN`:
they load as zeros, so their score is 0, not $-\infty$, and their probability must be set to 0.

*The units and the scale* are Part 2's: the LSE times $\log_2 e$, the scores times `qk_scale`, and $dQ = s\, dS\, K$,
so `dq` is multiplied by $s$ once, after the loop.""",
      r"""With $t$ the query block, $i$ its rows and $c = s \log_2 e$:

* $e = \min\big((t + 1)\,B_M,\ N\big)$ with the causal mask, $e = N$ without it
* for each key block starting at $n = 0, B_N, \dots < e$, for each row $i$ and key $j$ of the block:
  * $p_{ij} = 2^{\,c\,(q_i \cdot k_j) - \log_2 e \cdot \mathrm{LSE}_i}$ if $j < N$, $i < N$ and (causal) $j \le i$;
    else $p_{ij} = 0$
  * $dS_{ij} = p_{ij}\,(dO_i \cdot v_j - D_i)$
  * $dQ_i \mathrel{+}= \sum_j dS_{ij}\, k_j$
* then $dQ_i \leftarrow s\, dQ_i$"""),
code(r"""
# NBVAL_CHECK_OUTPUT
checks.check_dq()
"""),
md(r"""
## All of `backward.py`

The parts' checks run small fp32 inputs, one sequence, in the default layout. This one runs the parts' checks, then
all of `backward.py` on two inputs the parts never see, as the graded tests do: fp16 (both operands of a `tl.dot`
must be fp16: a probability tile or $dS$ computed in fp32 is cast down first), a batch of 2, MQA, head dim 80,
`sm_scale` 0.3, and $Q$, $K$, $V$, $O$, $dO$ laid out as `[B, N, H, D]` (a QKV projection's, through a transpose).
"""),
code(r"""
# NBVAL_CHECK_OUTPUT
checks.check_backward()
"""),
md(r"""
## A differentiable FlashAttention

`gqa_flash.flash_attention(q, k, v)` wraps the forward kernel and your backward kernels in a
`torch.autograd.Function`: the forward saves $O$ and the LSE ($O(N)$ memory), the backward calls
`backward.py`. It drops into a model wherever `F.scaled_dot_product_attention(q, k, v, is_causal=True,
enable_gqa=True)` would go.

## Training a tiny GQA transformer

The task needs no download: a sequence of random digits, a separator, then the same digits sorted. A
two-layer transformer with 4 query heads on 2 KV heads learns to sort by attending back to the unsorted half.
We train it twice from the same initial weights on the same batches: once with PyTorch's attention, once with
yours. If your gradients are right, the two loss curves are one curve. Every step runs your forward kernel first,
then your backward kernels, so `forward.py` must be done too: the cell says so when it is not.

On a CPU the kernels run in Triton's interpreter, one program at a time in Python, so the run is short: <<cpu_steps>>
steps of <<cpu_batch>> sequences, about <<cpu_seconds>> s of one CPU core with your kernels where these outputs were
made, and from about as long to three or four times as long on a laptop. On a GPU: <<gpu_steps>> steps of <<gpu_batch>>.
"""),
code(r"""
on_gpu = runtime.DEVICE.type == "cuda"
cfg = tiny_model.Config(dim=64 if on_gpu else 32, q_heads=4, kv_heads=2, layers=2)
run = dict(steps=<<gpu_steps>> if on_gpu else <<cpu_steps>>, batch=<<gpu_batch>> if on_gpu else <<cpu_batch>>,
           digits=8 if on_gpu else 6, lr=1e-2, cfg=cfg, device=runtime.DEVICE, dtype=torch.float32)
losses_sdpa = losses_course = None
not_yet = checks.backward_walks.why_not_train()  # training calls your forward first: is it done?
if not_yet:
    print("not run yet:", not_yet)
else:
    losses_sdpa = tiny_model.train(tiny_model.sdpa_attention, **run)
    losses_course = tiny_model.train(tiny_model.course_attention, **run)
    print(f"last step: SDPA {losses_sdpa[-1]:.4f}, course kernels {losses_course[-1]:.4f}")
"""),
code(r"""
fig, ax = plt.subplots(figsize=(6, 3.5))
if losses_course is not None:
    ax.plot(losses_sdpa, label="PyTorch SDPA", linewidth=4, alpha=0.4)
    ax.plot(losses_course, label="course kernels (forward + backward)", linestyle="--")
    ax.legend()
else:  # the axes stay, with why they are empty
    ax.text(0.5, 0.5, "not trained yet (see the cell above)", ha="center", va="center", transform=ax.transAxes)
ax.set(xlabel="step", ylabel="cross-entropy on the sorted half", title="Sorting digits with a tiny GQA transformer")
plt.show()
"""),
code(r"""
# NBVAL_CHECK_OUTPUT
if losses_course is None:
    print("not run yet:", not_yet)
else:
    print(checks.backward_walks.training_verdict(losses_sdpa, losses_course))
"""),
md(r"""
Both runs start from the same weights and see the same batches, so any difference comes from the attention
gradients alone. In fp32 the two curves agree to about $10^{-6}$: the kernels compute the same function and
the same gradients as PyTorch, in $O(N)$ memory.

### The same model on a GPU, until it has learned

A CPU run this short shows that the gradients are right, not that the model learns. On an H200 the
same model (dim <<train_dim>>, 4 query heads on 2 KV heads, 2 layers, fp32) was trained for
<<train_steps>> steps of batch <<train_batch>> on <<train_digits>> digits, three times from the same start on
the same batches: with PyTorch's attention, with the graded kernels (forward and backward, as you
wrote them) and with the fast ones (`flash_attention(..., fast=True)`). Every 25 steps the run measured
the training loss and the accuracy of greedy predictions on 512 held-out sequences: *sequence
accuracy* counts a sorted half as right only if every one of its digits is (<<train_file>>).
"""),
code(r"""
from gqa_flash.course.lab import results

curves = results.load("tiny_model_training")  # the H200 run, a topic of notebooks/data/INDEX.csv
print(results.cite("tiny_model_training"))
names = {"sdpa": "PyTorch SDPA", "course_graded": "course: graded kernels", "course_fast": "course: fast kernels"}
styles = {"sdpa": dict(linewidth=4, alpha=0.35), "course_graded": dict(linestyle="--"),
          "course_fast": dict(linestyle=":", linewidth=2)}
by = {p: [r for r in curves if r["provider"] == p] for p in names}
fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 3.8))
for p, label in names.items():
    steps = [int(r["step"]) for r in by[p]]
    ax_loss.plot(steps, [float(r["train_loss"]) for r in by[p]], label=label, **styles[p])
    ax_acc.plot(steps, [float(r["sequence_accuracy"]) for r in by[p]], label=label, **styles[p])
ax_loss.set_yscale("log")
ax_loss.set_ylabel("training loss (cross-entropy)")
ax_acc.set_ylabel("sequence accuracy, 512 held-out")
ax_acc.set_ylim(0, 1.02)
for ax in (ax_loss, ax_acc):
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
ax_acc.legend(loc="lower right", fontsize=8)
fig.suptitle("The tiny GQA transformer on an H200: fp32, batch 64, three attentions from one start")
plt.tight_layout()
plt.show()

print(f"{'step':>5s} " + " ".join(f"{label:>28s}" for label in names.values()) + "   (loss, sequence accuracy)")
for i, r in enumerate(by["sdpa"]):
    if int(r["step"]) in (1, 100, 200, 300, 350, 375, 500, 750) or i == len(by["sdpa"]) - 1:
        print(f"{int(r['step']):5d} " + " ".join(
            f"{float(by[p][i]['train_loss']):19.4f} {float(by[p][i]['sequence_accuracy']):8.3f}" for p in names))
"""),
md(r"""
All three learn the task, and for a while they are one curve: the losses agree to 3 decimals up to
step <<agree_step>>, and their sequence accuracies are the same number up to step <<same_step>>
(<<same_seq>>). Then they part: at step <<part_step>> the three losses are <<part_loss>>. No run is
wrong. The kernels add the same numbers in another order than PyTorch's attention does (tile by tile,
with the online softmax's rescaling), so their results differ in the last bits of fp32. Training
amplifies such differences, step after step, until the three runs take different paths down the same
loss landscape. The paths are noisy: after step
<<agree_step>>, <<dip_who>> run dipped to a sequence accuracy of <<dip_acc>> at step <<dip_step>>
before it recovered. At step <<train_steps>> the sequence accuracy is <<final_sdpa>> with SDPA,
<<final_graded>> with the graded kernels (in such a dip) and <<final_fast>> with the fast ones; the
best of each run is at least <<best_min>>.
"""),
md(r"""
## How fast is it?

Measured on an H200 by `bench/backward_dq_modes.py` (<<file>> in `notebooks/data/`, one run; every
gradient was checked against SDPA's first): the time of one backward pass (dQ, dK and dV given dO and the
forward's O and LSE), bf16, causal, 32 query heads on 8 KV heads, 16k tokens a launch, against SDPA's
default backward (cuDNN) on the same inputs and the same dO. The FLOPs are counted as 2.5 times the forward's: the backward does five matrix
products per tile ($S$ again, $dV$, $dP$, $dK$, $dQ$) where the forward does two.

Three course kernels: the one you wrote (`graded`: $D$, then dK/dV, then $dQ$ in its own kernel, so $S$ and
$dP$ are computed twice: seven products per tile instead of five), and `gqa_flash/fast/backward.py` two
ways: `fast_atomic`, one pass that adds each tile's share of $dQ$ into an fp32 buffer with atomic adds,
and `fast_separate`, two passes like yours but on the TMA and masking only the diagonal blocks, which is
how it ships. `gqa_flash.flash_attention(q, k, v, fast=True)` trains with the fast kernels.
"""),
code(r"""
from gqa_flash.course.lab import results

runs = results.load("backward_dq_modes")  # topic of notebooks/data/INDEX.csv
by = {(r["provider"], int(r["head_dim"]), int(r["seq_len"])): r for r in runs}
print(results.cite("backward_dq_modes"))
print("H200, bf16, causal, GQA 32:8; TFLOP/s counted as 2.5x the forward's FLOPs; (ratio to SDPA)")
kernels = ("graded", "fast_atomic", "fast_separate")
print(f"{'D':>4s} {'N':>6s} {'SDPA default':>13s} " + " ".join(f"{k:>15s}" for k in kernels))
for d, n in sorted({(int(r["head_dim"]), int(r["seq_len"])) for r in runs}):
    base = float(by[("sdpa_default", d, n)]["tflops"])
    cols = [f"{float(by[p, d, n]['tflops']):6.0f} ({results.two(by[p, d, n]['ratio_to_sdpa'])})" for p in kernels]
    print(f"{d:4d} {n:6d} {base:13.0f} " + " ".join(f"{c:>15s}" for c in cols))
"""),
md(r"""
BACKWARD_NARRATIVE
"""),
md(r"""
## Where the time goes

Two passes, but which one is slow? One profile of the fast backward (<<split_file>>: each kernel's time
on the GPU over 20 calls, from `torch.profiler`) splits every call into the three kernels it had then: $D$,
the dK/dV pass and the dQ pass (the fast backward has since folded $D$ into its dQ pass, which holds $dO$
already: two kernels). Below, each bar is one call, in units of SDPA's whole backward on the same inputs.

The dK/dV pass is <<kv_share>>% of the kernels' time. Count each pass's own work and the difference is
plain: from N = 4k the dQ pass runs at <<dq_rate>> TFLOP/s (three matrix products a tile), the dK/dV pass
at <<kv_rate>> (four), and cuDNN's whole backward at <<sdpa_rate>> in the same profile (another run than the
table's above, hence cuDNN's own numbers differ). The dQ pass is the forward's shape
again: one accumulator, queries down the rows, LSE and $D$ one number per row. The dK/dV pass holds two
accumulators, $dK$ and $dV$, a row per key, and works on the tile transposed: each thread keeps the LSE
and $D$ of every column it touches. At head_dim 128 that is more than a thread's 255 registers, and the
compiler spills to memory (ptxas's report for an H100 or H200 shows it). Your kernel has
the same shape and pays the same. The fast kernel profiled here also had three copies of its query loop
(the diagonal, the rest, and the rest masked for a ragged last key block), each compiled into a software
pipeline with its own buffers and registers; `bench/RESULTS.md` says how they became fewer since, and
what that measured.
"""),
code(r"""
from gqa_flash.course.lab import results

ms = {(int(r["d"]), int(r["n"]), r["provider"]): float(r["ms"]) for r in results.load("backward_split")}
print(results.cite("backward_split"))
shapes = sorted({(d, n) for d, n, _ in ms})
passes = [("_fast_backward_kernel", "dK/dV pass", 4), ("_fast_dq_kernel", "dQ pass", 3),
          ("_delta_kernel", "D = rowsum(dO * O)", 0)]
print("ms per call; in brackets a pass's own TFLOP/s (its matrix products a tile; the forward has 2)")
print(f"{'D':>4s} {'N':>6s} {'SDPA':>6s} {'fast':>6s} {'dK/dV':>12s} {'dQ':>12s} {'D':>6s}")
for d, n in shapes:
    forward_flops = 4 * (16384 // n) * 32 * n * n * d / 2  # bf16, causal, 32 query heads, 16k tokens
    cols = [f"{ms[(d, n, k)]:.2f} ({p / 2 * forward_flops / ms[(d, n, k)] * 1e-9:3.0f})" for k, _, p in passes[:2]]
    print(f"{d:4d} {n:6d} {ms[(d, n, 'sdpa_default')]:6.2f} {ms[(d, n, 'fast_total')]:6.2f} "
          f"{cols[0]:>12s} {cols[1]:>12s} {ms[(d, n, '_delta_kernel')]:6.3f}")

fig, ax = plt.subplots(figsize=(8, 4.4))
for i, (d, n) in enumerate(shapes):
    left, sdpa = 0.0, ms[(d, n, "sdpa_default")]
    for (key, name, _), color in zip(passes, ("tab:blue", "tab:orange", "tab:gray")):
        ax.barh(i, ms[(d, n, key)] / sdpa, left=left, color=color, label=name if i == 0 else None)
        left += ms[(d, n, key)] / sdpa
    ax.plot(ms[(d, n, "fast_total")] / sdpa, i, "k|", markersize=22, mew=2,
            label="the whole call, timed on its own" if i == 0 else None)
ax.axvline(1.0, color="black", lw=1, ls="--", label="SDPA's backward (cuDNN)")
ax.set_yticks(range(len(shapes)), [f"D={d}, N={n // 1024}k" for d, n in shapes])
ax.invert_yaxis()
ax.set_xlabel("time of one backward call, in units of SDPA's backward on the same inputs")
ax.set_title("The fast backward, kernel by kernel (H200, bf16, causal, GQA 32:8)")
ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, fontsize=8, frameon=False)
plt.tight_layout()
plt.show()
"""),
md(r"""
The black tick is the whole call timed on its own (`do_bench`, the cache flushed before each call), the
bar the profile's kernels back to back; the two methods agree to within about <<split_gap>>%. The gray sliver, $D$,
was one small kernel. The blue is the larger part and the slower one per product: a dK/dV pass that holds
fewer numbers at once is where the most time is to win.
"""),
]
nb = nbf.v4.new_notebook()
nb["cells"] = cells
nb["metadata"]["kernelspec"] = {"display_name": "Python 3 (gqa-flash)", "language": "python", "name": "python3"}
BACKWARD_NARRATIVE = """
Your kernels are within reach of cuDNN's on short sequences (<<g64_1k>>× at head_dim 64, <<g128_1k>>× at 128,
N = 1024) and fall to <<g_long>>× at N ≥ 4096: <<g_long_tf>> TFLOP/s against cuDNN's <<sdpa_long_tf>> (the
table above, from <<file>>). The separate dQ pass computes $S$ and $dP$ a second time, seven matrix products
per tile where five would do, so one pass looks like the obvious fix. It is not: `fast_atomic` removes the
two products and pays in atomics, every tile adding its share of $dQ$ one fp32 value at a time (8192 of
them for a 64 × 128 tile). It is ahead of yours at head_dim 64 from 4k (<<a64_16k>>× at 16k) and behind at
128 (<<a128>>×), where the dQ tile also crowds the registers. Two passes done well win instead:
`fast_separate` keeps your design and changes how each pass runs (the TMA loads tiles, only the diagonal
blocks are masked, tiles tuned for each pass), and reaches <<s64_long>>× at head_dim 64 and
<<s128_long>>× at 128 from 4k, <<s64_1k>>× and <<s128_1k>>× at 1k, with $dQ$ the same bits on every run.
Two extra matrix products cost less than the atomics they replace. A bulk alternative was measured and dropped (<<dq_file>>): letting the TMA (the Tensor Memory
Accelerator, which moves tiles between global and shared memory) add each $dQ$ tile to global memory in one
bulk reduction was <<bulk_loss>>% slower at head_dim 64, and at 128 the fp32 tile must first be staged in
shared memory: the kernel then needs <<smem_need>> bytes of it against the <<smem_max>> a program may use, and
did not compile. PyTorch's FlashAttention-2 backward is not in this file; `python -m gqa_flash.course.lab.bench --backward`
times the course's backward kernels against every SDPA backend on a GPU.
"""
for i, c in enumerate(cells):
    c["id"] = f"06-{i:02d}"  # stable ids: regenerating changes only what changed
    c["source"] = c["source"].replace("BACKWARD_NARRATIVE", BACKWARD_NARRATIVE.strip())
    for key, value in NUM.items():  # the numbers, in the text and in the code that must agree with it
        c["source"] = c["source"].replace(f"<<{key}>>", value)
    assert "_NARRATIVE" not in c["source"] and "<<" not in c["source"], c["source"][:80]
NOTEBOOK = "notebooks/06_backward_and_training.ipynb"
nb["metadata"]["gqa_flash"] = {"generated_by": "tools/make_backward_notebook.py",
                               "note": "edit the generator, run it, then execute the notebook (its docstring)"}


def stale() -> bool:
    """Whether the notebook's cells (their outputs aside) or its metadata differ from what this script writes."""
    written = nbf.read(NOTEBOOK, as_version=4)
    return ([(c.cell_type, c.get("id"), c.source) for c in written.cells] != [(c.cell_type, c.id, c.source)
                                                                             for c in cells]
            or written.metadata.get("gqa_flash") != nb["metadata"]["gqa_flash"])


if __name__ == "__main__":
    import sys

    if "--check" in sys.argv[1:]:
        if stale():
            sys.exit(f"out of date with tools/make_backward_notebook.py: {NOTEBOOK}; run it, then execute the "
                     "notebook as its docstring says")
        print(f"{NOTEBOOK} is what tools/make_backward_notebook.py writes")
    else:
        nbf.write(nb, NOTEBOOK)
