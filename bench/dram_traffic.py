"""DRAM traffic of the fast forward kernel in two launch orders, measured and modelled (notebook 05).

    python bench/dram_traffic.py OUT.csv              # time both orders, write the model's bytes
    ncu --clock-control none --profile-from-start off --metrics dram__bytes_read.sum,dram__bytes_write.sum \\
        --csv python bench/dram_traffic.py --profile   # the measured bytes, one launch per order

One kernel, one tile config (BLOCK_M 128, BLOCK_N 64, two query sub-tiles, 4 warps, 2 stages), two orders:
``group_major`` (the query heads of one KV group back to back: the fast kernel's order) and ``head_major``
(every query tile of one query head, then the next head: the graded kernel's order). bf16, causal, one
sequence of 16k tokens, 32 query heads on 8 KV heads, head_dim 64 and 128.

The model's bytes: ``minimum`` reads Q, K, V and writes O once (what a roofline with ideal caching assumes);
``no_reuse`` has every program read its own K/V prefix from DRAM (nothing shared through L2):
Q + O + per query tile t (t + 1) * BLOCK_M rows of K and of V.
"""

import argparse
import csv
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gqa_flash.fast import forward as fast  # noqa: E402
from gqa_flash.course.lab import bench  # noqa: E402

CONFIG = dict(BLOCK_M=128, BLOCK_N=64, SUBTILES=2, num_warps=4, num_stages=2)
B, HQ, HKV, N = 1, 32, 8, 16384
ORDERS = {"group_major": True, "head_major": False}


def model_bytes(d: int, block_m: int = CONFIG["BLOCK_M"], elem: int = 2) -> dict:
    q_or_o = B * HQ * N * d * elem
    k_or_v = B * HKV * N * d * elem
    tiles = triton.cdiv(N, block_m)
    rows_read = block_m * tiles * (tiles + 1) // 2  # K rows one query head's programs read, all tiles
    return dict(minimum=2 * q_or_o + 2 * k_or_v, no_reuse=2 * q_or_o + 2 * B * HQ * rows_read * d * elem)


def inputs(d: int):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, HQ, N, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(B, HKV, N, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    return q, k, v


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="?")
    parser.add_argument("--profile", action="store_true", help="one launch per order between profiler marks")
    args = parser.parse_args()
    rows, env = [], bench.environment()
    for d in (64, 128):
        q, k, v = inputs(d)
        ref = fast.fast_attention_forward(q, k, v, causal=True, config=CONFIG)
        for order, group_major in ORDERS.items():  # compile both, and check they agree
            o = fast.fast_attention_forward(q, k, v, causal=True, config=CONFIG, group_major=group_major)
            assert torch.equal(o, ref), f"{order} differs from group_major at d={d}"
        torch.cuda.synchronize()
        if args.profile:
            torch.cuda.cudart().cudaProfilerStart()
            for order, group_major in ORDERS.items():
                print(f"profile d={d} {order}", flush=True)
                fast.fast_attention_forward(q, k, v, causal=True, config=CONFIG, group_major=group_major)
                torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
            continue
        flops = 4 * B * HQ * N * N * d / 2
        for order, group_major in ORDERS.items():
            ms = triton.testing.do_bench(
                lambda: fast.fast_attention_forward(q, k, v, causal=True, config=CONFIG, group_major=group_major),
                warmup=100, rep=500, return_mode="median")
            rows.append(dict(order=order, head_dim=d, batch=B, q_heads=HQ, kv_heads=HKV, seq_len=N,
                             ms=round(ms, 4), tflops=round(flops / ms / 1e9, 1), flop=int(flops),
                             **{f"model_{k}_bytes": v for k, v in model_bytes(d).items()},
                             config=" ".join(f"{k}={v}" for k, v in CONFIG.items()), **env))
            print(rows[-1], flush=True)
    if args.out and rows:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
