"""Benchmark the course's kernels against PyTorch's attention: ``python -m gqa_flash.course.lab.bench``.

On a GPU it times every provider on the same inputs, in one run, and writes a
CSV whose every row records the date, GPU, driver, torch and triton versions,
and which implementation the switch pointed to:

    course_graded   the graded forward kernel, autotuned, from the implementation
                    switch (GQA_FLASH_IMPL, gqa_flash/course/impl.py): gqa_flash/forward.py
                    by default, the completed file where the switch says so
    course_fast     the course's fastest kernel (gqa_flash/fast/forward.py)
    sdpa_default    F.scaled_dot_product_attention, PyTorch's own choice of backend
    sdpa_flash      SDPA forced to its FlashAttention-2 backend
    sdpa_cudnn      SDPA forced to its cuDNN backend
    flex            FlexAttention (torch.compile'd), when it is there
    naive           attention with the whole N x N matrix (the switch's naive.py),
                    until it runs out of memory

Each provider's output is checked against SDPA's before it is timed (a wrong
kernel is reported, not timed; a stub that raises is reported too). That first
call also runs the autotuners; the ``tiles`` column says what each course
kernel's autotuner picked. Then the providers are timed in interleaved rounds
(``--rounds``, 5 by default): each round times every provider once
(``triton.testing.do_bench``, a median over 40 ms), starting one provider
further along each round, so that a drift of the machine within a shape reaches
every provider alike. ``ms_median`` is the median over the rounds and
``rounds_ms`` lists them. FLOPs are counted as
4 * B * Hq * N^2 * D (two matrix products of 2 * N^2 * D each per head),
halved when causal. Every launch processes 16k tokens (B = 16384 // N), so
every case does comparable work and short sequences still fill the GPU.

``--backward`` times the backward pass instead (the gradients of Q, K and V
given dO, after one forward): the course's backward kernels through
``gqa_flash.flash_attention`` (``course_graded``: the switch's backward.py;
``course_fast``: gqa_flash/fast/backward.py) against SDPA's backends, with
FLOPs counted as 2.5 times the forward's. ``--memory`` sweeps the peak memory
of one forward call from 1k to 128k tokens; ``--ceilings`` measures the
roofline's two ceilings. bench/forward_sweep.sh and bench/backward_sweep.sh
run these on a GPU machine; bench/RESULTS.md says what the H200 gave.

On a machine with no GPU it says that timings need one and exits cleanly.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import math
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from gqa_flash.course import impl, runtime
from gqa_flash.fast import forward as fast_forward

ENVIRONMENT = ["date", "gpu", "driver", "torch", "triton", "impl"]  # environment()'s keys, on every row
FIELDS = [
    "provider", "dtype", "causal", "head_dim", "seq_len", "batch", "q_heads", "kv_heads",
    "ms_median", "tflops", "ratio_to_sdpa_default", "peak_mem_mib", "rel_err_vs_sdpa",
    "status", "flops_counted_as", "tiles", "rounds_ms", "host_launch_ms", *ENVIRONMENT,
]
PROVIDERS = ["course_graded", "course_fast", "sdpa_default", "sdpa_flash", "sdpa_cudnn", "flex", "naive"]
MEMORY_FIELDS = ["provider", "seq_len", "batch", "q_heads", "kv_heads", "head_dim", "peak_mem_mib", "status",
                 *ENVIRONMENT]
TOKENS_PER_LAUNCH = 16384
ROUNDS, REP_MS = 5, 40  # interleaved timing rounds; each a do_bench median over REP_MS milliseconds
HOST_CALLS = 20  # calls queued without waiting, to time the host's launch of one


@dataclass(frozen=True)
class Case:
    dtype: torch.dtype
    causal: bool
    head_dim: int
    seq_len: int
    q_heads: int = 32
    kv_heads: int = 8

    @property
    def batch(self) -> int:
        return max(1, TOKENS_PER_LAUNCH // self.seq_len)

    @property
    def flops(self) -> float:
        f = 4.0 * self.batch * self.q_heads * self.seq_len**2 * self.head_dim
        return f / 2 if self.causal else f


def sweep(kind: str) -> list[Case]:
    """``main``: bf16, causal, GQA 32:8, head_dim 64 and 128, N = 1k..16k.
    ``extra``: MHA, MQA, non-causal, fp16, head_dim 96 and 256, at N = 4k and 16k."""
    bf16 = torch.bfloat16
    main = [Case(bf16, True, d, n) for d in (64, 128) for n in (1024, 2048, 4096, 8192, 16384)]
    if kind == "main":
        return main
    extra = []
    for n in (4096, 16384):
        extra += [
            Case(bf16, True, 128, n, 32, 32),  # MHA
            Case(bf16, True, 128, n, 32, 1),  # MQA
            Case(bf16, False, 128, n),  # non-causal
            Case(torch.float16, True, 128, n),  # fp16
            Case(bf16, True, 96, n),
            Case(bf16, True, 256, n),
        ]
    return main + extra if kind == "all" else extra


def sdpa(backend=None):
    """SDPA with PyTorch's choice of backend (None) or pinned to one: function(q, k, v, causal)."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    def run(q, k, v, causal):
        if backend is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    return run


def providers():
    """name -> function(q, k, v, causal) for every provider available here."""
    from torch.nn.attention import SDPBackend

    graded, naive = impl.load("forward"), impl.load("naive")  # whatever GQA_FLASH_IMPL points to
    table = {
        "course_graded": lambda q, k, v, causal: graded.flash_attention_forward(q, k, v, causal=causal),
        "course_fast": lambda q, k, v, causal: fast_forward.fast_attention_forward(q, k, v, causal=causal),
        "sdpa_default": sdpa(),
        "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION),
        "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
        "naive": lambda q, k, v, causal: naive.naive_attention(q, k, v, causal=causal),
    }
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        import torch._dynamo

        # One compiled kernel per shape (dynamic=False); the sweep has more shapes than the
        # default limit of 8, past which torch falls back to an unfused, O(N^2) implementation.
        limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
        setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 64))
        compiled = torch.compile(flex_attention, dynamic=False)
        masks = {}

        def flex(q, k, v, causal):
            n = q.shape[2]
            mask = None
            if causal:
                if n not in masks:
                    masks[n] = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, n, n, device=q.device)
                mask = masks[n]
            return compiled(q, k, v, block_mask=mask, enable_gqa=True)

        table["flex"] = flex
    except Exception:  # an older torch, or no compiler toolchain
        pass
    return table


def backward_providers():
    """name -> function(q, k, v, causal) returning a function that runs one backward pass."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import gqa_flash

    def prepared(forward):
        def prepare(q, k, v, causal):
            q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
            o = forward(q, k, v, causal)
            gen = torch.Generator(device=o.device).manual_seed(1)  # the same dO for every provider
            do = torch.randn(o.shape, dtype=o.dtype, device=o.device, generator=gen)
            return lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)

        return prepare

    def sdpa_backend_pinned(backend):
        def prepare(q, k, v, causal):
            run = prepared(sdpa(backend))(q, k, v, causal)

            def pinned():
                with sdpa_kernel(backend):
                    return run()

            return pinned

        return prepare

    return {
        "sdpa_default": prepared(sdpa()),  # first: the reference for the others' errors and ratios
        "course_graded": prepared(lambda q, k, v, causal: gqa_flash.flash_attention(q, k, v, causal=causal)),
        "course_fast": prepared(lambda q, k, v, causal: gqa_flash.flash_attention(q, k, v, causal=causal, fast=True)),
        "sdpa_flash": sdpa_backend_pinned(SDPBackend.FLASH_ATTENTION),
        "sdpa_cudnn": sdpa_backend_pinned(SDPBackend.CUDNN_ATTENTION),
    }


def run_backward(cases, out_path: Path, rounds=ROUNDS, log=print) -> list[dict]:
    """Time the backward pass: the gradient call alone, every provider checked, then interleaved rounds."""
    table, env, rows = backward_providers(), environment(), []
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for case in cases:
            q, k, v = inputs(case)
            ref, steps, checked = None, {}, {}
            for name, prepare in table.items():  # check first; the first call also runs the autotuners
                try:
                    step = prepare(q, k, v, case.causal)
                    grads = [g.float() for g in step()]
                    if name == "sdpa_default":  # first in the table: everyone's reference
                        ref = grads
                    if ref is None:  # SDPA failed: nothing to check against, so nothing is timed
                        err, status = math.nan, "no reference (sdpa_default failed)"
                    else:
                        err = max(((g - r).norm() / r.norm()).item() for g, r in zip(grads, ref))
                        status = "ok" if err < 5e-2 else "wrong result"
                    del grads
                    if status == "ok":
                        steps[name] = step
                except torch.OutOfMemoryError:
                    err, status = math.nan, "out of memory"
                except Exception as e:  # reported, and the sweep goes on
                    err, status = math.nan, f"error: {type(e).__name__}: {str(e)[:80]}"
                checked[name] = (err, status, picked_tiles(name, backward=True) if status == "ok" else "")
            times, errors = interleaved_times(steps, rounds)
            hosts, host_errors = host_times(steps, skip=errors)
            errors = {**host_errors, **errors}
            base_ms = median(times.get("sdpa_default", []))
            for name, (err, status, tiles) in checked.items():
                ms, status = median(times.get(name, [])), errors.get(name, status)
                row = dict(
                    provider=name, dtype=str(case.dtype).replace("torch.", ""), causal=case.causal,
                    head_dim=case.head_dim, seq_len=case.seq_len, batch=case.batch, q_heads=case.q_heads,
                    kv_heads=case.kv_heads, ms_median=round(ms, 4), tflops=round(2.5 * case.flops / ms * 1e-9, 1),
                    ratio_to_sdpa_default=round(base_ms / ms, 3), peak_mem_mib=math.nan,
                    rel_err_vs_sdpa=f"{err:.2e}", status=status,
                    flops_counted_as="2.5 * 4*B*Hq*N^2*D" + (" / 2 (causal)" if case.causal else ""),
                    tiles=tiles, rounds_ms=";".join(f"{t:.4f}" for t in times.get(name, [])),
                    host_launch_ms=round(hosts.get(name, math.nan), 4), **env,
                )
                writer.writerow(row)
                rows.append(row)
                log(f"backward D={case.head_dim:3d} N={case.seq_len:5d} {name:16s} {row['tflops']:7.1f} TFLOP/s "
                    f"x{row['ratio_to_sdpa_default']:.3f} err {err:.1e} {status} host {row['host_launch_ms']:.3f} ms "
                    f"{tiles}")
            f.flush()  # an interrupted sweep keeps what it measured
            del q, k, v, ref, steps
    return rows


def do_bench_ms(fn, rep_ms=REP_MS) -> float:
    """One timing: the median of ``triton.testing.do_bench`` over about ``rep_ms`` milliseconds."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=10, rep=rep_ms, return_mode="median")


def host_launch_ms(fn, calls=HOST_CALLS) -> float:
    """The host's time to launch one call: the mean over ``calls`` calls queued without waiting.

    do_bench clears the L2 before each call, which is all the head start the host gets: a call whose
    launch takes nearly as long as its kernels can be timed as the host's, not the GPU's (the fast
    backward at head_dim 64, 1k, bench/RESULTS.md). This column says how near a row came."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed * 1e3 / calls


def host_times(steps: dict, skip=()) -> tuple[dict, dict]:
    """(name -> host_launch_ms, name -> error text) for every step not in ``skip`` (those that raised
    while timed); a step that raises here gets NaN and its error, which its row's status then says."""
    out, errors = {}, {}
    for name, step in steps.items():
        if name in skip:
            continue
        try:
            out[name] = host_launch_ms(step)
        except Exception as e:
            out[name] = math.nan
            errors[name] = f"error while timing the host: {type(e).__name__}: {str(e)[:80]}"
    return out, errors


def interleaved_times(steps: dict, rounds=ROUNDS, time_one=None) -> tuple[dict, dict]:
    """Time every function of ``steps`` (name -> function()) ``rounds`` times, interleaved.

    Each round times every step once, starting one step further along than the round before, so that
    the machine's drift (clocks, temperature, a neighbour on the node) reaches every provider alike
    instead of whichever is timed last. Returns (name -> list of ms, name -> error text for a step that
    raised while timed; it is not timed again). ``time_one(function) -> ms``: ``do_bench_ms`` unless given."""
    time_one = time_one or do_bench_ms
    names = list(steps)
    times, errors = {name: [] for name in names}, {}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)] if names else []
        for name in order:
            if name in errors:
                continue
            try:
                times[name].append(time_one(steps[name]))
            except Exception as e:  # this provider's row says so; the others are still timed
                errors[name] = f"error while timing: {type(e).__name__}: {str(e)[:80]}"
                times[name] = []
    return times, errors


def checked_interleaved_times(steps: dict, error, tol, rounds=ROUNDS, time_one=None, say=print):
    """Run every step of ``steps`` once and measure ``error(output)`` (which also compiles and autotunes it),
    then time those under ``tol`` with ``interleaved_times``. A step that raises (out of shared memory, a
    compiler crash) is reported through ``say`` and not timed. Returns (times, errors while timed,
    name -> error of its output, NaN where it raised)."""
    errors = {}
    for name, fn in steps.items():
        try:
            errors[name] = error(fn())
        except Exception as e:
            say(f"{name}: {type(e).__name__}: {str(e)[:300]}")
            errors[name] = math.nan
    times, failed = interleaved_times({name: fn for name, fn in steps.items() if errors[name] < tol}, rounds, time_one)
    return times, failed, errors


def median(values) -> float:
    return statistics.median(values) if values else math.nan


def tile_text(tuner) -> str:
    """The tile an autotuner picked on its last call, e.g. '128x64 sub2 w4 s2', or '... s3 regs168' with a
    register cap ('' before any call)."""
    config = getattr(tuner, "best_config", None)
    if config is None:
        return ""
    kw = dict(config.kwargs)
    parts = [f"{kw.pop('BLOCK_M', '?')}x{kw.pop('BLOCK_N', '?')}"]
    for key, value in kw.items():
        if isinstance(value, bool):  # FLAT: named when on
            parts += [key.lower()] if value else []
        elif key == "SUBTILES":
            parts.append(f"sub{value}")
        else:
            parts.append(f"{key}={value}")
    cap = [f"regs{config.maxnreg}"] if getattr(config, "maxnreg", None) else []
    return " ".join(parts + [f"w{config.num_warps}", f"s{config.num_stages}"] + cap)


def picked_tiles(provider: str, backward: bool = False) -> str:
    """What the course kernels' autotuners picked for the shape they last ran: read after a call."""
    from gqa_flash.fast import backward as fast_backward

    try:
        if provider == "course_graded" and not backward:
            return tile_text(getattr(impl.load("forward"), "_autotuned_kernel", None))
        if provider == "course_fast" and not backward:
            if fast_forward.last_path["kernel"] == "gluon":
                return "gluon " + " ".join(f"{k}={v}" for k, v in fast_forward.GLUON_CONFIG.items())
            return tile_text(fast_forward.autotuned_kernel)
        if provider == "course_graded":
            tuned = getattr(impl.load("backward"), "_tuned", {})
            return "; ".join(f"{getattr(k, '__name__', '?')} {tile_text(t)}" for k, t in tuned.items())
        if provider == "course_fast":
            return "; ".join(f"{'dkdv ' + name if name != 'dq' else 'dq'} {tile_text(t)}"
                             for name, t in fast_backward.autotuned_kernels.items())
    except Exception as e:  # the tiles are for reading, never a reason to stop a sweep
        return f"? ({type(e).__name__})"
    return ""


def environment() -> dict:
    """The date, the GPU, its driver, torch and triton, and the implementation switch's choice."""
    try:
        driver = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        ).stdout.strip().splitlines()[0]
    except Exception:
        driver = "unknown"
    import triton

    return dict(
        date=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
        gpu=torch.cuda.get_device_name(0),
        driver=driver,
        torch=torch.__version__,
        triton=triton.__version__,
        impl=impl.current(),
    )


def inputs(case: Case, seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(heads):
        return torch.randn(case.batch, heads, case.seq_len, case.head_dim, device="cuda", dtype=case.dtype,
                           generator=gen)

    return rnd(case.q_heads), rnd(case.kv_heads), rnd(case.kv_heads)


def _peak_memory(fn, q, k, v, causal):
    """(output, MiB allocated at the peak of one call). A first, untimed call
    warms the autotuner up, whose trials (and their cache-flush buffer) must
    not count as the kernel's memory."""
    fn(q, k, v, causal)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn(q, k, v, causal)
    torch.cuda.synchronize()
    return out, (torch.cuda.max_memory_allocated() - before) / 2**20


def check(fn, q, k, v, causal, expected):
    """(peak MiB, relative error, status) of one provider's first call on one case."""
    try:
        out, peak = _peak_memory(fn, q, k, v, causal)
        # In the try too: a provider that returns None or the wrong shape is reported, not a crash.
        err = ((out.float() - expected.float()).norm() / expected.float().norm()).item()
        del out
    except torch.OutOfMemoryError:
        return math.nan, math.nan, "out of memory"
    except Exception as e:  # a kernel that does not compile here: reported, and the sweep goes on
        return math.nan, math.nan, f"error: {type(e).__name__}: {str(e)[:80]}"
    if not err < 2e-2:  # NaN fails too
        return peak, err, "wrong result"
    return peak, err, "ok"


def run(cases, names, out_path: Path, rounds=ROUNDS, log=print) -> list[dict]:
    """Time the forward pass of ``names`` on ``cases``: every provider checked, then interleaved rounds."""
    table = providers()
    unknown = [n for n in names if n not in table]
    if unknown:  # a typo, or flex on a torch without it
        log(f"not timed (no such provider here): {', '.join(unknown)}; known: {', '.join(table)}")
    names = ["sdpa_default"] + [n for n in names if n in table and n != "sdpa_default"]  # the reference first
    env = environment()
    rows = []
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        total, done, start = len(cases) * len(names), 0, time.time()
        for case in cases:
            q, k, v = inputs(case)
            expected = table["sdpa_default"](q, k, v, case.causal)
            checked, steps = {}, {}
            for name in names:  # check first; the first call also runs the autotuners
                peak, err, status = check(table[name], q, k, v, case.causal, expected)
                # The picks of this shape only after a call that ran: else an autotuner's last pick is stale.
                checked[name] = (peak, err, status, picked_tiles(name) if status == "ok" else "")
                if status == "ok":
                    steps[name] = lambda fn=table[name], args=(q, k, v, case.causal): fn(*args)
            times, errors = interleaved_times(steps, rounds)
            hosts, host_errors = host_times(steps, skip=errors)
            errors = {**host_errors, **errors}
            base_ms = median(times.get("sdpa_default", []))
            for name, (peak, err, status, tiles) in checked.items():
                ms, status = median(times.get(name, [])), errors.get(name, status)
                row = dict(
                    provider=name, dtype=str(case.dtype).replace("torch.", ""), causal=case.causal,
                    head_dim=case.head_dim, seq_len=case.seq_len, batch=case.batch, q_heads=case.q_heads,
                    kv_heads=case.kv_heads, ms_median=round(ms, 4), tflops=round(case.flops / ms * 1e-9, 1),
                    ratio_to_sdpa_default=round(base_ms / ms, 3),
                    peak_mem_mib=round(peak, 1), rel_err_vs_sdpa=f"{err:.2e}", status=status,
                    flops_counted_as="4*B*Hq*N^2*D" + (" / 2 (causal)" if case.causal else ""),
                    tiles=tiles, rounds_ms=";".join(f"{t:.4f}" for t in times.get(name, [])),
                    host_launch_ms=round(hosts.get(name, math.nan), 4), **env,
                )
                writer.writerow(row)
                rows.append(row)
                done += 1
                log(
                    f"[{done:3d}/{total}] {time.time() - start:6.0f}s  {row['dtype']:8s} "
                    f"{'causal' if case.causal else 'full  '} D={case.head_dim:3d} N={case.seq_len:5d} "
                    f"{case.q_heads}:{case.kv_heads:<2d} {name:14s} {row['tflops']:7.1f} TFLOP/s  "
                    f"x{row['ratio_to_sdpa_default']:.3f}  {status}  host {row['host_launch_ms']:.3f} ms  {tiles}"
                )
            f.flush()  # an interrupted sweep keeps what it measured
            del q, k, v, expected, steps
    return rows


def memory_sweep(out_path: Path, log=print) -> list[dict]:
    """Peak memory of one forward call as N grows: the course kernels (O(N)) against naive (O(N^2))."""
    graded, naive = impl.load("forward"), impl.load("naive")  # whatever GQA_FLASH_IMPL points to
    env, rows = environment(), []
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=MEMORY_FIELDS)
        writer.writeheader()
        for n in [1024 * 2**i for i in range(8)]:  # 1k .. 128k
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(1, h, n, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
                       for h in (32, 8, 8))
            kernels = (
                ("course_graded", graded.flash_attention_forward),
                ("course_fast", fast_forward.fast_attention_forward),
                ("naive", naive.naive_attention),
            )
            for name, fn in kernels:
                try:
                    out, peak = _peak_memory(lambda q, k, v, causal, fn=fn: fn(q, k, v, causal=causal), q, k, v, True)
                    status = "ok"
                    del out
                except torch.OutOfMemoryError:
                    peak, status = math.nan, "out of memory"
                except Exception as e:  # a stub, or a kernel that does not compile here: reported, the sweep goes on
                    peak, status = math.nan, f"error: {type(e).__name__}: {str(e)[:80]}"
                rows.append(dict(provider=name, seq_len=n, batch=1, q_heads=32, kv_heads=8, head_dim=128,
                                 peak_mem_mib=round(peak, 1), status=status, **env))
                writer.writerow(rows[-1])
                f.flush()  # an interrupted sweep keeps what it measured
                log(f"memory N={n:6d} {name:14s} {peak:10.1f} MiB {status}")
            del q, k, v
    return rows


def ceilings(out_path: Path, log=print) -> dict:
    """The roofline's two ceilings on this GPU: a bf16 matrix product's TFLOP/s and a copy's TB/s."""
    from triton.testing import do_bench

    n = 8192
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    matmul_ms = do_bench(lambda: a @ b, warmup=25, rep=200, return_mode="median")
    src = torch.empty(2**30, device="cuda", dtype=torch.uint8)  # 1 GiB, far beyond L2
    dst = torch.empty_like(src)
    copy_ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    row = dict(matmul_bf16_tflops=round(2 * n**3 / matmul_ms * 1e-9, 1),
               copy_tbps=round(2 * src.numel() / copy_ms * 1e-9, 2),  # read + write
               matmul="8192^3 bf16 torch.matmul", copy="1 GiB device-to-device, bytes read + written",
               **environment())
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(row))
        writer.writeheader()
        writer.writerow(row)
    log(f"ceilings: matmul {row['matmul_bf16_tflops']} TFLOP/s, copy {row['copy_tbps']} TB/s")
    return row


def _positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gqa_flash.course.lab.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", choices=["main", "extra", "all", "none"], default="main",
                        help="which cases to time (none: only --memory)")
    parser.add_argument("--providers", default=",".join(PROVIDERS), help="comma-separated provider names")
    parser.add_argument("--out", type=Path, default=Path("bench_forward.csv"), help="the CSV to write")
    parser.add_argument("--memory", type=Path, default=None, help="also sweep peak memory into this CSV")
    parser.add_argument("--backward", action="store_true", help="time the backward pass instead")
    parser.add_argument("--rounds", type=_positive_int, default=ROUNDS,
                        help=f"interleaved timings of every provider a shape (default {ROUNDS})")
    parser.add_argument("--ceilings", type=Path, default=None,
                        help="only measure the roofline's matmul and copy ceilings, into this CSV")
    args = parser.parse_args(argv)
    if runtime.DEVICE.type != "cuda":
        print("gqa_flash.course.lab.bench: timings need a CUDA GPU; this machine runs kernels in Triton's interpreter "
              "(notebooks/data and bench/RESULTS.md hold the H200's measurements). Nothing to do.")
        return 0
    if args.ceilings:
        ceilings(args.ceilings)
        return 0
    if args.backward:
        cases = [Case(torch.bfloat16, True, d, n) for d in (64, 128) for n in (1024, 4096, 16384)]
        run_backward(cases, args.out, args.rounds)
        return 0
    if args.sweep != "none":
        run(sweep(args.sweep), args.providers.split(","), args.out, args.rounds)
    if args.memory:
        memory_sweep(args.memory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
