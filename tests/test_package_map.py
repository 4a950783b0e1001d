"""gqa_flash/README.md, the map at the package's door: a row for every entry of the package, each marked as the
student's (graded, with its notebook, its check and its points), support, or to read after finishing.

Before it, only the banners told a student's eight files from the fourteen beside them, and the two partial
maps (docs/instructors.md, gqa_flash/lab/__init__.py) missed ten modules between them. A file added to the
package without a row fails here, as does a row whose points, check or notebook are not the course's.
"""

import re

from gqa_flash import layout
from gqa_flash.lab import checks
from test_points import graded_tests  # tests/ is on the path, as for conftest.py

MAP = layout.PACKAGE_DIR / "README.md"
ROW = re.compile(r"^\| `(?P<entry>[^`]+)` \|(?P<who>[^|]+)\|(?P<what>[^|]+)\|(?P<notebook>[^|]*)\|"
                 r"(?P<check>[^|]*)\|(?P<graded>[^|]*)\|$")


def _rows():
    return {m["entry"]: m for m in map(ROW.match, MAP.read_text().splitlines()) if m}


def test_every_entry_of_the_package_has_a_row_and_every_row_an_entry():
    entries = {p.name + ("/" if p.is_dir() else "") for p in layout.PACKAGE_DIR.iterdir()
               if p.name != "__pycache__" and not p.name.startswith(".") and p.suffix != ".pyc"}
    rows = _rows()
    assert not entries - set(rows), f"gqa_flash/README.md has no row for {sorted(entries - set(rows))}"
    assert not set(rows) - entries, f"gqa_flash/README.md has rows for what the package lacks: " \
                                    f"{sorted(set(rows) - entries)}"
    assert {r["who"].strip().split()[0] for r in rows.values()} <= {"yours", "support", "after"}


def test_a_students_row_gives_its_notebook_its_check_and_its_points():
    rows = _rows()
    points = {}
    for name, _, marks in graded_tests():
        points[name[5:-3]] = points.get(name[5:-3], 0) + marks.get("points", 0)
    notebooks = {p.name[:2] for p in layout.NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb")}
    for module in (*layout.GRADED_MODULES, *layout.PRACTICE_MODULES):
        row = rows[f"{module}.py"]
        bonus = module in layout.BONUS_MODULES
        practice = module in layout.PRACTICE_MODULES
        assert row["who"].strip() == "yours" + (" (bonus)" if bonus else " (practice)" if practice else ""), row[0]
        assert row["notebook"].strip() in notebooks, row[0]
        check = re.fullmatch(r"`checks\.(\w+)\(\)`", row["check"].strip())
        assert check and check[1] in checks.__all__, row[0]
        graded = row["graded"].strip()
        assert graded == ("not graded" if practice else f"`tests/graded/test_{module}.py` ({points[module]:g})"), \
            row[0]
    others = [r for e, r in rows.items() if e.removesuffix(".py") not in (*layout.GRADED_MODULES,
                                                                          *layout.PRACTICE_MODULES)]
    assert all(not r["who"].startswith("yours") for r in others)
