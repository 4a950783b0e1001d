"""The committed measurements, by topic: one index, ``notebooks/data/INDEX.csv``.

Each row of the index names one topic (``forward_main``, ``memory``, ...), the
file under ``notebooks/data/`` that holds it, what was measured, the command
that made it, the date and the GPU. Notebooks and their generators ask for a
topic, never for a file name, so a newer run replaces an older one by editing
one line of the index::

    rows = results.load("forward_main")     # a CSV: its rows, as dicts of strings
    log = results.load("backward_dq_add")   # anything else: its path
    print(results.cite("forward_main"))     # which file, date and GPU the numbers come from

Nothing here keeps state: every call reads the index again (it is a few lines).
"""

from __future__ import annotations

import csv
from pathlib import Path

from gqa_flash import layout

INDEX = layout.DATA_DIR / "INDEX.csv"
COLUMNS = ("topic", "file", "what", "command", "date", "gpu")


def index(path=INDEX) -> dict[str, dict]:
    """Every topic of the index: {topic: its row (topic, file, what, command, date, gpu)}."""
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


def entry(topic: str) -> dict:
    """The index's row for ``topic``; a KeyError that lists the known topics otherwise."""
    topics = index()
    if topic not in topics:
        raise KeyError(f"no topic {topic!r} in {INDEX}; known: {', '.join(sorted(topics))}")
    return topics[topic]


def path(topic: str) -> Path:
    """The file that holds ``topic``."""
    return layout.DATA_DIR / entry(topic)["file"]


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
    row = entry(topic)
    return f"source: notebooks/data/{row['file']} (topic {topic}, {row['date']}, {row['gpu']})"


def unindexed() -> list[str]:
    """What the index and the folder disagree on: data files with no topic, and topics with no file."""
    listed = {row["file"] for row in index().values()}
    present = {p.name for p in layout.DATA_DIR.iterdir()
               if p.is_file() and p != INDEX and not p.name.startswith(".")}
    return ([f"{name}: in notebooks/data but in no topic of INDEX.csv" for name in sorted(present - listed)]
            + [f"{name}: in INDEX.csv but not in notebooks/data" for name in sorted(listed - present)])
