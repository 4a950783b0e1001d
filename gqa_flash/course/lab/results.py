"""The committed measurements, by topic: two folders, each with its own ``INDEX.csv``.

* ``notebooks/data/`` holds what the notebooks and the README read; it ships
  in the student edition.
* ``bench/record/`` holds the rest of the record: superseded sweeps, tile
  explorations, probes, the logs of tests/gpu. It stays with the instructor
  (the student edition leaves it out), and bench/RESULTS.md discusses it.

Each row of an index names one topic (``forward_main``, ``memory``, ...), the
file in that index's folder that holds it, what was measured, the command
that made it, the date and the GPU. A topic is listed once over both indexes.
Notebooks and their generators ask for a topic, never for a file name, so a
newer run replaces an older one by editing one line of an index::

    rows = results.load("forward_main")     # a CSV: its rows, as dicts of strings
    log = results.load("backward_dq_add")   # anything else: its path
    print(results.cite("forward_main"))     # which file, date and GPU the numbers come from
    results.two(row["ratio_to_sdpa_default"])  # "0.965" -> "0.97": two decimals, as a reader rounds

A folder that is not there (``bench/record/`` in the student edition) has no
topics. Nothing here keeps state: every call reads the indexes again (a few lines each).
"""

from __future__ import annotations

import csv
import math
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

from gqa_flash.course import layout

RECORD_DIR = layout.COURSE_DIR / "bench" / "record"
FOLDERS = (layout.DATA_DIR, RECORD_DIR)  # what the notebooks and the README read, then the rest of the record
INDEX = layout.DATA_DIR / "INDEX.csv"
COLUMNS = ("topic", "file", "what", "command", "date", "gpu")


def index(path=None) -> dict[str, dict]:
    """Every topic: {topic: its row (topic, file, what, command, date, gpu)}, of the index at ``path``,
    or of both folders' indexes together when ``path`` is None."""
    if path is None:
        return {topic: row for topic, (_, row) in _located().items()}
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise ValueError(f"{path}: columns {reader.fieldnames}, expected {list(COLUMNS)}")
        rows = list(reader)
    topics = {}
    for row in rows:
        if row["topic"] in topics:
            raise ValueError(f"{path}: topic {row['topic']!r} is listed twice")
        topics[row["topic"]] = row
    return topics


def _located() -> dict[str, tuple[Path, dict]]:
    """{topic: (its folder, its row)} over every folder that has an index."""
    found: dict[str, tuple[Path, dict]] = {}
    for where in FOLDERS:
        if not (where / "INDEX.csv").is_file():
            continue
        for topic, row in index(where / "INDEX.csv").items():
            if topic in found:
                raise ValueError(f"topic {topic!r} is listed in both {_relative(found[topic][0])}/INDEX.csv "
                                 f"and {_relative(where)}/INDEX.csv")
            found[topic] = (where, row)
    return found


def _relative(folder: Path) -> str:
    return folder.relative_to(layout.COURSE_DIR).as_posix()


def _find(topic: str) -> tuple[Path, dict]:
    located = _located()
    if topic not in located:
        raise KeyError(f"no topic {topic!r} in {' or '.join(_relative(f) + '/INDEX.csv' for f in FOLDERS)}; "
                       f"known: {', '.join(sorted(located))}")
    return located[topic]


def entry(topic: str) -> dict:
    """The index's row for ``topic``; a KeyError that lists the known topics otherwise."""
    return _find(topic)[1]


def folder(topic: str) -> Path:
    """The folder whose index lists ``topic``: notebooks/data/ or bench/record/."""
    return _find(topic)[0]


def path(topic: str) -> Path:
    """The file that holds ``topic``."""
    where, row = _find(topic)
    return where / row["file"]


def load(topic: str):
    """A CSV topic's rows (a list of dicts, values as strings); for a log or a text file, its path."""
    p = path(topic)
    if p.suffix != ".csv":
        return p
    with open(p, newline="") as f:
        return list(csv.DictReader(f))


def cite(topic: str) -> str:
    """One line that says where a topic's numbers come from: its file, date and GPU (the command that
    made it is in the index)."""
    where, row = _find(topic)
    return f"source: {_relative(where)}/{row['file']} (topic {topic}, {row['date']}, {row['gpu']})"


def unindexed() -> list[str]:
    """What the indexes and their folders disagree on: files with no topic, topics with no file, and a
    folder with files but no index. Empty when all agree."""
    problems = []
    for where in FOLDERS:
        if not where.is_dir():
            continue  # bench/record/ in the student edition
        name = _relative(where)
        present = {p.name for p in where.iterdir() if p.is_file() and p.name != "INDEX.csv"
                   and not p.name.startswith(".")}
        if not (where / "INDEX.csv").is_file():
            problems += [f"{name}/INDEX.csv is missing ({len(present)} files there)"] if present else []
            continue
        listed = {row["file"] for row in index(where / "INDEX.csv").values()}
        problems += [f"{file}: in {name} but in no topic of {name}/INDEX.csv" for file in sorted(present - listed)]
        problems += [f"{file}: in {name}/INDEX.csv but not in {name}" for file in sorted(listed - present)]
    return problems


def two(value, sign: bool = False) -> str:
    """A measured number (a CSV's string, or a float read from one) with two decimals, a half rounded
    up, as a reader of the CSV rounds it: "0.965" reads 0.97, where Python's format gives 0.96 (the
    float 0.965 is stored as 0.96499...). The CSVs write ratios with three decimals, so every ratio
    the notebooks and docs quote goes through here. A difference of two such numbers should be
    rounded to three decimals first (``round(a - b, 3)``). ``sign`` writes a plus sign too."""
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    d = Decimal(str(value)).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
    return f"{d:+}" if sign else f"{d}"


def span(values, fmt: str | None = None) -> str:
    """The range of some measured numbers, "lo–hi" (one number when both ends read alike): each end with
    :func:`two`, or with ``fmt`` (a format such as "{:.0f}") for numbers that are not ratios."""
    lo, hi = (fmt.format(v) if fmt else two(v) for v in (min(values), max(values)))
    return lo if lo == hi else f"{lo}–{hi}"
