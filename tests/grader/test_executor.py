"""The judge apart: what crosses between the judge and the executor, and what the executor's death costs.

The wire (gqa_flash/course/grader/wire.py) carries a tensor to the executor as the view it is (strides, offset, the
NaN padding past a view), and back only as a dense tensor of a stated shape and dtype, built from bytes: no
pickle, no object of the student's. A crash, an exit or a hang in the executor fails the one call it happened
in, and the next call gets a fresh executor. The audit hook refuses what graded code never needs, even when
the code catches the refusal.
"""

import signal
import struct
import textwrap

import pytest
import torch

from gqa_flash.course import testing
from gqa_flash.course.grader import calls, cli, isolation, wire
from gqa_flash.course.grader.report import table
from gqa_flash.course.integrity import IntegrityViolation


@pytest.mark.parametrize("layout", ["contiguous", "bnhd", "strided", "padded"])
def test_a_view_reaches_the_executor_as_the_view_it_is(layout):
    q, k, v = testing.random_qkv(layout=layout, seed=3, device="cpu")
    got = wire.decode(wire.encode([q, (k, v), {"n": 3, "x": float("nan")}, torch.float16, None]))
    assert got[0].stride() == q.stride() and got[0].storage_offset() == q.storage_offset()
    assert torch.equal(got[0].nan_to_num(), q.nan_to_num()) and torch.equal(got[1][1], v)
    assert got[0].untyped_storage().nbytes() == q.untyped_storage().nbytes()  # the padding travels too
    assert got[2]["n"] == 3 and got[2]["x"] != got[2]["x"] and got[3] is torch.float16 and got[4] is None


def test_a_reply_holds_dense_tensors_and_the_names_of_anything_else():
    class Sneaky(torch.Tensor):
        pass

    value = [torch.arange(6.0).view(2, 3).t(), torch.zeros(2).as_subclass(Sneaky), object(), (1, "a")]
    got = wire.decode(wire.encode(value, dense=True), dense=True)
    assert torch.equal(got[0], value[0]) and got[0].is_contiguous() and type(got[0]) is torch.Tensor
    assert type(got[1]).__name__ == "Sneaky" and isinstance(got[1], wire.Foreign)
    assert type(got[2]).__name__ == "object" and got[3] == (1, "a")


def test_the_judge_refuses_a_reply_that_is_not_dense_or_not_whole():
    view = wire.encode([torch.zeros(3)])  # a view, as the judge sends: not what a reply may hold
    with pytest.raises(wire.WireError, match="dense"):
        wire.decode(view, dense=True)
    whole = wire.encode(torch.zeros(4), dense=True)
    with pytest.raises(wire.WireError):
        wire.decode(whole[:-4], dense=True)  # a tensor longer than its message
    header = b'{"$t": 0, "dtype": "float32", "shape": [1000000000, 1000000000]}'
    with pytest.raises(wire.WireError, match="larger"):
        wire.decode(struct.pack("<Q", len(header)) + header, dense=True)
    header = b'{"$t": 0, "dtype": "object", "shape": [1]}'
    with pytest.raises(wire.WireError, match="dtype"):
        wire.decode(struct.pack("<Q", len(header)) + header, dense=True)


def test_bubblewrap_exit_codes_read_as_signals():
    assert "SIGSEGV" in calls.death(128 + signal.SIGSEGV) and "SIGSEGV" in calls.death(-signal.SIGSEGV)
    assert "exit code 3" in calls.death(3) and "os._exit" in calls.death(3)


@pytest.fixture(scope="module")
def executor(tmp_path_factory):
    """An executor on a course folder whose naive.py misbehaves on request (by its inputs' first value)."""
    from gqa_flash.course.grader import sandbox

    tree = tmp_path_factory.mktemp("executor")
    course = sandbox.snapshot()
    sandbox.build_executor(course, tree, {"naive.py": textwrap.dedent('''
        import torch


        def naive_attention(q, k, v, causal=True, sm_scale=None):
            what = int(q.flatten()[0])
            if what == 1:
                raise ValueError("q is wrong")
            if what == 2:
                import ctypes
                ctypes.string_at(0)
            if what == 3:
                import os
                os._exit(3)
            if what == 4:
                while True:
                    pass
            if what == 5:
                try:
                    open("/etc/hostname-of-the-grader", "w")
                except Exception:
                    pass
            if what == 9:
                raise SystemExit(3)
            return q * 2
        ''').encode()})
    ex = calls.Executor(tree=tree, kind="bwrap" if isolation.bwrap_works() else "none", impl="student")
    yield ex
    ex.stop()


def _q(what):
    q = torch.zeros(1, 1, 2, 4)
    q[0, 0, 0, 0] = what
    return q


def test_the_students_exception_comes_back_as_itself_with_its_line(executor):
    with pytest.raises(ValueError, match="q is wrong") as info:
        executor.call("naive_attention", _q(1), _q(0), _q(0))
    assert info.value.student_where == "naive.py, line 8"
    with pytest.raises(calls.StudentRaised, match="SystemExit"):  # sys.exit is an exception like any other
        executor.call("naive_attention", _q(9), _q(0), _q(0))
    assert torch.equal(executor.call("naive_attention", _q(6), _q(0), _q(0)).value, _q(6) * 2)


def test_ctypes_is_refused_and_a_crash_costs_one_call(executor):
    with pytest.raises(IntegrityViolation, match="line 11 used ctypes"):
        executor.call("naive_attention", _q(2), _q(0), _q(0))
    with pytest.raises(calls.StudentCrash, match="exit code 3"):
        executor.call("naive_attention", _q(3), _q(0), _q(0))
    assert torch.equal(executor.call("naive_attention", _q(7), _q(0), _q(0)).value, _q(7) * 2)  # a fresh one


def test_a_refusal_the_code_caught_still_fails_the_call(executor):
    with pytest.raises(IntegrityViolation, match="to write"):
        executor.call("naive_attention", _q(5), _q(0), _q(0))


@pytest.mark.timeout(60)
def test_a_hang_is_stopped_by_the_judges_limit_and_the_executor_replaced(executor):
    def alarm(signum, frame):
        raise TimeoutError("the judge's limit")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(3)
    try:
        with pytest.raises(TimeoutError):
            executor.call("naive_attention", _q(4), _q(0), _q(0))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert executor.proc is None  # killed: its state is no longer to be trusted
    assert torch.equal(executor.call("naive_attention", _q(8), _q(0), _q(0)).value, _q(8) * 2)


def test_on_a_gpu_only_the_programs_triton_starts_may_start(tmp_path, monkeypatch):
    """Triton compiles for a GPU with ptxas (in its package), a C compiler, ldconfig and file: those, by real
    path, pass the audit hook; a program of the same name elsewhere does not, and a refusal names the program."""
    import os
    import shutil

    from gqa_flash.course.grader import audit

    cc = shutil.which("cc") or shutil.which("gcc")
    fake = tmp_path / "gcc"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setattr(audit._State, "tools", (str(tmp_path / "triton"),))
    monkeypatch.setattr(audit._State, "programs", isolation.triton_programs())
    assert audit._a_tool(str(tmp_path / "triton" / "backends" / "nvidia" / "bin" / "ptxas"))
    assert not audit._a_tool(str(fake)) and not audit._a_tool(str(tmp_path / "triton-not" / "ptxas"))
    if cc:
        assert audit._a_tool(cc) and audit._a_tool(os.path.basename(cc))
        monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
        assert not audit._a_tool("gcc")  # the first gcc on PATH is now the fake one
    monkeypatch.setattr(audit._State, "active", True)
    with pytest.raises(IntegrityViolation, match=r"tried subprocess.Popen \(gcc\)"):
        audit._hook("subprocess.Popen", (str(fake), [str(fake)], None, None))
    with pytest.raises(IntegrityViolation, match=r"tried os.posix_spawn \(gcc\)"):
        audit._hook("os.posix_spawn", (str(fake), [str(fake)], {}))
    monkeypatch.setattr(audit._State, "refused", [])


def test_on_a_gpu_the_interpreter_harnesses_go_to_a_sibling_with_the_gpu_hidden(monkeypatch, tmp_path):
    """score_tiles and probe count a kernel's work in Triton's interpreter: on a GPU machine the judge sends them
    to a second executor (CUDA hidden, TRITON_INTERPRET=1), and an executor on the GPU refuses them."""
    from gqa_flash.course import runtime
    from gqa_flash.course.grader import executor as executor_module

    monkeypatch.setattr(calls, "_gpu", lambda: True)
    ex = calls.Executor(tree=tmp_path, kind="none", impl="student")
    sibling = ex.in_interpreter()
    assert sibling is not ex and sibling.interpreter and ex.in_interpreter() is sibling
    assert sibling.in_interpreter() is sibling
    monkeypatch.setattr(calls, "_gpu", lambda: False)
    assert calls.Executor(tree=tmp_path, kind="none").in_interpreter().interpreter is False
    monkeypatch.setattr(runtime, "INTERPRETER", False)
    for kernel in ("forward", "windows", "backward"):
        reply = executor_module.handle({"op": "score_tiles", "kernel": kernel, "kwargs": {}})
        assert reply["ok"] is False and "TRITON_INTERPRET=1" in reply["error"]["message"]
    reply = executor_module.handle({"op": "score_tiles", "kernel": "decode", "kwargs": {}})
    assert reply["ok"] is False and "no kernel 'decode'" in reply["error"]["message"]
    sent = []
    monkeypatch.setattr(calls.Executor, "request", lambda self, message: sent.append((self, message)) or calls.Reply(
        [{}, {}]))
    monkeypatch.setattr(calls, "_gpu", lambda: True)
    ex.score_tiles(kernel="backward", seq_len=40)
    assert sent == [(sibling, {"op": "score_tiles", "kwargs": {"seq_len": 40}, "kernel": "backward"})]


def test_the_interpreter_takes_a_loop_bound_computed_from_the_program_id():
    """Triton 3.6's interpreter with NumPy 2.4 could not (runtime._index_one_element_arrays mends it)."""
    import triton
    import triton.language as tl

    @triton.jit
    def count_blocks(out_ptr, BLOCK: tl.constexpr):
        total = 0
        for _ in range(0, (tl.program_id(0) + 1) * BLOCK, BLOCK):
            total += 1
        tl.store(out_ptr + tl.program_id(0), total)

    out = torch.zeros(3, dtype=torch.int32)
    count_blocks[(3,)](out, BLOCK=16)
    assert out.tolist() == [1, 2, 3]


def test_a_venv_reached_through_a_link_runs_in_the_sandbox(tmp_path):
    """An instructor's .venv may be a link to a venv elsewhere: the sandbox showed the venv only at its real
    path, so the executor, started by the linked path, was not found ("execvp .../.venv/bin/python: No such
    file or directory") and grading fell back to no isolation."""
    import subprocess
    import sys
    from pathlib import Path

    from gqa_flash.course import layout

    if sys.prefix == sys.base_prefix:
        pytest.skip("not run from a virtual environment")
    if not isolation.bwrap_works():
        pytest.skip(f"no bubblewrap here: {isolation.bwrap_problem()}")
    link = tmp_path / ".venv"
    link.symlink_to(Path(sys.prefix).resolve())
    done = subprocess.run([str(link / "bin" / "python"), "-c", "from gqa_flash.course.grader import isolation as i; "
                           "print(i._python_links(), i.bwrap_problem())"], capture_output=True, text=True,
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(layout.COURSE_DIR)},
                          timeout=60)
    assert done.stdout.strip().endswith("None") and str(link) in done.stdout, done.stdout + done.stderr


def test_bubblewrap_runs_here_in_ci():
    """CI installs bubblewrap (make test does): the sandbox must then really run, not fall back silently."""
    import os

    if not os.environ.get("CI"):
        pytest.skip("outside CI a machine may lack bubblewrap: the grader then says NOT ISOLATED")
    assert isolation.bwrap_works(), isolation.bwrap_problem()
    assert isolation.choose("auto") == "bwrap"


@pytest.mark.timeout(300)
def test_grading_without_isolation_says_so_everywhere(tmp_path, monkeypatch, capsys):
    """Where no sandbox runs, the table, Gradescope's output, the CSV's isolation column and the batch's summary
    say NOT ISOLATED; never silently."""
    import csv

    from gqa_flash.course import impl
    from gqa_flash.course.grader import grade
    from gqa_flash.course.testing import folder

    monkeypatch.setenv("GQA_FLASH_ISOLATION", "none")
    subs = [folder(tmp_path, name, {"naive.py": (impl.SOLUTIONS_DIR / "naive.py").read_text()}) for name in "ab"]
    book = tmp_path / "grades.csv"
    assert cli.main([*map(str, subs), "--only", "naive", "--csv", str(book), "--jobs", "2",
                       "--workdir", str(tmp_path)]) == 0
    assert "NOT ISOLATED" in capsys.readouterr().out  # the summary
    rows = list(csv.DictReader(book.open()))
    assert [r["isolation"] for r in rows] == ["none", "none"] and all(r["score"] == "20" for r in rows)
    report = grade.grade(subs[0], only={"naive"}, workdir=tmp_path)
    assert "NOT ISOLATED" in table(report) and "NOT ISOLATED" in report.summary()


def test_on_a_gpu_the_executor_runs_each_autotuner_on_one_config(monkeypatch):
    """A graded call checks a kernel's answers; the autotuner's search of every candidate at every new shape
    is what made a graded forward test take ~25 s on an H100. The executor keeps the first candidate that the
    kernel's own pruning leaves (here, in the interpreter, a search would fail outright: it times on a GPU)."""
    import triton
    import triton.language as tl
    from triton.runtime.autotuner import Autotuner

    from gqa_flash.course.grader import executor as executor_module

    @triton.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["n"],
                     prune_configs_by={"early_config_prune": lambda configs, named, **kw: configs[::-1]})
    @triton.jit
    def doubled(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)

    monkeypatch.setattr(Autotuner, "prune_configs", Autotuner.prune_configs)  # restored after the test
    monkeypatch.setattr(Autotuner, "run", Autotuner.run)
    executor_module.one_config_per_autotuner()
    x = torch.ones(40)
    doubled[lambda meta: (triton.cdiv(40, meta["BLOCK"]),)](x, 40)
    assert torch.equal(x, torch.full((40,), 2.0)) and doubled.best_config.kwargs == {"BLOCK": 32}


def test_where_the_first_candidate_does_not_fit_the_gpu_the_executor_takes_the_next(monkeypatch):
    """On an H100 the solutions' forward failed test_forward_head_dim_256 under the grader: "OutOfResources: out
    of resource: shared memory, Required: 344320, Hardware limit: 232448". The first candidate its pruning
    leaves (64x64, 3 stages) does not fit at head dim 256; the autotuner's search would have passed over it.
    The executor now runs the next candidate instead, and keeps searching no further."""
    import triton
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.errors import OutOfResources

    from gqa_flash.course.grader import executor as executor_module

    launched = []

    def kernel():  # what the autotuner finds at the bottom of its .fn chain
        pass

    class Launcher:  # a kernel whose tiles past 32 need more shared memory than the GPU has
        arg_names = ["x", "n"]

        def __init__(self):
            self.fn = kernel

        def run(self, *args, **meta):
            launched.append(meta["BLOCK"])
            if meta["BLOCK"] > 32:
                raise OutOfResources(344320, 232448, "shared memory")
            return meta["BLOCK"]

    monkeypatch.setattr(Autotuner, "prune_configs", Autotuner.prune_configs)
    monkeypatch.setattr(Autotuner, "run", Autotuner.run)
    executor_module.one_config_per_autotuner()
    tuner = Autotuner(Launcher(), ["x", "n"], [triton.Config({"BLOCK": b}) for b in (128, 64, 32, 16)], ["n"],
                      None, None)
    assert tuner.run(None, 100) == 32 and launched == [128, 64, 32]
    assert tuner.run(None, 100) == 32 and launched[3:] == [32]  # the shape keeps the candidate that fit
    everything = Autotuner(Launcher(), ["x", "n"], [triton.Config({"BLOCK": b}) for b in (128, 64)], ["n"], None,
                           None)
    with pytest.raises(OutOfResources):  # none fits: the error the kernel gave, as the search would give it
        everything.run(None, 100)


def test_a_kernel_that_does_not_compile_is_placed_at_the_compilers_line(tmp_path):
    """On an H100 a backward.py whose pT was not cast before tl.dot failed its graded tests "(backward.py, line
    356)": the launch, in the given code, where a GPU's compiler raises. The notebook's check said line 186,
    the dot itself. The executor now reads the compiler's line, as the check does."""
    import importlib.util

    from triton.compiler.errors import CompilationError

    from gqa_flash.course.grader import executor as executor_module

    kernel = "def backward_dkdv(q, k):\n    s = tl.dot(k, q)\n    dv = tl.dot(pT, do)\n"
    graded = tmp_path / "gqa_flash" / "backward.py"
    graded.parent.mkdir()
    graded.write_text("import x\n\n" + kernel + "\n\ndef launch(error):\n    raise error\n")
    spec = importlib.util.spec_from_file_location("graded_backward_for_test", graded)
    module = importlib.util.module_from_spec(spec)
    source = graded.read_text().replace("import x\n", "")
    exec(compile("\n" + source, str(graded), "exec"), module.__dict__)  # the file's own line numbers
    node = type("Node", (), {"lineno": 3, "col_offset": 9})()
    try:
        module.launch(CompilationError(kernel, node, "AssertionError('Both operands must be same dtype')"))
    except CompilationError as exc:
        assert executor_module.where(exc) == "backward.py, line 5"  # the dot's line in the file, not line 9


def test_in_the_interpreter_a_kernels_error_is_placed_at_its_own_line(tmp_path):
    """On a CPU the same pT bug read "(backward.py, line 356)" too: Triton's interpreter re-raises the kernel's
    AssertionError at the launch, and only the exception it was raised from holds the kernel's frame."""
    import importlib.util

    from gqa_flash.course import impl, testing
    from gqa_flash.course.grader import executor as executor_module
    from gqa_flash.reference import reference_attention

    solution = (impl.SOLUTIONS_DIR / "backward.py").read_text()
    if "dv += tl.dot(pT.to(do.dtype), do" not in solution:
        pytest.skip("the student edition has no solutions/")
    planted = tmp_path / "gqa_flash" / "backward.py"
    planted.parent.mkdir()
    planted.write_text(solution.replace("dv += tl.dot(pT.to(do.dtype), do", "dv += tl.dot(pT, do"))
    line = planted.read_text().splitlines().index(next(ln for ln in planted.read_text().splitlines()
                                                       if "dv += tl.dot(pT, do" in ln)) + 1
    spec = importlib.util.spec_from_file_location("planted_backward_for_test", planted)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    q, k, v = testing.random_qkv(batch=1, n_q_heads=2, n_kv_heads=1, seq_len=20, head_dim=16, dtype=torch.float16,
                                 seed=1, device="cpu")
    o, lse = reference_attention(q, k, v, causal=True)
    with pytest.raises(Exception) as raised:
        module.flash_attention_backward(q, k, v, o.to(q.dtype), lse.float(), torch.randn_like(q), causal=True)
    assert executor_module.where(raised.value) == f"backward.py, line {line}"
