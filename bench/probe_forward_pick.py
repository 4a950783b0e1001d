"""Device probe (developers): the fast forward's autotuner pick against fixed tiles at head_dim 128.

    python bench/probe_forward_pick.py OUT.csv

bf16, causal, 32:8 heads, 16k tokens a launch, N = 4k and 8k; triton.testing.do_bench medians (as
bench/explore_fast.py). Prints the autotuner's pick beside each fixed tile's time, to tell a bad
pick from a slow kernel.
"""

import csv
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from gqa_flash.fast import forward as fast_forward

TILES = [(256, 64, 8, 3, 2), (128, 64, 4, 2, 2), (128, 64, 4, 3, 2), (64, 64, 4, 3, 1), (128, 64, 8, 3, 1)]


def main(path):
    with open(path, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["d", "n", "provider", "ms", "ratio"])
        for n in (4096, 8192):
            d, b = 128, 16384 // n
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=gen) for h in (32, 8, 8))
            base = do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                            warmup=25, rep=100, return_mode="median")
            rows = [("sdpa_default", base)]
            auto = do_bench(lambda: fast_forward.fast_attention_forward(q, k, v, causal=True), warmup=25, rep=100,
                            return_mode="median")
            pick = fast_forward._kernel().best_config
            rows.append((f"autotuned ({pick.kwargs}, w{pick.num_warps} s{pick.num_stages})", auto))
            for bm, bn, w, st, sub in TILES:
                cfg = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st, SUBTILES=sub)
                ms = do_bench(lambda: fast_forward.fast_attention_forward(q, k, v, causal=True, config=cfg), warmup=25,
                              rep=100, return_mode="median")
                rows.append((f"{bm}x{bn}_w{w}_s{st}_sub{sub}", ms))
            for name, ms in rows:
                writer.writerow([d, n, name, round(ms, 4), round(base / ms, 3)])
                print(f"d={d} n={n} {name:60s} {ms:.4f} ms x{base / ms:.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
