"""``checks.explain()`` shows the last check's verdict, whatever it was, and a failure no known mistake explains
says so plainly on its second look (issue 47, "checks.explain() is wrong or stale").

A student's trial found explain() printing an old Part 2 diagnosis after a check had passed, an earlier Part 1
failure after a Part 2 failure, and "No check has failed yet" right after check_tiled() had failed twice: it
only kept failures that had a likely cause. Each test here runs real checks on planted bugs (a solution file
with one edit, served as the student's) and reads what the notebook would print.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

from gqa_flash.course import impl
from gqa_flash.course.lab.checks import naive, softmax, tiled
from gqa_flash.course.lab.checks import common as v

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/, where mutants/ is
from mutants.catalog import serve  # noqa: E402

pytestmark = pytest.mark.skipif(not (impl.SOLUTIONS_DIR / "naive.py").is_file(),
                                reason="the student edition has no solutions/")

NO_RESCALE = ("l = l_a * torch.exp(m_a - m_finite) + l_b * torch.exp(m_b - m_finite)", "l = l_a + l_b")
# A bug that is none of the usual mistakes: O off by a factor that no replay makes.
ODD_EPILOGUE = ("o_rows = acc / l_i[..., None]", "o_rows = acc / (l_i[..., None] + 0.5)")


@pytest.fixture(autouse=True)
def fresh_session(monkeypatch):
    monkeypatch.setattr(v, "_SEEN", {})
    monkeypatch.setattr(v, "_LAST", [])


def plant(module, old, new, tmp_path, monkeypatch):
    text = (impl.SOLUTIONS_DIR / f"{module}.py").read_text()
    assert not old or text.count(old) == 1, old
    path = tmp_path / f"explained_{module}_{len(list(tmp_path.iterdir()))}.py"
    path.write_text(text.replace(old, new) if old else text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    planted = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(planted)
    serve(planted, module, monkeypatch)


def explained(capsys):
    capsys.readouterr()
    v.explain()
    return capsys.readouterr().out


def test_before_any_check_explain_says_none_has_run(capsys):
    out = explained(capsys)
    assert "none has run" in out, out


def test_after_a_pass_explain_shows_the_pass_not_an_old_diagnosis(tmp_path, monkeypatch, capsys):
    plant("online_softmax", *NO_RESCALE, tmp_path, monkeypatch)
    softmax.check_merge_states()
    assert "added without rescaling" in explained(capsys)
    plant("online_softmax", "", "", tmp_path, monkeypatch)  # the fix saved: the solution again
    softmax.check_merge_states()
    out = explained(capsys)
    assert out.startswith("PASS online_softmax.py Part 2 (merge_states)"), out
    assert "rescaling" not in out and "nothing to explain" in out, out


def test_after_a_part_2_failure_explain_shows_part_2_not_an_earlier_part_1(tmp_path, monkeypatch, capsys):
    plant("naive", ".triu(diagonal=1)", ".tril(diagonal=1)", tmp_path, monkeypatch)  # Part 2, a known cause
    naive.check_naive()
    plant("tiled", *ODD_EPILOGUE, tmp_path, monkeypatch)  # Part 5, no known cause
    tiled.check_tiled()
    out = explained(capsys)
    assert out.startswith("FAIL tiled.py"), out
    assert "naive.py" not in out and "tril" not in out, out


def test_check_tiled_failing_twice_is_explained_and_its_second_look_differs(tmp_path, monkeypatch, capsys):
    plant("tiled", *ODD_EPILOGUE, tmp_path, monkeypatch)
    tiled.check_tiled()
    first = capsys.readouterr().out
    tiled.check_tiled()
    second = capsys.readouterr().out
    assert first != second, first
    assert "none of the usual mistakes gives this result" in first and "compare next: " not in first, first
    assert f"likely cause: {v.NO_KNOWN_CAUSE}" in second and "compare next: " in second, second
    out = explained(capsys)
    assert "no check has failed" not in out and out.startswith("FAIL tiled.py"), out
    assert "compare next: " in out, out


def test_a_failure_with_a_hint_and_no_cause_still_shows_it_at_once():
    todo = v.fail("naive", 1, "Part 1 is not implemented yet", hint="open gqa_flash/naive.py, fill in Part 1")
    assert v.staged(todo) == str(todo) and "likely cause" not in str(todo)


def test_a_crash_no_known_mistake_explains_says_so_of_the_error(tmp_path, monkeypatch, capsys):
    plant("naive", "scores = (q32 @ k32.transpose(-1, -2)) * sm_scale", "scores = (q32 @ k32) * sm_scale",
          tmp_path, monkeypatch)
    naive.check_naive()
    first = capsys.readouterr().out
    assert first.startswith("FAIL naive.py Part 2") and "your code raised" in first, first
    assert "none of the usual mistakes raises this error" in first, first
    out = explained(capsys)
    assert "likely cause: none known: none of the usual mistakes that this check replays raises this error" in out
    assert "compare next: the shapes of the tensors on the line that raised" in out, out


def test_a_part_still_its_placeholder_is_told_so_on_the_first_run(monkeypatch):
    # forward.py's stub, Part 1 done: Part 2's check said "FAIL ... where: ... got 0" and held "the placeholder
    # is still there" for the second run, as if a mistake were to be found. There is nothing to find.
    from gqa_flash.course.lab.checks.kernel_parts import PART_CHECKS

    serve(impl.load("forward", "student"), "forward", monkeypatch)
    shown = [v.staged(check.verdict()) for check in PART_CHECKS]
    placeholders = [text for text in shown if v.PLACEHOLDER in text]
    assert placeholders, shown
    for text in placeholders:
        assert "likely cause: the placeholder is still there" in text and "re-run this cell" not in text, text


def test_an_lse_mistake_gets_a_hint_as_every_other_mistake_does(tmp_path, monkeypatch):
    # tiled.py's LSE in base 2 was named ("the log of the running sum is in base 2") with no hint line: the only
    # mistake of a student's trial left without one.
    from mutants.catalog import MUTANTS

    mutant = next(m for m in MUTANTS if m.name == "tiled_lse_base_2")
    serve(mutant.imported(tmp_path), "tiled", monkeypatch)
    verdict = tiled.check_tiled.verdict()
    assert not verdict.ok and "in base 2" in verdict.cause and "torch.log" in verdict.hint, verdict
