"""Sliding-window attention on a GPU: the course's fast kernels against FlexAttention and SDPA, in one run.

    python bench/explore_windows.py --out DIR [--budget SECONDS] [--dims 128,64] [--lengths 4096,16384,65536]
                                  [--windows 512,4096]

bf16, 32 query heads on 8 KV heads, batch 1, causal sliding window W (query i sees keys i-W+1 .. i). For each
shape, forward and then forward + backward, timed through what a user calls:
  course      gqa_flash.fast_attention_forward(q, k, v, window=W), and gqa_flash.flash_attention(..., window=W,
              fast=True) for the backward;
  flex        FlexAttention (torch.compile'd) with a sliding-window block mask (create_block_mask of
              q_idx - W < kv_idx <= q_idx), the way FlexAttention expresses windows;
  sdpa_mask   F.scaled_dot_product_attention with the window as an explicit boolean mask, up to 16k tokens
              (past that the [N, N] mask alone is gigabytes, and SDPA does the whole N x N work anyway).
FLOPs count only the visible pairs, sum_i min(i + 1, W): 4 * Hq * pairs * D for the forward and 2.5 times that
for the backward (timed alone: the forward runs once before); TFLOP/s columns use that count, and
ratio_flex = flex_ms / course_ms. Each time is the
median of 5 interleaved do_bench medians (gqa_flash.course.lab.bench). Each output is checked first against
FlexAttention's (max |error|, which also compiles and autotunes every provider).

Writes windows_forward.csv and windows_backward.csv (one row a shape and provider: date, gpu, torch, triton,
N, W, D, ms, TFLOP/s, ratio to flex, error) under --out. Stops starting shapes once the budget is spent.
"""

import argparse
import csv
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gqa_flash  # noqa: E402
from gqa_flash.course.lab import bench  # noqa: E402

HQ, HKV = 32, 8


def visible_pairs(n, w):
    return w * (w + 1) // 2 + (n - w) * w if n >= w else n * (n + 1) // 2


def flex_provider():
    import torch._dynamo
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 64))
    compiled = torch.compile(flex_attention, dynamic=False)
    masks = {}

    def flex(q, k, v, w):
        n = q.shape[2]
        if (n, w) not in masks:
            masks[(n, w)] = create_block_mask(lambda b, h, qi, ki: (ki <= qi) & (qi - ki < w), None, None, n, n,
                                              device=q.device)
        return compiled(q, k, v, block_mask=masks[(n, w)], enable_gqa=True)

    return flex


def sdpa_mask(q, k, v, w):
    n = q.shape[2]
    i = torch.arange(n, device=q.device)
    mask = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < w)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget", type=float, default=500)
    parser.add_argument("--dims", default="128,64")
    parser.add_argument("--lengths", default="4096,16384,65536")
    parser.add_argument("--windows", default="512,4096")
    parser.add_argument("--no-backward", action="store_true")
    args = parser.parse_args(argv)
    start = time.time()
    env = bench.environment()
    args.out.mkdir(parents=True, exist_ok=True)
    flex = flex_provider()
    forward = {"course": lambda q, k, v, w: gqa_flash.fast_attention_forward(q, k, v, window=w), "flex": flex,
               "sdpa_mask": sdpa_mask}
    fields = ["date", "gpu", "torch", "triton", "pass", "n", "window", "head_dim", "provider", "ms", "tflops",
              "ratio_flex", "max_error", "picked"]
    files = {p: open(args.out / f"windows_{p}.csv", "w", newline="") for p in ("forward", "backward")}
    writers = {p: csv.DictWriter(f, fieldnames=fields) for p, f in files.items()}
    for w in writers.values():
        w.writeheader()
    for d in (int(x) for x in args.dims.split(",")):
        for n in (int(x) for x in args.lengths.split(",")):
            for win in (int(x) for x in args.windows.split(",")):
                if time.time() - start > args.budget:
                    print(f"budget spent: stopped before d{d} n{n} w{win}", flush=True)
                    break
                gen = torch.Generator(device="cuda").manual_seed(0)
                q = torch.randn(1, HQ, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                k, v = (torch.randn(1, HKV, n, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in "kv")
                do = torch.randn(q.shape, device="cuda", dtype=torch.bfloat16, generator=gen)
                names = [p for p in forward if p != "sdpa_mask" or n <= 16384]
                flops = 4 * HQ * visible_pairs(n, win) * d
                passes = [("forward", flops)] + ([] if args.no_backward else [("backward", 2.5 * flops)])
                for pass_name, pass_flops in passes:
                    if pass_name == "forward":
                        steps = {p: (lambda p=p: forward[p](q, k, v, win)) for p in names}
                    else:  # the forward run once; the backward alone is timed (retain_graph keeps its inputs)
                        steps = {}
                        for p in names:
                            leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
                            try:
                                o = (gqa_flash.flash_attention(*leaves, window=win, fast=True) if p == "course"
                                     else forward[p](*leaves, win))
                            except Exception as e:
                                print(f"backward d{d} n{n} w{win} {p}: forward failed: {type(e).__name__}", flush=True)
                                continue
                            steps[p] = (lambda o=o, leaves=leaves: torch.autograd.grad(o, leaves, do,
                                                                                      retain_graph=True))
                    outputs = {}
                    for p, step in steps.items():
                        try:
                            got = step()
                            outputs[p] = got if pass_name == "forward" else got[0]
                        except Exception as e:
                            print(f"{pass_name} d{d} n{n} w{win} {p}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                    base = outputs.get("flex")
                    errors = {p: (o.float() - base.float()).abs().max().item() if base is not None else math.nan
                              for p, o in outputs.items()}
                    times, failed = bench.interleaved_times({p: steps[p] for p in outputs})
                    med = {p: bench.median(t) for p, t in times.items()}
                    for p in outputs:
                        row = dict(date=env["date"], gpu=env["gpu"], torch=env["torch"], triton=env["triton"],
                                   **{"pass": pass_name}, n=n, window=win, head_dim=d, provider=p,
                                   ms=f"{med[p]:.4f}", tflops=f"{pass_flops / med[p] / 1e9:.1f}",
                                   ratio_flex=f"{med.get('flex', math.nan) / med[p]:.3f}",
                                   max_error=f"{errors[p]:.3e}",
                                   picked=bench.picked_tiles("course_fast", pass_name == "backward")
                                   if p == "course" else "")
                        writers[pass_name].writerow(row)
                        files[pass_name].flush()
                        print(f"{pass_name:8s} d{d} n{n:6d} w{win:5d} {p:9s} {med[p]:8.3f} ms "
                              f"{row['tflops']:>6s} TFLOP/s  x{row['ratio_flex']} vs flex  err {row['max_error']}",
                              flush=True)
                q = k = v = do = None  # free this shape's tensors before the next
                torch.cuda.empty_cache()
    for f in files.values():
        f.close()
    print(f"done in {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
