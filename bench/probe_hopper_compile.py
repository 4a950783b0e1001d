"""Compile the Gluon forward (gqa_flash/fast/hopper_forward.py) for an H100 on a machine with no GPU.

    python bench/probe_hopper_compile.py [HEAD_DIM] [BLOCK_N] [K_STAGES] [V_STAGES] [--out DIR]

Run it with a Python whose Triton is the devices' (3.6), torch importable beside it, e.g.
``python -m venv /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0 numpy``, then
``PYTHONPATH=/tmp/t36/lib/python3.11/site-packages:.venv/lib/python3.11/site-packages /tmp/t36/bin/python
bench/probe_hopper_compile.py 128``. Prints the shared memory, the registers each
partition asks for (``setmaxnreg`` in the PTX) and ptxas's report (registers, spills), and writes
the TTGIR and PTX to DIR (default /tmp/hopper_forward). Triton compiles for
``GPUTarget("cuda", 90, 32)`` from a ``GluonASTSource``: no driver is needed, so a layout error, a
spill or a register split that asks more than an SM's 65,536 registers (a consumer's
``setmaxnreg.inc`` would then wait forever) shows up before any device time is spent.
"""
import collections
import os
import re
import subprocess
import sys
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gqa_flash.fast import hopper_forward as hf  # noqa: E402

NAMES = ["q_desc", "k_desc", "v_desc", "o_desc", "LSE", "stride_lb", "stride_lh", "sm_scale", "SEQ_LEN", "BATCH",
         "N_Q_HEADS", "N_KV_HEADS", "n_tiles"]


def compile_kernel(head_dim=128, block_n=128, k_stages=3, v_stages=2, causal=True, pair_heads=True):
    q = torch.zeros(1, 4, 1024, head_dim, dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 1024, head_dim, dtype=torch.bfloat16)
    descs = hf.descriptors(q, k, k, q, head_dim, block_n)
    signature = {name: mangle_type(d) for name, d in zip(NAMES[:4], descs)}
    signature.update(LSE="*fp32", stride_lb="i32", stride_lh="i32", sm_scale="fp32", SEQ_LEN="i32", BATCH="i32",
                     N_Q_HEADS="i32", N_KV_HEADS="i32", n_tiles="i32")
    constants = dict(CAUSAL=causal, PAIR_HEADS=pair_heads, BLOCK_N=block_n, HEAD_DIM=head_dim, K_STAGES=k_stages,
                     V_STAGES=v_stages, PINGPONG=False)
    signature.update({name: "constexpr" for name in constants})
    names = list(signature)
    source = GluonASTSource(hf._hopper_forward_kernel, signature,
                            {(names.index(name),): value for name, value in constants.items()})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


if __name__ == "__main__":
    args = [a for i, a in enumerate(sys.argv[1:], 1) if not a.startswith("--") and sys.argv[i - 1] != "--out"]
    out = Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else Path("/tmp/hopper_forward")
    head_dim, block_n, k_stages, v_stages = ([int(a) for a in args] + [128, 128, 3, 2][len(args):])[:4]
    compiled = compile_kernel(head_dim, block_n, k_stages, v_stages)
    out.mkdir(parents=True, exist_ok=True)
    for kind in ("ttgir", "ptx"):
        (out / f"kernel.{kind}").write_text(compiled.asm[kind])
    ptx = compiled.asm["ptx"]
    print(f"triton {triton.__version__}, head_dim {head_dim}, BLOCK_N {block_n}, K/V slots {k_stages}/{v_stages}: "
          f"{compiled.metadata.shared:,} bytes of shared memory")
    print("setmaxnreg:", dict(collections.Counter(re.findall(r"setmaxnreg\.(\w+)\.sync\.aligned\.u32\s+(\d+)", ptx))))
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    report = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", str(out / "kernel.ptx"), "-o", os.devnull],
                            capture_output=True, text=True)
    print("\n".join(line for line in report.stderr.splitlines() if "spill" in line or "Used" in line))
