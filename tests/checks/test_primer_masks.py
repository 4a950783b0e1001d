"""Notebook 03b's puzzle 3 (masked loads and stores) checks the load's mask too (issue 47: a kernel whose load had
no mask passed, though the puzzle's hint says to give the mask to the load and to the store).

With the store masked, what an unmasked load read past X's end never reaches OUT, so OUT alone cannot show it.
In the interpreter the check runs the kernel again with its loads recorded and finds the lanes past X; on a GPU,
which shows no address, it reads the kernel's source for a tl.load without a mask. The kernels are the
notebook's answer, with the mistake planted in its text.
"""

import importlib.util
import json
import re

import pytest
import torch

import gqa_flash  # noqa: F401  (first: it sets the interpreter up before Triton is imported)
from gqa_flash.course import layout, runtime
from gqa_flash.course.lab import checks
from gqa_flash.course.lab.checks.common import Stop

NOTEBOOK = layout.COURSE_DIR / "notebooks" / "03b_triton_primer.ipynb"
HEADER = "import triton\nimport triton.language as tl\n\n\n"
LOAD = "x = tl.load(X + offs, mask=mask)"


def _answer() -> str:
    for cell in json.loads(NOTEBOOK.read_text())["cells"]:
        for block in re.findall(r"<summary>Answer.*?```python\n(.*?)```", "".join(cell["source"]), re.S):
            if "def double(" in block:
                return block
    raise AssertionError("no answer for puzzle 3 in the notebook")


def _double(tmp_path, source):
    path = tmp_path / f"double_{abs(hash(source))}.py"
    path.write_text(HEADER + source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.double


def test_the_answer_masks_its_load_and_passes(tmp_path):
    assert LOAD in _answer()
    verdict = checks.check_primer_masked.verdict(_double(tmp_path, _answer()))
    assert verdict.ok and "read and wrote nothing past the end" in verdict.message, verdict


@pytest.mark.skipif(not runtime.INTERPRETER, reason="the loads' addresses are recorded in the interpreter")
def test_a_load_without_a_mask_fails_though_out_is_right(tmp_path):
    verdict = checks.check_primer_masked.verdict(_double(tmp_path, _answer().replace(LOAD, "x = tl.load(X + offs)")))
    assert not verdict.ok, verdict
    assert verdict.message == "your kernel reads X past its end: X[10], X[11] (X has 10 entries, 0-9)", verdict
    assert verdict.where.startswith("the load of program 2"), verdict
    assert verdict.cause.startswith("the load is not masked") and "mask" in verdict.hint, verdict
    assert "likely cause: " not in checks.common.staged(verdict)  # step one: what and where, the cause held back


def test_on_a_gpu_the_source_shows_the_load_without_a_mask(tmp_path, monkeypatch):
    from gqa_flash.course.lab.checks import primer_launch

    monkeypatch.setattr(runtime, "INTERPRETER", False)
    kernel = _double(tmp_path, _answer().replace(LOAD, "x = tl.load(X + offs)"))
    with pytest.raises(Stop) as stop:
        primer_launch.reads_within(3, kernel, (3,), (torch.zeros(10), torch.zeros(10), 10), {}, 4)
    # line 9 of the file: the answer starts after the 4 lines of HEADER
    assert "has no mask" in stop.value.verdict.message and "line 9 " in stop.value.verdict.where, stop.value.verdict
    masked = _double(tmp_path, _answer().replace(LOAD, "x = tl.load(X + offs, offs < n)"))  # a positional mask
    assert primer_launch.unmasked_load_line(masked) is None
