"""Writes notebooks/06_backward_and_training.ipynb. Run it from the top of the course, then execute the
notebook in place with the solutions, so that its stored outputs (the check cells' PASS lines) are real:

    .venv/bin/python tools/make_backward_notebook.py
    GQA_FLASH_IMPL=solutions .venv/bin/jupyter nbconvert --to notebook --execute --inplace \
        notebooks/06_backward_and_training.ipynb
"""
import nbformat as nbf

md = lambda s: nbf.v4.new_markdown_cell(s.strip())  # noqa: E731
code = lambda s: nbf.v4.new_code_cell(s.strip())  # noqa: E731
cells = [
md(r"""
# 06 · Bonus: the backward pass, and a model that trains with your kernels

The forward kernel stored one number per row that it did not need itself: the log-sum-exp (LSE). This
notebook spends it. You will derive the gradients of attention, see why the LSE and one more number per
row, $D$, make the backward pass cheap, write the backward kernels with GQA, and train a tiny transformer
with them, side by side with PyTorch's attention.

| part | what | where |
| --- | --- | --- |
| 1 | $D = \mathrm{rowsum}(dO \circ O)$ | `backward.py`, `_backward_preprocess` |
| 2 | $dK$ and $dV$ for one block of keys: recompute $P^\top$, then $dV \mathrel{+}= P^\top dO$, $dK \mathrel{+}= dS^\top Q$ | `backward.py`, `_backward_dkdv` |
| 3 | the GQA sum: a KV head's gradient adds up its whole group of query heads | `backward.py`, `_backward_dkdv` |
| 4 | $dQ$ for one block of queries | `backward.py`, `_backward_dq` |

This is a bonus (20 points beyond the 100). It needs a working `forward.py`.
"""),
code(r"""
import matplotlib.pyplot as plt
import torch

import gqa_flash
from gqa_flash import runtime
from gqa_flash.lab import checks, tiny_model

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

Fill in Parts 1 to 4. Each check below runs your kernels on exact forward results (from the float64 reference,
so your forward kernel's bugs cannot show up here) and compares with float64 autograd.
"""),
code(r"""
# NBVAL_CHECK_OUTPUT
checks.check_delta()
"""),
code(r"""
# NBVAL_CHECK_OUTPUT
checks.check_dkdv()
"""),
code(r"""
# NBVAL_CHECK_OUTPUT
checks.check_gqa_sum()
"""),
code(r"""
# NBVAL_CHECK_OUTPUT
checks.check_dq()
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
yours. If your gradients are right, the two loss curves are one curve. (On a CPU the kernels run in the
interpreter, so the run is short; on a GPU it is longer.)
"""),
code(r"""
on_gpu = runtime.DEVICE.type == "cuda"
cfg = tiny_model.Config(dim=64 if on_gpu else 32, q_heads=4, kv_heads=2, layers=2)
run = dict(steps=300 if on_gpu else 16, batch=64 if on_gpu else 4, digits=8 if on_gpu else 6, lr=1e-2,
           cfg=cfg, device=runtime.DEVICE, dtype=torch.float32)
losses_sdpa = tiny_model.train(tiny_model.sdpa_attention, **run)
losses_course = tiny_model.train(tiny_model.course_attention, **run)
print(f"last step: SDPA {losses_sdpa[-1]:.4f}, course kernels {losses_course[-1]:.4f}")
"""),
code(r"""
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(losses_sdpa, label="PyTorch SDPA", linewidth=4, alpha=0.4)
ax.plot(losses_course, label="course kernels (forward + backward)", linestyle="--")
ax.set_xlabel("step")
ax.set_ylabel("cross-entropy on the sorted half")
ax.set_title("Sorting digits with a tiny GQA transformer")
ax.legend()
plt.show()
"""),
code(r"""
# NBVAL_CHECK_OUTPUT
gap = max(abs(a - b) for a, b in zip(losses_sdpa, losses_course))
print("PASS: the two loss curves agree at every step" if gap < 1e-3
      else "FAIL: the loss curves part ways: check the backward parts above")
"""),
md(r"""
Both runs start from the same weights and see the same batches, so any difference comes from the attention
gradients alone. In fp32 the two curves agree to about $10^{-6}$: the kernels compute the same function and
the same gradients as PyTorch, in $O(N)$ memory.

## How fast is it?

Measured on an H200 (`bench/explore_fast.py`, the file in `notebooks/data/`; `python -m gqa_flash.lab.bench
--backward` makes the same comparison): the time of one backward pass (dQ, dK and dV given dO and the
forward's O and LSE), bf16, causal, 32 query heads on 8 KV heads, 16k tokens a launch, against SDPA's
default backward (cuDNN) on the same inputs and the same dO. The FLOPs are counted as 2.5 times the forward's: the backward does five matrix
products per tile ($S$ again, $dV$, $dP$, $dK$, $dQ$) where the forward does two.

Two course kernels: the one you wrote (`course_graded`: three kernels, $dQ$ in its own pass, so $S$ and
$dP$ are computed twice: seven products per tile instead of five) and `gqa_flash/fast/backward.py`
(`course_fast`: one pass that adds each tile's share of $dQ$ into an fp32 buffer with atomic adds, and
masks only the diagonal blocks). `gqa_flash.flash_attention(q, k, v, fast=True)` trains with the fast
kernels.
"""),
code(r"""
from gqa_flash.lab import perf_plots as pp

runs = [r for r in pp.read(pp.DATA_DIR / "h200_fast_tiles_forward_backward.csv") if r["kind"] == "bwd"]
by = {(r["provider"], int(r["d"]), int(r["n"])): float(r["tflops"]) for r in runs}
print("H200, bf16, causal, GQA 32:8; TFLOP/s counted as 2.5x the forward's FLOPs; (ratio to SDPA)")
print(f"{'D':>4s} {'N':>6s} {'SDPA default':>13s} {'course graded':>15s} {'course fast':>15s}")
for d, n in sorted({(int(r["d"]), int(r["n"])) for r in runs}):
    base = by[("sdpa_default", d, n)]
    cols = [f"{by[(p, d, n)]:6.0f} ({by[(p, d, n)] / base:4.2f})" for p in ("graded_autotuned", "fast_autotuned")]
    print(f"{d:4d} {n:6d} {base:13.0f} " + " ".join(f"{c:>15s}" for c in cols))
"""),
md(r"""
BACKWARD_NARRATIVE
"""),
]
nb = nbf.v4.new_notebook()
nb["cells"] = cells
nb["metadata"]["kernelspec"] = {"display_name": "Python 3 (gqa-flash)", "language": "python", "name": "python3"}
BACKWARD_NARRATIVE = """
Your kernels are within reach of cuDNN's on short sequences (0.98× at head_dim 64, 0.83× at 128, N = 1024)
and reach 0.65–0.73× at N ≥ 4096, where cuDNN's warp-specialised Hopper kernel pulls ahead: 270–360
TFLOP/s. That is 1.1–1.25× PyTorch's own FlashAttention-2 backward (225–308 TFLOP/s on the same shapes in a
separate H200 run), but short of the course's target of 0.8× cuDNN. Most of the gap is the
two products the separate dQ pass computes again. The fast kernel removes them, and pays in atomics: it
gains at head_dim 64 (0.69× against 0.65× at 16k) and loses at 128, where the only tile that fits in
registers is 64 × 128 and 8192 single-element atomic adds per tile queue up in L2. Letting the copy engine
add each dQ tile in one bulk reduce was measured too (an option since removed; `bench/RESULTS.md`): 4–6% slower
at head_dim 64, and at 128 the fp32 tile it must first stage in shared memory does not fit.
"""
for c in cells:
    if c["cell_type"] == "markdown":
        c["source"] = c["source"].replace("BACKWARD_NARRATIVE", BACKWARD_NARRATIVE.strip())
        assert "_NARRATIVE" not in c["source"], c["source"][:80]
nbf.write(nb, "notebooks/06_backward_and_training.ipynb")
