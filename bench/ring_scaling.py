"""Ring attention on GPUs: time, tokens a second per GPU, and how much of the transfers the compute hides.

    torchrun --nproc-per-node N bench/ring_scaling.py --out ring.csv [--tokens 32768,131072]
             [--layouts zigzag,contiguous] [--backend nccl] [--rounds 5]

One process a GPU (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK); several processes on fewer GPUs share them
round-robin, where the backend allows (NCCL refuses two ranks on one GPU; gloo moves CUDA tensors through the
host). bf16, causal, 32 query heads on 8 KV heads, head_dim 128, batch 1: Llama 3 8B's attention. For each
total sequence length and layout, every rank builds the same whole Q, K, V from one seed, keeps its shard, and
times, with CUDA events, the slowest rank's:

* ``ring_ms``: ``gqa_flash.ring_attention`` (K/V blocks passed around the ring, each transfer posted before the
  block's compute);
* ``compute_ms``: the same blocks' attention with no transfer at all (each rank's own K/V stands in for the
  visiting blocks), so ``ring_ms - compute_ms`` is the transfer time the compute did not hide;

and, on rank 0 where the whole sequence fits one GPU, the course's fast forward and SDPA's default on it; and
(NCCL only) PyTorch's own context parallelism on the same inputs, ``torch_cp_sdpa_ms``: SDPA under
``torch.distributed.tensor.experimental.context_parallel`` on a device mesh of every rank (its own load-balanced
sharding; with ``enable_gqa`` where that works, else K and V repeated to every query head, which sends 4x the
bytes: ``torch_cp_note`` says which). That column came after the committed single-GPU table
(notebooks/data/h100_ring_one_gpu.csv); it has run once, at world size 1 on an H100, with enable_gqa
(bench/record/h100_ring_torch_context_parallel_check.csv).
Writes one CSV row per (tokens, layout), with the GPU's name and count.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import time

import torch
import torch.distributed as dist

Q_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


def _ints(text):
    return tuple(int(x) for x in text.split(","))


def _time_ms(fn, rounds, device):
    """Median of ``rounds`` timings of fn (after one warm call), the slowest rank's, in ms."""
    fn()
    torch.cuda.synchronize(device)
    times = []
    for _ in range(rounds):
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(device)
        t = torch.tensor([start.elapsed_time(end)], device=device if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times.append(t.item())
    return sorted(times)[len(times) // 2]


def _torch_context_parallel_ms(q, k, v, rounds, device):
    """(ms, note): SDPA under PyTorch's context_parallel on a mesh of every rank, on copies of the whole q, k, v."""
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    for gqa in (True, False):
        qc, kc, vc = q.clone(), k.clone(), v.clone()
        if not gqa:
            kc, vc = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (kc, vc))
        try:
            with context_parallel(mesh, buffers=[qc, kc, vc], buffer_seq_dims=[2, 2, 2],
                                  no_restore_buffers={qc, kc, vc}):
                fn = lambda: F.scaled_dot_product_attention(qc, kc, vc, is_causal=True, enable_gqa=gqa)  # noqa: E731
                return _time_ms(fn, rounds, device), "enable_gqa" if gqa else "K and V repeated to every query head"
        except Exception as e:  # noqa: BLE001 (the next way, or the note says why)
            note = f"{type(e).__name__}: {' '.join(str(e).split())[:160]}"
    return float("nan"), note


def _compute_only(ring, q, k, v, layout, sm_scale):
    """The ring's blocks without the ring: each step's pairs computed against this rank's own K/V."""
    from gqa_flash.course import context_parallel

    rank, world = dist.get_rank(), dist.get_world_size()
    c = q.shape[2] // context_parallel.check_layout(layout)
    o = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full(q.shape[:3], float("-inf"), dtype=torch.float32, device=q.device)
    for step in range(world):
        source = ring.ring_source(rank, step, world)
        for i, j, diagonal in ring.block_pairs(layout, rank, source, world, True):
            rows, keys = slice(i * c, (i + 1) * c), slice(j * c, (j + 1) * c)
            o_b, lse_b = context_parallel.block_attention(q[:, :, rows], k[:, :, keys], v[:, :, keys], diagonal,
                                                          sm_scale)
            o[:, :, rows], lse[:, :, rows] = ring.merge_blocks(o[:, :, rows], lse[:, :, rows], o_b, lse_b)
    return o


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokens", type=_ints, default=(32768, 131072))
    parser.add_argument("--layouts", default="zigzag,contiguous")
    parser.add_argument("--backend", default="nccl")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import gqa_flash
    from gqa_flash.course import impl
    from gqa_flash.course.lab.bench import environment

    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    ring = impl.load("ring")
    rows = []
    for n in args.tokens:
        gen = torch.Generator(device=device).manual_seed(n)
        q, k, v = (torch.randn(1, h, n, HEAD_DIM, device=device, dtype=torch.bfloat16, generator=gen)
                   for h in (Q_HEADS, KV_HEADS, KV_HEADS))
        one_gpu_ms = sdpa_ms = err = float("nan")
        cp_ms, cp_note = (_torch_context_parallel_ms(q, k, v, args.rounds, device) if args.backend == "nccl"
                          else (float("nan"), "needs nccl"))
        if rank == 0:
            try:
                fast = lambda: gqa_flash.fast_attention_forward(q, k, v, causal=True)  # noqa: E731
                ref = fast()
                torch.cuda.synchronize()
                one_gpu_ms = _time_local(fast, args.rounds)
                sdpa_ms = _time_local(lambda: torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=True, enable_gqa=True), args.rounds)
            except torch.OutOfMemoryError:
                ref = None
        for layout in args.layouts.split(","):
            shards = [gqa_flash.shard_sequence(t, world, rank, layout).contiguous() for t in (q, k, v)]
            status = "ok"
            try:
                ring_ms = _time_ms(lambda: gqa_flash.ring_attention(*shards, layout=layout), args.rounds, device)
                compute_ms = _time_ms(lambda: _compute_only(ring, *shards, layout, HEAD_DIM ** -0.5), args.rounds,
                                      device)
                out = gqa_flash.ring_attention(*shards, layout=layout)
                if args.backend == "nccl":  # (gloo gathers no CUDA tensors: no error column then)
                    whole = [torch.empty_like(out) for _ in range(world)]
                    dist.all_gather(whole, out)
                    if rank == 0 and ref is not None:
                        err = (gqa_flash.unshard_sequence(whole, layout).float() - ref.float()).abs().max().item()
            except Exception as e:  # noqa: BLE001 (recorded in the row)
                ring_ms = compute_ms = float("nan")
                root = e.__cause__ or e  # the backend's own error, under ring_attention's
                status = f"error: {type(root).__name__}: {' '.join(str(root).split())[:300]}"
            flops = 4 * Q_HEADS * n * n * HEAD_DIM / 2  # causal: half of 4 N^2 D a head
            rows.append(dict(
                tokens=n, layout=layout, world_size=world, n_gpus=torch.cuda.device_count(), backend=args.backend,
                ring_ms=round(ring_ms, 3), compute_ms=round(compute_ms, 3),
                exposed_transfer_ms=round(ring_ms - compute_ms, 3),
                tokens_per_s_per_gpu=round(n / (ring_ms * 1e-3) / world, 1),
                tflops_per_gpu=round(flops / (ring_ms * 1e-3) / world / 1e12, 1),
                one_gpu_fast_ms=round(one_gpu_ms, 3), one_gpu_sdpa_ms=round(sdpa_ms, 3),
                torch_cp_sdpa_ms=round(cp_ms, 3), torch_cp_note=cp_note,
                max_abs_err_vs_one_gpu=f"{err:.2e}", status=status, flops_counted="4 Hq N^2 D / 2 (causal)",
                **environment()))
            if rank == 0:
                print(rows[-1], flush=True)
        q = k = v = ref = None  # free the GPU memory of this length before the next
        torch.cuda.empty_cache()
    if rank == 0:
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    dist.destroy_process_group()


def _time_local(fn, rounds):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


if __name__ == "__main__":
    main()
