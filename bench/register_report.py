"""Registers and spills of the fast kernels, per tile, from ptxas, on any machine (no GPU needed).

    python bench/register_report.py [--head-dim 128] [--dtype bf16] [--forward]

Compiles ``_fast_backward_kernel`` (two-pass mode: no dQ tile) and ``_fast_dq_kernel`` of
``gqa_flash/fast/backward.py`` (or, with ``--forward``, ``_fast_forward_kernel`` of
``gqa_flash/fast/forward.py``: its autotuner's candidates, and each sub-tiled one again with two
query heads a program, HEADS=2) for sm_90 (an H100 or H200) at each of their autotuner candidates, then
runs the ptxas that ships with Triton (``-v``) on the PTX and prints, per tile: registers a thread,
bytes spilled, and shared memory. A spilling tile keeps part of its state in local memory (L1, then
L2): where dK and dV, fp32 and a row per key, fill the registers, that is the first suspect.

Since 2026-12-04 (night) each compile carries the divisibility hints a launch at the measured shapes
gives (``launch_hints``). Earlier numbers in bench/RESULTS.md were compiled without them; against these
they differ by at most 5 registers a tile (no spill appears or goes for any pick) and at most by 24 bytes of
spill (the register-capped 128 x 64 with two heads at head_dim 128, a tile ``fits()`` excludes there).

The numbers are the local Triton's and ptxas's (the lent H200 runs Triton 3.6; a newer Triton may
allocate differently), and only the compiler's view: a tile that spills can still be the fastest.
"""

import argparse
import os
import subprocess
import tempfile

os.environ["TRITON_INTERPRET"] = "0"  # compile for a GPU even here (gqa_flash would pick the interpreter)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from gqa_flash.fast import backward as fast_backward, forward as fast_forward  # noqa: E402

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
COMMON = {"LSE": "*fp32", "Delta": "*fp32", "sm_scale": "fp32", "SEQ_LEN": "i32", "BATCH": "i32",
          "N_Q_HEADS": "i32", "N_KV_HEADS": "i32"}


def signature(kernel_name, block_m, block_n, head_dim, dtype):
    """The argument types of one kernel at one tile: descriptors carry their block shape."""
    def desc(rows):
        return f"tensordesc<{dtype}[1,1,{rows},{head_dim}]>"

    if kernel_name == "dkdv":
        tensors = {"q_desc": desc(block_m), "k_desc": desc(block_n), "v_desc": desc(block_n), "do_desc": desc(block_m),
                   "dk_desc": desc(block_n), "dv_desc": desc(block_n), "DQ": "*fp32"}
        constexprs = {"DQ_ATOMIC": False}
    else:
        tensors = {"q_desc": desc(block_m), "k_desc": desc(block_n), "v_desc": desc(block_n), "do_desc": desc(block_m),
                   "o_desc": desc(block_m), "dq_desc": desc(block_m)}
        constexprs = {}
    constexprs.update(HEAD_DIM_PAD=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=True, INPUT_PRECISION="tf32")
    return {**tensors, **COMMON, **{name: "constexpr" for name in constexprs}}, constexprs


def forward_signature(config, head_dim, dtype):
    """The fast forward's argument types at one config: q and o descriptors carry a sub-tile's rows."""
    kw = config.kwargs
    rows = kw["BLOCK_M"] // kw["SUBTILES"]

    def desc(r):
        return f"tensordesc<{dtype}[1,1,{r},{head_dim}]>"

    sig = {"q_desc": desc(rows), "k_desc": desc(kw["BLOCK_N"]), "v_desc": desc(kw["BLOCK_N"]), "o_desc": desc(rows),
           "LSE": "*fp32", "stride_lb": "i32", "stride_lh": "i32", "sm_scale": "fp32", "SEQ_LEN": "i32", "BATCH": "i32",
           "N_Q_HEADS": "i32", "N_KV_HEADS": "i32"}
    constexprs = dict(HEAD_DIM_PAD=head_dim, BLOCK_M=kw["BLOCK_M"], BLOCK_N=kw["BLOCK_N"], CAUSAL=True,
                      SUBTILES=kw["SUBTILES"], INPUT_PRECISION="tf32", GROUP_MAJOR=True, HEADS=kw.get("HEADS", 1))
    return {**sig, **{name: "constexpr" for name in constexprs}}, constexprs


def launch_hints(kernel, sig):
    """What a launch tells the compiler about its arguments at the shapes measured (N a multiple of 16,
    tensors from torch): every pointer 16-byte aligned, and every length and stride a multiple of 16.
    Not the head counts and the batch (8 KV heads, one 16k sequence: no multiple of 16; the backward
    does not specialise them at all, ``_HEAD_COUNTS``). Without these hints, loads and stores through
    pointers compile element by element instead of in 16-byte vectors, and their registers differ
    from what runs."""
    return {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name, kind in sig.items()
            if kind.startswith("*") or (kind == "i32" and name not in fast_backward._HEAD_COUNTS)}


def report(kernel_name, config, head_dim, dtype):
    bm, bn = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"]
    flat = config.kwargs.get("FLAT", False)
    if kernel_name == "fwd":
        kernel = fast_forward._fast_forward_kernel
        sig, constexprs = forward_signature(config, head_dim, dtype)
    else:
        kernel = fast_backward._fast_backward_kernel if kernel_name == "dkdv" else fast_backward._fast_dq_kernel
        sig, constexprs = signature(kernel_name, bm, bn, head_dim, dtype)
        if kernel_name == "dkdv":  # one loop for the KV group, or one a query head
            constexprs["FLAT"], sig["FLAT"] = flat, "constexpr"
    compiled = triton.compile(ASTSource(kernel, sig, constexprs, launch_hints(kernel, sig)),
                              target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=config.num_warps, num_stages=config.num_stages,
                                           maxnreg=config.maxnreg))
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "kernel.ptx")
        with open(ptx, "w") as f:
            f.write(compiled.asm["ptx"])
        log = subprocess.run([PTXAS, "-v", "--gpu-name", "sm_90a", ptx, "-o", os.devnull],
                             capture_output=True, text=True).stderr
    lines = [line.split(":", 1)[-1].strip() for line in log.splitlines() if "registers" in line or "spill" in line]
    extra = "".join(f", {k} {v}" for k, v in config.kwargs.items() if k in ("SUBTILES", "HEADS"))
    return (f"{kernel_name:5s} {bm:3d} x {bn:3d}, {config.num_warps} warps, {config.num_stages} stages"
            f"{', flat' if flat else ''}{extra}{f', at most {config.maxnreg} registers' if config.maxnreg else ''}: "
            f"shared {compiled.metadata.shared // 1024} KiB; {'; '.join(lines)}")


def forward_configs():
    """The fast forward's candidates, then each sub-tiled one with two query heads a program."""
    return fast_forward.CONFIGS + fast_forward.head_pair_twins(fast_forward.CONFIGS)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dim", type=int, default=128, help="a power of two (the padded head dim)")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    parser.add_argument("--forward", action="store_true", help="the fast forward's tiles instead of the backward's")
    args = parser.parse_args(argv)
    kernels = [("fwd", forward_configs())] if args.forward else [("dkdv", fast_backward.SEPARATE_CONFIGS),
                                                                   ("dq", fast_backward.DQ_CONFIGS)]
    for kernel_name, configs in kernels:
        for config in configs:
            try:
                print(report(kernel_name, config, args.head_dim, args.dtype), flush=True)
            except Exception as e:  # a tile the compiler refuses at this head dim
                print(f"{kernel_name} {config}: {type(e).__name__}: {str(e)[:200]}", flush=True)


if __name__ == "__main__":
    main()
