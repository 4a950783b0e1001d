"""The static gate (gqa_flash/course/grader/gate.py): what an honest file needs passes, each forbidden construct fails.

Every case is a few lines of source; a forbidden one marks its offending line with ``# <-`` so that the test
checks the rule and the line the gate names. Nothing here runs a kernel or needs a GPU.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gqa_flash.course.grader import stubs
from gqa_flash.course.grader.gate import EXERCISES, Violation, check

ROOT = Path(__file__).resolve().parents[2]
GRADED = sorted(EXERCISES)
STUBS = {path.name: text for path, text in stubs.plan(ROOT / "solutions", ROOT / "gqa_flash").items()}
HEADS = {  # what each kind of file starts with: its stub's imports
    "naive.py": "import torch\n",
    "forward.py": "import torch\nimport triton\nimport triton.language as tl\n\nfrom gqa_flash.course import runtime\n",
}


def gate(name: str, body: str) -> list[Violation]:
    """The gate's verdict on the stub's imports followed by ``body``, with the real stub."""
    return check(name, HEADS[name] + textwrap.dedent(body), STUBS[name])


def marked_line(name: str, body: str) -> int:
    lines = (HEADS[name] + textwrap.dedent(body)).splitlines()
    return next(i for i, line in enumerate(lines, start=1) if line.rstrip().endswith("# <-"))


# --- (a), (b): the solutions and the stubs pass ------------------------------


def test_every_graded_file_has_a_table():
    assert GRADED == sorted(["naive.py", "online_softmax.py", "tiled.py", "forward.py", "windows.py", "backward.py",
                             "decode.py", "ring.py"])


@pytest.mark.parametrize("name", GRADED)
def test_solution_and_stub_pass(name):
    assert check(name, (ROOT / "solutions" / name).read_text(), STUBS[name]) == []
    assert check(name, STUBS[name], STUBS[name]) == []


def test_classic_student_bugs_pass(monkeypatch):
    """The gate refuses cheats, not bugs: every mutant of tests/mutants/ (a solution with a bug) passes."""
    monkeypatch.syspath_prepend(str(ROOT / "tests"))
    from mutants.catalog import MUTANTS

    flagged = {m.name: [str(v) for v in check(m.file, m.apply((ROOT / "solutions" / m.file).read_text()),
                                              STUBS[m.file])] for m in MUTANTS}
    assert MUTANTS and not any(flagged.values()), {k: v for k, v in flagged.items() if v}


# --- (c): honest variants pass ------------------------------------------------

HONEST_PYTORCH = {
    "helper and loop": """
        def _scale(x, s, total=0):
            while total < 3:
                total += 1
            return x * s
        """,
    "math": "import math\n\ndef f(q):\n    return q * (1 / math.sqrt(q.shape[-1]))\n",
    "assert and print": """
        def f(q):
            assert q.dim() == 4, "q is [B, H, N, D]"
            print("shape", q.shape)
        """,
    "class with __init__": """
        class State:
            def __init__(self, m, l):
                super().__init__()
                self.m, self.l = m, l

            def __repr__(self):
                return f"State({self.m}, {self.l})"
        """,
    "for over range": "def f(n):\n    for i in range(0, n, 2):\n        print(i)\n",
    "main guard": 'if __name__ == "__main__":\n    print(torch.zeros(2))\n',
    "annotations, docstring, typing": '''
        from __future__ import annotations

        from dataclasses import dataclass
        from typing import Optional


        @dataclass
        class Tile:
            """A tile's bounds."""
            start: int
            end: Optional[int] = None


        def f(q: torch.Tensor, block: int = 64) -> torch.Tensor:
            """Docstring: what and why."""
            return q
        ''',
    "getattr with a constant": 'def f(x):\n    return getattr(x, "shape"), hasattr(x, "dtype")\n',
    "torch.nn.functional": """
        import torch.nn.functional as F
        from torch.nn import functional

        def f(s):
            return F.softmax(s, dim=-1) + functional.softmax(s, dim=-1) + torch.softmax(s, -1)
        """,
    "input as a tensor's name": "def f(input):\n    return input.float().exp()\n",
}


@pytest.mark.parametrize("body", HONEST_PYTORCH.values(), ids=HONEST_PYTORCH.keys())
def test_honest_pytorch_code_passes(body):
    assert gate("naive.py", body) == []


HONEST_LAUNCHER = """
    import math


    @triton.jit
    def _kernel(Q, O, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        q = tl.load(Q + offs, mask=offs < N, other=0.0)
        s = tl.dot(q[:, None] * 1.0, q[None, :] * 1.0)
        tl.store(O + offs, tl.sum(tl.exp2(s - tl.max(s, 1)[:, None]), 1) @ s, mask=offs < N)


    @torch.no_grad()
    def launch(q, sm_scale=None):
        assert q.is_cuda or runtime.INTERPRETER
        sm_scale = sm_scale or 1 / math.sqrt(q.shape[-1]) * math.log2(math.e)
        q = q.contiguous().view(-1).to(torch.float32)
        o = torch.empty_like(q)
        lse = runtime.empty_output((q.shape[0],), torch.float32, q.device)
        b, h = q.transpose(0, 0).shape[0], q.stride(0)
        _kernel[(triton.cdiv(q.numel(), 16),)](q, o, q.numel(), BLOCK=max(16, triton.next_power_of_2(h)))
        return o, lse, q.data_ptr(), b
    """


def test_honest_launcher_and_kernel_pass():
    assert gate("forward.py", HONEST_LAUNCHER) == []


# --- (d): each forbidden construct fails, with its rule and line --------------

FORBIDDEN = [  # (file, body with the offending line marked, rule)
    ("naive.py", "import os  # <-", "import"),
    ("naive.py", "import sys  # <-", "import"),
    ("naive.py", "import threading  # <-", "import"),
    ("naive.py", "import ctypes  # <-", "import"),
    ("naive.py", "import subprocess  # <-", "import"),
    ("naive.py", "import inspect  # <-", "import"),
    ("naive.py", "import gc  # <-", "import"),
    ("naive.py", "import builtins  # <-", "import"),
    ("naive.py", "from importlib import import_module  # <-", "import"),
    ("naive.py", "from gqa_flash.course import integrity  # <-", "import"),
    ("naive.py", "import gqa_flash.fast  # <-", "import"),
    ("naive.py", "import gqa_flash  # <-", "import"),
    ("naive.py", "from gqa_flash.course.lab import bench  # <-", "import"),
    ("naive.py", "from torch import *  # <-", "import"),
    ("naive.py", "from . import reference  # <-", "import"),
    ("naive.py", "import torch._dynamo  # <-", "import"),
    ("naive.py", "import numpy as np  # <-", "numpy"),
    ("naive.py", "def f(q):\n    return q.numpy()  # <-", "numpy"),
    ("naive.py", 'x = eval("1")  # <-', "reflection"),
    ("naive.py", 'exec("x = 1")  # <-', "reflection"),
    ("naive.py", 'os = __import__("os")  # <-', "reflection"),
    ("naive.py", 'name = "matmul"\nf = getattr(torch, name)  # <-', "reflection"),
    ("naive.py", 'def f(q):\n    setattr(q, "x", 1)  # <-', "reflection"),
    ("naive.py", "g = globals()  # <-", "reflection"),
    ("naive.py", 'text = open("solutions/naive.py").read()  # <-', "reflection"),
    ("naive.py", "b = __builtins__  # <-", "reflection"),
    ("naive.py", 'A = type("A", (), {})  # <-', "reflection"),
    ("naive.py", "frame = (x for x in ()).gi_frame  # <-", "reflection"),
    ("naive.py", "def f(q):\n    return q.__class__  # <-", "dunder"),
    ("naive.py", 'def f(q):\n    return getattr(q, "__class__")  # <-', "dunder"),
    ("naive.py", "def __getattr__(name):  # <-\n    return None", "dunder"),
    ("naive.py", "class T:\n    def __torch_function__(self, *a):  # <-\n        return None", "dunder"),
    ("naive.py", "x = torch.sys  # <-", "module-attribute"),
    ("naive.py", "x = torch._C  # <-", "module-attribute"),
    ("naive.py", 'x = getattr(torch, "_C")  # <-', "module-attribute"),
    ("naive.py", "f = torch.nn.functional.scaled_dot_product_attention  # <-", "module-attribute"),
    ("naive.py", "import torch.nn.functional as F\nf = F.scaled_dot_product_attention  # <-", "module-attribute"),
    ("naive.py", "def f(q, k):\n    return torch.ops.aten.mm(q, k)  # <-", "module-attribute"),
    ("naive.py", 'w = torch.load("weights.pt")  # <-', "module-attribute"),
    ("naive.py", "f = torch.compile  # <-", "module-attribute"),
    ("naive.py", "from torch import distributed  # <-", "module-attribute"),
    ("naive.py", "t = torch  # <-", "module-attribute"),
    ("forward.py", "x = runtime.torch  # <-", "module-attribute"),
    ("forward.py", "def f(q, k):\n    return q @ k  # <-", "host-torch"),
    ("forward.py", "def f(q, k):\n    return torch.matmul(q, k)  # <-", "host-torch"),
    ("forward.py", "def f(q):\n    return q.softmax(-1)  # <-", "host-torch"),
    ("forward.py", "def f(q):\n    return q.float().sum(-1)  # <-", "host-torch"),
    ("forward.py", "from torch import softmax  # <-", "host-torch"),
    ("forward.py", "@triton.jit\ndef k(a, b):\n    return torch.matmul(a, b)  # <-", "host-torch"),
    ("forward.py", "@triton.jit\ndef k(a, b):\n    return a @ b\n\ndef f(q):\n    return k.fn(q, q)  # <-",
     "host-torch"),
]


@pytest.mark.parametrize("name, body, rule", FORBIDDEN, ids=[f"{n}:{b.splitlines()[-1]}" for n, b, _ in FORBIDDEN])
def test_forbidden_construct_fails_with_rule_and_line(name, body, rule):
    line = marked_line(name, body)
    found = gate(name, body)
    assert found, f"the gate let through {body!r}"
    assert {(v.line, v.rule) for v in found} == {(line, rule)}, [str(v) for v in found]
    message = str(found[0])
    assert message.startswith(f"{name} line {line}: ") and f"rule {rule}:" in message


def test_distributed_is_allowed_in_ring_only():
    body = "import torch.distributed as dist\n\ndef f(x):\n    dist.all_reduce(x)\n"
    assert check("ring.py", body, STUBS["ring.py"]) == []
    assert {v.rule for v in check("naive.py", body, STUBS["naive.py"])} == {"import", "module-attribute"}


def test_windows_reaches_forward_through_the_switch_and_no_further():
    """windows.py's stub imports impl to call the student's forward.py (impl.load("forward")); the switch's
    knowledge of the completed files stays out of reach, and importing gqa_flash.forward is refused (it would
    bind the student's file whoever is graded)."""
    head = "import triton\nimport triton.language as tl\n\nfrom gqa_flash.course import impl, runtime\n\n"
    assert check("windows.py", head + 'forward = impl.load("forward")\n', STUBS["windows.py"]) == []
    for body, rule in (("x = impl.SOLUTIONS_DIR\n", "module-attribute"), ("x = impl.completed_dir()\n",
                                                                            "module-attribute"),
                       ("from gqa_flash import forward\n", "import")):
        assert [v.rule for v in check("windows.py", head + body, STUBS["windows.py"])] == [rule], body
    assert [v.rule for v in check("forward.py", head, STUBS["forward.py"])] == ["import"]  # impl: windows.py's


def test_the_stub_own_imports_are_allowed_and_only_those():
    body = "from gqa_flash.course import runtime\n"
    assert check("forward.py", body, STUBS["forward.py"]) == []
    assert [v.rule for v in check("forward.py", body)] == ["import"]  # without the stub: the table alone
    assert [v.rule for v in check("naive.py", body, STUBS["naive.py"])] == ["import"]


def test_message_names_line_rule_and_what_is_allowed():
    (v,) = check("forward.py", "import torch\n\nimport os\n", STUBS["forward.py"])
    assert v == Violation("forward.py", 3, "import", "imports os")
    assert str(v) == ("forward.py line 3: imports os (rule import: forward.py may import only __future__, "
                      "dataclasses, functools, math, torch, triton, triton.language, typing and what its stub "
                      "imports)")


def test_unknown_file_and_syntax_errors():
    with pytest.raises(ValueError, match="not a graded file"):
        check("traffic.py", "")
    assert check("naive.py", "def f(:\n") == []  # graded as its own failure elsewhere
    assert check("naive.py", b"import torch\n") == []  # bytes are fine
    deep = "x = " + "+".join(["1"] * 5000)
    assert [v.rule for v in check("naive.py", deep)] == ["too-complex"]  # fails closed


def test_gate_imports_neither_torch_nor_triton():
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('gate', {str(ROOT / 'gqa_flash/course/grader/gate.py')!r})\n"
        "gate = importlib.util.module_from_spec(spec); sys.modules['gate'] = gate; spec.loader.exec_module(gate)\n"
        "assert gate.check('forward.py', 'import os\\n')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'numpy', 'gqa_flash')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
