"""What the notebooks tell a student agrees with the course: its graded tests, its parts, the edition's files.

* The graded head dims: what notebooks 00 and 04 say the graded tests use is what tests/graded/ uses.
* The parts in order: a notebook presents a graded file's parts in the order of the file's banners, each
  section followed by folded hints and a check cell.
* Paths: a notebook names only files the student edition ships (tools/student_edition.py).
* The course speaks to students: no notebook talks of the course's own backlog (its issues, machines not lent).
"""

from __future__ import annotations

import ast
import inspect
import json
import re
from pathlib import Path

import pytest

from gqa_flash.course import layout, testing

COURSE = layout.COURSE_DIR
NOTEBOOKS = COURSE / "notebooks"
GRADED = COURSE / "tests" / "graded"
REQUIRED = ("test_naive.py", "test_online_softmax.py", "test_tiled.py", "test_forward.py")  # the 100 points
# The notebooks these tests hold to their word (the ones this file was written for; add others as they comply).
CHECKED = ("00_setup_and_map", "04_triton_kernel", "04b_windows_and_sinks", "08_context_parallel")


def cells(name: str, kind: str | None = None) -> list[dict]:
    nb = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())
    return [c for c in nb["cells"] if kind is None or c["cell_type"] == kind]


def text(name: str, kind: str | None = "markdown") -> str:
    return "\n".join("".join(c["source"]) for c in cells(name, kind))


# --- the graded head dims ------------------------------------------------------------------------------------


def _table_column(node: ast.Assign, source: str) -> int | None:
    """The column of D in a module-level table of cases, from its comment: ``CASES = [  # (Hq, Hkv, N, D, ...)``."""
    line = source.splitlines()[node.lineno - 1]
    comment = re.search(r"#\s*\(([^)]*)\)", line)
    if not comment:
        return None
    names = [n.strip() for n in comment.group(1).split(",")]
    return names.index("D") if "D" in names else None


def graded_head_dims(test_file: Path) -> set[int]:
    """Every head dim a graded test file uses: ``head_dim=`` literals, tuple assignments, the D column of its
    case tables, and the default of an input maker called without one."""
    source = test_file.read_text()
    dims: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            keywords = {k.arg: k.value for k in node.keywords}
            value = keywords.get("head_dim")
            if isinstance(value, ast.Constant) and isinstance(value.value, int):
                dims.add(value.value)
            name = getattr(node.func, "id", getattr(node.func, "attr", None))
            maker = getattr(testing, name, None) if name in ("peaked_qkv", "random_qkv", "decode_inputs") else None
            if maker is not None and value is None and not any(k.arg is None for k in node.keywords):
                default = inspect.signature(maker).parameters["head_dim"].default
                if isinstance(default, int):
                    dims.add(default)
        elif isinstance(node, ast.Assign):
            target, value = node.targets[0], node.value
            if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
                for t, v in zip(target.elts, value.elts):
                    if getattr(t, "id", None) == "head_dim" and isinstance(v, ast.Constant):
                        dims.add(v.value)
            elif isinstance(value, ast.List) and (column := _table_column(node, source)) is not None:
                dims |= {row.elts[column].value for row in value.elts
                         if isinstance(row, ast.Tuple) and isinstance(row.elts[column], ast.Constant)}
    return dims


def test_the_head_dims_are_found_in_the_graded_tests():
    dims = graded_head_dims(GRADED / "test_forward.py")
    assert {24, 80, 96, 256} <= dims, dims  # the cases' tables, a literal, and the corner case at 256
    assert 16 in graded_head_dims(GRADED / "test_naive.py")


def _stated(notebook: str) -> tuple[list[tuple[int, int]], list[int]]:
    said = text(notebook)
    ranges = [(int(a), int(b)) for a, b in re.findall(r"head dims (?:from )?(\d+) (?:to|up to) (\d+)", said)]
    corners = [int(d) for d in re.findall(r"corner case[^.]*? at head dim (\d+)", said)]
    return ranges, corners


@pytest.mark.parametrize("notebook, files", [("00_setup_and_map", REQUIRED),
                                             ("04_triton_kernel", ("test_forward.py",))])
def test_the_notebooks_state_the_graded_head_dims(notebook, files):
    dims = sorted(set().union(*(graded_head_dims(GRADED / f) for f in files)))
    corner, ordinary = dims[-1], dims[:-1]
    ranges, corners = _stated(notebook)
    assert ranges, f"{notebook} does not say which head dims the graded tests use ({', '.join(files)}: {dims})"
    assert set(ranges) == {(ordinary[0], ordinary[-1])}, (
        f"{notebook} says the graded tests use head dims {ranges}; {', '.join(files)} use {dims}: "
        f"{ordinary[0]} to {ordinary[-1]}, and one corner case at {corner}")
    assert corners == [corner], f"{notebook} must name the graded corner case at head dim {corner}; it says {corners}"
    assert "past 128" not in text(notebook), f"{notebook} still says no graded test goes past 128"


def test_00_and_04_agree_on_the_kernels_corner_case():
    assert _stated("00_setup_and_map")[1] == _stated("04_triton_kernel")[1]


# --- the parts, in order -------------------------------------------------------------------------------------

PART_NOTEBOOKS = [("04_triton_kernel", "forward.py"), ("04b_windows_and_sinks", "windows.py"),
                  ("07_decoding", "decode.py"), ("08_context_parallel", "ring.py")]
BANNER = re.compile(r"STUDENT IMPLEMENTATION REQUIRED HERE \(Part (\d+)\)")


def banner_parts(module: str) -> list[tuple[int, str]]:
    """(part, function) in the order the graded file's banners come, the function being the one each sits in."""
    parts, function = [], None
    for line in (layout.PACKAGE_DIR / module).read_text().splitlines():
        if m := re.match(r"def (\w+)\(", line):
            function = m.group(1)
        if m := BANNER.search(line):
            parts.append((int(m.group(1)), function))
    return parts


def notebook_parts(notebook: str) -> list[tuple[int, str, int]]:
    """(part, function, cell index) of each heading ``## Part N: `function`...`` in the notebook, in order."""
    found = []
    for index, cell in enumerate(cells(notebook)):
        if cell["cell_type"] == "markdown":
            found += [(int(n), f, index) for n, f in re.findall(r"^#+ Part (\d+): `(\w+)", "".join(cell["source"]),
                                                                re.M)]
    return found


@pytest.mark.parametrize("notebook, module", PART_NOTEBOOKS)
def test_a_notebook_presents_its_parts_in_the_files_order(notebook, module):
    expected = banner_parts(module)
    assert [p for p, _ in expected] == list(range(1, len(expected) + 1)), f"{module}'s banners: {expected}"
    got = [(p, f) for p, f, _ in notebook_parts(notebook)]
    assert got == expected, f"{notebook} presents the parts {got}; {module} has them in the order {expected}"


@pytest.mark.parametrize("notebook, module", PART_NOTEBOOKS)
def test_each_part_has_folded_hints_then_a_check(notebook, module):
    every = cells(notebook)
    heads = notebook_parts(notebook)
    for (part, function, start), end in zip(heads, [h[2] for h in heads[1:]] + [len(every)]):
        section = every[start:end]
        sources = ["".join(c["source"]) for c in section]
        hints = [i for i, (c, s) in enumerate(zip(section, sources)) if c["cell_type"] == "markdown"
                 and "<details>" in s]
        checks = [i for i, (c, s) in enumerate(zip(section, sources)) if c["cell_type"] == "code"
                  and s.lstrip().startswith("# NBVAL_CHECK_OUTPUT") and "checks.check_" in s]
        assert hints, f"{notebook}, Part {part} ({function}): no folded hint (<details>)"
        assert checks and checks[0] > hints[0], f"{notebook}, Part {part} ({function}): no check cell after its hints"


def test_08_prints_no_merge_formula_outside_its_hints():
    # The merge's two lines are Part 3's answer: they belong in a folded hint, never in the open text.
    for cell in cells("08_context_parallel", "markdown"):
        source = "".join(cell["source"])
        open_text = re.sub(r"<details>.*?</details>", "", source, flags=re.S)
        assert not re.search(r"e\^\{\\mathrm\{LSE\}_a - \\mathrm\{LSE\}\}", open_text), open_text[:300]
        assert "\\log\\left(e^{\\mathrm{LSE}_a}" not in open_text, open_text[:300]


# --- the files a notebook names ------------------------------------------------------------------------------

PATH = re.compile(r"(?<![\w/.])((?:bench|docs|tests|tools|solutions|gqa_flash|notebooks)/[\w./-]*[\w/])")


def cited_paths(notebook: str) -> set[str]:
    return set(PATH.findall(text(notebook, None)))


def edition_rules() -> dict[str, tuple[str, ...]]:
    """SHIPPED and LEFT_OUT of tools/student_edition.py, read as literals (importing it would
    import the whole grader)."""
    tree = ast.parse((layout.COURSE_DIR / "tools" / "student_edition.py").read_text())
    return {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) in ("SHIPPED", "LEFT_OUT")}


def shipped(path: str) -> bool:
    rules = edition_rules()
    return path.startswith(rules["SHIPPED"]) and not path.startswith(rules["LEFT_OUT"])


def test_the_path_rule_knows_what_ships():
    assert shipped("notebooks/data/h200_memory.csv") and shipped("bench/ring_scaling.py") and shipped("tests/gpu/")
    assert not shipped("bench/record/h100_ring_two_processes_one_gpu.csv") and not shipped("docs/instructors.md")
    assert not shipped("solutions/ring.py")


@pytest.mark.parametrize("notebook", CHECKED)
def test_no_notebook_cites_a_path_the_edition_does_not_ship(notebook):
    paths = cited_paths(notebook)
    missing = sorted(p for p in paths if not (COURSE / p).exists())
    assert not missing, f"{notebook} names paths the course does not have: {missing}"
    unshipped = sorted(p for p in paths if not shipped(p))
    assert not unshipped, f"{notebook} names files the student edition does not ship: {unshipped}"


# --- the course speaks to students ---------------------------------------------------------------------------

BACKLOG = re.compile(r"\b(?<!triton )issues?\b(?! #\d)|\blent\b|\bwaits for a machine\b|\ba later (?:issue|session)\b",
                     re.I)


@pytest.mark.parametrize("notebook", CHECKED)
def test_a_notebook_speaks_to_students_not_about_the_backlog(notebook):
    said = [m.group(0) for m in BACKLOG.finditer(text(notebook))]
    assert not said, f"{notebook} talks of the course's own backlog: {said}"
