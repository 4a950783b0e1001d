"""Notebook 04's messages name the student's real mistake (issue 36, "Messages that name no cause, or the wrong one").

Each test plants one bug in a copy of solutions/forward.py, serves it as the forward module, and asserts the
verdict's cause (Verdict.cause): the mistake in words, not a neighbour's. Step one of a verdict (its message
and where) says what is wrong and where, with no code in it. Two of Triton's raw errors (two dtypes in a
tl.dot, a broadcast on the wrong axis) are translated for every checked file, from the interpreter and,
by their text, from a GPU's compiler.
"""

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from gqa_flash.course import impl, runtime
from gqa_flash.course.lab.checks import common, kernel, kernel_parts, kernel_walk, triton_errors

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/, where mutants/ is
from mutants.catalog import MUTANTS, serve  # noqa: E402

SOLUTION = impl.SOLUTIONS_DIR / "forward.py"
pytestmark = [
    pytest.mark.skipif(not SOLUTION.is_file(), reason="the student edition has no solutions/"),
    pytest.mark.skipif(not runtime.INTERPRETER, reason="the checks are compared here in the interpreter"),
]

_SCORES = "s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * qk_scale\n"


def plant(tmp_path, monkeypatch, *edits, name="planted"):
    """Serve solutions/forward.py with ``edits`` ((old, new, how many times old occurs)) as the forward module."""
    text = SOLUTION.read_text()
    for old, new, count in edits:
        assert text.count(old) == count, (old, text.count(old))
        text = text.replace(old, new)
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"forward_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    serve(module, "forward", monkeypatch)
    return module


def step_one_has_no_code(v):
    """The headline and where say what and where: no code, no fix."""
    for text in (v.message, v.where or ""):
        for code in ("`", "[:, None]", "[None, :]", ".to(", " = ", "tl.int64", "other=", "tl.maximum"):
            assert code not in text, f"{code!r} in step one: {text}"


def no_equal_contradiction(text):
    """Never "visited 5 key blocks, expected 5": two equal numbers read as a contradiction."""
    for got, expected in re.findall(r"(\d+) key blocks[^,;]*, expected (\d+)", text):
        assert got != expected, text


def failing(check, part=None, *args):
    v = check.verdict(*args)
    assert not v.ok, str(v)
    if part is not None:
        assert f"Part {part} " in v.what, str(v)
    step_one_has_no_code(v)
    no_equal_contradiction(str(v))
    return v


# --- the catalog's mutants whose verdict named no cause, or the wrong one --------

CAUSES = {  # mutant -> (its part, the start of its cause)
    "forward_group_size_inverted": (1, "every query head reads KV head 0"),
    "forward_rescale_new_max_only": (4, "the rescale factor uses the new max alone"),
    "forward_no_causal_mask": (5, "the causal rule is missing"),
    "forward_divides_twice": (6, "o is divided by the row sums l_i twice"),
    "forward_lse_batch_stride": (6, "LSE is stored into batch 1, head 0, not batch 1, head 2"),
}


@pytest.mark.parametrize("name", list(CAUSES))
def test_a_catalog_mutant_is_named(tmp_path, monkeypatch, name):
    serve(next(m for m in MUTANTS if m.name == name).imported(tmp_path), "forward", monkeypatch)
    part, cause = CAUSES[name]
    v = failing(kernel_parts.PART_CHECKS[part - 1], part)
    assert v.cause and v.cause.startswith(cause), str(v)


# --- Part 3: the loop bounds ---------------------------------------------------


def test_phase_one_overshooting_seq_len_is_named(tmp_path, monkeypatch):
    plant(tmp_path, monkeypatch, ("unmasked_end = (SEQ_LEN // BLOCK_N) * BLOCK_N",
                                  "unmasked_end = tl.cdiv(SEQ_LEN, BLOCK_N) * BLOCK_N", 1))
    v = failing(kernel_walk.check_key_loop, 3)
    assert "overshoots SEQ_LEN" in v.cause and "past the end of the sequence" in v.cause, str(v)
    assert "keys 64..71 visited once without the mask" in v.where, str(v)
    assert "Part 2" not in str(v), str(v)  # Part 2 passes: no word of it


def test_causal_bound_without_min_names_the_end_of_the_sequence(tmp_path, monkeypatch):
    plant(tmp_path, monkeypatch, ("masked_end = tl.minimum((q_tile_idx + 1) * BLOCK_M, SEQ_LEN)",
                                  "masked_end = (q_tile_idx + 1) * BLOCK_M", 1))
    v = failing(kernel_walk.check_key_loop, 3)
    assert "past the end of the sequence" in v.cause and "future" not in v.cause, str(v)
    assert "6 key blocks loaded, expected 5" in v.where, str(v)


def test_walking_past_the_diagonal_still_names_the_future(tmp_path, monkeypatch):
    plant(tmp_path, monkeypatch, ("masked_end = tl.minimum((q_tile_idx + 1) * BLOCK_M, SEQ_LEN)",
                                  "masked_end = SEQ_LEN", 1))
    v = failing(kernel_walk.check_key_loop, 3)
    assert "only future keys" in v.cause and "past the end" not in v.cause, str(v)


# --- Part 3: the scores, and check_forward ---------------------------------------


def test_a_forgotten_qk_scale_fails_part_3_and_the_kernel_names_it(tmp_path, monkeypatch):
    plant(tmp_path, monkeypatch, (_SCORES, _SCORES.replace(" * qk_scale", ""), 2))
    v = failing(kernel_walk.check_key_loop, 3)
    assert v.message == "computes the wrong scores", str(v)
    assert v.cause.startswith("the scores are not multiplied by qk_scale"), str(v)
    assert "Part 2" not in str(v), str(v)
    whole = kernel.check_forward.verdict()
    assert not whole.ok and "qk_scale" in whole.cause, str(whole)
    # Even were Part 3's check to pass, the whole kernel's check names the scale, not the course's code.
    passing = [common.Verdict(True, common.what_of("forward", p), "passes") for p in range(1, 7)]
    whole = kernel.check_forward.verdict(passing)
    assert "never multiplied by qk_scale" in whole.cause and "the loads, the loops" not in whole.cause, str(whole)


def test_qk_scale_missing_in_one_phase_only(tmp_path, monkeypatch):
    masked = _SCORES + "        s = mask_scores"
    plant(tmp_path, monkeypatch, (masked, masked.replace(" * qk_scale", ""), 1))
    v = failing(kernel_walk.check_key_loop, 3)
    assert v.cause.startswith("phase 2's scores are not multiplied by qk_scale"), str(v)


def test_qk_scale_without_log2e_is_named_by_the_kernel_check(tmp_path, monkeypatch):
    plant(tmp_path, monkeypatch, ("qk_scale = sm_scale * 1.4426950408889634", "qk_scale = sm_scale", 1))
    assert kernel_walk.check_key_loop.verdict().ok
    whole = failing(kernel.check_forward)
    assert "log2(e) is missing" in whole.cause, str(whole)


def test_part_3_blames_part_2_only_when_part_2_fails(tmp_path, monkeypatch):
    plant(tmp_path, monkeypatch, ("ptrs = base + rows[:, None] * stride_row + cols[None, :] * stride_col",
                                  "ptrs = base + rows[:, None] * stride_col + cols[None, :] * stride_row", 1))
    assert not kernel_walk.check_load_tile.verdict().ok
    v = failing(kernel_walk.check_key_loop, 3)
    assert "Part 2 (load_tile) fails its own check" in v.cause and "Part 2's check" in v.hint, str(v)


# --- Part 4: Python's built-ins, and tl.dot's dtypes -----------------------------


def test_python_max_on_blocks_is_named(tmp_path, monkeypatch):
    plant(tmp_path, monkeypatch, ("m_new = tl.maximum(m_i, tl.max(s, 1))", "m_new = max(m_i, tl.max(s, 1))", 1))
    v = failing(kernel_parts.check_online_softmax_update, 4)
    assert v.cause.startswith("Python's built-in max on Triton blocks"), str(v)
    assert "returns b, its last argument" in v.cause and "tl.maximum" in v.hint, str(v)
    assert "row max alone" not in str(v), str(v)


def test_python_sum_on_a_block_is_named(tmp_path, monkeypatch):
    plant(tmp_path, monkeypatch, ("l_i = l_i * alpha + tl.sum(p, 1)", "l_i = l_i * alpha + sum(p, 1)", 1))
    v = failing(kernel_parts.check_online_softmax_update, 4)
    assert v.message == "Python's built-in sum is called on a Triton block", str(v)
    assert "sum iterates" in v.cause and "tl.sum(x, axis)" in v.hint, str(v)
    assert re.search(r"forward\.py, line \d+$", v.where), str(v)


def test_two_dtypes_in_tl_dot_name_the_operand_to_cast(tmp_path, monkeypatch):
    plant(tmp_path, monkeypatch, ("tl.dot(p.to(v.dtype), v,", "tl.dot(p, v,", 1))
    v = failing(kernel_parts.check_online_softmax_update, 4)
    assert v.message == "tl.dot gets operands of two dtypes, fp32 and fp16", str(v)
    assert v.cause == "`p` is fp32 and `v` is fp16: tl.dot multiplies two blocks of one dtype", str(v)
    assert "cast `p` down to fp16 (p.to(v.dtype))" in v.hint, str(v)


def test_two_dtypes_from_the_gpu_compiler_by_its_text():
    """A GPU's compiler wraps the same assertion in a CompilationError that carries the helper's source."""
    from triton.compiler.errors import CompilationError

    src = "def f(a, b):\n    acc = tl.dot(tl.trans(ds), k)\n"
    node = type("Node", (), {"lineno": 2, "col_offset": 4})()
    error = CompilationError(src, node, "AssertionError('Both operands must be same dtype. Got fp32 and bf16')")
    message, cause, hint = triton_errors.triton_error(error, src.splitlines()[1])
    assert message == "tl.dot gets operands of two dtypes, fp32 and bf16"
    assert cause.startswith("`tl.trans(ds)` is fp32 and `k` is bf16"), cause
    assert "(tl.trans(ds)).to(k.dtype)" in hint, hint


# --- broadcasting on the wrong axis (generic: any checked file) --------------------


def test_a_vector_expanded_on_the_wrong_axis_is_named(tmp_path, monkeypatch):
    plant(tmp_path, monkeypatch, ("p = tl.exp2(s - m_new[:, None])", "p = tl.exp2(s - m_new[None, :])", 1))
    v = failing(kernel_parts.check_online_softmax_update, 4)
    assert v.message.startswith("two blocks of shapes [16, 32] and [1, 16] do not broadcast together"), str(v)
    assert "expanded on the wrong axis" in v.cause and "[:, None]" in v.hint, str(v)
    assert "make_shape_compatible" not in str(v), str(v)


def test_a_missing_expansion_is_named(tmp_path, monkeypatch):
    plant(tmp_path, monkeypatch, ("p = tl.exp2(s - m_new[:, None])", "p = tl.exp2(s - m_new)", 1))
    v = failing(kernel_parts.check_online_softmax_update, 4)
    assert v.message.startswith("two blocks of shapes [16, 32] and [16] do not broadcast together"), str(v)
    assert "its expansion to a column is missing" in v.cause, str(v)


@triton.jit
def _wrong_axis(X, OUT, ROWS: tl.constexpr, COLS: tl.constexpr):
    r = tl.arange(0, ROWS)
    c = tl.arange(0, COLS)
    x = tl.load(X + r[:, None] * COLS + c[None, :])
    tl.store(OUT + r[:, None] * COLS + c[None, :], x - tl.max(x, 1)[None, :])


def test_broadcast_error_is_translated_for_any_kernel():
    x, out = torch.zeros(4, 8), torch.zeros(4, 8)
    with pytest.raises(Exception) as raised:
        _wrong_axis[(1,)](x, out, ROWS=4, COLS=8)
    message, cause, hint = triton_errors.triton_error(raised.value)
    assert message == "two blocks of shapes [4, 8] and [1, 4] do not broadcast together (axis 1: 8 against 4)"
    assert "a vector of 4 values, one per row of the [4, 8] block, is expanded into a row" in cause
    assert "wrong axis or missing" in hint


# --- a student trial's findings (issue 36): each names the real mistake, in the right part ---------------------


def test_a_fixed_dtype_cast_in_tl_dot_is_the_mistake(tmp_path, monkeypatch):
    plant(tmp_path, monkeypatch, ("tl.dot(p.to(v.dtype), v,", "tl.dot(p.to(tl.float16), v,", 1))
    v = failing(kernel_parts.check_online_softmax_update, 4)  # the first case's v is fp32
    assert v.message == "tl.dot gets operands of two dtypes, fp16 and fp32", str(v)
    assert v.cause.startswith("`p.to(tl.float16)` casts to a fixed dtype, fp16, and `v` is fp32"), str(v)
    assert "p.to(v.dtype)" in v.hint and "v.to(" not in v.hint, str(v)


def test_swapped_arguments_of_mask_scores_blame_the_call_in_part_3(tmp_path, monkeypatch):
    call = "s = mask_scores(s, offs_m, offs_n,"
    plant(tmp_path, monkeypatch, (call, call.replace("offs_m, offs_n", "offs_n, offs_m"), 1))
    assert kernel_parts.check_mask_scores.verdict().ok
    v = failing(kernel.check_forward, 3)
    assert "the call in key_loop passes its arguments in the wrong order" in v.cause, str(v)
    assert "mask_scores(s, offs_m, offs_n, SEQ_LEN, CAUSAL)" in v.hint, str(v)
    assert "(the call in Part 3)" in v.where, str(v)


def test_a_reduction_on_the_wrong_axis_is_named(tmp_path, monkeypatch):
    plant(tmp_path, monkeypatch, ("m_new = tl.maximum(m_i, tl.max(s, 1))", "m_new = tl.maximum(m_i, tl.max(s, 0))", 1))
    v = failing(kernel_parts.check_online_softmax_update, 4)
    assert v.message.startswith("two blocks of shapes [16] and [32] do not broadcast"), str(v)
    assert v.cause.startswith("`tl.max(s, 0)` reduces axis 0") and "wrong axis" in v.cause, str(v)
    assert "reduces axis 1" in v.hint and "[:, None]" not in v.hint, str(v)


def test_scores_without_transposing_k_are_named(tmp_path, monkeypatch):
    plant(tmp_path, monkeypatch, (_SCORES, _SCORES.replace("tl.trans(k)", "k"), 2))
    v = failing(kernel_walk.check_key_loop, 3)
    assert v.message.startswith("the two blocks of tl.dot do not fit: [32, 128] by [16, 128]"), str(v)
    assert "`k` must be transposed" in v.cause and "q·kᵀ" in v.cause, str(v)
    assert "tl.trans(k)" in v.hint, str(v)


def test_phase_two_scale_without_log2e_is_named(tmp_path, monkeypatch):
    masked = _SCORES + "        s = mask_scores"
    plant(tmp_path, monkeypatch, (masked, masked.replace(" * qk_scale", " * qk_scale * 0.6931471805599453"), 1))
    v = failing(kernel_walk.check_key_loop, 3)
    assert v.message == "computes the wrong scores", str(v)
    assert v.cause.startswith("log2(e) is missing from the scale in phase 2"), str(v)


def test_lse_stored_with_o_row_stride_is_named(tmp_path, monkeypatch):
    plant(tmp_path, monkeypatch, ("offs_m * stride_ln", "offs_m * stride_on", 1))
    v = failing(kernel_parts.check_epilogue, 6)
    assert v.cause.startswith("the LSE's rows are stored 16 elements apart (O's row stride, stride_on)"), str(v)


def test_the_kernel_not_run_says_why_at_once(tmp_path, monkeypatch):
    plant(tmp_path, monkeypatch, ("ptrs = base + rows[:, None] * stride_row + cols[None, :] * stride_col",
                                  "ptrs = base + rows[:, None] * stride_col + cols[None, :] * stride_row", 1))
    v = kernel.check_forward.verdict()
    assert not v.ok and v.cause is None, str(v)
    assert v.message.startswith("not run yet: the whole kernel is not run until forward.py Part 2"), str(v)
    assert common.staged(v) == str(v)  # no cause held back: step one shows it all
