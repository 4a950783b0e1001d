"""Benchmark decoding over a KV cache on a GPU: ``python -m gqa_flash.course.lab.bench_decode --out OUT.csv``.

One new token (Nq = 1) a sequence, bf16, 32 query heads on 8 KV heads, head dim
128 (Llama 3 8B's attention); batch 1, 8 and 64; contexts of 1k, 8k, 32k and
128k tokens, every sequence full (cache_seqlens = context). Providers, all on
the same inputs, interleaved within a shape:

    sdpa_default            F.scaled_dot_product_attention(enable_gqa=True) on the
                            contiguous cache: PyTorch's own choice of backend
    flash_decode            the public gqa_flash.flash_decode(..., max_seqlen=context), as
                            a serving loop calls it (api=public): decode.py from the
                            implementation switch (GQA_FLASH_IMPL: yours, or the
                            completed file), on the contiguous cache [B, Hkv, S, D] and
                            on a paged one (pages of 16, shuffled in the pool)
    flex                    FlexAttention (torch.compile, dynamic=False: one compile per
                            shape, its first call's time in the note), contiguous cache
    course_prefill          gqa_flash.flash_attention_forward with q of one token: the
                            API refuses it (q and k must have one length); its error is
                            the row's status
    course_prefill_padded   the same kernel on q padded to the whole context (the new
                            token last, causal), the output's last row kept: what
                            decoding with a prefill kernel costs, a whole prefill per
                            token; only where it takes at most ~10 TFLOP

Every output is compared with SDPA's before it is timed (a wrong one is not
timed). Each row is timed two ways, a row for each (the ``timing`` column):
``cuda_graph`` (triton.testing.do_bench_cudagraph: the call captured once in a
CUDA graph and replayed, as serving engines run a decode step; a call that
cannot be captured says so in its status) and ``plain`` (do_bench: the call
as Python makes it, host time included when the host is slower than the GPU).
Times are medians over ``--rounds`` rounds, in each of which every provider is
timed once in each way; ratios compare rows timed the same way. ``host_us``
is the host's time to make one call: the mean over 50 calls queued without
waiting for the GPU (when the GPU is the slower, the queue fills and the host
waits: then it is the GPU's pace, not the host's). The bytes a
step needs are K and V at every valid position, every KV head, 2 bytes each:
``tbps`` is those bytes over the time, ``ratio_to_sdpa_default`` SDPA's time
over the row's (the paged rows too: SDPA reads the contiguous cache that holds
the same values), ``ratio_to_read_ceiling`` tbps over the read ceiling, and
``num_splits`` the split count flash_decode's launcher picks. Two ceilings are
measured first: the fastest of the read-only reductions over 2 GiB of bf16
(torch.sum to fp32, torch.amax, and ``_stream_read_kernel``, a Triton kernel
that only streams and sums, at a few tiles), and a 2 GiB device-to-device copy
(bytes read plus written).
On a machine with no GPU it refuses, with a message, and writes nothing.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

from gqa_flash.course import runtime
from gqa_flash.course.lab.bench import ENVIRONMENT, environment

Q_HEADS, KV_HEADS, HEAD_DIM, NEW_TOKENS, PAGE_SIZE = 32, 8, 128, 1, 16
DEVICE, DTYPE = "cuda", torch.bfloat16  # (tests/given/test_bench_decode.py runs the sweep's logic on a CPU in fp32)
BATCHES = (1, 8, 64)
CONTEXTS = (1024, 8192, 32768, 131072)
PROVIDERS = ("sdpa_default", "flash_decode", "flex", "course_prefill", "course_prefill_padded")
PREFILL_MAX_FLOP = 10e12  # course_prefill_padded only up to here: beyond, one call takes tens of ms to seconds
MAX_ABS_ERR = 2e-2  # bf16 outputs against SDPA's, values of order 1
FIELDS = [
    "provider", "cache", "batch", "context", "q_heads", "kv_heads", "head_dim", "new_tokens", "dtype", "page_size",
    "num_splits", "api", "timing", "ms", "host_us", "kv_bytes", "tbps", "ratio_to_sdpa_default",
    "ratio_to_read_ceiling", "read_ceiling_tbps", "copy_tbps", "max_abs_err_vs_sdpa", "status", "note", *ENVIRONMENT,
]


def _name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _empty_cache():
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def _free_bytes() -> int:
    return torch.cuda.mem_get_info()[0] if DEVICE == "cuda" else 2**62


def kv_bytes(batch, context, kv_heads=KV_HEADS, head_dim=HEAD_DIM, elem_bytes=2) -> int:
    """The K/V bytes one decoding step needs: K and V, every valid position, every KV head."""
    return 2 * batch * kv_heads * context * head_dim * elem_bytes


def prefill_flop(batch, context, q_heads=Q_HEADS, head_dim=HEAD_DIM) -> float:
    """FLOPs of a causal prefill over the whole context (what course_prefill_padded computes per token)."""
    return 2.0 * batch * q_heads * context**2 * head_dim


def bytes_to_allocate(batch, context, padded_prefill) -> int:
    """What a shape holds at once: the contiguous cache, the paged pool, and the padded q and O."""
    cache = 2 * kv_bytes(batch, context)
    if padded_prefill:
        cache += 2 * batch * Q_HEADS * context * HEAD_DIM * 2
    return cache + 2 * 2**30  # workspaces, partial states, the allocator's rounding


def plan(batches=BATCHES, contexts=CONTEXTS, providers=PROVIDERS):
    """The shapes, in the order they run, each with the (provider, cache) rows it gets."""
    shapes = []
    for batch in batches:
        for context in contexts:
            rows = []
            for name in providers:
                if name == "flash_decode":
                    rows += [(name, "contiguous"), (name, "paged")]
                elif name != "course_prefill_padded" or prefill_flop(batch, context) <= PREFILL_MAX_FLOP:
                    rows.append((name, "contiguous"))
            shapes.append((batch, context, rows))
    return shapes


@triton.jit
def _stream_read_kernel(X, OUT, N, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    """Read STEPS * BLOCK consecutive elements of X and write their fp32 sum: a pure read stream."""
    start = tl.program_id(0).to(tl.int64) * BLOCK * STEPS
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(STEPS):
        offs = start + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(X + offs, mask=offs < N, other=0.0).to(tl.float32)
    tl.store(OUT + tl.program_id(0), tl.sum(acc))


STREAM_READ_TILES = ((4096, 8, 4), (8192, 8, 8), (2048, 32, 4), (8192, 32, 8))  # BLOCK, STEPS, warps


def _stream_rates() -> tuple[float, float]:
    from triton.testing import do_bench

    x = torch.empty(2**30, dtype=torch.bfloat16, device="cuda").normal_()  # 2 GiB, far beyond L2
    readers = [lambda: x.sum(dtype=torch.float32), lambda: x.amax()]
    for block, steps, warps in STREAM_READ_TILES:
        sums = torch.empty(triton.cdiv(x.numel(), block * steps), dtype=torch.float32, device="cuda")
        readers.append(lambda block=block, steps=steps, warps=warps, sums=sums: _stream_read_kernel[(sums.numel(),)](
            x, sums, x.numel(), BLOCK=block, STEPS=steps, num_warps=warps))
    reads = [do_bench(fn, warmup=25, rep=200, return_mode="median") for fn in readers]
    y = torch.empty_like(x)
    copy_ms = do_bench(lambda: y.copy_(x), warmup=25, rep=200, return_mode="median")
    return 2 * x.numel() / min(reads) * 1e-9, 2 * 2 * x.numel() / copy_ms * 1e-9  # copy: read + written


def ceilings(log=print) -> tuple[float, float]:
    """(read TB/s, copy TB/s) on this GPU: 2 GiB of bf16 read by reductions, and copied."""
    read, copy = _stream_rates()
    torch.cuda.empty_cache()
    log(f"ceilings: read {read:.2f} TB/s (the fastest of torch.sum, torch.amax and a Triton read stream over "
        f"2 GiB bf16), copy {copy:.2f} TB/s")
    return read, copy


def _flex():
    """A compiled FlexAttention, or the reason there is none."""
    try:
        import torch._dynamo
        from torch.nn.attention.flex_attention import flex_attention

        limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
        setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 64))
        return torch.compile(flex_attention, dynamic=False), None
    except Exception as e:  # an older torch, or no compiler toolchain
        return None, f"unavailable: {type(e).__name__}: {str(e)[:100]}"


def splits_chosen(q, k_cache, v_cache, block_table, context) -> int:
    """The split count flash_decode(max_seqlen=context) launches with for these inputs (its plan's)."""
    from gqa_flash.course import decode_launch

    return decode_launch.DecodePlan((None, None), q, k_cache, v_cache, block_table, max_seqlen=context).num_splits


def contiguous_inputs(batch, context, seed=0):
    """q [B, Hq, 1, D], a full contiguous cache k, v [B, Hkv, S, D] and cache_seqlens (= context)."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    q = torch.randn(batch, Q_HEADS, NEW_TOKENS, HEAD_DIM, device=DEVICE, dtype=DTYPE, generator=gen)
    k, v = (torch.empty(batch, KV_HEADS, context, HEAD_DIM, device=DEVICE, dtype=DTYPE).normal_(generator=gen)
            for _ in range(2))
    return q, k, v, torch.full((batch,), context, dtype=torch.int32, device=DEVICE)


def paged_pool(k, v, page_size, seed=0, shuffle=True):
    """The contiguous cache k, v [B, Hkv, S, D] as a pool [pages, page_size, Hkv, D] holding the same
    values, and its block table [B, S / page_size] int32: the pages shuffled in the pool, or in order."""
    batch, kv_heads, context, head_dim = k.shape
    pages = context // page_size
    order = (torch.randperm(batch * pages, generator=torch.Generator().manual_seed(seed)) if shuffle
             else torch.arange(batch * pages)).to(k.device)
    kp, vp = (torch.empty(batch * pages, page_size, kv_heads, head_dim, device=k.device, dtype=k.dtype)
              for _ in range(2))
    for b in range(batch):  # one sequence at a time: a copy of the whole cache would double its memory
        where = order[b * pages:(b + 1) * pages]
        kp[where] = k[b].view(kv_heads, pages, page_size, head_dim).permute(1, 2, 0, 3)
        vp[where] = v[b].view(kv_heads, pages, page_size, head_dim).permute(1, 2, 0, 3)
    return kp, vp, order.view(batch, pages).to(torch.int32)


def inputs(batch, context, seed=0):
    """q, the contiguous cache k, v [B, Hkv, S, D], cache_seqlens, and the same cache paged: kp, vp, table."""
    q, k, v, seqlens = contiguous_inputs(batch, context, seed)
    return (q, k, v, seqlens, *paged_pool(k, v, PAGE_SIZE, seed))


def providers(q, k, v, seqlens, kp, vp, table, flex, rows):
    """{(provider, cache): function of no arguments returning O [B, Hq, 1, D]} for this shape's rows;
    a provider that cannot run here maps to the reason (a string)."""
    import torch.nn.functional as F

    import gqa_flash

    context = k.shape[2]
    table_fns = {
        ("sdpa_default", "contiguous"): lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
        ("flash_decode", "contiguous"): lambda: gqa_flash.flash_decode(q, k, v, seqlens, max_seqlen=context),
        ("flash_decode", "paged"): lambda: gqa_flash.flash_decode(q, kp, vp, seqlens, block_table=table,
                                                                  max_seqlen=context),
    }
    if isinstance(flex, str):
        table_fns[("flex", "contiguous")] = flex
    else:
        table_fns[("flex", "contiguous")] = lambda: flex(q, k, v, enable_gqa=True)
    try:
        gqa_flash.flash_attention_forward(q, k, v, causal=False)
        table_fns[("course_prefill", "contiguous")] = "unsupported: the API accepted q of one token"
    except (ValueError, TypeError) as e:
        table_fns[("course_prefill", "contiguous")] = f"unsupported: {e}"
    if ("course_prefill_padded", "contiguous") in rows:
        q_pad = torch.zeros(q.shape[0], Q_HEADS, context, HEAD_DIM, device=DEVICE, dtype=q.dtype)
        q_pad[:, :, -NEW_TOKENS:] = q  # the new token is the last position: causal, it sees the whole cache
        table_fns[("course_prefill_padded", "contiguous")] = (
            lambda: gqa_flash.flash_attention_forward(q_pad, k, v, causal=True)[:, :, -NEW_TOKENS:])
    return {row: table_fns[row] for row in rows}


TIMINGS = ("cuda_graph", "plain")
HOST_CALLS = 50


def time_once(fn, timing, rep_ms):
    """One timing of ``fn`` in ms, a median: captured in a CUDA graph and replayed, or called plainly.
    A call that cannot be captured raises (its row says so; it is not timed another way)."""
    from triton.testing import do_bench, do_bench_cudagraph

    if timing == "cuda_graph":
        return do_bench_cudagraph(fn, rep=rep_ms, return_mode="median")
    return do_bench(fn, warmup=5, rep=rep_ms, return_mode="median")


def host_us(fn, calls=HOST_CALLS) -> float:
    """Microseconds of the host's time per call: ``calls`` calls queued back to back, no waiting between."""
    fn()
    _sync()
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    spent = time.perf_counter() - began
    _sync()
    return spent / calls * 1e6


def _median(times):
    return sorted(times)[len(times) // 2] if times else math.nan


def measure_shape(batch, context, rows, flex, ceiling, rounds, rep_ms, log=print) -> list[dict]:
    """Check every provider against SDPA, then time them interleaved, ``rounds`` times, with and without
    CUDA graphs; one dict per (row, timing)."""
    q, k, v, seqlens, kp, vp, table = inputs(batch, context)
    fns = providers(q, k, v, seqlens, kp, vp, table, flex, rows)
    expected = fns[("sdpa_default", "contiguous")]().float()
    checked = {row: dict(status="ok", note="", err=math.nan, host=math.nan) for row in rows}
    for row, fn in fns.items():
        if isinstance(fn, str):
            checked[row]["status"] = fn
            continue
        try:
            began = time.time()
            got = fn()
            _sync()
            if row[0] == "flex":
                checked[row]["note"] = f"first call {time.time() - began:.1f} s (compiled for this shape)"
            err = (got.float() - expected).abs().max().item()
            checked[row]["err"] = err
            if not err <= MAX_ABS_ERR:  # NaN fails too
                checked[row]["status"] = "wrong result"
            else:
                checked[row]["host"] = host_us(fn)
        except torch.OutOfMemoryError:
            checked[row]["status"] = "out of memory"
        except Exception as e:  # a stub, a compile failure: reported, and the sweep goes on
            checked[row]["status"] = f"error: {type(e).__name__}: {str(e)[:120]}"
    out = {(row, timing): dict(checked[row], times=[]) for row in rows for timing in TIMINGS}
    timed = [key for key in out if out[key]["status"] == "ok"]
    for _ in range(rounds):
        for key in list(timed):
            try:
                ms = time_once(fns[key[0]], key[1], rep_ms)
            except Exception as e:  # this row says so; the others are still timed
                _sync()
                what = "capture in a CUDA graph failed" if key[1] == "cuda_graph" else "error while timing"
                out[key].update(status=f"{what}: {type(e).__name__}: {str(e)[:120]}", times=[])
                timed.remove(key)
                continue
            out[key]["times"].append(ms)
    result = []
    for ((name, cache), timing), o in out.items():
        base_ms = _median(out[(("sdpa_default", "contiguous"), timing)]["times"])
        ms = _median(o["times"])
        tbps = kv_bytes(batch, context) / ms * 1e-9 if o["times"] else math.nan
        result.append(dict(
            provider=name, cache=cache, batch=batch, context=context, q_heads=Q_HEADS, kv_heads=KV_HEADS,
            head_dim=HEAD_DIM, new_tokens=NEW_TOKENS, dtype=_name(DTYPE),
            page_size=PAGE_SIZE if cache == "paged" else "",
            num_splits=splits_chosen(q, *((kp, vp, table) if cache == "paged" else (k, v, None)), context)
            if name == "flash_decode" else "",
            api="public" if name == "flash_decode" else "", timing=timing, ms=round(ms, 5),
            host_us=round(o["host"], 1), kv_bytes=kv_bytes(batch, context),
            tbps=round(tbps, 3), ratio_to_sdpa_default=round(base_ms / ms, 3),
            ratio_to_read_ceiling=round(tbps / ceiling[0], 3), read_ceiling_tbps=round(ceiling[0], 3),
            copy_tbps=round(ceiling[1], 3), max_abs_err_vs_sdpa=f"{o['err']:.2e}", status=o["status"],
            note=o["note"]))
    del q, k, v, kp, vp, fns, expected
    _empty_cache()
    return result


def skipped_rows(batch, context, rows, why, ceiling) -> list[dict]:
    return [dict(provider=name, cache=cache, batch=batch, context=context, q_heads=Q_HEADS, kv_heads=KV_HEADS,
                 head_dim=HEAD_DIM, new_tokens=NEW_TOKENS, dtype=_name(DTYPE), kv_bytes=kv_bytes(batch, context),
                 timing=timing, read_ceiling_tbps=round(ceiling[0], 3), copy_tbps=round(ceiling[1], 3),
                 status=f"skipped: {why}")
            for name, cache in rows for timing in TIMINGS]


def run(out_path: Path, budget=None, batches=BATCHES, contexts=CONTEXTS, names=PROVIDERS, rounds=5, rep_ms=20,
        log=print) -> list[dict]:
    start = time.time()
    env = environment()
    ceiling = ceilings(log)
    flex, why_not = _flex() if "flex" in names else (None, None)
    flex_failures = 0
    rows_out, last_shape_s = [], 0.0
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, restval="")
        writer.writeheader()
        for batch, context, rows in plan(batches, contexts, names):
            began = time.time()
            need = bytes_to_allocate(batch, context, ("course_prefill_padded", "contiguous") in rows)
            if budget is not None and began - start + max(1.5 * last_shape_s, 10) > budget:
                shape_rows = skipped_rows(batch, context, rows, f"the time budget of {budget:.0f} s was spent", ceiling)
            elif need > (free := _free_bytes()):
                shape_rows = skipped_rows(batch, context, rows, f"needs about {need / 2**30:.0f} GiB, "
                                          f"{free / 2**30:.0f} GiB free", ceiling)
            else:
                flex_arg = why_not or flex
                if flex_failures >= 2:
                    flex_arg = "not tried: it failed on two shapes before"
                try:
                    shape_rows = measure_shape(batch, context, rows, flex_arg, ceiling, rounds, rep_ms, log)
                except torch.OutOfMemoryError:
                    _empty_cache()
                    shape_rows = skipped_rows(batch, context, rows, "out of memory", ceiling)
                except Exception as e:  # building the inputs or SDPA itself failed: say so, go on
                    _empty_cache()
                    shape_rows = skipped_rows(batch, context, rows, f"{type(e).__name__}: {str(e)[:120]}", ceiling)
                flex_row = next((r for r in shape_rows if r["provider"] == "flex"), None)
                if flex_row and flex_row["status"].startswith("error"):
                    flex_failures += 1
                last_shape_s = time.time() - began
            for row in shape_rows:
                row.update(env)
                writer.writerow(row)
                log(f"B={batch:3d} ctx={context:6d} {row['provider']:22s} {row['cache']:10s} {row['timing']:10s} "
                    f"{row.get('tbps', math.nan):6.2f} TB/s x{row.get('ratio_to_sdpa_default', math.nan):.3f} "
                    f"host {row.get('host_us', math.nan)} us err {row.get('max_abs_err_vs_sdpa', '')} "
                    f"{row['status']}")
            f.flush()  # an interrupted sweep keeps what it measured
            rows_out += shape_rows
    log(f"done in {time.time() - start:.0f} s: {out_path}")
    return rows_out


def _positive(kind):
    def parse(text):
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return parse


def positive_ints(text):
    values = tuple(int(x) for x in text.split(",") if x.strip())
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return values


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m gqa_flash.course.lab.bench_decode",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the CSV to write")
    parser.add_argument("--budget", type=_positive(float), default=None,
                        help="seconds: start no shape that would end past this (its rows say skipped)")
    parser.add_argument("--batches", type=positive_ints, default=BATCHES, help="comma-separated (default 1,8,64)")
    parser.add_argument("--contexts", type=positive_ints, default=CONTEXTS,
                        help=f"comma-separated multiples of {PAGE_SIZE} (default 1024,8192,32768,131072)")
    parser.add_argument("--providers", default=",".join(PROVIDERS), help="comma-separated: " + ",".join(PROVIDERS))
    parser.add_argument("--rounds", type=_positive(int), default=5, help="timings of each provider, interleaved")
    parser.add_argument("--page-size", type=_positive(int), default=PAGE_SIZE,
                        help=f"positions a page of the paged cache holds (default {PAGE_SIZE}, vLLM's; "
                             "FlashAttention's paged cache takes multiples of 256)")
    args = parser.parse_args(argv)
    if any(c % args.page_size for c in args.contexts):
        parser.error(f"--contexts: every context must be a multiple of the page size, {args.page_size}")
    args.providers = tuple(p for p in args.providers.split(",") if p)
    unknown = sorted(set(args.providers) - set(PROVIDERS))
    if unknown:
        parser.error(f"--providers: no provider {', '.join(unknown)}; known: {', '.join(PROVIDERS)}")
    if "sdpa_default" not in args.providers:
        args.providers = ("sdpa_default",) + args.providers  # the reference of every check and ratio
    return args


def main(argv=None) -> int:
    global PAGE_SIZE
    args = parse_args(argv)
    PAGE_SIZE = args.page_size  # read by inputs() and by every row's page_size
    if runtime.DEVICE.type != "cuda":
        print("gqa_flash.course.lab.bench_decode: refused: timings need a CUDA GPU, and this machine runs kernels in "
              "Triton's interpreter. notebooks/data holds the H200's measurements (topic decode_h200).",
              file=sys.stderr)
        return 1
    run(args.out, args.budget, args.batches, args.contexts, args.providers, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
