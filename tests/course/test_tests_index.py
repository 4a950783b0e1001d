"""The tests index (docs/instructors.md, "Tests") names every folder of tests/ and nothing that is gone.

tests/ holds a folder for each kind of test, by who runs it and what it covers; the index gives each of
its entries (the folders and the files beside them, conftest.py) a line of its own, and names the folders
inside them (tests/grader/routes/). Its last flat version named 30 of the 48 test files then in tests/.
A file or folder added to tests/ without its line fails here, as does a path the index names that does
not exist.
"""

import re

from gqa_flash.course import layout

GUIDE = layout.COURSE_DIR / "docs" / "instructors.md"
TESTS = layout.TESTS_DIR
SKIPPED = {"__pycache__"}  # written by Python, no part of the course


def index_text() -> str:
    text = GUIDE.read_text()
    found = re.search(r"^## Tests\n(.*?)^## ", text, re.M | re.S)
    assert found, f"{GUIDE.name} has no section '## Tests'"
    return found.group(1)


def entries() -> list[str]:
    """What the index must give a line: each entry of tests/ (a folder as 'tests/name/')."""
    return sorted(f"tests/{p.name}/" if p.is_dir() else f"tests/{p.name}" for p in TESTS.iterdir()
                  if p.name not in SKIPPED and not p.name.startswith("."))


def folders_inside() -> list[str]:
    """The folders inside tests/' folders, which the index must name somewhere."""
    return sorted(f"{p.relative_to(layout.COURSE_DIR).as_posix()}/" for p in TESTS.glob("*/**")
                  if p.is_dir() and p.parent != TESTS and not SKIPPED & set(p.parts)
                  and not any(part.startswith(".") for part in p.relative_to(TESTS).parts))


def test_the_index_has_a_line_for_every_entry_of_tests():
    lines = re.findall(r"^- `(tests/[^`]*)`", index_text(), re.M)
    missing = [entry for entry in entries() if entry not in lines]
    assert not missing, f"docs/instructors.md's tests index has no line (- `path` ...) for: {missing}"
    twice = sorted({line for line in lines if lines.count(line) > 1})
    assert not twice, f"the tests index gives these more than one line: {twice}"


def test_the_index_names_every_folder_inside_them():
    named = set(re.findall(r"`(tests/[^`]*)`", index_text()))
    missing = [folder for folder in folders_inside() if folder not in named]
    assert not missing, f"docs/instructors.md's tests index does not name: {missing}"


def test_every_path_the_index_names_exists():
    named = sorted(set(re.findall(r"`(tests/[^`\s]*)`", index_text())))
    assert named
    gone = [path for path in named if not (layout.COURSE_DIR / path).exists()]
    assert not gone, f"docs/instructors.md's tests index names paths that do not exist: {gone}"
