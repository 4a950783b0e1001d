"""Train notebook 06's tiny GQA transformer to sort digits, on a GPU, with three attentions; write the curves.

    GQA_FLASH_IMPL=solutions python bench/train_tiny_model.py OUT.csv [--steps 1000]

The same model from the same start on the same batches, once per attention: PyTorch's
scaled_dot_product_attention, the course's graded kernels (gqa_flash.flash_attention: forward and
backward) and the fast ones (fast=True). Every 25 steps it records the training loss and the accuracy
of greedy predictions on a held-out batch of 512 sequences: digits right, and whole sorted halves
right. If the kernels' gradients are right, the three curves agree and the accuracy climbs to ~1.
Each row carries the date, GPU, driver and versions (gqa_flash.course.lab.bench.environment()).
"""

import argparse
import csv
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gqa_flash  # noqa: E402
from gqa_flash.course.lab import bench, tiny_model  # noqa: E402


def fast_attention(q, k, v):
    return gqa_flash.flash_attention(q, k, v, causal=True, fast=True)


PROVIDERS = {"sdpa": tiny_model.sdpa_attention, "course_graded": tiny_model.course_attention,
             "course_fast": fast_attention}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, args.dtype)
    cfg = tiny_model.Config(dim=64, q_heads=4, kv_heads=2, layers=2)
    env = bench.environment()
    rows = []
    for name, attention in PROVIDERS.items():
        start = time.perf_counter()
        history = tiny_model.train_and_evaluate(attention, steps=args.steps, device=device, dtype=dtype, cfg=cfg)
        seconds = time.perf_counter() - start
        last = history[-1]
        print(f"{name:14s} {seconds:6.1f} s  loss {last['train_loss']:.4f}  digits {last['digit_accuracy']:.4f}"
              f"  sequences {last['sequence_accuracy']:.4f}", flush=True)
        for r in history:
            rows.append(dict(provider=name, dtype=args.dtype, batch=64, digits=8, model_dim=cfg.dim,
                             q_heads=cfg.q_heads, kv_heads=cfg.kv_heads, layers=cfg.layers, seconds=round(seconds, 1),
                             **r, **env))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
