"""Tokens per second of greedy generation with a KV cache, on a GPU; the tokens checked against no cache.

    PYTHONPATH=$PWD python bench/generate_tokens.py OUT.csv
        [--batches 1,8] [--prompts 1024,8192] [--new-tokens 64] [--rounds 5] [--budget 170]

times your decode.py; an instructor adds GQA_FLASH_IMPL=solutions to time the course's.

The model: an untrained TinyGQATransformer (gqa_flash/course/lab/tiny_model.py, seed 0) of dim 1024, 8 query
heads on 2 KV heads of head_dim 128 (GQA groups of 4, as Llama 3 8B's 32 on 8), 4 layers, the tiny
model's vocabulary of 11 tokens. Its weights are about 90 MB in bf16, and its cache holds 1 KiB a token
a layer, so at batch 8 and 8k tokens a step reads more cache than weights. The prompts are random tokens.

For each batch and prompt length, five decode loops (gqa_flash/course/lab/generate.py's CachedGenerator):

    provider      cache       launch
    sdpa          contiguous  eager        indexed K/V write, then F.scaled_dot_product_attention over
                                           the whole capacity with a mask of the valid positions
    sdpa          contiguous  cuda_graph   the same step, captured once and replayed per token
    flash_decode  contiguous  eager        gqa_flash.flash_decode(..., k_new=, v_new=, max_seqlen=capacity)
    flash_decode  contiguous  cuda_graph
    flash_decode  paged       cuda_graph   pages of 16, shuffled in the pool

The capacity is the prompt plus the new tokens. Each loop is prefilled once (SDPA, causal), run once to
warm up (and, for cuda_graph, captured), then timed ``--rounds`` times, the loops interleaved within a
round: each time rewinds the cache to the prompt and writes ``--new-tokens`` tokens, ``new_tokens - 1``
decode steps after the prefill's token, the prefill not timed. Nothing is read back to the host inside a
loop (no end-of-sequence test), so an eager loop runs as fast as its host can launch kernels.
``ms_per_step`` is a median round's time over its steps (a step writes one token of every sequence),
``tokens_per_s`` the batch times the steps over that time, ``ratio_to_sdpa_eager`` the row's tokens/s over
the SDPA eager loop's, ``rounds_ms`` every round's time.

The check, before the timing: the same model in fp32 writes ``--check-tokens`` tokens without a cache
(the whole sequence through SDPA at every step), and again with each of the five loops;
``tokens_equal_no_cache_fp32`` says whether the loop's tokens are those, every one of them, and
``min_top2_margin_fp32`` is the smallest gap between the best and the second-best logit over the reference's
steps (a gap near 1e-5 would explain a flip). The timed loops run in bf16;
``same_tokens_as_sdpa_eager`` compares each loop's timed tokens with the SDPA eager loop's, in bf16,
where rounding may settle a near-tie either way.

Every row carries the date, GPU, driver, torch, triton and the switch (gqa_flash.course.lab.bench.environment()).
``--smoke`` runs the script's logic with a tiny model (dim 32, 4 query heads on 2 KV heads, 2 layers);
on a machine without a GPU, in Triton's interpreter, with the eager loops only and fp32: to check the
script before a GPU run (tests/api/test_generate.py does).
"""

from __future__ import annotations

import argparse
import copy
import csv
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gqa_flash.course import impl, runtime  # noqa: E402  (first: it picks the interpreter before triton loads)
from gqa_flash.course.lab import generate, tiny_model  # noqa: E402
from gqa_flash.course.lab.bench import ENVIRONMENT, environment  # noqa: E402
from gqa_flash.course.lab.bench_decode import positive_ints  # noqa: E402  (comma-separated positive integers)

import triton  # noqa: E402

MODEL = dict(dim=1024, q_heads=8, kv_heads=2, layers=4)
SMOKE_MODEL = dict(dim=32, q_heads=4, kv_heads=2, layers=2)
PAGE_SIZE = 16
LOOPS = tuple(generate.LOOP_NAMES)  # (provider, cache, launch): the five loops of the docstring
FIELDS = ["provider", "cache", "launch", "batch", "prompt", "new_tokens", "model_dim", "q_heads", "kv_heads",
          "head_dim", "layers", "dtype", "page_size", "ms_per_step", "tokens_per_s", "ratio_to_sdpa_eager",
          "rounds_ms", "check_tokens", "tokens_equal_no_cache_fp32", "min_top2_margin_fp32",
          "same_tokens_as_sdpa_eager", "status", *ENVIRONMENT]


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def make_generator(model, batch, capacity, loop):
    attention, cache, launch = loop
    return generate.CachedGenerator(model, batch, capacity, attention, page_size=PAGE_SIZE if cache == "paged"
                                    else None, cuda_graph=launch == "cuda_graph")


def check_tokens(model32, prompt, n, loops) -> tuple[dict, float]:
    """({loop: its fp32 tokens equal the no-cache SDPA generation's, or an error}, the smallest top-2 gap)."""
    ref_tokens, ref_logits = generate.generate_without_cache(model32, prompt, n)
    top2 = ref_logits.float().topk(2, dim=-1).values
    margin = (top2[..., 0] - top2[..., 1]).min().item()
    equal = {}
    for loop in loops:
        try:
            tokens, _ = make_generator(model32, prompt.shape[0], prompt.shape[1] + n, loop).generate(prompt, n)
            equal[loop] = tokens.tolist() == ref_tokens.tolist()
        except Exception as e:  # reported in the row; the other loops go on
            equal[loop] = f"error: {type(e).__name__}: {str(e)[:160]}"
    return equal, margin


def measure(model, prompt, new_tokens, rounds, loops, log) -> dict:
    """{loop: dict(times=[s per round], tokens=last round's tokens, status)}, the loops interleaved."""
    device, batch, n = prompt.device, prompt.shape[0], prompt.shape[1]
    state = {}
    for loop in loops:
        try:
            gen = make_generator(model, batch, n + new_tokens, loop)
            first = gen.prefill(prompt).clone()
            gen.decode(new_tokens - 1)  # warm-up (Triton compiles), and the capture for cuda_graph
            state[loop] = dict(gen=gen, first=first, times=[], tokens=None, status="ok")
        except Exception as e:
            state[loop] = dict(times=[], tokens=None, status=f"error: {type(e).__name__}: {str(e)[:160]}")
            log(f"  {'/'.join(loop)}: {state[loop]['status']}")
    for _ in range(rounds):
        for loop, s in state.items():
            if s["status"] != "ok":
                continue
            try:
                s["gen"].rewind(n, s["first"])
                _sync(device)
                began = time.perf_counter()
                tokens = s["gen"].decode(new_tokens - 1)
                _sync(device)
                s["times"].append(time.perf_counter() - began)
                s["tokens"] = torch.cat([s["first"][:, None], tokens], dim=1).tolist()
            except Exception as e:
                s["status"] = f"error while timing: {type(e).__name__}: {str(e)[:160]}"
    for s in state.values():
        s.pop("gen", None)
    return state


def measure_shape(model32, model, prompt, new_tokens, rounds, n_check, loops, common, log) -> list[dict]:
    """The check in fp32, then the timing of every loop: one row per loop."""
    equal, margin = check_tokens(model32, prompt, n_check, loops)
    state = measure(model, prompt, new_tokens, rounds, loops, log)
    base = state[("sdpa", "contiguous", "eager")]
    base_s = statistics.median(base["times"]) if base["times"] else float("nan")
    steps, batch = new_tokens - 1, prompt.shape[0]
    rows = []
    for (p, c, launch), s in state.items():
        secs = statistics.median(s["times"]) if s["times"] else float("nan")
        rows.append(dict(
            common, provider=p, cache=c, launch=launch, page_size=PAGE_SIZE if c == "paged" else "",
            ms_per_step=round(secs / steps * 1e3, 4), tokens_per_s=round(batch * steps / secs, 1),
            ratio_to_sdpa_eager=round(base_s / secs, 3), rounds_ms=" ".join(f"{t * 1e3:.2f}" for t in s["times"]),
            tokens_equal_no_cache_fp32=equal[(p, c, launch)], min_top2_margin_fp32=f"{margin:.2e}",
            same_tokens_as_sdpa_eager=(s["tokens"] == base["tokens"]) if s["tokens"] else "", status=s["status"]))
    return rows


def run(out, batches, prompts, new_tokens, rounds, n_check, budget, smoke, log=print) -> list[dict]:
    start = time.time()
    device = runtime.DEVICE
    shape = SMOKE_MODEL if smoke else MODEL
    loops = tuple(loop for loop in LOOPS if device.type == "cuda" or loop[2] != "cuda_graph")
    cfg = tiny_model.Config(**shape, max_len=max(prompts) + max(new_tokens, n_check))
    torch.manual_seed(0)
    model32 = tiny_model.TinyGQATransformer(cfg, tiny_model.sdpa_attention).to(device).eval()
    timed_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = copy.deepcopy(model32).to(timed_dtype)
    env = (environment() if device.type == "cuda" else
           dict(date=time.strftime("%Y-%m-%d"), gpu="none (Triton's interpreter)", driver="-", torch=torch.__version__,
                triton=triton.__version__, impl=impl.current()))
    rows = []
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, restval="")
        writer.writeheader()
        for batch in batches:
            for n in prompts:
                common = dict(batch=batch, prompt=n, new_tokens=new_tokens, model_dim=cfg.dim, q_heads=cfg.q_heads,
                              kv_heads=cfg.kv_heads, head_dim=cfg.dim // cfg.q_heads, layers=cfg.layers,
                              dtype=str(timed_dtype).replace("torch.", ""), check_tokens=n_check, **env)
                gen = torch.Generator().manual_seed(batch * 100003 + n)
                prompt = torch.randint(0, tiny_model.VOCAB, (batch, n), generator=gen).to(device)
                skipped = None
                if time.time() - start > budget:
                    skipped = f"skipped: the budget of {budget:.0f} s was spent"
                else:
                    try:
                        shape_rows = measure_shape(model32, model, prompt, new_tokens, rounds, n_check, loops, common,
                                                   log)
                    except Exception as e:  # the reference itself failed (out of memory, say): say so, go on
                        skipped = f"error: {type(e).__name__}: {str(e)[:160]}"
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                if skipped is not None:
                    shape_rows = [dict(common, provider=p, cache=c, launch=launch, status=skipped)
                                  for p, c, launch in loops]
                for row in shape_rows:
                    writer.writerow(row)
                    log(f"B={batch:2d} prompt={n:5d} {row['provider']:12s} {row['cache']:10s} {row['launch']:10s} "
                        f"{row.get('tokens_per_s', ''):>9} tok/s {row.get('ms_per_step', ''):>8} ms/step "
                        f"x{row.get('ratio_to_sdpa_eager', '')} fp32 tokens equal: "
                        f"{row.get('tokens_equal_no_cache_fp32', '')}  {row['status']}")
                f.flush()  # an interrupted run keeps what it measured
                rows += shape_rows
    log(f"done in {time.time() - start:.0f} s: {out}")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the CSV to write")
    parser.add_argument("--batches", type=positive_ints, default=(1, 8))
    parser.add_argument("--prompts", type=positive_ints, default=(1024, 8192), help="prompt lengths, in tokens")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens written in a timed loop (>= 2)")
    parser.add_argument("--check-tokens", type=int, default=8, help="tokens written in fp32 for the check")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=170, help="seconds: no shape starts after this")
    parser.add_argument("--smoke", action="store_true", help="a tiny model, to check the script (any machine)")
    args = parser.parse_args(argv)
    if args.new_tokens < 2 or args.check_tokens < 1 or args.rounds < 1:
        parser.error("--new-tokens must be at least 2, --check-tokens and --rounds at least 1")
    if not args.smoke and runtime.DEVICE.type != "cuda":
        print("bench/generate_tokens.py: refused: timings need a CUDA GPU (--smoke checks the script here)",
              file=sys.stderr)
        return 1
    with torch.no_grad():
        run(args.out, args.batches, args.prompts, args.new_tokens, args.rounds, args.check_tokens, args.budget,
            args.smoke)
    return 0


if __name__ == "__main__":
    sys.exit(main())
