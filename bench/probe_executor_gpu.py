"""Device probe (developers): what the graded executor meets on a GPU that the interpreter never shows.

    GQA_FLASH_IMPL=solutions PYTHONPATH=$PWD python bench/probe_executor_gpu.py OUT_DIR

1. Every process Triton starts while the solutions' forward, backward and decode compile for the first time
   (a fresh cache, as the executor has): program, real path, and the files of the frames that started it.
2. The child Python that runs a kernel in the interpreter with the GPU hidden: its exit code and error.
Writes OUT_DIR/processes.txt and OUT_DIR/interpreter_child.txt.
"""

import json
import os
import subprocess
import sys
import tempfile
import traceback

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
cache = tempfile.mkdtemp()
os.environ["HOME"] = os.environ["TRITON_CACHE_DIR"] = cache
seen = []


def hook(event, args):
    if event in ("subprocess.Popen", "os.posix_spawn", "os.exec", "os.system"):
        program = args[0] if args else "?"
        frames = [f"{f.filename}:{f.lineno}" for f in traceback.extract_stack()[-12:-1]]
        seen.append({"event": event, "program": str(program), "args": str(args[1])[:300] if len(args) > 1 else "",
                     "real": os.path.realpath(str(program)) if isinstance(program, (str, bytes)) else "?",
                     "frames": frames})


sys.addaudithook(hook)
import torch  # noqa: E402

import gqa_flash  # noqa: E402
from gqa_flash.course import testing  # noqa: E402

q, k, v = testing.random_qkv(batch=1, n_q_heads=4, n_kv_heads=2, seq_len=64, head_dim=32, dtype=torch.float16,
                             seed=0, device="cuda")
lengths = torch.full((1,), 64, dtype=torch.int32, device="cuda")
for what, run in (("forward", lambda: gqa_flash.flash_attention_forward(q, k, v, causal=True)),
                  ("decode", lambda: gqa_flash.flash_decode(q[:, :, -1:], k, v, lengths)),
                  ("backward", lambda: gqa_flash.flash_attention_backward(
                      q, k, v, *gqa_flash.flash_attention_forward(q, k, v, causal=True, return_lse=True),
                      torch.randn_like(q), causal=True))):
    seen.append({"event": "begin " + what})
    try:
        run()
        torch.cuda.synchronize()
    except Exception as exc:
        seen.append({"event": f"{what} raised {type(exc).__name__}: {exc}"[:500]})
with open(os.path.join(out, "processes.txt"), "w") as f:
    for row in seen:
        f.write(json.dumps(row, indent=1) + "\n")

code = ("import json, sys; from gqa_flash.course import testing; "
        "print(json.dumps(tile_counts.score_tiles_per_program(**json.loads(sys.argv[1]))))")
env = {k: os.environ[k] for k in ("PATH", "LD_LIBRARY_PATH", "GQA_FLASH_IMPL") if k in os.environ}
env.update(PYTHONPATH=os.getcwd(), HOME=cache, TMPDIR=cache, CUDA_VISIBLE_DEVICES="", PYTHONDONTWRITEBYTECODE="1")
done = subprocess.run([sys.executable, "-c", code, json.dumps({"seq_len": 100})], capture_output=True, text=True,
                      env=env, timeout=300)
with open(os.path.join(out, "interpreter_child.txt"), "w") as f:
    f.write(f"exit {done.returncode}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-6000:]}\n")
print(open(os.path.join(out, "interpreter_child.txt")).read()[:3000])
print(f"{len(seen)} process events")
