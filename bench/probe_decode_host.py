"""Device probe (developers): where the host's time goes in one call of the public ``flash_decode``.

    GQA_FLASH_IMPL=solutions python bench/probe_decode_host.py OUT.csv [--profile PROFILE.txt]

A serving loop that does not capture its decode step in a CUDA graph pays the host's time on every
step, and at short contexts a step's GPU time is a few microseconds. For bf16, 32:8 heads, head_dim
128, one new token, this times the host's part of each layer of the call: 200 calls queued without
waiting (``host_us``, the mean), beside the GPU's time of the same 200 (``gpu_us``). Rows: SDPA; the
public API with max_seqlen (contiguous, paged, with k_new/v_new); the checked API (reads the lengths);
the launcher under the API; the launcher with one split (one kernel, no merge); the input checks alone;
``impl.load``; and an empty Python call. ``--profile`` writes Python's profile of 2000 public calls.
"""

import argparse
import cProfile
import csv
import io
import pstats
import time

import torch
import torch.nn.functional as F

import gqa_flash
from gqa_flash.course import impl, validation
from gqa_flash.course.lab.bench import environment

CALLS = 200


def host_and_gpu_us(fn, calls=CALLS):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - began) / calls * 1e6
    end.record()
    torch.cuda.synchronize()
    return host, start.elapsed_time(end) * 1e3 / calls


def calls_for(batch, context):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(batch, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(batch, 8, context, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    pages = context // 16
    kp, vp = (t.view(batch, 8, pages, 16, 128).permute(0, 2, 3, 1, 4).reshape(batch * pages, 16, 8, 128)
              for t in (k, v))
    table = torch.arange(batch * pages, device="cuda", dtype=torch.int32).view(batch, pages)
    seqlens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    k_new, v_new = (torch.randn(batch, 8, 1, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    decode = impl.load("decode")
    return {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
        "public max_seqlen contiguous": lambda: gqa_flash.flash_decode(q, k, v, seqlens, max_seqlen=context),
        "public max_seqlen paged": lambda: gqa_flash.flash_decode(q, kp, vp, seqlens, block_table=table,
                                                                  max_seqlen=context),
        "public max_seqlen contiguous k_new": lambda: gqa_flash.flash_decode(q, k, v, seqlens, max_seqlen=context,
                                                                             k_new=k_new, v_new=v_new),
        "public checked contiguous": lambda: gqa_flash.flash_decode(q, k, v, seqlens),
        "public checked paged": lambda: gqa_flash.flash_decode(q, kp, vp, seqlens, block_table=table),
        "launcher": lambda: decode.flash_decode(q, k, v, seqlens, max_seqlen=context),
        "launcher one split": lambda: decode.flash_decode(q, k, v, seqlens, max_seqlen=context, num_splits=1),
        "checks only": lambda: validation.check_decode_inputs(q, k, v, seqlens, None, None, False, context),
        "impl.load": lambda: impl.load("decode"),
        "torch.empty": lambda: torch.empty((batch, 32, 1, 128), device="cuda", dtype=torch.bfloat16),
        "python call": lambda: None,
    }


def main(out, profile=None):
    env = environment()
    rows = []
    for batch, context in ((1, 1024), (8, 8192), (64, 32768)):
        for name, fn in calls_for(batch, context).items():
            host, gpu = host_and_gpu_us(fn)
            row = dict(call=name, batch=batch, context=context, host_us=round(host, 2), gpu_us=round(gpu, 2), **env)
            rows.append(row)
            print(f"{name:40s} B={batch:2d} ctx={context:6d} host {host:8.2f} us  gpu {gpu:8.2f} us", flush=True)
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    if profile:
        fns = calls_for(1, 1024)
        for name in ("public max_seqlen paged", "launcher"):
            fn = fns[name]
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(2000):
                fn()
            profiler.disable()
            torch.cuda.synchronize()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
            with open(profile, "a") as f:
                f.write(f"=== {name}, batch 1, 1k, 2000 calls\n{text.getvalue()}\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--profile")
    args = parser.parse_args()
    main(args.out, args.profile)
