"""The checks of notebook 05's practice exercise, traffic.py: PASS on the solution, FAIL on the stubs and on mutants.

Each mutant is one small edit of solutions/traffic.py (a usual mistake), and the check must name it as the
likely cause. The checks run here on a module loaded from a temporary file, in place of impl.load.
"""

import importlib.util

import pytest

from gqa_flash.course import impl, layout
from gqa_flash.course.lab.checks import traffic as traffic_checks

SOLUTION = impl.SOLUTIONS_DIR / "traffic.py"
pytestmark = pytest.mark.skipif(not SOLUTION.is_file(), reason="the student edition has no solutions/")

CHECKS = (traffic_checks.check_launch_order, traffic_checks.check_traffic_model)

# (name, the text to replace in the solution, its replacement, the check that must fail, words of its cause)
MUTANTS = [
    ("orders_swapped", 'if order == "group_major":', 'if order == "head_major":', 0, "swapped"),
    ("lightest_first", "range(n_q_blocks - 1, -1, -1)", "range(n_q_blocks)", 0, "heaviest-first"),
    ("heads_dealt_out", "kv_head * group_size + member", "member * n_kv_heads + kv_head", 0, "% for //"),
    ("fifo", "cache.move_to_end(entry)", "pass", 1, "FIFO"),
    ("q_not_counted", " + len(programs) * block_m * head_dim * elem_bytes", "", 1, "Q is not counted"),
    ("keyed_by_query_head", "entry = (q_head // group_size, step)", "entry = (q_head, step)", 1, "query head"),
    ("newest_evicted", "cache.popitem(last=False)", "cache.popitem()", 1, "wrong entry is evicted"),
]


def _module(tmp_path, text, name):
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"traffic_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _verdicts(monkeypatch, module):
    monkeypatch.setattr(traffic_checks, "load", lambda name: module)
    return [check.verdict() for check in CHECKS]


def test_traffic_is_a_practice_module_not_a_graded_one():
    assert "traffic" in layout.PRACTICE_MODULES and "traffic.py" not in layout.GRADED_FILES
    assert impl.path_of("traffic", "solutions") == SOLUTION


def test_the_checks_pass_on_the_solution(monkeypatch):
    monkeypatch.setenv("GQA_FLASH_IMPL", "solutions")
    for check in CHECKS:
        verdict = check.verdict()
        assert verdict.ok, str(verdict)


def test_the_checks_fail_on_the_stubs(monkeypatch, tmp_path):
    from gqa_flash.course.grader import stubs

    stub = _module(tmp_path, stubs.student_text(SOLUTION), "stub")
    for verdict, part in zip(_verdicts(monkeypatch, stub), (1, 2)):
        assert not verdict.ok and f"Part {part} is not implemented yet" in verdict.message, str(verdict)


@pytest.mark.parametrize("name, old, new, failing, cause", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_the_checks_name_the_mistake_of_a_mutant(monkeypatch, tmp_path, name, old, new, failing, cause):
    text = SOLUTION.read_text()
    assert text.count(old) == 1, f"{old!r} is not in solutions/traffic.py once"
    verdicts = _verdicts(monkeypatch, _module(tmp_path, text.replace(old, new), name))
    verdict = verdicts[failing]
    assert not verdict.ok and cause in (verdict.cause or ""), str(verdict)
    assert verdicts[1 - failing].ok, f"the other part's check should still pass:\n{verdicts[1 - failing]}"


def test_the_model_matches_the_prototype_at_the_h200_sizes():
    """The numbers notebook 05 quotes: 32:8 heads, one 16k sequence, 128 x 64 tiles (read bytes, in MB)."""
    solution = impl.load("traffic", "solutions")
    got = {}
    for cache_mib, concurrent in ((50, 132), (25, 264)):
        for d in (64, 128):
            for order in solution.ORDERS:
                programs = solution.launch_order(order, 32, 8, 16384 // 128)
                got[(cache_mib, d, order)] = round(solution.dram_bytes(
                    programs, 32, 8, d, cache_bytes=cache_mib * 2**20, concurrent=concurrent) / 1e6)
    assert got == {(50, 64, "group_major"): 101, (50, 64, "head_major"): 101,
                   (50, 128, "group_major"): 611, (50, 128, "head_major"): 201,
                   (25, 64, "group_major"): 213, (25, 64, "head_major"): 101,
                   (25, 128, "group_major"): 635, (25, 128, "head_major"): 201}
