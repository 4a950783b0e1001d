"""Device exploration (developers): where flash_decode loses time, one run.

    GQA_FLASH_IMPL=solutions python3 bench/explore_decode.py OUT_DIR          (parts 1-3)
    GQA_FLASH_IMPL=solutions python3 bench/explore_decode.py OUT_DIR paged    (paged_tiles)

bf16, 32 query heads on 8 KV heads, head_dim 128, one new token, CUDA graphs
(triton.testing.do_bench_cudagraph, medians), SDPA's default on the same
contiguous cache as the reference of every ratio. Three questions, one CSV
(OUT_DIR/explore_decode.csv, one row a timing):

1. tiles and splits: decode.py's launcher at fixed (BLOCK_N, warps, stages)
   and split counts around one and two programs per SM slot, and with
   programmatic dependent launch of the merge kernel ("pdl");
2. what a paged cache costs: the same kernel on the contiguous cache
   [B, Hkv, S, D], on a contiguous cache in the paged layout's order
   [B, S, Hkv, D] (no table: only the heads interleaved), and on paged pools
   of 16 and 256 positions a page, in order (an identity table) and shuffled;
3. whether loading the next block's page numbers one step ahead helps
   (``_split_prefetch_kernel`` below, a copy of decode.py's split kernel with
   its key loop written out).

Every variant's output is compared with SDPA's before it is timed.
"""

import csv
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench_cudagraph

from gqa_flash.course import decode_launch, impl
from gqa_flash.course.lab import bench_decode as bd
from gqa_flash.course.lab.bench import environment

dec = impl.load("decode")
HQ, HKV, D = bd.Q_HEADS, bd.KV_HEADS, bd.HEAD_DIM  # bench_decode's shape: Llama 3 8B's attention
SHAPES = [(1, 1024), (1, 8192), (1, 32768), (8, 1024), (8, 8192), (8, 32768), (64, 1024), (64, 8192)]
TILES = [(32, 4, 3), (64, 4, 2), (64, 4, 3), (64, 4, 4), (64, 8, 3), (128, 4, 2), (128, 4, 3), (128, 8, 3)]


@triton.jit
def _split_prefetch_kernel(
    Q, K, V, SEQLENS, BLOCK_TABLE, ACC, L, M,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kp, stride_ks, stride_kh, stride_kd, stride_vp, stride_vs, stride_vh, stride_vd,
    stride_tb, stride_tp, qk_scale, N_Q_HEADS, N_KV_HEADS, N_SPLITS, CHUNK,
    N_Q: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
):
    """decode.py's split kernel, paged only, one new token a row, with the page numbers of the
    next key block loaded while this one is used (and one scalar load when a block fits a page)."""
    split_idx = tl.program_id(1)
    batch_idx = tl.program_id(2) // N_KV_HEADS
    kv_head_idx = tl.program_id(2) % N_KV_HEADS
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < (N_Q_HEADS // N_KV_HEADS) * N_Q
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    q, q_head, token = dec.group_tile(Q, batch_idx, kv_head_idx, rows, row_ok, offs_d, stride_qb, stride_qh,
                                      stride_qn, stride_qd, N_Q_HEADS, N_KV_HEADS, N_Q, HEAD_DIM)
    seq_len = tl.load(SEQLENS + batch_idx)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    start = split_idx * CHUNK
    end = tl.minimum(start + CHUNK, seq_len)
    table_row = BLOCK_TABLE + batch_idx.to(tl.int64) * stride_tb
    offs_n = start + tl.arange(0, BLOCK_N)
    if PAGE_SIZE >= BLOCK_N:
        page = tl.load(table_row + (start // PAGE_SIZE) * stride_tp, mask=start < end, other=0)
    else:
        page = tl.load(table_row + (offs_n // PAGE_SIZE) * stride_tp, mask=offs_n < end, other=0)
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        key_ok = offs_n < end
        nxt = start_n + BLOCK_N
        if PAGE_SIZE >= BLOCK_N:
            page_next = tl.load(table_row + (nxt // PAGE_SIZE) * stride_tp, mask=nxt < end, other=0)
            page_v = tl.zeros([BLOCK_N], dtype=tl.int32) + page
        else:
            offs_next = nxt + tl.arange(0, BLOCK_N)
            page_next = tl.load(table_row + (offs_next // PAGE_SIZE) * stride_tp, mask=offs_next < end, other=0)
            page_v = page
        slot = offs_n % PAGE_SIZE
        k = dec._load_cache_tile(K, page_v, slot, kv_head_idx, offs_d, stride_kp, stride_ks, stride_kh, stride_kd,
                                 key_ok, HEAD_DIM, 2147483647)  # no clamp: an exploration
        v = dec._load_cache_tile(V, page_v, slot, kv_head_idx, offs_d, stride_vp, stride_vs, stride_vh, stride_vd,
                                 key_ok, HEAD_DIM, 2147483647)  # no clamp: an exploration
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(key_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
        page = page_next
    state = ((batch_idx.to(tl.int64) * N_Q_HEADS + q_head) * N_Q + token) * N_SPLITS + split_idx
    tl.store(L + state, l_i, mask=row_ok)
    tl.store(M + state, m_i, mask=row_ok)
    tl.store(ACC + state[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=row_ok[:, None])


def prefetch_decode(q, kp, vp, seqlens, table, num_splits, block_n, warps, stages):
    """Full-context, one-token decoding through _split_prefetch_kernel and decode.py's merge kernel."""
    batch, hq, nq, d = q.shape
    page_size, hkv = kp.shape[1], kp.shape[2]
    context = table.shape[1] * page_size
    chunk = triton.cdiv(triton.cdiv(context, num_splits), block_n) * block_n
    splits = triton.cdiv(context, chunk)
    acc = torch.empty((batch, hq, nq, splits, d), dtype=torch.float32, device=q.device)
    l_part = torch.empty((batch, hq, nq, splits), dtype=torch.float32, device=q.device)
    m_part = torch.empty_like(l_part)
    o = torch.empty_like(q)
    lse = torch.empty((batch, hq, nq), dtype=torch.float32, device=q.device)
    _split_prefetch_kernel[(1, splits, batch * hkv)](
        q, kp, vp, seqlens, table, acc, l_part, m_part, *q.stride(), *kp.stride(), *vp.stride(), *table.stride(),
        d ** -0.5 * decode_launch.LOG2_E, hq, hkv, splits, chunk, N_Q=nq, HEAD_DIM=d, HEAD_DIM_PAD=d, BLOCK_M=16,
        BLOCK_N=block_n, PAGE_SIZE=page_size, num_warps=warps, num_stages=stages)
    merge = decode_launch.merge_launch(dec._flash_decode_merge_kernel, acc.shape, o.stride(), False)
    merge(acc, l_part, m_part, o, lse)
    return o


def split_candidates(batch, context, sms):
    programs = batch * HKV
    out = {1}
    for per_sm in (1, 2, 3, 4):
        out.add(max(1, per_sm * sms // programs))
        out.add(max(1, -(-per_sm * sms // programs)))
    return sorted(s for s in out if s <= context // 64)


def main(out_dir):
    out_dir = Path(out_dir)
    env = environment()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    f = open(out_dir / "explore_decode.csv", "w", newline="")
    fields = ["question", "variant", "cache", "batch", "context", "num_splits", "block_n", "warps", "stages", "pdl",
              "ms", "tbps", "ratio_to_sdpa", "err", "status", *env]
    writer = csv.DictWriter(f, fieldnames=fields, restval="")
    writer.writeheader()
    began = time.time()
    for batch, context in SHAPES:
        q, k, v, seqlens = bd.contiguous_inputs(batch, context)
        expected = F.scaled_dot_product_attention(q, k, v, enable_gqa=True).float()
        kv_bytes = bd.kv_bytes(batch, context)
        sdpa_ms = []

        def record(question, variant, cache, fn, splits="", tile=("", "", ""), pdl=""):
            row = dict(question=question, variant=variant, cache=cache, batch=batch, context=context,
                       num_splits=splits, block_n=tile[0], warps=tile[1], stages=tile[2], pdl=pdl, **env)
            try:
                err = (fn().float() - expected).abs().max().item()
                row["err"] = f"{err:.1e}"
                if not err <= 2e-2:
                    row["status"] = "wrong"
                else:
                    ms = do_bench_cudagraph(fn, rep=20, return_mode="median")
                    row.update(ms=round(ms, 5), tbps=round(kv_bytes / ms * 1e-9, 3), status="ok")
                    if variant == "sdpa_default":
                        sdpa_ms.append(ms)
                    row["ratio_to_sdpa"] = round(sorted(sdpa_ms)[len(sdpa_ms) // 2] / ms, 3)
            except Exception as e:
                row["status"] = f"error: {type(e).__name__}: {str(e)[:150]}"
            writer.writerow(row)
            f.flush()
            print(f"{time.time() - began:5.0f}s B={batch:2d} ctx={context:6d} {question:8s} {variant:14s} {cache:16s} "
                  f"s={splits!s:3s} tile={tile} pdl={pdl!s:5s} {row.get('tbps', ''):>6} TB/s "
                  f"x{row.get('ratio_to_sdpa', '')} {row.get('status')}", flush=True)
            return row.get("ms", float("inf"))

        sdpa = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
        record("baseline", "sdpa_default", "contiguous", sdpa)
        record("baseline", "flash_decode", "contiguous",
               lambda: dec.flash_decode(q, k, v, seqlens, max_seqlen=context))
        record("baseline", "sdpa_default", "contiguous", sdpa)
        # 1. tiles and splits, contiguous cache
        best = (float("inf"), None)
        for splits in split_candidates(batch, context, sms):
            for tile in TILES:
                for pdl in ((False, True) if splits > 1 and tile == (64, 4, 3) else (False,)):
                    cfg = dict(BLOCK_N=tile[0], num_warps=tile[1], num_stages=tile[2], pdl=pdl)
                    ms = record("tiles", "flash_decode", "contiguous",
                                lambda: dec.flash_decode(q, k, v, seqlens, max_seqlen=context, num_splits=splits,
                                                         config=cfg), splits, tile, pdl)
                    if ms < best[0]:
                        best = (ms, (splits, tile, pdl))
        record("tiles", "sdpa_default", "contiguous", sdpa)
        splits, tile, pdl = best[1]
        cfg = dict(BLOCK_N=tile[0], num_warps=tile[1], num_stages=tile[2], pdl=pdl)
        # 2. layouts, at the contiguous cache's best split and tile, and at 64-key tiles
        k_bshd, v_bshd = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (k, v))
        record("layout", "flash_decode", "bshd", lambda: dec.flash_decode(q, k_bshd, v_bshd, seqlens,
               max_seqlen=context, num_splits=splits, config=cfg), splits, tile, pdl)
        for page_size in (16, 256):
            for shuffle in (False, True):
                kp, vp, table = bd.paged_pool(k, v, page_size, shuffle=shuffle)
                name = f"paged{page_size}_{'shuffled' if shuffle else 'in_order'}"
                record("layout", "flash_decode", name, lambda: dec.flash_decode(
                    q, kp, vp, seqlens, block_table=table, max_seqlen=context, num_splits=splits, config=cfg),
                    splits, tile, pdl)
                if shuffle:
                    for ptile in ((64, 4, 3), (32, 4, 3), (64, 4, 4), (128, 4, 2)):
                        pcfg = dict(BLOCK_N=ptile[0], num_warps=ptile[1], num_stages=ptile[2])
                        record("layout", "flash_decode", name, lambda: dec.flash_decode(
                            q, kp, vp, seqlens, block_table=table, max_seqlen=context, num_splits=splits,
                            config=pcfg), splits, ptile, False)
                        # 3. the next block's page numbers loaded one step ahead
                        record("prefetch", "prefetch", name, lambda: prefetch_decode(
                            q, kp, vp, seqlens, table, splits, *ptile), splits, ptile, False)
    print(f"done in {time.time() - began:.0f} s", flush=True)


PAGED_SHAPES = [(1, 1024), (1, 8192), (8, 1024), (64, 1024), (64, 8192)]
PAGED_TILES = [(32, 4, 3), (32, 4, 4), (32, 8, 3), (64, 4, 2), (64, 4, 3), (64, 4, 4), (128, 4, 2)]


def paged_tiles(out_dir):
    """Part two, after decode.py looked its pages up one block ahead: tiles for the paged cache (pages
    of 16, shuffled) against the same tiles on the contiguous cache, at the launcher's split count and
    one split either side; OUT_DIR/explore_decode_paged.csv."""
    env = environment()
    f = open(Path(out_dir) / "explore_decode_paged.csv", "w", newline="")
    writer = csv.DictWriter(f, fieldnames=["cache", "batch", "context", "num_splits", "block_n", "warps", "stages",
                                           "ms", "tbps", "ratio_to_sdpa", "status", *env], restval="")
    writer.writeheader()
    for batch, context in PAGED_SHAPES:
        q, k, v, seqlens = bd.contiguous_inputs(batch, context)
        kp, vp, table = bd.paged_pool(k, v, 16)
        expected = F.scaled_dot_product_attention(q, k, v, enable_gqa=True).float()
        sdpa_ms = do_bench_cudagraph(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), rep=20)
        chosen = decode_launch.default_num_splits(batch * HKV, context, decode_launch.SPLIT_BLOCK_N, q.device)
        for splits in sorted({max(1, chosen - 1), chosen, chosen + 1} if chosen > 1 else {1}):
            for tile in PAGED_TILES:
                cfg = dict(BLOCK_N=tile[0], num_warps=tile[1], num_stages=tile[2], pdl=splits > 1)
                for cache, args in (("paged16", (kp, vp, seqlens, table)), ("contiguous", (k, v, seqlens, None))):
                    fn = lambda: dec.flash_decode(q, *args[:3], block_table=args[3], max_seqlen=context,  # noqa
                                                  num_splits=splits, config=cfg)
                    row = dict(cache=cache, batch=batch, context=context, num_splits=splits, block_n=tile[0],
                               warps=tile[1], stages=tile[2], **env)
                    try:
                        err = (fn().float() - expected).abs().max().item()
                        if err <= 2e-2:
                            ms = do_bench_cudagraph(fn, rep=20)
                            row.update(ms=round(ms, 5), tbps=round(bd.kv_bytes(batch, context) / ms * 1e-9, 3),
                                       ratio_to_sdpa=round(sdpa_ms / ms, 3), status="ok")
                        else:
                            row["status"] = f"wrong: {err:.1e}"
                    except Exception as e:
                        row["status"] = f"error: {type(e).__name__}: {str(e)[:150]}"
                    writer.writerow(row)
                    f.flush()
                    print(f"B={batch:2d} ctx={context:6d} {cache:10s} s={splits:2d} tile={tile} "
                          f"x{row.get('ratio_to_sdpa', '')} {row['status']}", flush=True)


if __name__ == "__main__":
    if sys.argv[2:] == ["paged"]:
        paged_tiles(sys.argv[1])
    else:
        main(sys.argv[1])
