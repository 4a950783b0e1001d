"""Device probe (developers): the fast forward's autotuner pick against fixed tiles at head_dim 128.

    python bench/probe_forward_pick.py OUT.csv [N ...]

bf16, causal, 32:8 heads, 16k tokens a launch, N = 4k and 8k unless given; triton.testing.do_bench
medians (as bench/explore_fast.py), timed in 5 interleaved rounds (gqa_flash.course.lab.bench.interleaved_times),
each tile checked against SDPA first. Prints the autotuner's pick beside each fixed tile's time, to tell a
bad pick from a slow kernel, and to compare a tile that is not a candidate at a length with the ones
that are (``LONG_TILES_FROM``).
"""

import csv
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from gqa_flash.fast import forward as fast_forward
from gqa_flash.course.lab.bench import checked_interleaved_times, median, tile_text

TILES = [(256, 64, 8, 3, 2), (128, 64, 4, 2, 2), (128, 64, 4, 3, 2), (64, 64, 4, 3, 1), (128, 64, 8, 3, 1)]
ROUNDS = 5


def bench(fn):
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def main(path, lengths=(4096, 8192)):
    with open(path, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["d", "n", "provider", "ms", "ratio", "rel_err", "rounds_ms"])
        for n in lengths:
            d, b = 128, 16384 // n
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=gen) for h in (32, 8, 8))
            sdpa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
            ref = sdpa().float()
            steps = {"sdpa_default": sdpa,
                     "autotuned": lambda: fast_forward.fast_attention_forward(q, k, v, causal=True)}
            for bm, bn, w, st, sub in TILES:
                cfg = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st, SUBTILES=sub)
                steps[f"{bm}x{bn}_w{w}_s{st}_sub{sub}"] = (
                    lambda cfg=cfg: fast_forward.fast_attention_forward(q, k, v, causal=True, config=cfg))
            say = lambda text: print(f"d={d} n={n} {text}", flush=True)  # noqa: E731
            times, failed, errors = checked_interleaved_times(
                steps, lambda out: ((out.float() - ref).norm() / ref.norm()).item(), 2e-2, ROUNDS, bench, say)
            picked = f"autotuned ({tile_text(fast_forward._kernel())})"  # it picked during the check above
            base = median(times["sdpa_default"])
            for name in steps:
                ms = median(times.get(name, []))
                label = picked if name == "autotuned" else name
                writer.writerow([d, n, label, round(ms, 4), round(base / ms, 3), f"{errors[name]:.1e}",
                                 ";".join(f"{t:.4f}" for t in times.get(name, []))])
                print(f"d={d} n={n} {label:60s} {ms:.4f} ms x{base / ms:.3f} err {errors[name]:.1e}", flush=True)
            for name, why in failed.items():
                say(f"{name}: {why}")


if __name__ == "__main__":
    main(sys.argv[1], tuple(int(n) for n in sys.argv[2:]) or (4096, 8192))
