"""Runtime detection and the implementation switch."""

import os
import subprocess
import sys

import pytest
import torch

import gqa_flash
from gqa_flash.course import impl, layout, runtime


def run_python(code, **env):
    full_env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "GQA_FLASH_IMPL")}
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=120)


def test_describe_names_device_interpreter_and_versions():
    import triton

    line = gqa_flash.describe()
    assert "device:" in line and torch.__version__ in line and triton.__version__ in line
    assert ("interpreter" in line) == runtime.INTERPRETER


def test_without_a_gpu_the_interpreter_is_switched_on_before_kernels_are_defined():
    result = run_python(
        "import os, gqa_flash.forward as f; from gqa_flash.course import runtime;"
        "print(os.environ['TRITON_INTERPRET'], runtime.INTERPRETER, runtime.DEVICE, runtime.default_dtype());"
        "print(type(f._flash_attention_forward_gqa_kernel).__name__)",
        CUDA_VISIBLE_DEVICES="",
    )
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()
    assert first == "1 True cpu torch.float16"
    assert second == "InterpretedFunction"


def test_a_users_own_triton_interpret_setting_is_kept():
    result = run_python("import os, gqa_flash; print(os.environ['TRITON_INTERPRET'])", TRITON_INTERPRET="1")
    assert result.stdout.strip() == "1"


def test_switch_rejects_unknown_values():
    result = run_python("import gqa_flash, torch; gqa_flash.naive_attention(*[torch.randn(1,1,2,4)]*3)",
                        GQA_FLASH_IMPL="teacher")
    assert result.returncode != 0 and "GQA_FLASH_IMPL must be one of student, solutions; got 'teacher'" in result.stderr


@pytest.mark.skipif(not impl.SOLUTIONS_DIR.is_dir(), reason="the student edition has no solutions/")
def test_switch_chooses_the_files(monkeypatch):
    monkeypatch.setenv("GQA_FLASH_IMPL", "solutions")
    assert impl.load("naive").__file__ == str(impl.SOLUTIONS_DIR / "naive.py")
    monkeypatch.setenv("GQA_FLASH_IMPL", "student")
    assert impl.load("naive").__file__ == str(layout.PACKAGE_DIR / "naive.py")
    assert impl.load("naive") is sys.modules["gqa_flash.naive"]


def test_load_reimports_a_file_that_changed(tmp_path, monkeypatch):
    monkeypatch.setattr(impl, "SOLUTIONS_DIR", tmp_path)
    target = tmp_path / "naive.py"
    target.write_text("VERSION = 1\n")
    assert impl.load("naive", "solutions").VERSION == 1
    assert impl.load("naive", "solutions") is impl.load("naive", "solutions")  # cached while unchanged
    target.write_text("VERSION = 2\n")
    os.utime(target, ns=(target.stat().st_atime_ns, target.stat().st_mtime_ns + 10**9))
    assert impl.load("naive", "solutions").VERSION == 2


def test_unknown_graded_module():
    with pytest.raises(ValueError, match="unknown graded module 'attention'"):
        impl.load("attention")


@pytest.mark.parametrize("interpreter, device, capability, expected", [
    (True, "cpu", None, False),       # this machine: the interpreter
    (False, "cuda:0", (8, 0), False),   # an A100, or an Ampere laptop GPU: no griddepcontrol
    (False, "cuda:0", (9, 0), True),    # an H100 or H200
    (False, "cuda:0", (10, 0), True),   # Blackwell
])
def test_decode_launches_the_merge_early_only_where_the_gpu_can(monkeypatch, interpreter, device, capability,
                                                                 expected):
    """decode.py asks for programmatic dependent launch (PDL) by default on a GPU; a GPU older than
    Hopper cannot compile its instructions, so there the merge kernel must be launched plainly."""
    from gqa_flash.course import decode_launch

    monkeypatch.setattr(runtime, "INTERPRETER", interpreter)
    # the GPU's (SMs, capability's major number, shared memory), as decode.py asks for them
    monkeypatch.setattr(runtime, "gpu_properties", lambda index: (132, capability[0], 232448, "a GPU"))
    if decode_launch.gdc_wait is None:  # an older Triton: never
        expected = False
    assert decode_launch.pdl_supported(torch.device(device)) is expected


def test_an_output_nothing_was_written_to_reads_nan_and_the_verdict_says_so():
    """Outputs start as NaN in the interpreter (a stub's failures then read alike, not as stale memory),
    and a comparison with every entry NaN asks whether anything was written."""
    import torch

    from gqa_flash.course import runtime, testing

    out = runtime.empty_output((1, 2, 3), torch.float16, "cpu")
    assert out.dtype == torch.float16 and bool(torch.isnan(out).all())
    problem = testing.mismatch("O", out, torch.zeros(1, 2, 3), atol=1e-3, rtol=1e-3)
    assert "every entry is NaN: was anything written?" in str(problem)
    out[0, 0, 0] = 0.0  # one entry written: no longer "nothing written", and the NaN ones are counted
    problem = str(testing.mismatch("O", out, torch.zeros(1, 2, 3), atol=1e-3, rtol=1e-3))
    assert "every entry is NaN" not in problem and "(5 of 6 entries wrong, 5 of them NaN," in problem, problem
