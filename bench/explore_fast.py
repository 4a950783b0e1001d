"""Device exploration (developers): the fast kernels' tile configs, one run.

    python bench/explore_fast.py OUT_DIR [fwd] [bwd] [bwd2] [split] [flat] [heads] [regs] [d128]

bf16, causal, GQA 32:8, 16k tokens a launch; medians of triton.testing.do_bench.
Forward: SDPA default, the graded and fast kernels autotuned, then the fast
kernel at fixed configs: one query tile or two query sub-tiles a program
(ping-pong). Backward: SDPA default, the graded and fast backward autotuned,
then the fast backward at fixed configs. bwd2 (not run by default): the fast
backward in two passes at N = 4k and 16k, the dK/dV kernel's tiles with the dQ
kernel's fixed, then the other way round. Every variant is checked against
SDPA before it is timed. split (not run by default): where the two-pass fast
backward's time goes, and the graded one's, kernel by kernel (torch.profiler's
CUDA times, 20 calls; rows "fast KERNEL" and "graded KERNEL"), at N = 1k, 4k and
16k, beside SDPA's backward. heads (not run by default): the
fast forward's sub-tiled tiles with one query head a program and with two
(HEADS=2: the same rows of two heads of a KV group), N = 1k to 16k, timed in
three interleaved rounds (gqa_flash.course.lab.bench.interleaved_times) beside SDPA.
regs (not run by default): a register cap (``maxnreg``) that lets one more
program share an SM, each tile with and without it, in interleaved rounds: the
fast forward's 128 x 64 two-sub-tile tiles at head_dim 64 (178 registers a
thread, 2 programs an SM; 160 or 168 fit 3), and the two-pass backward's dQ
kernel at head_dim 128 (128 x 32 on 8 warps: 132 registers, one program; 128
fit 2) with the dK/dV kernel's tile fixed.
Writes OUT_DIR/explore_fast_<parts>.csv.

Earlier runs also timed the forward with the blocks before the diagonal and
the diagonal's in one loop (part merged, commit 239abec), a persistent grid
(part persist, commit 66b133a), two tiles a program (part tiles2, commit
b4ad365), the diagonal's variants (part diag, commit 9212611; the kept one is
now the kernel's only path), lazy rescaling, a warp-specialized key loop, the
TMA's bulk dQ add and the dK/dV pass launched head-major (part order, commit
ad714a9), options since taken out of the kernels; their outcomes are in
bench/RESULTS.md (lazy rescaling's numbers in
notebooks/data/h200_fast_forward_subtiles_lazy_rescaling.csv).
"""

import csv
import sys
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import gqa_flash
from gqa_flash.course import impl
from gqa_flash.fast import backward as fast_backward, forward as fast_forward

FWD = [  # BLOCK_M, BLOCK_N, warps, stages, query sub-tiles (2: ping-pong)
    (128, 128, 8, 3, 1), (128, 64, 8, 3, 1), (64, 64, 4, 3, 1), (256, 64, 8, 3, 2),
    (256, 64, 8, 2, 2), (256, 64, 8, 4, 2), (256, 32, 8, 3, 2),
    (128, 64, 4, 3, 2), (128, 64, 4, 2, 2), (128, 64, 4, 4, 2), (128, 32, 4, 3, 2),
]
BWD = [  # BLOCK_M, BLOCK_N, warps, stages (dQ: one atomic add per element)
    (64, 128, 8, 2), (64, 128, 8, 3), (64, 64, 4, 2),
]
# Two passes (dq_mode="separate"): the dK/dV kernel's tiles with the dQ kernel fixed at DQ_FIXED, then
# the dQ kernel's tiles with the dK/dV kernel fixed at the autotuner's usual pick (KV_FIXED).
KV_SEPARATE = [(64, 128, 8, 3), (64, 128, 8, 2), (32, 128, 8, 3), (32, 128, 4, 3), (16, 128, 4, 3),
               (64, 64, 4, 3), (64, 64, 4, 2), (32, 64, 4, 3), (64, 128, 8, 4), (128, 128, 8, 2),
               (64, 128, 16, 2), (128, 128, 16, 2)]  # 16 warps: dK and dV of 128 keys over 512 threads
DQ_SEPARATE = [(128, 64, 8, 3), (128, 64, 8, 2), (128, 32, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3),
               (64, 128, 8, 2), (128, 64, 8, 4), (64, 32, 4, 3)]
DQ_FIXED = {64: (128, 64, 8, 3), 128: (128, 64, 8, 3)}
KV_FLAT = [(64, 128, 8, 2), (64, 128, 8, 3), (64, 64, 4, 2), (64, 64, 4, 3), (32, 128, 8, 3), (32, 64, 8, 2),
           (64, 128, 8, 1), (32, 128, 4, 3)]
KV_FIXED = {64: (64, 64, 4, 2), 128: (64, 128, 8, 2)}
HEAD_PAIR_TILES = [(256, 64, 8, 3), (256, 64, 8, 2), (128, 64, 4, 3), (128, 64, 4, 2), (128, 32, 4, 3)]
# Part regs: (BLOCK_M, BLOCK_N, warps, stages), each with these register caps (None: the compiler's own).
# ptxas (sm_90, Triton 3.8, no spill at any cap here): the forward tile 178 registers uncapped; the dQ
# tiles 132 (128 x 32), 170 (128 x 64) and 242 (128 x 128, 2 stages).
REG_FORWARD = {64: [((128, 64, 4, 3), (None, 168, 160)), ((128, 64, 4, 2), (None, 160))]}
REG_DQ = {128: [((128, 32, 8, 3), (None, 128)), ((128, 32, 8, 2), (None, 128)), ((128, 64, 8, 3), (None,))]}
REG_KV_FIXED = {128: dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2, FLAT=True)}  # the usual pick


def backward_tile(t):
    """(BLOCK_M, BLOCK_N, warps, stages) as the fast backward's ``config`` / ``dq_config``."""
    return dict(BLOCK_M=t[0], BLOCK_N=t[1], num_warps=t[2], num_stages=t[3])


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def bench(fn):
    return do_bench(fn, warmup=10, rep=60, return_mode="median")


def main(out_dir, parts=("fwd", "bwd")):
    graded = impl.load("forward", "solutions")
    out = open(Path(out_dir) / f"explore_fast_{'_'.join(parts)}.csv", "w", newline="")
    writer = csv.DictWriter(out, fieldnames=["kind", "provider", "d", "n", "ms", "tflops", "ratio", "err"])
    writer.writeheader()

    def record(kind, name, d, n, ms, flops, base, err):
        writer.writerow(dict(kind=kind, provider=name, d=d, n=n, ms=ms, tflops=flops / ms * 1e-9, ratio=base / ms,
                             err=err))
        out.flush()  # a run cut short by the time limit keeps what it measured
        print(f"{kind} d={d:4d} n={n:6d} {name:34s} {ms:8.4f} ms {flops / ms * 1e-9:6.1f} TFLOP/s "
              f"x{base / ms:.3f} err {err:.1e}", flush=True)

    def measure(kind, variants, d, n, flops, base, error, tol):
        """Check each variant (error of its output against the reference), then time the right ones."""
        for name, fn in variants:
            try:
                err = error(fn())
                record(kind, name, d, n, bench(fn) if err < tol else float("nan"), flops, base, err)
            except Exception as e:  # out of shared memory, a compiler crash: reported, the run goes on
                print(f"{kind} d={d} n={n} {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                if "autotuned" in name:
                    traceback.print_exc()

    def forward_inputs(d, n):
        """q, k, v of one forward shape, its FLOPs, and SDPA's output and call."""
        b, hq, hkv = 16384 // n, 32, 8
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=gen) for h in (hq, hkv, hkv))
        sdpa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
        return q, k, v, 4 * b * hq * n * n * d / 2, sdpa(), sdpa

    def forward_case(d, n):
        q, k, v, flops, ref, sdpa = forward_inputs(d, n)
        base = bench(sdpa)
        record("fwd", "sdpa_default", d, n, base, flops, base, 0.0)
        variants = [("graded_autotuned", lambda: graded.flash_attention_forward(q, k, v, causal=True)),
                    ("fast_autotuned", lambda: fast_forward.fast_attention_forward(q, k, v, causal=True))]
        for bm, bn, w, st, sub in FWD:
            cfg = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st, SUBTILES=sub)
            variants.append((f"fast_{bm}x{bn}_w{w}_s{st}{'_sub2' if sub == 2 else ''}",
                             lambda cfg=cfg: fast_forward.fast_attention_forward(q, k, v, causal=True, config=cfg)))
        measure("fwd", variants, d, n, flops, base, lambda out: rel(out, ref), 2e-2)

    def backward_inputs(d, n):
        """q, k, v, dO of one backward shape, O and LSE from the fast forward (any tile gives the same),
        its FLOPs, SDPA's gradients and SDPA's time."""
        b, hq, hkv = 16384 // n, 32, 8
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=gen) for h in (hq, hkv, hkv))
        do = torch.randn(b, hq, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        flops = 2.5 * 4 * b * hq * n * n * d / 2
        qr, kr, vr = (t.detach().requires_grad_(True) for t in (q, k, v))
        o_ref = F.scaled_dot_product_attention(qr, kr, vr, is_causal=True, enable_gqa=True)
        ref = torch.autograd.grad(o_ref, (qr, kr, vr), do, retain_graph=True)
        base = bench(lambda: torch.autograd.grad(o_ref, (qr, kr, vr), do, retain_graph=True))
        o, lse = fast_forward.fast_attention_forward(q, k, v, causal=True, return_lse=True)
        return q, k, v, do, o, lse, flops, ref, base

    def backward_case(d, n):
        q, k, v, do, o, lse, flops, ref, base = backward_inputs(d, n)
        record("bwd", "sdpa_default", d, n, base, flops, base, 0.0)
        variants = [
            ("graded_autotuned", lambda: gqa_flash.flash_attention_backward(q, k, v, o, lse, do, causal=True)),
            ("fast_autotuned", lambda: fast_backward.fast_attention_backward(q, k, v, o, lse, do, causal=True)),
        ]
        for bm, bn, w, st in BWD:
            cfg = backward_tile((bm, bn, w, st))
            variants.append((f"fast_{bm}x{bn}_w{w}_s{st}",
                             lambda cfg=cfg: fast_backward.fast_attention_backward(q, k, v, o, lse, do, causal=True,
                                                                                  config=cfg)))
        measure("bwd", variants, d, n, flops, base, lambda out: max(rel(g, r) for g, r in zip(out, ref)), 5e-2)

    def separate_case(d, n):
        q, k, v, do, o, lse, flops, ref, base = backward_inputs(d, n)
        record("bwd2", "sdpa_default", d, n, base, flops, base, 0.0)

        def run(kv, dq):
            return lambda: fast_backward.fast_attention_backward(q, k, v, o, lse, do, causal=True, dq_mode="separate",
                                                                 config=backward_tile(kv), dq_config=backward_tile(dq))

        variants = [("fast_separate_autotuned", lambda: fast_backward.fast_attention_backward(
            q, k, v, o, lse, do, causal=True, dq_mode="separate"))]
        variants += [(f"kv_{t[0]}x{t[1]}_w{t[2]}_s{t[3]}", run(t, DQ_FIXED[d])) for t in KV_SEPARATE]
        variants += [(f"dq_{t[0]}x{t[1]}_w{t[2]}_s{t[3]}", run(KV_FIXED[d], t)) for t in DQ_SEPARATE]
        measure("bwd2", variants, d, n, flops, base, lambda out: max(rel(g, r) for g, r in zip(out, ref)), 5e-2)

    def flat_case(d, n):
        q, k, v, do, o, lse, flops, ref, base = backward_inputs(d, n)
        record("flat", "sdpa_default", d, n, base, flops, base, 0.0)

        def run(kv, flat):
            return lambda: fast_backward.fast_attention_backward(q, k, v, o, lse, do, causal=True, dq_mode="separate",
                                                                 config=dict(backward_tile(kv), FLAT=flat),
                                                                 dq_config=backward_tile(DQ_FIXED[d]))

        variants = [(f"kv_{t[0]}x{t[1]}_w{t[2]}_s{t[3]}{'_flat' if flat else ''}", run(t, flat))
                    for t in KV_FLAT for flat in (False, True)]
        measure("flat", variants, d, n, flops, base, lambda out: max(rel(g, r) for g, r in zip(out, ref)), 5e-2)

    def split_case(d, n):
        """Each kernel's share of one backward, the fast (two passes) and the graded (autotuned; the
        tuning runs before the profile)."""
        q, k, v, do, o, lse, flops, ref, base = backward_inputs(d, n)
        record("split", "sdpa_default", d, n, base, flops, base, 0.0)
        for who, fn in (("fast", lambda: fast_backward.fast_attention_backward(q, k, v, o, lse, do, causal=True)),
                        ("graded", lambda: gqa_flash.flash_attention_backward(q, k, v, o, lse, do, causal=True))):
            record("split", f"{who}_total", d, n, bench(fn), flops, base, max(rel(g, r) for g, r in zip(fn(), ref)))
            calls = 20
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(calls):
                    fn()
                torch.cuda.synchronize()
            for event in prof.key_averages():
                if event.device_type == torch.autograd.DeviceType.CUDA and event.count >= calls:
                    ms = event.device_time_total / 1e3 / calls  # device_time_total is in microseconds
                    record("split", f"{who} {event.key[:40]}", d, n, ms, flops, base, float("nan"))

    def interleaved(kind, d, n, steps, error, tol, flops):
        """Check every step (``error`` of its output), then time the right ones in 3 interleaved rounds;
        the first step is the ratios' base."""
        from gqa_flash.course.lab.bench import checked_interleaved_times, median

        say = lambda text: print(f"{kind} d={d} n={n} {text}", flush=True)  # noqa: E731
        times, failed, errors = checked_interleaved_times(steps, error, tol, 3, bench, say)
        base = median(times.get(next(iter(steps)), []))
        for name, err in errors.items():
            record(kind, name, d, n, median(times.get(name, [])), flops, base, err)
        for name, why in failed.items():
            say(f"{name}: {why}")

    def heads_case(d, n):
        """Each sub-tiled tile with one query head a program and with two (HEADS=2), interleaved."""
        q, k, v, flops, ref, sdpa = forward_inputs(d, n)
        steps = {"sdpa_default": sdpa,
                 "fast_autotuned": lambda: fast_forward.fast_attention_forward(q, k, v, causal=True)}
        for bm, bn, w, st in HEAD_PAIR_TILES:
            for heads in (1, 2):
                cfg = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st, SUBTILES=2, HEADS=heads)
                steps[f"fast_{bm}x{bn}_w{w}_s{st}_sub2_heads{heads}"] = (
                    lambda cfg=cfg: fast_forward.fast_attention_forward(q, k, v, causal=True, config=cfg))
        interleaved("heads", d, n, steps, lambda out: rel(out, ref), 2e-2, flops)

    def regs_case(d, n):
        """Tiles with and without a register cap (REG_FORWARD at head_dim 64, REG_DQ at 128), interleaved."""
        def capped(tile, cap):
            cfg = dict(BLOCK_M=tile[0], BLOCK_N=tile[1], num_warps=tile[2], num_stages=tile[3])
            return (dict(cfg, maxnreg=cap) if cap else cfg), f"{tile[0]}x{tile[1]}_w{tile[2]}_s{tile[3]}" + (
                f"_maxnreg{cap}" if cap else "")

        if d in REG_FORWARD:
            q, k, v, flops, ref, sdpa = forward_inputs(d, n)
            steps = {"sdpa_default": sdpa,
                     "fast_autotuned": lambda: fast_forward.fast_attention_forward(q, k, v, causal=True)}
            for tile, caps in REG_FORWARD[d]:
                for cap in caps:
                    cfg, name = capped(tile, cap)
                    steps[f"fast_{name}_sub2"] = lambda cfg=dict(cfg, SUBTILES=2): fast_forward.fast_attention_forward(
                        q, k, v, causal=True, config=cfg)
            interleaved("regs_fwd", d, n, steps, lambda out: rel(out, ref), 2e-2, flops)
        if d in REG_DQ:
            q, k, v, do, o, lse, flops, ref, base = backward_inputs(d, n)
            qr, kr, vr = (t.detach().requires_grad_(True) for t in (q, k, v))
            o_ref = F.scaled_dot_product_attention(qr, kr, vr, is_causal=True, enable_gqa=True)
            steps = {"sdpa_default": lambda: torch.autograd.grad(o_ref, (qr, kr, vr), do, retain_graph=True)}
            for tile, caps in REG_DQ[d]:
                for cap in caps:
                    cfg, name = capped(tile, cap)
                    steps[f"fast_dq_{name}"] = lambda cfg=cfg: fast_backward.fast_attention_backward(
                        q, k, v, o, lse, do, causal=True, config=REG_KV_FIXED[d], dq_config=cfg)
            interleaved("regs_dq", d, n, steps, lambda out: max(rel(g, r) for g, r in zip(out, ref)), 5e-2,
                        flops)

    # One function a case: its tensors are freed when it returns, before the next case allocates.
    for kind, case in (("fwd", forward_case), ("bwd", backward_case), ("bwd2", separate_case),
                       ("flat", flat_case), ("split", split_case), ("heads", heads_case), ("regs", regs_case)):
        for d in (64, 128) if kind in parts else ():
            if "d128" in parts and d != 128:  # `bwd2 d128`: head_dim 128 only
                continue
            lengths = {"bwd2": (4096, 16384), "flat": (4096, 16384), "heads": (1024, 2048, 4096, 8192, 16384),
                       "regs": (1024, 4096, 16384)}
            for n in lengths.get(kind, (1024, 4096, 16384)):
                case(d, n)

    out.close()


if __name__ == "__main__":
    main(sys.argv[1], tuple(sys.argv[2:]) or ("fwd", "bwd"))
