"""Full marks only for the student's own work: every route to the course's answers scores its part 0.

Each submission below hands a graded part's work to something that is not the
student's: the fast kernels (through the public API or their module), the
float64 reference, a notebook check's float64 model, PyTorch's attention. The
grader must score that part 0, say so in its own ``integrity`` field (and CSV
column), and leave the other parts alone. Underneath, gqa_flash.course.integrity's
guard is tested on its own: a kernel launched from another file, a Triton
helper of the fast kernels called inside the student's kernel, and the honest
call, which must pass.
"""

import csv
import os
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import triton
import triton.language as tl

import gqa_flash
from gqa_flash.course import impl, integrity, testing
from gqa_flash.course.grader import grade, sandbox, testrun
from gqa_flash.course.grader.report import GradeBook, table

SOLUTIONS = impl.SOLUTIONS_DIR


def solution(name):
    return (SOLUTIONS / name).read_text()


# The graded file does only this, as the trials that found the holes wrote it.
ROUTES = {
    "forward_calls_the_fast_api": ("forward", "called gqa_flash.fast_attention_forward", '''
        import gqa_flash
        INTERPRETER_CONFIG = dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1)

        def flash_attention_forward(q, k, v, causal=True, sm_scale=None, return_lse=False):
            return gqa_flash.fast_attention_forward(q, k, v, causal=causal, sm_scale=sm_scale, return_lse=return_lse)
        '''),
    "forward_calls_the_fast_module": ("forward", "gqa_flash.fast.forward.fast_attention_forward", '''
        import importlib
        INTERPRETER_CONFIG = dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1)

        def flash_attention_forward(q, k, v, causal=True, sm_scale=None, return_lse=False):
            fast = importlib.import_module("gqa_flash.fast.forward")
            return fast.fast_attention_forward(q, k, v, causal=causal, sm_scale=sm_scale, return_lse=return_lse)
        '''),
    "forward_calls_sdpa": ("forward", "PyTorch's torch.nn.functional.scaled_dot_product_attention", '''
        import torch
        INTERPRETER_CONFIG = dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1)

        def flash_attention_forward(q, k, v, causal=True, sm_scale=None, return_lse=False):
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale,
                                                                 enable_gqa=True)
            return (o, torch.zeros(q.shape[:3])) if return_lse else o
        '''),
    "backward_calls_the_fast_api": ("backward", "called gqa_flash.fast_attention_backward", '''
        import gqa_flash

        def flash_attention_backward(q, k, v, o, lse, do, causal=True, sm_scale=None):
            return gqa_flash.fast_attention_backward(q, k, v, o, lse, do, causal=causal, sm_scale=sm_scale)
        '''),
    "tiled_calls_the_reference": ("tiled", "called gqa_flash.reference.reference_attention", '''
        import gqa_flash

        def tiled_attention(q, k, v, causal=True, sm_scale=None, block_m=64, block_n=64, return_lse=False):
            o, lse = gqa_flash.reference_attention(q, k, v, causal=causal, sm_scale=sm_scale)
            return (o.to(q.dtype), lse.float()) if return_lse else o.to(q.dtype)
        '''),
    "naive_calls_sdpa": ("naive", "scaled_dot_product_attention", '''
        import torch

        def naive_attention(q, k, v, causal=True, sm_scale=None):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale,
                                                                    enable_gqa=True)
        '''),
}
ROUTES["naive_calls_sdpa_with_the_hooks_off"] = ("naive", "switched off PyTorch's hooks", '''
        import torch

        def naive_attention(q, k, v, causal=True, sm_scale=None):
            with torch._C.DisableTorchFunction():
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale,
                                                                        enable_gqa=True)
        ''')
ROUTES["tiled_runs_the_reference_in_a_thread"] = ("tiled", "started a thread", '''
        import threading
        import gqa_flash

        def tiled_attention(q, k, v, causal=True, sm_scale=None, block_m=64, block_n=64, return_lse=False):
            q[..., :block_m, :] @ k[..., :block_n, :].transpose(-1, -2)  # one tile, for the count
            out = {}
            worker = threading.Thread(target=lambda: out.update(r=gqa_flash.reference_attention(q, k, v, causal,
                                                                                            sm_scale)))
            worker.start()
            worker.join()
            o, lse = out["r"]
            return (o.to(q.dtype), lse.float()) if return_lse else o.to(q.dtype)
        ''')
# A merge that returns the notebook check's float64 answer: the rest of online_softmax.py is the solution's.
MERGE_FROM_THE_CHECK = solution("online_softmax.py").replace(
    "def merge_states(m_a, l_a, m_b, l_b):\n",
    "def merge_states(m_a, l_a, m_b, l_b):\n"
    "    from gqa_flash.course.lab.checks.softmax import _merge64\n"
    "    return tuple(t.float() for t in _merge64(m_a, l_a, m_b, l_b))\n", 1)
ROUTES["online_softmax_merge_from_the_check"] = ("online_softmax", "gqa_flash.course.lab.checks.softmax",
                                                 MERGE_FROM_THE_CHECK)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("integrity")
    work = tmp_path_factory.mktemp("grading")
    course = sandbox.snapshot()
    jobs = {}
    for name, (part, _, code) in ROUTES.items():
        folder = root / name
        folder.mkdir()
        (folder / f"{part}.py").write_text(textwrap.dedent(code) if code.startswith("\n") else code)
        if part != "naive":  # an honest part beside it, which must keep its points
            (folder / "naive.py").write_text(solution("naive.py"))
        jobs[name] = (folder, {part, "naive"})
    limits = testrun.Limits(timeout_cap_s=120, gate=False)  # the layer beneath the static gate: the guard

    def run(item):
        name, (folder, only) = item
        return name, grade.grade(folder, course=course, only=only, workdir=work, limits=limits)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return dict(pool.map(run, jobs.items()))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("route", list(ROUTES))
def test_a_part_that_hands_its_work_to_the_course_scores_0_and_is_flagged(graded, route):
    part, called, _ = ROUTES[route]
    report = graded[route]
    assert report.part_score(part)[0] == 0, table(report)
    assert any(flag.startswith(f"{part}.py scores 0") and called in flag for flag in report.integrity), \
        (report.integrity, table(report))
    line = next(t.message for t in report.tests if t.part == part and t.integrity)
    assert line.startswith(f"integrity: {part}.py line ") and called in line, line
    if part != "naive":  # the honest part beside it keeps its points
        assert report.part_score("naive") == (20, 20), table(report)
    assert "INTEGRITY" in table(report) and "INTEGRITY" in report.summary()


def test_the_gradebook_has_an_integrity_column(graded, tmp_path):
    book = GradeBook(tmp_path / "grades.csv", ["naive", "forward"], hidden=False)
    book.add(graded["forward_calls_the_fast_api"])
    rows = list(csv.DictReader(open(tmp_path / "grades.csv")))
    assert rows[0]["forward"] == "0" and "fast_attention_forward" in rows[0]["integrity"], rows
    assert "fast_attention_forward" not in rows[0]["notes"], "the flag has a column of its own, not a note"


# --- the guard itself, in this process --------------------------------------------------------------


@triton.jit
def _copy_kernel(X, Y, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(Y + offs, tl.load(X + offs))


def test_a_kernel_defined_elsewhere_is_refused():
    x = torch.arange(16.0, device=gqa_flash.course.runtime.DEVICE)
    y = torch.empty_like(x)
    with pytest.raises(integrity.IntegrityViolation, match=r"launched the kernel _copy_kernel of tests/"):
        with integrity.own_work("forward"):
            _copy_kernel[(1,)](x, y, N=16)
    _copy_kernel[(1,)](x, y, N=16)  # outside the guard nothing is patched any more
    assert torch.equal(x, y)


def _as_graded_forward(graded):
    """The kernels of a file written in a test, and the guard that takes that file for the graded forward.py."""
    namespace = {}
    exec(compile(graded.read_text(), str(graded), "exec"), namespace)
    return namespace, integrity.own_work("forward", file=graded)


def test_a_fast_kernel_helper_inside_the_students_kernel_is_refused(tmp_path):
    if not gqa_flash.course.runtime.INTERPRETER:
        pytest.skip("a compiled kernel inlines its helpers; the interpreter calls them")
    graded = tmp_path / "forward.py"
    graded.write_text(textwrap.dedent('''
        import triton
        import triton.language as tl
        from gqa_flash.fast import windows as fast


        @triton.jit
        def kernel(Y, N: tl.constexpr):
            acc, row_sum, row_max = fast.start_state(N, N, Y, 0, False)
            tl.store(Y + tl.arange(0, N), row_sum)
        '''))
    namespace, guard = _as_graded_forward(graded)
    y = torch.empty(16, device=gqa_flash.course.runtime.DEVICE)
    with pytest.raises(integrity.IntegrityViolation, match=r"called the Triton function start_state of "
                                                           r"gqa_flash/fast/windows.py"):
        with guard:
            namespace["kernel"][(1,)](y, N=16)


def test_a_fast_helper_run_as_plain_python_inside_the_students_kernel_is_refused(tmp_path):
    # .fn is the helper's Python function: the interpreter runs it without a jit call the guard could see.
    if not gqa_flash.course.runtime.INTERPRETER:
        pytest.skip("a compiled kernel cannot call a plain Python function")
    graded = tmp_path / "forward.py"
    graded.write_text(textwrap.dedent('''
        import triton
        import triton.language as tl
        from gqa_flash.fast import forward as fast


        @triton.jit
        def kernel(S, V, Y, N: tl.constexpr):
            offs = tl.arange(0, N)
            s = tl.load(S + offs[:, None] * N + offs[None, :])
            v = tl.load(V + offs[:, None] * N + offs[None, :])
            acc = tl.zeros([N, N], dtype=tl.float32)
            row_sum = tl.zeros([N], dtype=tl.float32)
            row_max = tl.full([N], float("-inf"), dtype=tl.float32)
            acc, row_sum, row_max = fast._fold.fn(acc, row_sum, row_max, s, v, 1.0, "ieee")
            tl.store(Y + offs[:, None] * N + offs[None, :], acc)
        '''))
    namespace, guard = _as_graded_forward(graded)
    s, v, y = (torch.randn(16, 16) for _ in range(3))
    with pytest.raises(integrity.IntegrityViolation, match=r"called gqa_flash.fast.forward._fold"):
        with guard:
            namespace["kernel"][(1,)](s, v, y, N=16)


def test_the_honest_kernel_passes_the_guard():
    q, k, v = testing.random_qkv(seq_len=20, head_dim=16)
    with testing.kernel_only() as launches:  # the forward's own work, at its own addresses
        out = gqa_flash.flash_attention_forward(q, k, v)
    assert launches.count > 0
    testing.assert_attention_matches(out, q, k, v, causal=True, sm_scale=None, return_lse=False)


@pytest.mark.skipif(not (SOLUTIONS / "windows.py").is_file(), reason="the student edition has no solutions/")
def test_the_helpers_of_the_file_windows_py_builds_on_are_its_own_work(monkeypatch):
    # windows.py calls forward.py's helpers (layout's builds_on). With the completed files behind the switch,
    # forward's are in solutions/, which the guard refuses to any other file: to windows.py they are its own.
    monkeypatch.setenv("GQA_FLASH_IMPL", "solutions")
    q, k, v = testing.random_qkv(seq_len=40, head_dim=16)
    with testing.kernel_only("flash_attention_forward", part="windows") as launches:
        out = gqa_flash.flash_attention_forward(q, k, v, window=5, sink_tokens=1)
    assert launches.count == 1
    testing.assert_matches("O", out, gqa_flash.reference_attention(q, k, v, window=5, sink_tokens=1)[0], q.dtype)
    with pytest.raises(integrity.IntegrityViolation, match=r"^integrity: forward\.py "):  # not the other way round
        with testing.kernel_only():
            gqa_flash.flash_attention_forward(q, k, v, window=5)


@triton.jit
def _copy_by_descriptors(X, Y, N, D, stride_n, BLOCK: tl.constexpr, DP: tl.constexpr):
    src = tl.make_tensor_descriptor(X, shape=[N, D], strides=[stride_n, 1], block_shape=[BLOCK, DP])
    dst = tl.make_tensor_descriptor(Y, shape=[N, D], strides=[stride_n, 1], block_shape=[BLOCK, DP])
    dst.store([tl.program_id(0) * BLOCK, 0], src.load([tl.program_id(0) * BLOCK, 0]))


@triton.jit
def _copy_by_host_descriptors(XD, YD, BLOCK: tl.constexpr):
    YD.store([tl.program_id(0) * BLOCK, 0], XD.load([tl.program_id(0) * BLOCK, 0]))


@pytest.mark.skipif(not gqa_flash.course.runtime.INTERPRETER, reason="the address check runs in the interpreter")
def test_tensor_descriptor_loads_pass_the_address_check():
    """An honest kernel may load through tensor descriptors, made in the kernel or on the host: the interpreter
    loads them with a cache_policy keyword, and the address check must take it (it once failed every such load)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    x = torch.randn(37, 24)
    y, y2 = torch.zeros_like(x), torch.zeros_like(x)
    with testing.kernel_only(part=None) as launches:
        _copy_by_descriptors[(triton.cdiv(37, 16),)](x, y, 37, 24, x.stride(0), BLOCK=16, DP=32)
        _copy_by_host_descriptors[(3,)](TensorDescriptor.from_tensor(x, [16, 32]),
                                        TensorDescriptor.from_tensor(y2, [16, 32]), BLOCK=16)
    assert launches.count == 2 and torch.equal(x, y) and torch.equal(x, y2)


def test_a_lazy_tensor_is_refused():
    # A tensor subclass could compute its values when the test reads them, outside the graded call.
    class Lazy(torch.Tensor):
        pass

    q, k, v = testing.random_qkv(seq_len=8, head_dim=16, device="cpu")
    out = gqa_flash.reference_attention(q, k, v)[0].float().as_subclass(Lazy)
    with pytest.raises(AssertionError, match="plain torch.Tensor"):
        testing.assert_matches("O", out, out.double(), torch.float32)


def test_the_static_check_names_the_routes(tmp_path):
    from gqa_flash.course.grader import submission

    (tmp_path / "forward.py").write_text(textwrap.dedent(ROUTES["forward_calls_the_fast_api"][2]))
    sub = submission.read(tmp_path)
    assert any("fast_attention_forward (line 6)" in f for f in sub.flags), sub.flags
    assert any(f.endswith("which reaches the course's own answers or checks") for f in sub.flags), sub.flags
    # SDPA is PyTorch's, not the course's (issue 47: the flag said it reached the course's answers)
    (tmp_path / "forward.py").write_text(textwrap.dedent(ROUTES["forward_calls_sdpa"][2]))
    (flag,) = submission.read(tmp_path).flags
    assert flag.endswith("scaled_dot_product_attention (line 6), which is PyTorch's own attention, not the "
                         "student's"), flag
    (tmp_path / "forward.py").write_text(solution("forward.py"))
    assert submission.read(tmp_path).flags == [], "the solution names nothing of the course's answers"



@triton.autotune(configs=[triton.Config({"BLOCK": 16})], key=["n"])
@triton.jit
def _doubled_autotuned(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def test_a_launch_through_the_autotuner_counts_once():
    """On a GPU the course's kernels launch through @triton.autotune; kernel_only counted none of those (the
    autotuner's own run was not counted and hid the kernel's), so every graded forward test failed there
    with "must launch the Triton kernel"."""
    x = torch.ones(16)
    with testing.kernel_only("a test's kernel", part=None) as launches:
        _doubled_autotuned[(1,)](x, 16)
        _doubled_autotuned[(1,)](x, 16)
    assert launches.count == 2 and torch.equal(x, torch.full((16,), 4.0))
