"""Device exploration (developers): the Gluon forward for Hopper (gqa_flash/fast/hopper_forward.py).

    python bench/explore_hopper.py OUT.csv [check] [time] [--rounds 5]

check: the Gluon kernel against a float64 reference over a shape matrix (GQA ratios with an even
and an odd group, MHA, ragged lengths, head dims 64/80/96/128, fp16/bf16, causal or not, strided
inputs, K and V differing), beside SDPA's error on the same inputs. time: bf16, GQA 32:8, 16k tokens
a launch, head_dim 64 and 128, N 1k-16k, causal: SDPA's default, the fast Triton kernel (autotuned)
and the Gluon kernel's
variants, in interleaved rounds (medians), ratios to SDPA within the run.
"""
import csv
import sys

import torch

from gqa_flash.fast import forward as fast
from gqa_flash.fast import hopper_forward as hopper
from gqa_flash.course.lab import bench
from gqa_flash.reference import reference_attention


def sdpa(q, k, v, causal):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


VARIANTS = {"gluon": None, "gluon_n64_pp": {"BLOCK_N": 64, "K_STAGES": 3, "V_STAGES": 3, "PINGPONG": True},
            "gluon_pp_one_tile": {"PINGPONG": True, "PERSISTENT": False}}

TIMED = {  # the Gluon variants timed beside SDPA and the fast Triton kernel
    "gluon": None,  # config_for: 128-key tiles, K in 3 slots, V in 2 (3 at head_dim 64)
    "gluon_n128_k2v2": {"BLOCK_N": 128, "K_STAGES": 2, "V_STAGES": 2},
    "gluon_n64": {"BLOCK_N": 64, "K_STAGES": 3, "V_STAGES": 3},
    "gluon_n64_k4v4": {"BLOCK_N": 64, "K_STAGES": 4, "V_STAGES": 4},
    "gluon_n64_k4v2": {"BLOCK_N": 64, "K_STAGES": 4, "V_STAGES": 2},
}

CHECKS = [  # batch, hq, hkv, n, d, dtype, causal, layout
    (2, 8, 2, 1024, 128, torch.bfloat16, True, "plain"),
    (2, 8, 2, 1000, 128, torch.bfloat16, True, "plain"),
    (1, 4, 4, 777, 128, torch.float16, True, "plain"),
    (1, 6, 2, 300, 64, torch.bfloat16, True, "plain"),
    (2, 4, 1, 1, 64, torch.bfloat16, True, "plain"),
    (1, 4, 2, 65, 64, torch.float16, True, "plain"),
    (1, 8, 2, 513, 96, torch.bfloat16, True, "plain"),
    (1, 8, 2, 200, 80, torch.float16, False, "plain"),
    (1, 8, 2, 1024, 128, torch.bfloat16, False, "plain"),
    (1, 4, 2, 333, 128, torch.bfloat16, False, "plain"),
    (2, 8, 2, 640, 128, torch.bfloat16, True, "bnhd"),
    (1, 8, 8, 384, 64, torch.float16, True, "bnhd"),
    (1, 32, 8, 4096, 128, torch.bfloat16, True, "plain"),
    (1, 32, 8, 4096, 64, torch.bfloat16, True, "plain"),
]


def make(b, hq, hkv, n, d, dtype, layout, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def one(h, scale=1.0):
        if layout == "bnhd":  # [B, N, H, D] memory seen as [B, H, N, D]
            return (torch.randn(b, n, h, d, device="cuda", dtype=dtype, generator=g) * scale).transpose(1, 2)
        return torch.randn(b, h, n, d, device="cuda", dtype=dtype, generator=g) * scale

    return one(hq), one(hkv, 2.0), one(hkv, 0.5)


def check(writer, env, variants=None, cases=None):
    ok = True
    for i, (b, hq, hkv, n, d, dtype, causal, layout) in enumerate(cases or CHECKS):
        q, k, v = make(b, hq, hkv, n, d, dtype, layout, 100 + i)
        ref, ref_lse = reference_attention(q, k, v, causal=causal)  # float64, on the CPU
        base = (sdpa(q, k, v, causal).cpu().double() - ref).abs().max().item()
        for name, config in (variants or VARIANTS).items():
            o, lse = hopper.attention(q, k, v, causal, config=config)
            err = (o.cpu().double() - ref).abs().max().item()
            lse_err = (lse.cpu().double() - ref_lse).abs().max().item()
            good = err <= max(2 * base, 4e-3) and lse_err < 1e-3
            ok &= good
            row = dict(part="check", batch=b, q_heads=hq, kv_heads=hkv, seq_len=n, head_dim=d, dtype=str(dtype)[6:],
                       causal=causal, layout=layout, provider=name, max_err=f"{err:.3g}", sdpa_err=f"{base:.3g}",
                       lse_err=f"{lse_err:.3g}", verdict="ok" if good else "WRONG", **env)
            writer.writerow(row)
            print(row, flush=True)
    return ok


def time_main(writer, env, rounds, head_dims=(64, 128), timed=None):
    timed = TIMED if timed is None else timed
    for d in head_dims:
        for n in (1024, 2048, 4096, 8192, 16384):
            case = bench.Case(head_dim=d, seq_len=n, causal=True, dtype=torch.bfloat16)
            q, k, v = bench.inputs(case)
            steps = {"sdpa_default": lambda: sdpa(q, k, v, True),
                     "course_fast": lambda: fast.fast_attention_forward(q, k, v, True)}
            for name, config in timed.items():
                steps[name] = lambda config=config: hopper.attention(q, k, v, True, config=config)
            ref = steps["sdpa_default"]()
            errs = {}
            for name, fn in steps.items():
                out = fn()
                out = out[0] if isinstance(out, tuple) else out
                errs[name] = (out.float() - ref.float()).abs().max().item()
            times, failed = bench.interleaved_times(steps, rounds)
            base = bench.median(times["sdpa_default"])
            for name in steps:
                ms = bench.median(times[name])
                row = dict(part="time", batch=case.batch, q_heads=32, kv_heads=8, seq_len=n, head_dim=d,
                           dtype="bfloat16", causal=True, layout="plain", provider=name, ms=f"{ms:.4f}",
                           tflops=f"{case.flops / ms / 1e9:.1f}", ratio_to_sdpa_default=f"{base / ms:.3f}",
                           rounds_ms=" ".join(f"{t:.4f}" for t in times[name]), max_err=f"{errs[name]:.3g}",
                           tiles=bench.picked_tiles(name) if name == "course_fast" else "", **env)
                writer.writerow(row)
                print(row, flush=True)


if __name__ == "__main__":
    out = sys.argv[1]
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 5
    words = [a for i, a in enumerate(sys.argv[2:], 2) if sys.argv[i - 1] != "--rounds"]  # not the value of --rounds
    parts = [a for a in words if not a.startswith("--")] or ["check", "time"]
    # --route-only: the routed config alone, checked on the shapes below 4k, then the public function at head_dim
    # 128 beside SDPA (a short run on a card not yet measured)
    route = "--route-only" in sys.argv
    env = bench.environment()
    fields = ["part", "batch", "q_heads", "kv_heads", "seq_len", "head_dim", "dtype", "causal", "layout", "provider",
              "ms", "tflops", "ratio_to_sdpa_default", "rounds_ms", "max_err", "sdpa_err", "lse_err", "verdict",
              "tiles", *env]
    with open(out, "w", newline="", buffering=1) as f:  # line-buffered: a run cut short keeps its rows
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        if "check" in parts:
            check(writer, env, {"routed": fast.GLUON_CONFIG} if route else None,
                  [c for c in CHECKS if c[3] < 4096] if route else None)
        f.flush()
        if "time" in parts:  # timed even after a wrong check: its rows say so
            # --route-only times the routed config beside the public function too: on a card the route does not
            # name yet (GLUON_CARDS), the public function runs the Triton kernel, and this row says what the
            # Gluon kernel would give there
            time_main(writer, env, rounds, (128,) if route else (64, 128),
                      {"gluon_routed": fast.GLUON_CONFIG} if route else None)
