"""Device probe (developers): is a call's time the GPU's, or the host's time to launch it?

    GQA_FLASH_IMPL=solutions python bench/probe_host_overhead.py OUT.csv [--profile PROFILE.txt]

``triton.testing.do_bench`` (what the sweeps use) clears the L2 before every call and times each call
with CUDA events; when the host takes longer to launch a call's kernels than the GPU takes to run
them, the GPU waits between the events and the host's time is what gets measured. For the forward and
the backward of each course kernel and SDPA (bf16, causal, GQA 32:8, 16k tokens a launch), three
numbers a call: do_bench's median; the host's time to launch it (the mean over 30 calls queued
without waiting); and the time of 30 calls queued back to back (events around all of them, no L2
clearing between): the GPU's own time when the host keeps ahead, the host's pace when it does not.
The backward both through autograd (as the sweeps call it) and called directly with O and the LSE.
Writes OUT.csv; prints each row. ``--profile`` also runs Python's profiler over 300 calls of the
fast backward through autograd (head_dim 64, 1k, where its time was the host's) and writes the
functions that took the host's time, by their own time and by cumulative time, to PROFILE.txt
(bench/record/h200_host_profile_fast_backward_through_autotuner.txt and ..._picks_kept.txt: each call
through the autotuner, then the fast kernels keeping its picks, bench/RESULTS.md).
"""

import argparse
import cProfile
import csv
import io
import pstats
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import gqa_flash
from gqa_flash.fast import backward as fast_backward

CALLS = 30


def host_and_gpu_ms(fn):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(CALLS):
        fn()
    host = (time.perf_counter() - t0) * 1e3 / CALLS
    end.record()
    torch.cuda.synchronize()
    return host, start.elapsed_time(end) / CALLS


def profile_fast_backward(path, calls=300):
    """Where the host's time goes in one autograd call of the fast backward (head_dim 64, 1k)."""
    q, k, v = (torch.randn(16, h, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for h in (32, 8, 8))
    out = gqa_flash.flash_attention(q, k, v, fast=True)
    do = torch.randn_like(out)
    call = lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)  # noqa: E731
    for _ in range(20):  # autotuned and compiled before the profile starts
        call()
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    for order in ("tottime", "cumulative"):
        pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(40)
    with open(path, "w") as f:
        f.write(f"fast backward through autograd, head_dim 64, N = 1024, {calls} calls\n")
        f.write(text.getvalue())


def main(out_path):
    rows = []
    for d in (64, 128):
        for n in (1024, 4096):
            b, hq, hkv = 16384 // n, 32, 8
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                       for h in (hq, hkv, hkv))
            do = torch.randn(b, hq, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            o, lse = gqa_flash.fast_attention_forward(q, k, v, return_lse=True)

            def autograd(forward):
                qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
                out = forward(qg, kg, vg)
                return lambda: torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True)

            sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
            calls = {
                "forward sdpa": lambda: sdpa(q, k, v),
                "forward graded": lambda: gqa_flash.flash_attention_forward(q, k, v),
                "forward fast": lambda: gqa_flash.fast_attention_forward(q, k, v),
                "backward sdpa autograd": autograd(sdpa),
                "backward graded autograd": autograd(gqa_flash.flash_attention),
                "backward fast autograd": autograd(lambda q, k, v: gqa_flash.flash_attention(q, k, v, fast=True)),
                "backward graded direct": lambda: gqa_flash.flash_attention_backward(q, k, v, o, lse, do),
                "backward fast direct": lambda: gqa_flash.fast_attention_backward(q, k, v, o, lse, do),
                "backward fast kernels only": lambda: fast_backward.fast_attention_backward(q, k, v, o, lse, do),
            }
            for name, fn in calls.items():
                fn()  # autotuned here
                bench_ms = do_bench(fn, warmup=10, rep=60, return_mode="median")
                host, gpu = host_and_gpu_ms(fn)
                row = dict(call=name, d=d, n=n, do_bench_ms=round(bench_ms, 4), host_ms=round(host, 4),
                           gpu_ms=round(gpu, 4))
                rows.append(row)
                print(row, flush=True)
    with open(out_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the CSV to write")
    parser.add_argument("--profile", help="also profile the fast backward's host time into this file")
    args = parser.parse_args()
    if args.profile:
        profile_fast_backward(args.profile)
    main(args.out)
