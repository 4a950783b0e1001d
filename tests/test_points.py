"""The grading contract: every graded test has points and a timeout; the required modules sum to 100."""

import ast

from gqa_flash import layout

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


# Each bonus module's points, on top of the 100.
BONUS_POINTS = {"test_backward.py": 20, "test_decode.py": 15}


def test_each_bonus_is_worth_its_points():
    assert set(BONUS_POINTS) == BONUS, f"bonus modules without their points here: {BONUS ^ set(BONUS_POINTS)}"
    for name, points in BONUS_POINTS.items():
        total = sum(m.get("points", 0) for f, _, m in graded_tests() if f == name)
        assert total == points, f"the graded tests of {name} are worth {total} points, not {points}"


def test_every_graded_file_is_required_or_bonus():
    files = {f for f, _, _ in graded_tests()}
    assert files <= REQUIRED | BONUS, f"graded test files neither required nor bonus: {files - REQUIRED - BONUS}"
