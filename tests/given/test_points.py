"""The grading contract: every graded test has points and a timeout; the required modules sum to 100.

And how points are reported when some modules are not done: a module still holding its stub is one
line, "not started", in the table (make test-graded, make grade) and in Gradescope's results.json, and
a run of some modules counts its points out of theirs, never out of 0.
"""

import ast
import json
import re

from gqa_flash.course import layout
from gqa_flash.course.grader import gradescope, started, testrun
from gqa_flash.course.grader.report import COURSE_POINTS, REQUIRED_PARTS, Report, table

GRADED = layout.GRADED_TESTS_DIR

BONUS = {f"test_{m}.py" for m in layout.BONUS_MODULES}
REQUIRED = {f"test_{m}.py" for m in layout.GRADED_MODULES} - BONUS


def _marks(func):
    marks = {}
    for dec in func.decorator_list:
        if isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and dec.func.attr in ("points", "timeout"):
            marks[dec.func.attr] = ast.literal_eval(dec.args[0])
    return marks


def graded_tests():
    for path in sorted(GRADED.glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                yield path.name, node.name, _marks(node)


def test_every_graded_test_has_points_and_a_timeout():
    missing = [f"{f}::{n}" for f, n, m in graded_tests() if "points" not in m or "timeout" not in m]
    assert not missing, f"graded tests without @pytest.mark.points or @pytest.mark.timeout: {missing}"


def test_required_modules_are_worth_100_points():
    total = sum(m.get("points", 0) for f, _, m in graded_tests() if f in REQUIRED)
    assert total == 100, f"the required graded tests are worth {total} points, not 100"
    # What a run of some modules counts its points beside ("20 / 20 of the modules run (100 in the course)").
    assert COURSE_POINTS == total and set(REQUIRED_PARTS) == {f[5:-3] for f in REQUIRED}


# Each bonus module's points, on top of the 100.
BONUS_POINTS = {"test_windows.py": 15, "test_backward.py": 20, "test_decode.py": 15, "test_ring.py": 10}


def test_each_bonus_is_worth_its_points():
    assert set(BONUS_POINTS) == BONUS, f"bonus modules without their points here: {BONUS ^ set(BONUS_POINTS)}"
    for name, points in BONUS_POINTS.items():
        total = sum(m.get("points", 0) for f, _, m in graded_tests() if f == name)
        assert total == points, f"the graded tests of {name} are worth {total} points, not {points}"


def test_every_graded_file_is_required_or_bonus():
    files = {f for f, _, _ in graded_tests()}
    assert files <= REQUIRED | BONUS, f"graded test files neither required nor bonus: {files - REQUIRED - BONUS}"


# --- how points are reported: modules not started, some modules run --------------------------------------

STUB = 'def f(x):\n    # Part 1: f(x) = 2x\n    raise NotImplementedError("Part 1 of x.py is not implemented yet")\n'
PRINTS = {name: started.code_fingerprint(STUB) for name in layout.GRADED_FILES}  # every file's stub, here


def _results(part: str, n: int, points: float, passed: bool) -> list[testrun.TestResult]:
    return [testrun.TestResult(id=f"tests/graded/test_{part}.py::test_{i}", part=part, name=f"test_{i}",
                               max_score=points / n, passed=passed, message="" if passed else "AssertionError: wrong",
                               bonus=part in layout.BONUS_MODULES) for i in range(n)]


def test_only_code_starts_a_module():
    assert started.not_started("naive.py", STUB.replace("# Part 1", "# my notes. Part 1") + "\n\n# more\n", PRINTS)
    assert not started.not_started("naive.py", STUB.replace("    raise", "    y = 2 * x\n    raise"), PRINTS)
    assert not started.not_started("naive.py", STUB + "def g(:\n", PRINTS)  # a syntax error: started, and failing
    assert started.not_started("naive.py", None, PRINTS)  # not submitted: the stub is graded
    assert not started.not_started("naive.py", STUB, {})  # no stub known: graded as started


def test_a_module_not_started_is_one_line_in_the_table_and_in_gradescopes_json():
    # A student who did the required modules and skipped the bonus: 29 red tests become two lines.
    done = {"naive": (8, 20), "online_softmax": (8, 15), "tiled": (8, 25), "forward": (10, 40)}
    tests = [t for part, (n, points) in done.items() for t in _results(part, n, points, True)]
    tests += _results("backward", 13, 20, False) + _results("decode", 16, 15, False)
    files = {f"{part}.py": b"def f(x):\n    return 2 * x\n" for part in done}  # the bonus files: not submitted
    assert started.mark_not_started(tests, files, prints=PRINTS) == ["backward", "decode"]
    report = Report("alice.zip", tests=tests, seconds=30)
    text = table(report)
    assert re.search(r"backward\.py \(bonus\)\s+0 / 20\s+not handed in", text), text  # not in files: not handed in
    assert re.search(r"decode\.py \(bonus\)\s+0 / 15\s+not handed in", text), text
    assert "AssertionError" not in text and text.splitlines()[-1].split() == ["total", "100", "/", "100"], text
    results = json.loads(json.dumps(gradescope.results_json(report)))
    bonus = [t for t in results["tests"] if "(bonus)" in t["name"]]
    assert [(t["name"], t["score"], t["max_score"], t["status"]) for t in bonus] == [
        ("backward.py (bonus): not handed in", 0, 20, "failed"),
        ("decode.py (bonus): not handed in", 0, 15, "failed")]
    assert "13 tests" in bonus[0]["output"] and len(results["tests"]) == 34 + 2 and results["score"] == 100
    assert all(set(t) == {"name", "score", "max_score", "status", "output", "visibility"} for t in results["tests"])
    assert "backward.py (bonus): 0 / 20  not handed in" in results["output"]


def test_a_module_started_or_passing_a_test_is_graded_test_by_test():
    begun = STUB.replace("    raise", "    y = 2 * x\n    raise")
    tests = _results("online_softmax", 8, 15, False) + _results("naive", 8, 20, False)
    tests[-1].passed = True  # no stub passes a test: a module that does is graded, whatever its file
    assert started.mark_not_started(tests, {"online_softmax.py": begun.encode()}, prints=PRINTS) == []
    assert not any(t.not_started for t in tests) and "AssertionError: wrong" in table(Report("x", tests))


def test_no_total_reads_out_of_0_when_some_modules_run():
    naive = Report("x", tests=_results("naive", 8, 20, True))
    assert naive.points() == "20 / 20 points of the modules run"
    assert table(naive).splitlines()[-1].split() == "total 20 / 20 of the modules run (100 in the course)".split()
    backward = Report("x", tests=_results("backward", 2, 10, True) + _results("backward", 2, 10, False))
    for text in (table(backward), backward.summary()):
        assert not re.search(r"/ 0\b", text), text
    assert "total 10 / 20 of the modules run (100 in the course)" in " ".join(table(backward).split())
    assert backward.summary().startswith("gqa-flash: 10 / 20 points of the modules run")


# --- points follow harm: O and the LSE are judged apart --------------------------------------------------------

LN2 = 0.6931471805599453


class _Answers:
    """A stand-in for the executor that answers every graded call with the float64 reference (O in q's dtype),
    its LSE and its O bent by ``lse`` and ``o``, and reports the work of an honest tile walk."""

    def __init__(self, lse=lambda x: x, o=lambda x: x):
        self.lse, self.o = lse, o

    def call(self, name, q, k, v, *, causal=True, sm_scale=None, return_lse=False, **_):
        import torch

        from gqa_flash.course.grader.calls import Reply
        from gqa_flash.reference import reference_attention

        out, lse = reference_attention(q, k, v, causal=causal, sm_scale=sm_scale)
        out, lse = self.o(out).to(q.dtype), self.lse(lse).to(torch.float32)
        return Reply((out, lse) if return_lse else out, {"launches": 1, "products": 1, "largest": [1, 1]})

    def score_tiles(self, seq_len, causal=True, **_):
        from gqa_flash.course.tile_counts import key_blocks_needed

        config = {"BLOCK_M": 32, "BLOCK_N": 16}
        counts = {f"{t},{bh}": key_blocks_needed(t, seq_len, 32, 16, causal)
                  for t in range(-(-seq_len // 32)) for bh in range(2)}
        return counts, config

    def probe(self, function):
        return None


def _points_lost(part: str, answers: _Answers, monkeypatch) -> float:
    """The points of tests/graded/test_<part>.py that ``answers`` lose, each test run as the grader runs it
    (every case of a parametrized test, its points shared among them)."""
    import importlib.util
    import inspect
    import itertools

    from gqa_flash.course.grader import calls

    monkeypatch.setattr(calls, "_student", answers)
    spec = importlib.util.spec_from_file_location(f"graded_{part}_for_points", GRADED / f"test_{part}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lost = 0.0
    for name, func in vars(module).items():
        if not name.startswith("test_") or not callable(func):
            continue
        marks = getattr(func, "pytestmark", [])
        points = next(m.args[0] for m in marks if m.name == "points")
        axes = []
        for mark in (m for m in marks if m.name == "parametrize"):
            names = [n.strip() for n in mark.args[0].split(",")]
            axes.append([dict(zip(names, value if len(names) > 1 else (value,))) for value in mark.args[1]])
        cases = [dict(kv for d in combo for kv in d.items()) for combo in itertools.product(*axes)]
        for case in cases:
            if "seed" in inspect.signature(func).parameters:
                case["seed"] = 0
            try:
                func(**case)
            except AssertionError:
                lost += points / len(cases)
    return lost


LSE_SHARE = {"tiled": 5, "forward": 8}  # the points of test_<part>_lse_natural_log: the LSE's share


def test_the_lse_share_is_its_own_tests_points():
    for part, share in LSE_SHARE.items():
        tests = [(n, m) for f, n, m in graded_tests() if f == f"test_{part}.py"]
        assert sum(m["points"] for n, m in tests if "lse" in n) == share, part
        assert sum(m["points"] for _, m in tests) == {"tiled": 25, "forward": 40}[part], part


def test_a_bug_in_the_lse_alone_loses_the_lse_share_and_no_more(monkeypatch):
    # README, "How the points are shared": the LSE matters only to the backward pass and to merges, so an O
    # that is right beside a wrong LSE loses the LSE's own tests; an O that is wrong loses at least half its part.
    for part, share in LSE_SHARE.items():
        assert _points_lost(part, _Answers(), monkeypatch) == 0, f"{part}: the stand-in answers are not right"
        for bug, bend in (("in base 2", lambda lse: lse / LN2), ("in another batch's rows", lambda lse: lse.flip(0))):
            lost = _points_lost(part, _Answers(lse=bend), monkeypatch)
            assert lost == share, f"{part}: an LSE {bug}, with O right, loses {lost:g} points, not the LSE's {share}"
        worth = {"tiled": 25, "forward": 40}[part]
        lost = _points_lost(part, _Answers(o=lambda o: o * 1.01), monkeypatch)
        assert lost >= worth / 2, f"{part}: an O 1% off loses {lost:g} of {worth} points, under half"
