"""The fast backward's two dQ modes against the graded backward and cuDNN, on one GPU, in one run.

    GQA_FLASH_IMPL=solutions python3 bench/backward_dq_modes.py OUT.csv

First a correctness pass at odd shapes (N = 777, head_dim 96 and 256, MHA and MQA, bf16): both
modes of ``gqa_flash/fast/backward.py`` through their autotuners, against float64 autograd
(``gqa_flash.reference_gradients``), one ok/WRONG line a case. Then the timings: bf16, causal,
32 query heads on 8 KV heads, head_dim 64 and 128, N = 1k, 4k, 16k with 16k tokens a launch
(batch = 16384 // N), four providers on the same inputs and the same dO:

    sdpa_default   SDPA's default backward (cuDNN on Hopper), timed as ``python -m
                   gqa_flash.course.lab.bench --backward`` times it (its ``backward_providers``)
    graded         ``gqa_flash.flash_attention_backward``, the implementation switch's
                   backward.py (solutions/ with GQA_FLASH_IMPL=solutions): dK/dV pass, dQ pass
    fast_atomic    ``fast_attention_backward(..., dq_mode="atomic")``: one pass, dQ by atomics
    fast_separate  ``fast_attention_backward(..., dq_mode="separate")``: dK/dV pass, dQ pass

The course's backwards are called directly with O and LSE from the fast forward (at one fixed
tile, which saves its autotuner's time; O and LSE do not depend on the tile), as
bench/explore_fast.py did for the numbers in bench/RESULTS.md. Every provider's dQ, dK and dV are
checked against SDPA's before it is timed (the largest of the three relative errors, in the Frobenius
norm, is recorded; above 5e-2 it is reported and not timed). Times: medians of
``triton.testing.do_bench``, three rounds interleaved across the providers (each round in another
order), the median of the three. FLOPs: 2.5 * 4*B*Hq*N^2*D / 2 (causal). Writes OUT.csv, one row a
(provider, shape), with ``gqa_flash.course.lab.bench.environment()``'s columns, and prints one line a row,
then a summary and the autotuner's tiles. Exits 1 if a check failed.

Time on an H200: not yet run. Budgeted for under 4 minutes, most of it compiling: the autotuners
run once a shape, and every candidate tile is compiled once a head dim (the fast backward's
kernels do not recompile for a batch of one or one KV head); the correctness pass at N = 777
(not a multiple of 16) compiles them once more.

PREDICTION, written before any run of the separate mode (ratios to SDPA's default backward; the
earlier run, bench/RESULTS.md: graded D64 0.98 / 0.72 / 0.65 and D128 0.83 / 0.69 / 0.68 at
1k / 4k / 16k, fast one-pass D64 0.79 / 0.73 / 0.69 and D128 0.58 / 0.61 / 0.64):

    fast_separate, head_dim 128:  1k 0.80-0.90   4k 0.72-0.80   16k 0.72-0.80
    fast_separate, head_dim 64:   1k 0.92-1.02   4k 0.72-0.80   16k 0.68-0.76

Reasoning. The separate mode is the graded design (a dK/dV pass of 4 matrix products a tile, a dQ
pass of 3) with what made the fast forward 10-15% faster than the graded forward at D128 (0.99 vs
0.87 at 16k, 0.85 vs 0.74 at 1k): TMA tiles, masks only on the diagonal, the heaviest blocks first.
So at D128 I expect it above the graded backward by 5-15% and far above one pass, whose 64 x 128
dK/dV tile spills with the dQ tile in registers (ptxas, sm_90) and adds 8192 fp32 atomics a step;
without the dQ tile, 32 x 128 on 8 warps with 3 stages compiles without spills. At D64 one pass
wins on FLOPs (5 products a tile against 7), but it also zeroes, scales and casts an fp32 dQ buffer
on the host: about 0.6 GB moved, ~0.15 ms, which is ~16% of its 0.9 ms at 1k and ~2% at 16k. So
at D64 I expect separate to win clearly at 1k (near the graded's 0.98) and to be within +-5% of
one pass at 4k and 16k. If that holds, the default rule (``default_dq_mode``: separate above
head_dim 64, atomic at 64 and below) is right at D128 and wrong at D64 1k. Ratios move by about
+-3% between runs (bench/RESULTS.md, "How to read the numbers").
"""

import csv
import math
import os
import sys
import time
from pathlib import Path

# The graded backward is solutions/backward.py where the course has it (as bench/common.sh decides);
# in the student edition, the student's own.
_SOLUTIONS = Path(__file__).resolve().parents[1] / "solutions"
os.environ.setdefault("GQA_FLASH_IMPL", "solutions" if _SOLUTIONS.is_dir() else "student")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, without `pip install -e .`

import torch  # noqa: E402

import gqa_flash  # noqa: E402  (before triton: gqa_flash.course.runtime decides where kernels run)
import triton  # noqa: E402
from gqa_flash.course import impl  # noqa: E402
from triton.testing import do_bench  # noqa: E402
from gqa_flash.fast import backward as fast_backward, forward as fast_forward  # noqa: E402
from gqa_flash.course.lab import bench as lab_bench  # noqa: E402
from gqa_flash.course.testing import random_qkv  # noqa: E402

DEVICE, DTYPE = "cuda", torch.bfloat16
MODES = ("atomic", "separate")
HEAD_DIMS = (64, 128)
SEQ_LENS = (1024, 4096, 16384)
ROUNDS = 3
TOLERANCE_VS_SDPA = 5e-2  # as gqa_flash.course.lab.bench's backward
TOLERANCE_VS_FLOAT64 = 3e-2  # bf16, as tests/gpu/test_gpu_backward.py
# The forward that makes O and LSE for the timed backwards: one of the fast forward's shipped tiles.
FORWARD_TILE = dict(BLOCK_M=128, BLOCK_N=64, SUBTILES=2, num_warps=4, num_stages=2)
ODD_CASES = [  # (batch, Hq, Hkv, N, head_dim, causal): ragged N, padded head dims, MHA and MQA
    (2, 8, 8, 777, 96, True),
    (2, 8, 1, 777, 96, True),
    (1, 8, 8, 777, 256, False),
    (1, 8, 1, 777, 256, True),
]
FIELDS = ["provider", "head_dim", "seq_len", "batch", "ms", "tflops", "ratio_to_sdpa", "rel_err", "status", "tiles",
          "rounds_ms", *lab_bench.ENVIRONMENT]
START = time.time()


def log(msg):
    print(f"[{time.time() - START:6.1f}s] {msg}", flush=True)


def rel_err(got, ref):
    """The largest of the three gradients' relative errors (Frobenius norm), in float64."""
    return max(((g.double() - r.double()).norm() / r.double().norm()).item() for g, r in zip(got, ref))


def tiles(provider):
    try:
        if provider == "graded":
            tuned = getattr(impl.load("backward"), "_tuned", {})
            return "; ".join(f"{getattr(k, '__name__', '?')} {lab_bench.tile_text(t)}" for k, t in tuned.items())
        if provider == "fast_atomic":
            return f"dkdv {lab_bench.tile_text(fast_backward.autotuned_kernels.get('atomic'))}"
        if provider == "fast_separate":
            tuned = fast_backward.autotuned_kernels
            return f"dkdv {lab_bench.tile_text(tuned.get('separate'))}; dq {lab_bench.tile_text(tuned.get('dq'))}"
    except Exception as e:  # the tiles are for reading, never a reason to stop
        return f"? ({type(e).__name__})"
    return ""


def correctness_pass():
    """Both modes at odd shapes against float64 autograd; True when every case is right."""
    all_ok = True
    for seed, (b, hq, hkv, n, d, causal) in enumerate(ODD_CASES):
        label = f"N={n} D={d} {hq}:{hkv} b={b} {'causal' if causal else 'full'}"
        q, k, v = random_qkv(b, hq, hkv, n, d, dtype=DTYPE, seed=seed, device=DEVICE)
        do = torch.randn(q.shape, generator=torch.Generator().manual_seed(100 + seed)).to(DEVICE, DTYPE)
        # O and LSE from float64, rounded as a forward would hand them over: only the backward is under test.
        ref_o, ref_lse = gqa_flash.reference_attention(q, k, v, causal=causal)
        o, lse = ref_o.to(DEVICE, DTYPE), ref_lse.to(DEVICE, torch.float32)
        refs = gqa_flash.reference_gradients(q, k, v, do, causal=causal)
        parts = []
        for mode in MODES:
            try:
                grads = fast_backward.fast_attention_backward(q, k, v, o, lse, do, causal=causal, dq_mode=mode)
                errs = [((g.double().cpu() - r).norm() / r.norm()).item() for g, r in zip(grads, refs)]
                ok = all(e <= TOLERANCE_VS_FLOAT64 for e in errs)  # NaN fails too
                note = ""
                if mode == "separate":  # no atomics: dQ must come out the same bits every run
                    again = fast_backward.fast_attention_backward(q, k, v, o, lse, do, causal=causal, dq_mode=mode)
                    same = torch.equal(again[0], grads[0])
                    ok, note = ok and same, f", dQ {'identical' if same else 'DIFFERENT'} on a second run"
                parts.append(f"{mode}: {'ok' if ok else 'WRONG'} (dQ {errs[0]:.1e} dK {errs[1]:.1e} "
                             f"dV {errs[2]:.1e}{note})")
            except Exception as e:
                ok = False
                parts.append(f"{mode}: WRONG ({type(e).__name__}: {str(e)[:200]})")
            all_ok = all_ok and ok
        log(f"check {label:28s} " + "; ".join(parts))
    return all_ok


def time_shape(d, n, env, writer, rows):
    case = lab_bench.Case(DTYPE, True, d, n)
    q, k, v = lab_bench.inputs(case)  # seed 0, as the benchmark's
    sdpa_step = lab_bench.backward_providers()["sdpa_default"](q, k, v, True)
    ref = [g.float() for g in sdpa_step()]
    # The dO that backward_providers draws for SDPA, drawn again the same way: every provider gets the same.
    gen = torch.Generator(device=q.device).manual_seed(1)
    do = torch.randn(q.shape, dtype=q.dtype, device=q.device, generator=gen)
    o, lse = fast_forward.fast_attention_forward(q, k, v, causal=True, return_lse=True, config=FORWARD_TILE)
    steps = {
        "sdpa_default": sdpa_step,
        "graded": lambda: gqa_flash.flash_attention_backward(q, k, v, o, lse, do, causal=True),
        "fast_atomic": lambda: fast_backward.fast_attention_backward(q, k, v, o, lse, do, causal=True,
                                                                     dq_mode="atomic"),
        "fast_separate": lambda: fast_backward.fast_attention_backward(q, k, v, o, lse, do, causal=True,
                                                                       dq_mode="separate"),
    }
    err, status, picked = {}, {}, {}
    for name, step in steps.items():  # check first (the first call also runs the autotuners)
        try:
            err[name] = rel_err([g.float() for g in step()], ref)
            status[name] = "ok" if err[name] < TOLERANCE_VS_SDPA else "wrong result"
        except torch.OutOfMemoryError:
            err[name], status[name] = math.nan, "out of memory"
        except Exception as e:  # reported, and the run goes on
            err[name], status[name] = math.nan, f"error: {type(e).__name__}: {str(e)[:120]}"
        picked[name] = tiles(name)
    # Interleaved: each round runs every provider once, starting one further along.
    rounds, errors = lab_bench.interleaved_times({name: steps[name] for name in steps if status[name] == "ok"}, ROUNDS,
                                                 lambda fn: do_bench(fn, warmup=25, rep=100, return_mode="median"))
    status.update(errors)
    ms = {name: lab_bench.median(rounds.get(name, [])) for name in steps}
    flops = 2.5 * case.flops  # case.flops: 4*B*Hq*N^2*D, halved when causal
    for name in steps:
        base = ms["sdpa_default"]
        row = dict(provider=name, head_dim=d, seq_len=n, batch=case.batch, ms=round(ms[name], 4),
                   tflops=round(flops / ms[name] * 1e-9, 1), ratio_to_sdpa=round(base / ms[name], 3),
                   rel_err=f"{err[name]:.2e}", status=status[name], tiles=picked[name],
                   rounds_ms=";".join(f"{t:.4f}" for t in rounds.get(name, [])), **env)
        writer.writerow(row)
        rows.append(row)
        log(f"D={d:3d} N={n:5d} B={case.batch:2d} {name:14s} {row['ms']:8.3f} ms {row['tflops']:6.1f} TFLOP/s "
            f"x{row['ratio_to_sdpa']:.3f}  err {err[name]:.1e}  {status[name]}  {picked[name]}")


def summary(rows):
    ratio = {(r["provider"], r["head_dim"], r["seq_len"]): r["ratio_to_sdpa"] for r in rows}
    log("summary, ratio to SDPA's default backward (higher is faster):")
    print(f"{'D':>4} {'N':>6} {'graded':>7} {'atomic':>7} {'separate':>9}  faster mode  default  default >= graded",
          flush=True)
    for d in HEAD_DIMS:
        for n in SEQ_LENS:
            g, a, s = (ratio.get((p, d, n), math.nan) for p in ("graded", "fast_atomic", "fast_separate"))
            best = "separate" if s > a else "atomic" if a >= s else "?"
            default = fast_backward.default_dq_mode(max(16, triton.next_power_of_2(d)))  # its head_dim_pad
            chosen = s if default == "separate" else a
            print(f"{d:4d} {n:6d} {g:7.3f} {a:7.3f} {s:9.3f}  {best:11s}  {default:8s} "
                  f"{'yes' if chosen >= g else 'NO'}", flush=True)


def main(argv):
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1])
        return 2
    if not torch.cuda.is_available():
        print("bench/backward_dq_modes.py needs a CUDA GPU")
        return 2
    out = Path(argv[1])
    out.parent.mkdir(parents=True, exist_ok=True)
    env = lab_bench.environment()
    log(f"{env['gpu']}, driver {env['driver']}, torch {env['torch']}, triton {env['triton']}, "
        f"GQA_FLASH_IMPL={impl.current()}")
    if impl.current() != "solutions":
        log("warning: the graded backward is the student's file, not solutions/ (set GQA_FLASH_IMPL=solutions)")
    checks_ok = correctness_pass()
    log(f"correctness pass: {'all ok' if checks_ok else 'SOME WRONG'}")
    rows = []
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for d in HEAD_DIMS:
            for n in SEQ_LENS:
                time_shape(d, n, env, writer, rows)  # its tensors are freed when it returns
                f.flush()  # a run cut short keeps what it measured
                torch.cuda.empty_cache()
    summary(rows)
    log(f"wrote {out}")
    bad = [r for r in rows if r["status"] != "ok"]
    return 0 if checks_ok and not bad else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
