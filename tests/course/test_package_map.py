"""gqa_flash/README.md, the map at the package's door: a row for every entry of the package, each marked as the
student's (graded, with its notebook, its check and its points), support, or to read after finishing.

Before it, only the banners told a student's eight files from the fourteen beside them, and the two partial
maps (docs/instructors.md, gqa_flash/course/lab/__init__.py) missed ten modules between them. A file added to the
package without a row fails here, as does a row whose points, check or notebook are not the course's.
"""

import re
import sys
from pathlib import Path

from gqa_flash.course import layout
from gqa_flash.course.lab import checks

sys.path.insert(0, str(Path(__file__).parents[1] / "given"))  # tests/given/, where test_points.py is
from test_points import graded_tests  # noqa: E402

MAP = layout.PACKAGE_DIR / "README.md"
ROW = re.compile(r"^\| `(?P<entry>[^`]+)` \|(?P<who>[^|]+)\|(?P<what>[^|]+)\|(?P<notebook>[^|]*)\|"
                 r"(?P<check>[^|]*)\|(?P<graded>[^|]*)\|$")


def _rows():
    return {m["entry"]: m for m in map(ROW.match, MAP.read_text().splitlines()) if m}


def _entries(folder, prefix=""):
    return {prefix + p.name + ("/" if p.is_dir() else "") for p in folder.iterdir()
            if p.name != "__pycache__" and not p.name.startswith(".") and p.suffix != ".pyc"}


def test_every_entry_of_the_package_has_a_row_and_every_row_an_entry():
    """A row for each entry of gqa_flash/ and of gqa_flash/course/, where the course's machinery lives."""
    entries = _entries(layout.PACKAGE_DIR) | _entries(layout.PACKAGE_DIR / "course", "course/")
    rows = _rows()
    assert not entries - set(rows), f"gqa_flash/README.md has no row for {sorted(entries - set(rows))}"
    assert not set(rows) - entries, f"gqa_flash/README.md has rows for what the package lacks: " \
                                    f"{sorted(set(rows) - entries)}"
    assert {r["who"].strip().split()[0] for r in rows.values()} <= {"yours", "support", "after"}


def test_the_package_shows_the_students_files_and_five_other_entries():
    """`ls gqa_flash/` shows a student their own files first: the machinery sits in course/, which the map
    says they need not open. Beside the student's files: the API, the map, the spec, fast/ and course/."""
    others = _entries(layout.PACKAGE_DIR) - {f"{m}.py" for m in layout.STUDENT_FILES}
    assert others == {"__init__.py", "README.md", "reference.py", "fast/", "course/"}, sorted(others)


def test_the_registry_of_student_files_is_the_courses():
    """layout.STUDENT_FILES: one entry a graded or practice module, each naming a notebook that exists, a
    whole-file check the notebooks can call, and the points its graded tests' marks add up to."""
    points = {}
    for name, _, marks in graded_tests():
        points[name[5:-3]] = points.get(name[5:-3], 0) + marks.get("points", 0)
    assert set(layout.STUDENT_FILES) == {*layout.GRADED_MODULES, *layout.PRACTICE_MODULES}
    for module, info in layout.STUDENT_FILES.items():
        assert (layout.NOTEBOOKS_DIR / f"{info.notebook}.ipynb").is_file(), module
        assert info.check in checks.__all__, module
        assert info.points == points.get(module, 0), (module, info.points, points.get(module))
        if info.spec.startswith("reference."):
            from gqa_flash import reference

            assert callable(getattr(reference, info.spec.split(".")[1].split()[0])), module


def test_a_students_row_gives_its_notebook_its_check_and_its_points():
    rows = _rows()
    for module, info in layout.STUDENT_FILES.items():
        row = rows[f"{module}.py"]
        bonus = module in layout.BONUS_MODULES
        practice = module in layout.PRACTICE_MODULES
        assert row["who"].strip() == "yours" + (" (bonus)" if bonus else " (practice)" if practice else ""), row[0]
        assert row["notebook"].strip() == info.notebook[:2], row[0]
        assert row["check"].strip() == f"`checks.{info.check}()`", row[0]
        graded = row["graded"].strip()
        assert graded == ("not graded" if practice else f"`tests/graded/test_{module}.py` ({info.points})"), row[0]
    others = [r for e, r in rows.items() if e.removesuffix(".py") not in layout.STUDENT_FILES]
    assert all(not r["who"].startswith("yours") for r in others)


def test_every_stub_has_a_signpost_to_its_spec_its_check_and_its_graded_tests():
    """No stub said what it is measured against: each now names, under its header, its specification, its
    notebook's check, its graded test file and points, and the make command that runs them."""
    from gqa_flash.course.grader import stubs

    for path, text in stubs.plan().items():
        module = path.stem
        info = layout.STUDENT_FILES[module]
        head = text.split('"""', 1)[0]
        assert f"checks.{info.check}()" in head and f"notebooks/{info.notebook}.ipynb" in head, head
        assert info.spec.split(".")[-1].split()[0] in head, head
        if info.points:
            assert f"tests/graded/test_{module}.py: {info.points} points" in head, head
            assert f"make test-graded MODULE={module}" in head, head
        assert (layout.PACKAGE_DIR / path.name).read_text() == text, f"{path.name}: run the release tool"


def test_the_readme_hand_in_list_is_the_registrys():
    """README.md's "Handing in" block lists the graded files in course order, each required or bonus with its
    points, as layout.STUDENT_FILES has them: a file added, renamed or re-weighted there fails here until the
    README says so."""
    readme = (layout.COURSE_DIR / "README.md").read_text()
    first = True
    rows = []
    for name in layout.GRADED_MODULES:
        info = layout.STUDENT_FILES[name]
        if info.bonus:
            rows.append(f"    {name + '.py':<21}bonus, {info.points} (only once you have started it)")
        else:
            rows.append(f"    {name + '.py':<21}required, {info.points}" + (" points" if first else ""))
            first = False
    block = "submission.zip\n" + "\n".join(rows) + "\n```"
    assert block in readme, f"README.md's hand-in list should read:\n{block}"


def test_each_solutions_part_table_names_the_registrys_parts():
    """A completed file's docstring lists its parts (`Part 3  key_loop  ...`). Where the registry names a part
    by its function, the table names the same function: a part renamed in one place only fails here."""
    from gqa_flash.course import impl

    table = re.compile(r"^\s+Part (\d+)\s+(\S+)\s{2,}", re.M)
    for module, info in layout.STUDENT_FILES.items():
        rows = {int(n): name for n, name in table.findall((impl.SOLUTIONS_DIR / f"{module}.py").read_text())}
        for part, title in info.parts.items():
            if title.isidentifier() and "_" in title and rows:  # a function's name, not "dQ"
                assert rows.get(part) == title, (module, part, title, rows.get(part))


def test_only_the_switch_names_the_completed_files():
    """Where the completed graded files live is the implementation switch's to know (gqa_flash/course/impl.py);
    every other module asks it (impl.completed_dir, impl.SOLUTIONS_DIR). The integrity guard and the submission
    review name the folder too, as one of the routes to the answers they refuse."""
    allowed = {"course/impl.py", "course/integrity.py", "course/grader/submission.py"}
    naming = sorted(p.relative_to(layout.PACKAGE_DIR).as_posix() for p in layout.PACKAGE_DIR.rglob("*.py")
                    if "solutions" in p.read_text())
    assert set(naming) <= allowed, f"these name solutions/ themselves; ask impl: {sorted(set(naming) - allowed)}"
