"""Notebook 03b, the Triton primer: each puzzle's answer passes its check, and each classic mistake is named.

The kernels come from the notebook itself: the answer folded away under each
puzzle, and the stub in the puzzle's kernel cell. A mistake is planted by
editing the answer's text (``old`` -> ``new``), so the list below reads as the
mistakes a student makes, and breaks loudly if an answer changes under it.
Each kernel is written to a file and imported, as Triton wants a function's
source.
"""

import importlib.util
import json
import re

import pytest

import gqa_flash  # noqa: F401  (first: it sets the interpreter up before Triton is imported)
from gqa_flash.course import layout, runtime
from gqa_flash.course.lab import checks
from gqa_flash.course.lab.checks import primer
from gqa_flash.course.lab.checks.common import STEP_TWO

NOTEBOOK = layout.COURSE_DIR / "notebooks" / "03b_triton_primer.ipynb"
HEADER = "import triton\nimport triton.language as tl\n\n\n"


def _notebook():
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    checked = {}  # kernel name -> the check its check cell calls
    answers, stubs = {}, {}
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code":
            m = re.search(r"checks\.(check_primer_\w+)\((\w+)\)", source)
            if m:
                checked[m.group(2)] = getattr(checks, m.group(1))
            elif "@triton.jit" in source and re.search(r"^\s+pass$", source, re.M):
                stubs[re.search(r"def (\w+)", source).group(1)] = source
        for block in re.findall(r"<summary>Answer.*?```python\n(.*?)```", source, re.S):
            answers[re.search(r"def (\w+)", block).group(1)] = block
    return checked, answers, stubs


CHECKED, ANSWERS, STUBS = _notebook()


def _kernel(tmp_path, source, name):
    path = tmp_path / f"primer_{name}_{abs(hash(source))}.py"
    path.write_text(HEADER + source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def test_every_puzzle_has_a_stub_a_check_and_an_answer():
    assert len(CHECKED) == len(primer.PRIMER_CHECKS) == 8
    assert set(CHECKED) == set(ANSWERS) == set(STUBS)
    assert set(CHECKED.values()) == set(primer.PRIMER_CHECKS)


@pytest.mark.parametrize("name", sorted(CHECKED))
def test_the_answer_passes(tmp_path, name):
    verdict = CHECKED[name].verdict(_kernel(tmp_path, ANSWERS[name], name))
    assert verdict.ok, str(verdict)


@pytest.mark.parametrize("name", sorted(CHECKED))
def test_the_stub_is_not_written_yet(tmp_path, name):
    verdict = CHECKED[name].verdict(_kernel(tmp_path, STUBS[name], name))
    assert not verdict.ok and "wrote nothing" in verdict.message and verdict.cause is None, str(verdict)


# (kernel, [(old, new), ...] applied to its answer, a phrase the verdict's cause must hold)
ONLY_INTERPRETED = "V was brought up"  # compiled, fp32 tl.dot is TF32, which rounds P as fp16 does: it passes there
MISTAKES = [
    ("grid_ids", [("i = tl.program_id(0)\n    j = tl.program_id(1)", "i = tl.program_id(1)\n    j = tl.program_id(0)")],
     "axes are swapped"),
    ("grid_ids", [("10 * i + j)", "10 * j + i)")], "value's i and j are swapped"),
    ("grid_ids", [("i * n_cols + j", "i * 3 + j")], "not i * 3"),
    ("grid_ids", [("OUT + i * n_cols + j", "OUT + i + j")], "without the row length"),
    ("outer_sum", [("x[:, None] + y[None, :]", "x[None, :] + y[:, None]")], "a column ([M, 1]) and a row"),
    ("outer_sum", [("x[:, None] + y[None, :]", "x + y")], "a column ([M, 1]) and a row"),
    ("outer_sum", [("i[:, None] * N", "i[:, None] * M")], "not i * M"),
    ("outer_sum", [("OUT + i[:, None] * N + j[None, :]", "OUT + i[:, None] + j[None, :] * M")], "column by column"),
    ("double", [("2 * x, mask=mask)", "2 * x)")], "store is not masked"),
    ("double", [(", mask=mask", "")], "store is not masked"),
    ("double", [("offs < n", "offs <= n")], "off by one"),
    ("double", [("tl.program_id(0) * BLOCK + ", "")], "same first block"),
    ("double", [("tl.program_id(0) * BLOCK", "tl.program_id(0)")], "overlap"),
    ("softmax_rows", [('other=float("-inf")', "other=0.0")], "loaded as 0"),
    ("softmax_rows", [(', other=float("-inf")', "")], "loaded as 0"),
    ("softmax_rows", [("tl.exp(x - tl.max(x, 1)[:, None])", "tl.exp(x)")], "overflows"),
    ("softmax_rows", [("tl.max(x, 1)[:, None]", "tl.max(x, 0)[None, :]")], "max was taken along axis 0"),
    ("softmax_rows", [("tl.sum(p, 1)[:, None]", "tl.sum(p, 0)[None, :]")], "sum was taken along axis 0"),
    ("softmax_rows", [("tl.max(x, 1)[:, None]", "tl.max(x, 1)")], "must stand as a column"),
    ("softmax_rows", [("tl.sum(p, 1)[:, None]", "sum(p)")], "Python's sum"),
    ("softmax_rows", [("[:, None], mask=mask)", "[:, None])")], "store is not masked"),
    ("scores", [("tl.dot(a, tl.trans(b))", "tl.dot(a, b)")], "turned on its side"),
    ("scores", [("tl.dot(a, tl.trans(b))", "tl.dot(b, tl.trans(a))")], "[M, N] = [16, 32]"),
    ("scores", [("tl.dot(a, tl.trans(b))", "tl.dot(a, b)"),
                ("B + n[:, None] * K + k[None, :]", "B + k[:, None] * N + n[None, :]")], "as if it were stored [K, N]"),
    ("causal_mask", [("<= (ROW0 + i)", "< (ROW0 + i)")], "hides the diagonal"),
    ("causal_mask", [("<= (ROW0 + i)", ">= (ROW0 + i)")], "reversed"),
    ("causal_mask", [('tl.where(seen, s, float("-inf"))', "tl.where(seen, s, 0.0)")], "0, not -inf"),
    ("causal_mask", [('tl.where(seen, s, float("-inf"))', "s * seen")], "0, not -inf"),
    ("causal_mask", [("(COL0 + j)[None, :] <= (ROW0 + i)[:, None]", "j[None, :] <= i[:, None]")], "lane numbers"),
    ("running_max", [("tl.maximum(m, tl.max(s, 1))", "max(m, tl.max(s, 1))")], "Python's max"),
    ("running_max", [("tl.maximum(m, tl.max(s, 1))", "tl.max(s, 1)")], "old maximum is dropped"),
    ("running_max", [("tl.maximum(m, tl.max(s, 1))", "tl.maximum(m, s)")], "reduced to one value per row"),
    ("running_max", [("tl.maximum(m, tl.max(s, 1))", "tl.maximum(m, tl.max(s, 0))")], "reduced to one value per row"),
    ("running_max", [("tl.max(s, 1)", "tl.max(s)")], "whole tile"),
    ("weighted_values", [("tl.dot(p.to(v.dtype), v)", "tl.dot(p, v)")], "P is fp32 and V fp16"),
    ("weighted_values", [("p.to(v.dtype)", "p.to(tl.float16)")], "a fixed dtype"),
    ("weighted_values", [("tl.dot(p.to(v.dtype), v)", "tl.dot(p, v.to(tl.float32))")], ONLY_INTERPRETED),
]


@pytest.mark.parametrize("name, edits, cause", MISTAKES, ids=[f"{m[0]}-{i}" for i, m in enumerate(MISTAKES)])
def test_a_classic_mistake_is_named(tmp_path, name, edits, cause):
    source = ANSWERS[name]
    for old, new in edits:
        assert old in source, f"the answer to {name} no longer holds {old!r}: update this mistake"
        source = source.replace(old, new)
    if cause == ONLY_INTERPRETED and runtime.DEVICE.type == "cuda":
        pytest.skip("compiled for a GPU, this mistake gives the same numbers")
    verdict = CHECKED[name].verdict(_kernel(tmp_path, source, name))
    assert not verdict.ok, f"{name} with {edits} passes"
    assert verdict.cause and cause in verdict.cause, str(verdict)
    assert verdict.where, str(verdict)  # step one says where, before the cause is shown


def test_a_failure_is_told_in_two_steps(tmp_path, capsys):
    source = ANSWERS["causal_mask"].replace("<= (ROW0 + i)", "< (ROW0 + i)")
    kernel = _kernel(tmp_path, source, "causal_mask")
    checks.check_primer_where(kernel)
    first = capsys.readouterr().out
    assert first.startswith("FAIL") and "where:" in first and "likely cause:" not in first and STEP_TWO in first
    checks.check_primer_where(kernel)
    second = capsys.readouterr().out
    assert "likely cause: the mask hides the diagonal" in second and "hint:" in second


def test_a_plain_function_is_not_a_kernel():
    def grid_ids(OUT, n_cols):
        pass

    verdict = checks.check_primer_program_ids.verdict(grid_ids)
    assert not verdict.ok and "not a Triton kernel" in verdict.message and "@triton.jit" in verdict.hint


def test_the_notebook_gives_no_graded_line_away():
    from gqa_flash.course.grader import stubs
    from tools_path import student_edition as edition

    if not stubs.COMPLETED_DIR.is_dir():
        pytest.skip("the student edition has no solutions/ to compare with")
    content = edition.cleared_notebook(NOTEBOOK.read_text()).encode()
    assert edition.leaks({"notebooks/" + NOTEBOOK.name: content}, stubs.COMPLETED_DIR) == []
