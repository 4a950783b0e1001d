"""Device exploration (developers): the graded kernel's tile configs against SDPA, one run.

    python bench/explore_forward.py OUT_DIR

bf16, causal, GQA 32:8, 16k tokens a launch; medians of triton.testing.do_bench.
Each config is checked against SDPA before it is timed. Writes OUT_DIR/explore_forward.csv (committed as notebooks/data/h200_explore_forward_*.csv).
"""

import csv
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from gqa_flash import impl

fwd = impl.load("forward", "solutions")
CONFIGS = [
    (128, 64, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3), (128, 128, 8, 3), (64, 32, 4, 3),
    (128, 32, 4, 3), (128, 64, 8, 4), (128, 64, 8, 2), (64, 64, 4, 4), (128, 128, 8, 2), (64, 64, 4, 2),
]


def main(out_dir):
    rows = []
    for d in (64, 128):
        for n in (1024, 4096, 16384):
            b, hq, hkv = 16384 // n, 32, 8
            gen = torch.Generator(device="cuda").manual_seed(0)
            q = torch.randn(b, hq, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            k = torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            v = torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            flops = 4 * b * hq * n * n * d / 2
            ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            ms = do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                          warmup=25, rep=100, return_mode="median")
            base = ms
            rows.append(dict(provider="sdpa_default", d=d, n=n, ms=ms, tflops=flops / ms * 1e-9, ratio=1.0, err=0.0))
            for bm, bn, w, st in CONFIGS:
                cfg = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st)
                try:
                    o = fwd.flash_attention_forward(q, k, v, causal=True, config=cfg)
                    err = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
                    ms = do_bench(lambda: fwd.flash_attention_forward(q, k, v, causal=True, config=cfg),
                                  warmup=25, rep=100, return_mode="median")
                except Exception as e:  # out of shared memory, etc.
                    print(f"d={d} n={n} {cfg}: {type(e).__name__}: {str(e)[:100]}")
                    continue
                rows.append(dict(provider=f"graded_{bm}x{bn}_w{w}_s{st}", d=d, n=n, ms=ms,
                                 tflops=flops / ms * 1e-9, ratio=base / ms, err=err))
            for r in rows[-(len(CONFIGS) + 1):]:
                print(f"d={r['d']:4d} n={r['n']:6d} {r['provider']:28s} {r['ms']:8.4f} ms {r['tflops']:6.1f} TFLOP/s "
                      f"x{r['ratio']:.3f} err {r['err']:.1e}", flush=True)
    path = Path(out_dir) / "explore_forward.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main(sys.argv[1])
