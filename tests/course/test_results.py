"""The measurements' indexes (gqa_flash/course/lab/results.py): notebooks/data/INDEX.csv and bench/record/INDEX.csv.

Each index and its folder agree, file for file; every topic the notebooks and
their generators read, and every file the README and the notebooks name, is in
notebooks/data/ (the part that ships to students); and notebooks/data/ holds
nothing else: the rest of the record lives in bench/record/, with the instructor.
"""

import json
import re

import pytest

from gqa_flash.course import layout
from gqa_flash.course.lab import results

COURSE = layout.COURSE_DIR
MAX_NOT_CSV = 5  # logs and text files a student unpacks with the data (the issue "Learnable from the student's seat")


def _reader_texts() -> dict[str, str]:
    """What reads the data: the notebooks' cells, their generators in tools/, the package, the README."""
    texts = {}
    for p in sorted(layout.NOTEBOOKS_DIR.glob("*.ipynb")):
        cells = json.loads(p.read_text())["cells"]
        texts[p.relative_to(COURSE).as_posix()] = "\n".join("".join(c["source"]) for c in cells)
    for p in sorted((COURSE / "tools").glob("*.py")) + sorted(layout.PACKAGE_DIR.rglob("*.py")):
        if p.name != "results.py":  # its docstring's examples read nothing
            texts[p.relative_to(COURSE).as_posix()] = p.read_text()
    texts["README.md"] = (COURSE / "README.md").read_text()
    for p in sorted((COURSE / "docs").glob("*.md")):  # the README's own parts: the guide, the performance record
        texts[p.relative_to(COURSE).as_posix()] = p.read_text()
    return texts


def files_read() -> dict[str, set[str]]:
    """{file name: the files that read it}: a topic a notebook, a generator or the package names (as a string:
    results.load("memory"), or a tuple of topics), or a file the README or a notebook names (h200_memory.csv,
    or the README's `..._repeat.csv` for the one file whose name ends so)."""
    topics = results.index()
    read: dict[str, set[str]] = {}
    for where, text in _reader_texts().items():
        names = {topics[t]["file"] for t in re.findall(r"[\"']([a-z0-9_]+)[\"']", text) if t in topics}
        if where == "README.md" or where.startswith(("notebooks/", "docs/")):
            # h100_... and h200_... files named in prose; bench/record/ files are cited there, not read
            names |= set(re.findall(r"(?<!record/)\bh[0-9]00_\w+\.(?:csv|log|txt)\b", text))
            for suffix in re.findall(r"\.\.\.(_\w+\.(?:csv|log|txt))", text):
                ending = [row["file"] for row in topics.values() if row["file"].endswith(suffix)]
                names |= set(ending) if len(set(ending)) == 1 else set()
        for name in names:
            read.setdefault(name, set()).add(where)
    return read


def test_each_index_and_its_folder_agree():
    problems = results.unindexed()
    assert not problems, "the indexes and their folders disagree:\n" + "\n".join(problems)
    assert set(results.index(results.INDEX)) <= set(results.index())  # one topic, one row, over both indexes


def test_the_check_finds_a_file_without_a_topic_and_a_topic_without_a_file(tmp_path, monkeypatch):
    data, record = tmp_path / "data", tmp_path / "record"
    for folder in (data, record):
        folder.mkdir()
        (folder / "INDEX.csv").write_text(",".join(results.COLUMNS) + "\n")
    (data / "INDEX.csv").write_text((data / "INDEX.csv").read_text() + "memory,gone.csv,w,c,d,g\n")
    (record / "stray.log").write_text("x")
    monkeypatch.setattr(results, "FOLDERS", (data, record))
    monkeypatch.setattr(layout, "COURSE_DIR", tmp_path)
    problems = results.unindexed()
    assert problems == ["gone.csv: in data/INDEX.csv but not in data", "stray.log: in record but in no topic of "
                        "record/INDEX.csv"], problems
    (record / "INDEX.csv").write_text((record / "INDEX.csv").read_text() + "memory,stray.log,w,c,d,g\n")
    with pytest.raises(ValueError, match="'memory' is listed in both"):
        results.index()


def test_what_the_course_reads_ships_in_notebooks_data():
    # A topic a notebook reads must resolve in the student edition too, where bench/record/ is not.
    shipped = {row["file"] for row in results.index(results.INDEX).values()}
    elsewhere = {name: sorted(where) for name, where in files_read().items() if name not in shipped}
    assert not elsewhere, f"read by the course but not in notebooks/data/: {elsewhere}"


def test_notebooks_data_holds_only_what_the_notebooks_and_the_readme_read():
    present = sorted(p.name for p in layout.DATA_DIR.iterdir() if p.is_file() and p.name != "INDEX.csv")
    unread = [name for name in present if name not in files_read()]
    assert not unread, f"in notebooks/data/ but read by no notebook nor the README (move to bench/record/): {unread}"
    not_csv = [name for name in present if not name.endswith(".csv")]
    assert len(not_csv) <= MAX_NOT_CSV, f"more than {MAX_NOT_CSV} files in notebooks/data/ are not CSV: {not_csv}"


def test_no_measurement_is_named_for_a_round_of_work():
    rounds = re.compile(r"_(final|before|after|review|first|last|old|new|v\d+)(_|\.)")
    named = [row["file"] for row in results.index().values() if rounds.search(row["file"])]
    assert not named, f"name these for what they measured, not for when: {named}"


@pytest.mark.parametrize("value, sign, shown", [
    ("0.965", False, "0.97"), (0.965, False, "0.97"),  # Python's format gives 0.96: the float is 0.96499...
    ("1.045", False, "1.05"), (0.955, False, "0.96"), ("0.964", False, "0.96"), ("1", False, "1.00"),
    (round(0.941 - 0.846, 3), True, "+0.10"), (-0.005, True, "-0.01"), (0.0, True, "+0.00"),
    (float("nan"), False, "nan"),
])
def test_two_rounds_a_measured_number_as_a_reader_of_its_csv_would(value, sign, shown):
    assert results.two(value, sign=sign) == shown
