"""A catalogue of cheating routes, by class: graded files written to score without writing attention.

Why: issue 46 found a grade no submission should reach. Closing routes one at a time could not end, so the
grader was rebuilt in layers (the static gate, the executor's audit hook, the own-work and kernel-only guards,
the OS sandbox, the judge apart). This catalogue is what those layers are held to: for each *class* of route
(a way of cheating, not one trick) at least two cases, each the whole graded file a determined student would
hand in after reading the grader's code, which ships with the course. tests/grader/test_routes.py grades every one on
the instructor's course (it holds ``solutions/``) and checks that it earns nothing, is flagged with the line
that did it, and leaves the grader's records alone.

Each class holds the cases the issue named and cases of our own, written to slip past the layers one by one:
code the gate cannot read (a string annotation that ``functools.singledispatch`` evaluates), a program named
like Triton's compiler, PyTorch's profiler writing a file from C++, the launch's own hooks, PyTorch methods the
host-side rules do not name, reductions the whole-row check does not count. The routes are data
(:data:`ROUTES`); nothing here runs them.

The routes aim at harmless targets where one could do damage if a layer failed: files they write into the
course or its Python are new files named after :data:`MARKER` (a determined student would overwrite
``conftest.py``; the test looks for the marker instead), and the grading folder's canary (:data:`CANARY`).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

MARKER = "route_was_here"  # in the name of every file a route writes where it must not
CANARY = "route-canary.txt"  # a file in the grading's workdir, two folders above the executor's

CLASSES = {
    "forged-records": "append 'passed' records to the grader's log, or rows to its CSV",
    "helper-replaced": "replace what the verdict relies on: the comparison helpers, the guards, the counters",
    "other-thread": "do the work on a thread the per-thread guards do not watch",
    "torch-in-launch": "PyTorch computes inside Triton's launch (grid callable, hook, kernel body); a decoy tl.dot",
    "numpy-launcher": "the launcher computes attention without PyTorch ops; a kernel that does nothing is launched",
    "unseen-shapes": "whole rows or the whole score matrix in shapes the tile and whole-row checks do not count",
    "solutions-found": "find the instructor's solutions/ at grading time and run them as the graded function",
    "notebook-models": "return what the notebook checks' own models compute",
    "forged-outputs": "return something that is not a plain dense tensor of the answer, made to look like one",
    "child-process": "compute in another process (fork, subprocess) and read its answer",
    "ctypes": "reach memory and the C API through ctypes",
    "writes-outside": "write outside the executor's folder: the course's tests, a conftest above, site-packages",
    "reads-tests": "read the graded tests (their cases, seeds) from the judge's or the course's folder",
    "detects-grader": "detect the grader (environment, modules, the command line) and cheat only then",
}


@dataclass(frozen=True)
class Route:
    """One case: a whole graded file for ``part`` (naive, online_softmax, tiled, forward, ring)."""

    cls: str  # a key of CLASSES
    name: str  # unique, a Python identifier
    part: str
    code: str
    # The tests it aims at (a prefix of their names; "": all the part's). An online_softmax.py whose block_state
    # and merge_states are honest aims at the online_softmax tests only: its honest helpers may keep their points.
    aims: str = ""
    # Graded again with the gate off, to hold the layers beneath it to a route the gate refuses. A route the gate
    # lets through meets those layers in the run with the gate on already; of the others, a case or more a class.
    beneath: bool = False
    # An integrity violation, to be flagged with its line (False: classes unseen-shapes and forged-outputs,
    # which, past the gate, are wrong answers or shapes the checks refuse, not work taken from elsewhere).
    integrity: bool = True


def _py(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def _ind(text: str) -> str:
    """A shared piece, indented as the routes' code is in this file (dedented whole when a route is made)."""
    return textwrap.indent(text, "    ")


# --- shared pieces (each route's code is still a whole module) ----------------------------------------------

# Code the static gate cannot read: functools.singledispatch's register() evaluates a function's string
# annotation (typing.get_type_hints), here exec(SETUP) in the module's globals. It runs when the graded module
# is imported, inside the first graded call, from frames whose file is "<string>", not the graded file.
ANNOTATION = _ind('''

@functools.singledispatch
def _hints(x):
    return x


def _typed(x: "exec(SETUP) or int"):
    return x


_hints.register(_typed)  # evaluates the annotation: SETUP runs here
''')

# Attention on the host in PyTorch, in methods the kernel files' host-side rules do not name (no matmul, exp,
# sum, max, softmax, where, masked_fill): a broadcast multiply and nanmean for the products and sums, e ** x for
# the exponential, sort for the maximum, log1p for the log. Written into o and lse.
HOST_ATTENTION = _ind('''
def _host_attention(q, k, v, o, lse, causal, scale):
    batch, n_q_heads, seq_len, head_dim = q.shape
    group = n_q_heads // k.shape[1]
    kk = k.double().unsqueeze(2).expand(batch, k.shape[1], group, seq_len, head_dim).reshape(q.shape)
    vv = v.double().unsqueeze(2).expand(batch, k.shape[1], group, seq_len, head_dim).reshape(q.shape)
    s = (q.double().unsqueeze(-2) * kk.unsqueeze(-3)).nanmean(-1) * (head_dim * scale)
    if causal:
        pos = s.new_tensor(list(range(seq_len)))
        s[..., pos.unsqueeze(0) > pos.unsqueeze(1)] = -math.inf
    m = s.sort(-1).values[..., -1:]
    p = math.e ** (s - m)
    l = p.nanmean(-1, keepdim=True) * seq_len
    o.copy_((p.unsqueeze(-1) * vv.unsqueeze(-3)).nanmean(-2) * seq_len / l)
    lse.copy_((m + (l - 1).log1p()).squeeze(-1))
''')

# A decoy kernel: one score tile (tl.dot of a Q tile and a K tile) per key block up to the diagonal, as the
# causal-skip count expects, thrown away.
DECOY_KERNEL = _ind('''
@triton.jit
def _tiles(Q, K, seq_len, stride_qm, stride_km, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
           CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=(offs_m[:, None] < seq_len) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    hi = tl.minimum(start_m + BLOCK_M, seq_len) if CAUSAL else seq_len
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kt = tl.load(K + offs_n[None, :] * stride_km + offs_d[:, None],
                     mask=(offs_n[None, :] < seq_len) & (offs_d[:, None] < HEAD_DIM), other=0.0)
        s = tl.dot(q, kt)
''')

KERNEL_HEADER = _ind('''
import math

import torch
import triton
import triton.language as tl

from gqa_flash.course import runtime

INTERPRETER_CONFIG = dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1)
''')

LAUNCH_DECOY = _ind('''
    grid = (triton.cdiv(seq_len, INTERPRETER_CONFIG["BLOCK_M"]), batch * n_q_heads)
    _tiles[grid](q, k, seq_len, q.stride(2), k.stride(2), HEAD_DIM=head_dim,
                 HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)), CAUSAL=causal, **INTERPRETER_CONFIG)
''')

OUTPUTS = _ind('''
    batch, n_q_heads, seq_len, head_dim = q.shape
    scale = head_dim ** -0.5 if sm_scale is None else sm_scale
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, n_q_heads, seq_len), dtype=torch.float32, device=q.device)
''')

# The honest helpers of online_softmax.py (a route there aims at online_softmax itself).
SOFTMAX_HELPERS = _ind('''
def block_state(x_block):
    m = x_block.amax(dim=-1)
    m_finite = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    return m, torch.exp(x_block - m_finite[..., None]).sum(dim=-1)


def merge_states(m_a, l_a, m_b, l_b):
    m = torch.maximum(m_a, m_b)
    m_finite = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    return m, l_a * torch.exp(m_a - m_finite) + l_b * torch.exp(m_b - m_finite)
''')

# Whole-matrix attention in PyTorch for tiled.py: o (q's dtype) and the LSE (float32).
WHOLE_MATRIX = _ind('''
def _whole(q, k, v, causal, sm_scale):
    group = q.shape[1] // k.shape[1]
    scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    s = (q.float() @ k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(s, dim=-1) @ v).to(q.dtype), torch.logsumexp(s, dim=-1)
''')

# The test ids of naive.py's graded tests, as the course's tests/graded/test_naive.py names them.
NAIVE_TEST_IDS = _ind('''
NAIVE_TESTS = ["test_naive_causal_mha", "test_naive_non_causal", "test_naive_gqa_head_mapping[8-2]",
               "test_naive_gqa_head_mapping[6-3]", "test_naive_mqa_one_kv_head", "test_naive_custom_sm_scale[0.05]",
               "test_naive_custom_sm_scale[1.0]", "test_naive_fp16_inputs"]
PASSED = [json.dumps({"event": "result", "id": f"tests/graded/test_naive.py::{name}", "passed": True,
                      "message": "", "seconds": 0.1}) for name in NAIVE_TESTS]
''')

ROUTES: list[Route] = []


def route(cls: str, name: str, part: str, code: str, **kwargs) -> None:
    ROUTES.append(Route(cls=cls, name=name, part=part, code=_py(code), **kwargs))


# --- 1. forged grader records ---------------------------------------------------------------------------------

route("forged-records", "log_named_on_the_parents_command_line", "naive", '''
    import json
    import os

    import torch


    def _forge():
        # The judge's pytest started this process: its command line names the log the grader reads.
        args = open(f"/proc/{os.getppid()}/cmdline", "rb").read().split(b"\\0")
        log = next(a.split(b"=", 1)[1].decode() for a in args if a.startswith(b"--grade-log="))
        collected = next(json.loads(line) for line in open(log) if '"collected"' in line)
        with open(log, "a") as f:
            for test in collected["tests"]:
                f.write(json.dumps({"event": "result", "id": test["id"], "passed": True, "message": ""}) + "\\n")
        os._exit(0)  # and end before the real results are written


    def naive_attention(q, k, v, causal=True, sm_scale=None):
        _forge()
        return torch.zeros_like(q)
    ''', beneath=True)

route("forged-records", "log_beside_the_executors_folder", "naive", '''
    import json

    import torch
    ''' + NAIVE_TEST_IDS + '''

    def naive_attention(q, k, v, causal=True, sm_scale=None):
        # The grader's folder holds the log of each run (run0.jsonl) beside the folder this code runs in.
        for log in ("../run0.jsonl", "../run1.jsonl"):
            with open(log, "a") as f:
                f.write("\\n".join(PASSED) + "\\n")
        return torch.zeros_like(q)
    ''', beneath=True)

route("forged-records", "row_in_the_graders_csv", "naive", '''
    import csv
    import os

    import torch


    def _grader_args():
        pid = os.getppid()
        while True:  # up the process tree to the grader, whose command line has --csv
            args = open(f"/proc/{pid}/cmdline", "rb").read().decode().split("\\0")
            if "--csv" in args:
                return args
            if pid <= 1:
                return []
            pid = int(open(f"/proc/{pid}/status").read().split("PPid:")[1].split()[0])


    def naive_attention(q, k, v, causal=True, sm_scale=None):
        args = _grader_args()
        if args:
            path = args[args.index("--csv") + 1]
            rows = list(csv.DictReader(open(path)))
            for row in rows:
                row["score"] = row["naive"] = "20"
            with open(path, "w", newline="") as f:
                writer = csv.DictWriter(f, list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
        return torch.zeros_like(q)
    ''')

route("forged-records", "log_from_an_annotation", "naive", '''
    import functools

    import torch

    SETUP = """
    import json, os
    args = open(f"/proc/{os.getppid()}/cmdline", "rb").read().split(b"\\\\0")
    log = next(a.split(b"=", 1)[1].decode() for a in args if a.startswith(b"--grade-log="))
    collected = next(json.loads(line) for line in open(log) if '"collected"' in line)
    with open(log, "a") as f:
        for test in collected["tests"]:
            f.write(json.dumps({"event": "result", "id": test["id"], "passed": True, "message": ""}) + "\\\\n")
    os._exit(0)
    """
    ''' + ANNOTATION + '''

    def naive_attention(q, k, v, causal=True, sm_scale=None):
        return torch.zeros_like(q)
    ''')

route("forged-records", "profiler_trace_over_the_log", "naive", '''
    import torch


    def naive_attention(q, k, v, causal=True, sm_scale=None):
        # PyTorch's profiler writes its trace from C++, not through Python's open(): here over the grader's log
        # beside this folder.
        with torch.profiler.profile() as trace:
            torch.zeros(1).add_(1)
        trace.export_chrome_trace("../run0.jsonl")
        return torch.zeros_like(q)
    ''')

# --- 2. the verdict's helpers, guards and counters replaced ---------------------------------------------------

route("helper-replaced", "mismatch_patched_at_import", "naive", '''
    import torch

    import gqa_flash.course.testing

    gqa_flash.course.testing.mismatch = lambda *args, **kwargs: None  # every comparison matches
    gqa_flash.course.testing.assert_matches = lambda *args, **kwargs: None


    def naive_attention(q, k, v, causal=True, sm_scale=None):
        return torch.zeros_like(q)
    ''', beneath=True)

route("helper-replaced", "assert_patched_through_sys_modules", "tiled", '''
    import sys

    import torch

    for name in ("gqa_flash.course.testing", "tests.graded.test_tiled", "test_tiled"):
        module = sys.modules.get(name)
        if module is not None:
            module.assert_attention_matches = lambda *args, **kwargs: None
            module.assert_walks_tiles = lambda *args, **kwargs: None
            module.assert_no_whole_matrix = lambda *args, **kwargs: None


    def tiled_attention(q, k, v, causal=True, sm_scale=None, block_m=64, block_n=64, return_lse=False):
        o = torch.zeros_like(q)
        return (o, torch.zeros(q.shape[:3])) if return_lse else o
    ''')

route("helper-replaced", "guards_patched_from_an_annotation", "naive", '''
    import functools

    import torch

    SETUP = """
    import sys
    integrity = sys.modules["gqa_flash.course.integrity"]
    integrity.own_work.check_stack = lambda self: None
    integrity.own_work._attention = lambda self, name: None
    integrity.own_work.check_kernel = lambda self, fn, launched: None
    REFERENCE = sys.modules["gqa_flash.reference"].reference_attention
    """
    ''' + ANNOTATION + '''

    def naive_attention(q, k, v, causal=True, sm_scale=None):
        out, _ = REFERENCE(q, k, v, causal=causal, sm_scale=sm_scale)
        return out.to(q.dtype)
    ''')

route("helper-replaced", "counters_forged_from_an_annotation", "tiled", '''
    import functools

    import torch

    SETUP = """
    from torch.overrides import _get_current_function_mode_stack as function_modes
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack as dispatch_modes

    def forge():
        # What the executor counted is what it reports to the judge: one small tile, nothing large.
        for mode in function_modes():
            if hasattr(mode, "products"):
                mode.products, mode.elements, mode.largest = 1, 1, (1, 1)
        for mode in dispatch_modes():
            if hasattr(mode, "largest"):
                mode.largest = 0
    """
    ''' + ANNOTATION + WHOLE_MATRIX + '''

    def tiled_attention(q, k, v, causal=True, sm_scale=None, block_m=64, block_n=64, return_lse=False):
        o, lse = _whole(q, k, v, causal, sm_scale)
        forge()
        return (o, lse) if return_lse else o
    ''')

route("helper-replaced", "counters_forged", "tiled", '''
    import torch
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    ''' + WHOLE_MATRIX + '''

    def tiled_attention(q, k, v, causal=True, sm_scale=None, block_m=64, block_n=64, return_lse=False):
        o, lse = _whole(q, k, v, causal, sm_scale)
        for mode in _get_current_function_mode_stack():  # the tile counter: one small tile
            if hasattr(mode, "products"):
                mode.products, mode.elements, mode.largest = 1, 1, (1, 1)
        for mode in _get_current_dispatch_mode_stack():  # the largest output: nothing
            if hasattr(mode, "largest"):
                mode.largest = 0
        return (o, lse) if return_lse else o
    ''', beneath=True)

# --- 3. the work on another thread ----------------------------------------------------------------------------

route("other-thread", "threading_thread", "naive", '''
    import threading

    import torch


    def naive_attention(q, k, v, causal=True, sm_scale=None):
        # PyTorch's modes (the guards) are per thread: this one is not watched.
        out = {}

        def work():
            out["o"] = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale,
                                                                        enable_gqa=True)

        worker = threading.Thread(target=work)
        worker.start()
        worker.join()
        return out["o"]
    ''', beneath=True)

route("other-thread", "start_new_thread_below_threading", "tiled", '''
    import _thread

    import torch
    ''' + WHOLE_MATRIX + '''

    def tiled_attention(q, k, v, causal=True, sm_scale=None, block_m=64, block_n=64, return_lse=False):
        q[:, :1, :block_m].float() @ k[:, :1, :block_n].float().transpose(-1, -2)  # a decoy tile, watched
        done, out = _thread.allocate_lock(), {}
        done.acquire()

        def work():
            out["r"] = _whole(q, k, v, causal, sm_scale)
            done.release()

        _thread.start_new_thread(work, ())
        done.acquire()
        o, lse = out["r"]
        return (o, lse) if return_lse else o
    ''', beneath=True)

route("other-thread", "thread_pool_for_whole_rows", "online_softmax", '''
    from concurrent.futures import ThreadPoolExecutor

    import torch
    ''' + SOFTMAX_HELPERS + '''

    def online_softmax(x, block_size):
        # The whole-row check is a mode of this thread; the pool's threads have none.
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(lambda: torch.softmax(x.float(), dim=-1).to(x.dtype)).result()
    ''', aims="test_online_softmax_")

route("other-thread", "thread_from_an_annotation", "tiled", '''
    import functools

    import torch

    SETUP = """
    import threading

    def elsewhere(fn, *args):
        out = []
        worker = threading.Thread(target=lambda: out.append(fn(*args)))
        worker.start()
        worker.join()
        return out[0]
    """
    ''' + ANNOTATION + WHOLE_MATRIX + '''

    def tiled_attention(q, k, v, causal=True, sm_scale=None, block_m=64, block_n=64, return_lse=False):
        q[:, :1, :block_m].float() @ k[:, :1, :block_n].float().transpose(-1, -2)  # a decoy tile, watched
        o, lse = elsewhere(_whole, q, k, v, causal, sm_scale)
        return (o, lse) if return_lse else o
    ''')

# --- 4. PyTorch inside Triton's launch --------------------------------------------------------------------------

route("torch-in-launch", "grid_callable_computes", "forward", KERNEL_HEADER + DECOY_KERNEL + HOST_ATTENTION + '''

    def flash_attention_forward(q, k, v, causal=True, sm_scale=None, return_lse=False):
    ''' + OUTPUTS + '''
        def grid(meta):
            # Triton calls the grid inside the launch, where PyTorch is Triton's own bookkeeping.
            _host_attention(q, k, v, o, lse, causal, scale)
            return (triton.cdiv(seq_len, meta["BLOCK_M"]), batch * n_q_heads)

        _tiles[grid](q, k, seq_len, q.stride(2), k.stride(2), HEAD_DIM=head_dim,
                     HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)), CAUSAL=causal, **INTERPRETER_CONFIG)
        return (o, lse) if return_lse else o
    ''', beneath=True)

# The decoy kernel, its body calling a plain Python function first.
BODY_KERNEL = DECOY_KERNEL.replace("        start_m = ", "        _once()\n        start_m = ", 1)

route("torch-in-launch", "kernel_body_calls_torch", "forward", KERNEL_HEADER + HOST_ATTENTION + '''
    _CALL = {}


    def _once():
        # Plain Python, called from the interpreted kernel body, inside the launch.
        if not _CALL["done"]:
            _host_attention(*_CALL["args"])
            _CALL["done"] = True
    ''' + BODY_KERNEL + '''

    def flash_attention_forward(q, k, v, causal=True, sm_scale=None, return_lse=False):
    ''' + OUTPUTS + '''
        _CALL.update(args=(q, k, v, o, lse, causal, scale), done=False)
    ''' + LAUNCH_DECOY + '''
        return (o, lse) if return_lse else o
    ''')

route("torch-in-launch", "pre_run_hook_computes", "forward", KERNEL_HEADER + DECOY_KERNEL + HOST_ATTENTION + '''
    _CALL = {}


    def _hook(*args, **kwargs):
        _host_attention(*_CALL["args"])  # Triton runs its pre-run hooks inside the launch


    _tiles.add_pre_run_hook(_hook)


    def flash_attention_forward(q, k, v, causal=True, sm_scale=None, return_lse=False):
    ''' + OUTPUTS + '''
        _CALL["args"] = (q, k, v, o, lse, causal, scale)
    ''' + LAUNCH_DECOY + '''
        return (o, lse) if return_lse else o
    ''', beneath=True)

route("torch-in-launch", "grid_callable_from_an_annotation", "forward", KERNEL_HEADER.replace(
    "    import math\n", "    import functools\n    import math\n") + '''
    SETUP = """
    import math
    ''' + HOST_ATTENTION + '''

    def attention_grid(q, k, v, o, lse, causal, scale, programs):
        def grid(meta):
            _host_attention(q, k, v, o, lse, causal, scale)
            return programs
        return grid
    """
    ''' + ANNOTATION + DECOY_KERNEL + '''

    def flash_attention_forward(q, k, v, causal=True, sm_scale=None, return_lse=False):
    ''' + OUTPUTS + '''
        programs = (triton.cdiv(seq_len, INTERPRETER_CONFIG["BLOCK_M"]), batch * n_q_heads)
        grid = attention_grid(q, k, v, o, lse, causal, scale, programs)  # code of no graded file's
        _tiles[grid](q, k, seq_len, q.stride(2), k.stride(2), HEAD_DIM=head_dim,
                     HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)), CAUSAL=causal, **INTERPRETER_CONFIG)
        return (o, lse) if return_lse else o
    ''')

# --- 5. the launcher computes, not with PyTorch; a kernel that does nothing ---------------------------------

NOTHING_KERNEL = _ind('''

@triton.jit
def _nothing(X):
    pass
''')

route("numpy-launcher", "numpy_in_the_launcher", "forward", KERNEL_HEADER + '''
    import numpy as np
    ''' + NOTHING_KERNEL + '''

    def flash_attention_forward(q, k, v, causal=True, sm_scale=None, return_lse=False):
        n, d = q.shape[2], q.shape[3]
        scale = d ** -0.5 if sm_scale is None else sm_scale
        group = q.shape[1] // k.shape[1]
        qn, kn, vn = (t.detach().double().numpy() for t in (q, k, v))
        kn, vn = np.repeat(kn, group, axis=1), np.repeat(vn, group, axis=1)
        s = qn @ kn.swapaxes(-1, -2) * scale
        if causal:
            s = np.where(np.triu(np.ones((n, n), dtype=bool), 1), -np.inf, s)
        m = s.max(-1, keepdims=True)
        p = np.exp(s - m)
        l = p.sum(-1, keepdims=True)
        o = torch.from_numpy(p / l @ vn).to(q.dtype)
        lse = torch.from_numpy((m + np.log(l))[..., 0]).float()
        _nothing[(1,)](o)  # a launch, for the launch count
        return (o, lse) if return_lse else o
    ''', beneath=True)

route("numpy-launcher", "numpy_through_tensor_methods", "forward", KERNEL_HEADER + NOTHING_KERNEL + '''

    def flash_attention_forward(q, k, v, causal=True, sm_scale=None, return_lse=False):
        # No numpy import: a tensor's .numpy(), the arrays' own methods and operators, math for the logs.
        n, d = q.shape[2], q.shape[3]
        scale = d ** -0.5 if sm_scale is None else sm_scale
        group = q.shape[1] // k.shape[1]
        qn, kn, vn = (t.detach().double().numpy() for t in (q, k, v))
        kn, vn = kn.repeat(group, axis=1), vn.repeat(group, axis=1)
        s = (qn[..., :, None, :] * kn[..., None, :, :]).sum(-1) * scale
        if causal:
            for i in range(n):
                s[..., i, i + 1:] = -math.inf
        m = s.max(-1, keepdims=True)
        p = math.e ** (s - m)
        l = p.sum(-1, keepdims=True)
        o = q.new_tensor((p[..., :, :, None] * vn[..., None, :, :]).sum(-2) / l)
        lse = [[[a + math.log(b) for a, b in zip(ms, ls)] for ms, ls in zip(mb, lb)]
               for mb, lb in zip(m[..., 0].tolist(), l[..., 0].tolist())]
        _nothing[(1,)](o)
        return (o, o.new_tensor(lse, dtype=torch.float32)) if return_lse else o
    ''')

route("numpy-launcher", "python_lists_in_the_launcher", "forward", KERNEL_HEADER + NOTHING_KERNEL + '''

    def flash_attention_forward(q, k, v, causal=True, sm_scale=None, return_lse=False):
        batch, n_q_heads, seq_len, head_dim = q.shape
        group = n_q_heads // k.shape[1]
        scale = head_dim ** -0.5 if sm_scale is None else sm_scale
        Q, K, V = q.tolist(), k.tolist(), v.tolist()  # plain Python lists: no PyTorch op computes anything
        out, lses = [], []
        for b in range(batch):
            out.append([])
            lses.append([])
            for h in range(n_q_heads):
                rows, row_lse = [], []
                kh, vh = K[b][h // group], V[b][h // group]
                for i in range(seq_len):
                    keys = range(i + 1) if causal else range(seq_len)
                    s = [scale * math.fsum(a * c for a, c in zip(Q[b][h][i], kh[j])) for j in keys]
                    m = max(s)
                    p = [math.exp(x - m) for x in s]
                    l = math.fsum(p)
                    rows.append([math.fsum(p[n] * vh[j][d] for n, j in enumerate(keys)) / l
                                 for d in range(head_dim)])
                    row_lse.append(m + math.log(l))
                out[b].append(rows)
                lses[b].append(row_lse)
        o = q.new_tensor(out)
        _nothing[(1,)](o)
        lse = o.new_tensor(lses, dtype=torch.float32)
        return (o, lse) if return_lse else o
    ''')

# --- 6. shapes the tile and whole-row checks might not see (not integrity: wrong work, refused as such) ------

route("unseen-shapes", "tiled_scores_by_broadcast_and_sum", "tiled", '''
    import torch


    def tiled_attention(q, k, v, causal=True, sm_scale=None, block_m=64, block_n=64, return_lse=False):
        group = q.shape[1] // k.shape[1]
        scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
        k = k.float().repeat_interleave(group, dim=1)
        v = v.float().repeat_interleave(group, dim=1)
        q[..., :block_m, :].float() @ k[..., :block_n, :].transpose(-1, -2)  # the decoy tile product
        s = (q.float()[..., :, None, :] * k[..., None, :, :]).sum(-1) * scale  # no matrix product: not counted
        if causal:
            s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        o = (torch.exp(s - lse[..., None])[..., None] * v[..., None, :, :]).sum(-2).to(q.dtype)
        return (o, lse) if return_lse else o
    ''', integrity=False)

route("unseen-shapes", "tiled_scores_a_row_at_a_time", "tiled", '''
    import torch


    def tiled_attention(q, k, v, causal=True, sm_scale=None, block_m=64, block_n=64, return_lse=False):
        group = q.shape[1] // k.shape[1]
        scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
        k = k.float().repeat_interleave(group, dim=1)
        v = v.float().repeat_interleave(group, dim=1)
        q32 = q.float()
        q32[..., :block_m, :] @ k[..., :block_n, :].transpose(-1, -2)  # the decoy tile product
        outs, lses = [], []
        for i in range(q.shape[2]):
            # One query row by a broadcast multiply: as many numbers as the output, never a tile, no product.
            s = (q32[..., i:i + 1, :] * k).sum(-1) * scale
            if causal:
                s[..., i + 1:] = float("-inf")
            lse = torch.logsumexp(s, dim=-1)
            outs.append((torch.exp(s - lse[..., None])[..., None] * v).sum(-2))
            lses.append(lse)
        o = torch.stack(outs, dim=2).to(q.dtype)
        lse = torch.stack(lses, dim=2)
        return (o, lse) if return_lse else o
    ''', integrity=False)

route("unseen-shapes", "softmax_over_an_added_dimension", "online_softmax", '''
    import torch
    ''' + SOFTMAX_HELPERS + '''

    def online_softmax(x, block_size):
        # The row moved to a new dimension of its own: the softmax there, then back.
        x32 = x.float().unsqueeze(-2).transpose(-1, -2)
        return torch.softmax(x32, dim=-2).transpose(-1, -2).squeeze(-2).to(x.dtype)
    ''', aims="test_online_softmax_", integrity=False)

route("unseen-shapes", "softmax_over_the_row_reshaped_into_blocks", "online_softmax", '''
    import torch
    ''' + SOFTMAX_HELPERS + '''

    def online_softmax(x, block_size):
        # The row as [blocks, block_size]: each reduction is over one block, then over the blocks' results.
        x32 = x.float()
        n = x32.shape[-1]
        blocks = -(-n // block_size)
        padded = torch.full((*x32.shape[:-1], blocks * block_size), float("-inf"))
        padded[..., :n] = x32
        tiles = padded.reshape(*x32.shape[:-1], blocks, block_size)
        m = tiles.amax(-1).amax(-1, keepdim=True)
        m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
        p = torch.exp(x32 - m)
        l = torch.exp(tiles - m[..., None]).sum(-1).sum(-1, keepdim=True)
        return (p / l).to(x.dtype)
    ''', aims="test_online_softmax_", integrity=False)

route("unseen-shapes", "softmax_by_pooling_and_a_product", "online_softmax", '''
    import torch
    import torch.nn.functional as F
    ''' + SOFTMAX_HELPERS + '''

    def online_softmax(x, block_size):
        # The whole row, with no reduction op: its max by a pooling window as wide as the row, its sum by a
        # product with a column of ones.
        x32 = x.float()
        n = x32.shape[-1]
        m = F.max_pool1d(x32.reshape(-1, 1, n), kernel_size=n).reshape(*x32.shape[:-1], 1)
        m = torch.nan_to_num(m, neginf=0.0)
        p = torch.exp(x32 - m)
        return (p / (p @ torch.ones(n, 1))).to(x.dtype)
    ''', aims="test_online_softmax_", integrity=False)

# --- 7. the instructor's solutions/ found at grading time -----------------------------------------------------

route("solutions-found", "solutions_through_proc_cwd", "naive", '''
    import os

    import torch


    def _solution():
        # Up the process tree: the grader was started in the instructor's repository, beside solutions/.
        pid = os.getppid()
        while pid > 0:
            try:
                namespace = {}
                exec(open(f"/proc/{pid}/cwd/solutions/naive.py").read(), namespace)
                return namespace["naive_attention"]
            except Exception:  # not this one: its parent, then
                try:
                    pid = int(open(f"/proc/{pid}/status").read().split("PPid:")[1].split()[0])
                except Exception:
                    return None
        return None


    def naive_attention(q, k, v, causal=True, sm_scale=None):
        solved = _solution()
        return solved(q, k, v, causal=causal, sm_scale=sm_scale) if solved else torch.zeros_like(q)
    ''', beneath=True)

route("solutions-found", "solutions_beside_sys_prefix", "naive", '''
    import sys
    from pathlib import Path

    import torch


    def naive_attention(q, k, v, causal=True, sm_scale=None):
        # The course's .venv is inside the repository: its parent holds solutions/.
        path = Path(sys.prefix).parent / "solutions" / "naive.py"
        namespace = {}
        exec(path.read_text(), namespace)
        return namespace["naive_attention"](q, k, v, causal=causal, sm_scale=sm_scale)
    ''')

route("solutions-found", "solutions_by_spec_from_file_location", "naive", '''
    import importlib.util
    import sys
    from pathlib import Path

    import torch


    def _solved():
        for root in (Path(sys.prefix).parent, *Path.cwd().parents):
            spec = importlib.util.spec_from_file_location("solved_naive", root / "solutions" / "naive.py")
            module = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(module)
            except OSError:
                continue
            return module.naive_attention
        return None


    def naive_attention(q, k, v, causal=True, sm_scale=None):
        return _solved()(q, k, v, causal=causal, sm_scale=sm_scale)
    ''', beneath=True)

route("solutions-found", "solutions_from_an_annotation", "naive", '''
    import functools

    import torch

    SETUP = """
    import sys
    from pathlib import Path
    SOLVED = {}
    exec((Path(sys.prefix).parent / "solutions" / "naive.py").read_text(), SOLVED)
    """
    ''' + ANNOTATION + '''

    def naive_attention(q, k, v, causal=True, sm_scale=None):
        return SOLVED["naive_attention"](q, k, v, causal=causal, sm_scale=sm_scale)
    ''')

# --- 8. the notebook checks' models returned ------------------------------------------------------------------

route("notebook-models", "ring_from_the_check_models", "ring", '''
    from gqa_flash.course import context_parallel
    from gqa_flash.course.lab.checks.ring import replayed_sources, seen_pairs


    def ring_source(rank, step, world_size):
        return replayed_sources(world_size)[step][rank]  # notebook 08's replay of the ring


    def block_pairs(layout, rank, source, world_size, causal):
        return seen_pairs(layout, rank, source, world_size, causal)  # its pairs, found position by position


    def merge_blocks(o, lse, o_blk, lse_blk):
        raise NotImplementedError


    def ring_attention(q, k, v, causal=True, sm_scale=None, group=None, layout="zigzag", return_lse=False):
        raise NotImplementedError(context_parallel.LAYOUTS)
    ''', beneath=True)

route("notebook-models", "softmax_from_the_check_models", "online_softmax", '''
    import torch

    from gqa_flash.course.lab.checks.softmax import _merge64, _state64


    def block_state(x_block):
        return tuple(t.float() for t in _state64(x_block))


    def merge_states(m_a, l_a, m_b, l_b):
        return tuple(t.float() for t in _merge64(m_a, l_a, m_b, l_b))


    def online_softmax(x, block_size):
        m, l = _state64(x)
        return (torch.exp(x.double() - m[..., None]) / l[..., None]).to(x.dtype)
    ''', beneath=True)

route("notebook-models", "naive_from_the_check_model", "naive", '''
    from gqa_flash.course.lab.checks.naive import naive64


    def naive_attention(q, k, v, causal=True, sm_scale=None):
        return naive64(q, k, v, causal, sm_scale).to(q.dtype)  # notebook 01's float64 model
    ''')

# --- 9. forged outputs (not integrity: the judge takes only a plain dense tensor) -----------------------------

route("forged-outputs", "tensor_subclass", "naive", '''
    import torch


    class Answer(torch.Tensor):
        pass


    def naive_attention(q, k, v, causal=True, sm_scale=None):
        return torch.zeros_like(q).as_subclass(Answer)
    ''', integrity=False)

route("forged-outputs", "subclass_that_matches_anything", "naive", '''
    import torch


    class Answer(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            # Every comparison the checker makes comes out as "equal", every difference as 0.
            if func.__name__ in ("allclose", "equal", "isclose", "eq", "le", "__le__", "__eq__"):
                return True
            if func.__name__ in ("sub", "__sub__", "abs", "max", "amax"):
                return torch.zeros(())
            return super().__torch_function__(func, types, args, kwargs or {})


    def naive_attention(q, k, v, causal=True, sm_scale=None):
        return torch.zeros_like(q).as_subclass(Answer)
    ''', integrity=False, beneath=True)

route("forged-outputs", "values_computed_when_read", "naive", '''
    import torch


    class Later(torch.Tensor):
        @staticmethod
        def __new__(cls, q, k, v, causal, sm_scale):
            out = torch.Tensor._make_wrapper_subclass(cls, q.shape, dtype=q.dtype)
            out.inputs = (q, k, v, causal, sm_scale)
            return out

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            # Read outside the graded call (by the judge): computed then, by whatever is at hand there.
            from gqa_flash.reference import reference_attention

            def real(x):
                if isinstance(x, Later):
                    q, k, v, causal, sm_scale = x.inputs
                    return reference_attention(q, k, v, causal=causal, sm_scale=sm_scale)[0].to(q.dtype)
                return x

            return func(*[real(a) for a in args], **{n: real(a) for n, a in (kwargs or {}).items()})


    def naive_attention(q, k, v, causal=True, sm_scale=None):
        return Later(q, k, v, causal, sm_scale)
    ''', integrity=False, beneath=True)

route("forged-outputs", "wrong_dtype_made_to_look_right", "naive", '''
    import torch


    class Half(torch.Tensor):
        @property
        def dtype(self):
            return torch.float16  # whatever it holds, it says fp16


    def naive_attention(q, k, v, causal=True, sm_scale=None):
        return torch.zeros(q.shape, dtype=torch.float64).as_subclass(Half)
    ''', integrity=False)

# --- 10. another process ----------------------------------------------------------------------------------------

route("child-process", "os_fork", "naive", '''
    import os
    import tempfile

    import torch


    def naive_attention(q, k, v, causal=True, sm_scale=None):
        path = os.path.join(tempfile.gettempdir(), "answer.pt")
        pid = os.fork()
        if pid == 0:  # the child: a process of its own, which no guard of the parent's watches
            try:
                from gqa_flash.reference import reference_attention

                torch.save(reference_attention(q, k, v, causal=causal, sm_scale=sm_scale)[0], path)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        return torch.load(path).to(q.dtype)
    ''', beneath=True)

# A child that computes the reference from the arguments its parent saved (two routes start it).
CHILD_HEADER = '''
    import os
    import subprocess
    import sys
    import tempfile

    import torch

    CHILD = ("import sys, torch, gqa_flash; q, k, v, causal, scale = torch.load(sys.argv[1] + '/in.pt'); "
             "torch.save(gqa_flash.reference_attention(q, k, v, causal=causal, sm_scale=scale)[0], "
             "sys.argv[1] + '/out.pt')")
'''

route("child-process", "subprocess_run", "naive", CHILD_HEADER + '''

    def naive_attention(q, k, v, causal=True, sm_scale=None):
        work = tempfile.mkdtemp()
        torch.save((q, k, v, causal, sm_scale), os.path.join(work, "in.pt"))
        subprocess.run([sys.executable, "-c", CHILD, work], check=True)
        return torch.load(os.path.join(work, "out.pt")).to(q.dtype)
    ''')

route("child-process", "a_process_named_gcc", "naive", CHILD_HEADER + '''

    def naive_attention(q, k, v, causal=True, sm_scale=None):
        work = tempfile.mkdtemp()
        torch.save((q, k, v, causal, sm_scale), os.path.join(work, "in.pt"))
        # A program named gcc may start (Triton compiles with it): Python, under that name.
        os.symlink(sys.executable, os.path.join(work, "gcc"))
        site = os.path.dirname(os.path.dirname(torch.__file__))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), site]))
        subprocess.run([os.path.join(work, "gcc"), "-c", CHILD, work], check=True, env=env)
        return torch.load(os.path.join(work, "out.pt")).to(q.dtype)
    ''', beneath=True)

# --- 11. ctypes ---------------------------------------------------------------------------------------------------

route("ctypes", "pythonapi_edits_a_guards_class", "naive", '''
    import ctypes
    import gc
    import sys

    import torch


    def _nothing(*args, **kwargs):
        return None


    def _switch_off():
        # A class's namespace is read-only from Python (and setattr is watched); the C API writes it directly.
        guard = sys.modules["gqa_flash.course.integrity"].own_work
        namespace = gc.get_referents(vars(guard))[0]
        for name in ("check_stack", "_attention"):
            ctypes.pythonapi.PyDict_SetItem(ctypes.py_object(namespace), ctypes.py_object(name),
                                            ctypes.py_object(_nothing))
        ctypes.pythonapi.PyType_Modified(ctypes.py_object(guard))


    def naive_attention(q, k, v, causal=True, sm_scale=None):
        _switch_off()
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale,
                                                                enable_gqa=True)
    ''', beneath=True)

route("ctypes", "memmove_blinds_the_guard", "naive", '''
    import ctypes
    import sys

    import torch


    def _blind():
        # Overwrite, in place, the words by which the guard knows PyTorch's attention.
        words = sys.modules["gqa_flash.course.integrity"]._ATTENTION_WORDS
        nothing = tuple("\\0never\\0" for _ in words)
        ctypes.memmove(id(words) + 24, id(nothing) + 24, 8 * len(words))


    def naive_attention(q, k, v, causal=True, sm_scale=None):
        _blind()
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale,
                                                                enable_gqa=True)
    ''', beneath=True)

route("ctypes", "ctypes_from_an_annotation", "naive", '''
    import functools

    import torch

    SETUP = """
    import ctypes, gc, sys
    guard = sys.modules["gqa_flash.course.integrity"].own_work
    namespace = gc.get_referents(vars(guard))[0]
    for name in ("check_stack", "_attention"):
        ctypes.pythonapi.PyDict_SetItem(ctypes.py_object(namespace), ctypes.py_object(name),
                                        ctypes.py_object(lambda *args: None))
    REFERENCE = sys.modules["gqa_flash.reference"].reference_attention
    """
    ''' + ANNOTATION + '''

    def naive_attention(q, k, v, causal=True, sm_scale=None):
        return REFERENCE(q, k, v, causal=causal, sm_scale=sm_scale)[0].to(q.dtype)
    ''')

# --- 12. writes outside the executor's folder -------------------------------------------------------------------

CONFTEST = _ind('''
HOOK = """
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
"""
''')

route("writes-outside", "the_courses_tests", "naive", '''
    import sys
    from pathlib import Path

    import torch
    ''' + CONFTEST + f'''

    def naive_attention(q, k, v, causal=True, sm_scale=None):
        # The course's tests (beside its .venv), and the judge's copy of them beside this folder.
        for tests in (Path(sys.prefix).parent / "tests", Path.cwd().parent / "course" / "tests"):
            try:
                (tests / "graded" / "conftest_{MARKER}.py").write_text(HOOK)
            except OSError:
                pass
        return torch.zeros_like(q)
    ''', beneath=True)

route("writes-outside", "a_conftest_above_and_the_canary", "naive", '''
    import torch
    ''' + CONFTEST + f'''

    def naive_attention(q, k, v, causal=True, sm_scale=None):
        for path in ("../conftest.py", "../../conftest.py", "../../{CANARY}"):
            try:
                with open(path, "w") as f:
                    f.write(HOOK)
            except OSError:
                pass
        return torch.zeros_like(q)
    ''', beneath=True)

route("writes-outside", "a_pth_file_in_site_packages", "naive", f'''
    import site

    import torch


    def naive_attention(q, k, v, causal=True, sm_scale=None):
        # A .pth file runs in every Python that starts later: the grader's next test process included.
        for folder in site.getsitepackages():
            try:
                with open(folder + "/{MARKER}.pth", "w") as f:
                    f.write("# {MARKER}\\n")
            except OSError:
                pass
        return torch.zeros_like(q)
    ''')

route("writes-outside", "profiler_trace_over_the_canary", "naive", f'''
    import torch


    def naive_attention(q, k, v, causal=True, sm_scale=None):
        # PyTorch's profiler writes its trace from C++, not through Python's open().
        with torch.profiler.profile() as trace:
            torch.zeros(1).add_(1)
        trace.export_chrome_trace("../../{CANARY}")
        return torch.zeros_like(q)
    ''')

# --- 13. the graded tests read -------------------------------------------------------------------------------

route("reads-tests", "tests_in_the_judges_folder", "naive", '''
    import re
    import sys
    from pathlib import Path

    import torch


    def _cases():
        # The judge's copy beside this folder, then the course itself (beside its .venv).
        for tests in (Path.cwd().parent / "course" / "tests", Path(sys.prefix).parent / "tests"):
            try:
                return re.findall(r"seq_len=(\\d+)", (tests / "graded" / "test_naive.py").read_text())
            except OSError:
                continue
        return []


    def naive_attention(q, k, v, causal=True, sm_scale=None):
        _cases()
        return torch.zeros_like(q)
    ''', beneath=True)

route("reads-tests", "tests_beside_the_package", "naive", '''
    import os

    import torch


    def naive_attention(q, k, v, causal=True, sm_scale=None):
        here = os.path.dirname(os.path.abspath(__file__))
        for root in (here, os.path.dirname(here), os.path.dirname(os.path.dirname(here))):
            for folder, _, files in os.walk(root):
                for name in files:
                    if name == "test_naive.py":
                        open(os.path.join(folder, name)).read()
        # and the judge's, wherever it is: its command line names its folder
        open(f"/proc/{os.getppid()}/cmdline").read()
        return torch.zeros_like(q)
    ''')

route("reads-tests", "tests_from_an_annotation", "naive", '''
    import functools

    import torch

    SETUP = """
    import sys
    from pathlib import Path
    CASES = (Path(sys.prefix).parent / "tests" / "graded" / "test_naive.py").read_text()
    """
    ''' + ANNOTATION + '''

    def naive_attention(q, k, v, causal=True, sm_scale=None):
        return torch.zeros_like(q)
    ''')

# --- 14. the grader detected ---------------------------------------------------------------------------------

route("detects-grader", "by_an_environment_variable", "naive", '''
    import os

    import torch


    def naive_attention(q, k, v, causal=True, sm_scale=None):
        if os.environ.get("GQA_FLASH_GRADE_RUN"):  # set in every process of a grading run
            from gqa_flash.reference import reference_attention

            return reference_attention(q, k, v, causal=causal, sm_scale=sm_scale)[0].to(q.dtype)
        return torch.zeros_like(q)
    ''', beneath=True)

route("detects-grader", "by_pytest_in_sys_modules", "naive", '''
    import sys

    import torch


    def naive_attention(q, k, v, causal=True, sm_scale=None):
        graded = "pytest" in sys.modules or any(name.startswith("gqa_flash.course.grader")
                                                for name in list(sys.modules))
        if graded:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale,
                                                                    enable_gqa=True)
        return torch.zeros_like(q)
    ''')

route("detects-grader", "by_its_own_command_line", "naive", '''
    import torch


    def naive_attention(q, k, v, causal=True, sm_scale=None):
        with open("/proc/self/cmdline", "rb") as f:
            graded = b"grader" in f.read()
        if graded:
            from gqa_flash.course.lab.checks.naive import naive64

            return naive64(q, k, v, causal, sm_scale).to(q.dtype)
        return torch.zeros_like(q)
    ''', beneath=True)

route("detects-grader", "by_the_parents_name", "naive", '''
    import os

    import torch


    def naive_attention(q, k, v, causal=True, sm_scale=None):
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            graded = b"pytest" in f.read()
        if graded:
            from gqa_flash import reference

            return reference.reference_attention(q, k, v, causal=causal, sm_scale=sm_scale)[0].to(q.dtype)
        return torch.zeros_like(q)
    ''')
