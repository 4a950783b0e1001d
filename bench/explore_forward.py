"""The graded forward kernel at fixed tiles against SDPA, on a GPU (developers; bench/tile_sweep.sh runs it).

    GQA_FLASH_IMPL=solutions python bench/explore_forward.py OUT_DIR

The graded kernel is the one the implementation switch points to (GQA_FLASH_IMPL, gqa_flash/course/impl.py).
bf16, causal, GQA 32:8, 16k tokens a launch, head_dim 64 and 128, N = 1k, 4k, 16k; medians of
triton.testing.do_bench; ratios to SDPA's default in the same run. Each config's error against SDPA is
recorded with its time (err). Writes OUT_DIR/graded_forward_tiles.csv, the kind of file committed as
notebooks/data/h200_graded_forward_tiles.csv (notebook 05, section 5; the graded kernel's autotuner
candidates were chosen from it).
"""

import csv
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from gqa_flash.course import impl  # first: it decides where kernels run before triton is used
from triton.testing import do_bench

CONFIGS = [  # BLOCK_M, BLOCK_N, warps, stages
    (128, 64, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3), (128, 128, 8, 3), (64, 32, 4, 3),
    (128, 32, 4, 3), (128, 64, 8, 4), (128, 64, 8, 2), (64, 64, 4, 4), (128, 128, 8, 2), (64, 64, 4, 2),
]


def bench(fn):
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def main(out_dir):
    fwd = impl.load("forward")  # whatever GQA_FLASH_IMPL points to
    path = Path(out_dir) / "graded_forward_tiles.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["provider", "d", "n", "ms", "tflops", "ratio", "err"])
        writer.writeheader()

        def record(provider, d, n, ms, flops, base, err):
            row = dict(provider=provider, d=d, n=n, ms=ms, tflops=flops / ms * 1e-9, ratio=base / ms, err=err)
            writer.writerow(row)
            f.flush()  # a run cut short by its time limit keeps what it measured
            print(f"d={d:4d} n={n:6d} {provider:28s} {ms:8.4f} ms {row['tflops']:6.1f} TFLOP/s "
                  f"x{row['ratio']:.3f} err {err:.1e}", flush=True)

        for d in (64, 128):
            for n in (1024, 4096, 16384):
                b, hq, hkv = 16384 // n, 32, 8
                gen = torch.Generator(device="cuda").manual_seed(0)
                q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                           for h in (hq, hkv, hkv))
                flops = 4 * b * hq * n * n * d / 2
                ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                base = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
                record("sdpa_default", d, n, base, flops, base, 0.0)
                for bm, bn, w, st in CONFIGS:
                    cfg = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st)
                    try:
                        o = fwd.flash_attention_forward(q, k, v, causal=True, config=cfg)
                        err = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
                        ms = bench(lambda: fwd.flash_attention_forward(q, k, v, causal=True, config=cfg))
                    except Exception as e:  # out of shared memory, a stub: reported, the run goes on
                        print(f"d={d} n={n} {cfg}: {type(e).__name__}: {str(e)[:100]}", flush=True)
                        continue
                    record(f"graded_{bm}x{bn}_w{w}_s{st}", d, n, ms, flops, base, err)


if __name__ == "__main__":
    main(sys.argv[1])
