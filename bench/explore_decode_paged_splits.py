"""Device exploration (developers): a paged cache split into short chunks, more and smaller programs.

    GQA_FLASH_IMPL=solutions python bench/explore_decode_paged_splits.py OUT.csv

bf16, 32 query heads on 8 KV heads, head_dim 128, one new token, pages of 16 shuffled in the pool, CUDA
graphs (one timing of each). At batch 1 up to 8k and batch 8 at 1k, each program of the split kernel walks
four 64-key blocks or fewer, and a paged cache ran at 0.88 of the contiguous one: each program waits on
its table loads with little else to do. This times decode.flash_decode at tiles (BLOCK_N, warps, stages)
and 1, 2 and 4 times the default split count, beside the default contiguous and paged calls and SDPA;
every variant's output is compared with SDPA's first. decode_launch.PAGED_SHORT_SPLIT_CONFIG came from it
(bench/record/h100_decode_paged_splits.csv).
"""

import csv
import sys

import torch.nn.functional as F
from triton.testing import do_bench_cudagraph

from gqa_flash.course import decode_launch, impl
from gqa_flash.course.lab import bench_decode as bd
from gqa_flash.course.lab.bench import environment

TILES = [(64, 4, 3), (32, 4, 3), (32, 4, 4), (32, 2, 3), (16, 4, 4), (16, 2, 4)]
SHAPES = [(1, 1024), (1, 8192), (8, 1024), (1, 32768), (8, 8192)]


def main(out):
    dec, env, rows = impl.load("decode"), environment(), []
    for batch, ctx in SHAPES:
        q, k, v, seqlens, kp, vp, table = bd.inputs(batch, ctx)
        ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True).float()
        base = decode_launch.default_num_splits(batch * bd.KV_HEADS, ctx, decode_launch.SPLIT_BLOCK_N, q.device)
        t_sdpa = do_bench_cudagraph(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), rep=50)
        t_con = do_bench_cudagraph(lambda: dec.flash_decode(q, k, v, seqlens, max_seqlen=ctx), rep=50)
        for block_n, warps, stages in TILES:
            for mult in (1, 2, 4):
                splits = min(base * mult, -(-ctx // block_n))
                cfg = dict(BLOCK_N=block_n, num_warps=warps, num_stages=stages, pdl=True)
                fn = lambda: dec.flash_decode(q, kp, vp, seqlens, block_table=table, max_seqlen=ctx,  # noqa: E731
                                              num_splits=splits, config=cfg)
                err = (fn().float() - ref).abs().max().item()
                t = do_bench_cudagraph(fn, rep=50)
                rows.append(dict(batch=batch, context=ctx, block_n=block_n, warps=warps, stages=stages, splits=splits,
                                 ms=round(t, 5), paged_over_contig=round(t_con / t, 3), x_sdpa=round(t_sdpa / t, 3),
                                 err=f"{err:.1e}", **env))
                print(rows[-1], flush=True)
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main(sys.argv[1])
