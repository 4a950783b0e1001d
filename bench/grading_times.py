"""How long the grader takes on a batch of six kinds of submission, for one or more copies of the course.

    python bench/grading_times.py OUT.csv COURSE [COURSE ...] [--jobs 2] [--label TEXT]

Each COURSE is a checkout of the course (the working tree, or ``git worktree add /tmp/old REV``), graded in
turn on the same machine in the same run, so two versions of the grader compare fairly. The six submissions
are written from this checkout's solutions/: every module right with the bonus, the four required modules,
the required modules with a classic bug in naive.py, a naive.py that hangs, a notebook only, an empty zip.
Each course's batch runs with its own code (``python -m gqa_flash.course.grader`` with that course first on the
path), ``--jobs`` at a time; a row per submission records its seconds and the batch's wall time.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
REQUIRED = ("naive.py", "online_softmax.py", "tiled.py", "forward.py")
BONUS = ("windows.py", "backward.py", "decode.py", "ring.py")
HANG = "def naive_attention(q, k, v, causal=True, sm_scale=None):\n    while True:\n        pass\n"


def submissions(root: Path) -> dict[str, str]:
    """The six zips, {file name: what it is}."""
    solutions = HERE / "solutions"

    def zipped(name, files):
        with zipfile.ZipFile(root / name, "w") as z:
            for member, text in files.items():
                z.writestr(member, text)

    def sol(names):
        return {n: (solutions / n).read_text() for n in names}

    bug = sol(REQUIRED)
    bug["naive.py"] = bug["naive.py"].replace("// group_size", "% n_kv_heads", 1)
    zipped("full_marks.zip", sol(REQUIRED + BONUS))
    zipped("required_only.zip", sol(REQUIRED))
    zipped("classic_bugs.zip", bug)
    zipped("hangs_in_naive.zip", {**sol(REQUIRED), "naive.py": HANG})
    zipped("notebook_only.zip", {"01_naive_attention.ipynb": json.dumps({"cells": []})})
    zipped("empty.zip", {})
    return {"full_marks.zip": "every module right, bonus included",
            "required_only.zip": "the four required modules right, no bonus",
            "classic_bugs.zip": "required modules, naive.py with % for // (a classic bug)",
            "hangs_in_naive.zip": "required modules, naive.py hangs (an endless loop)",
            "notebook_only.zip": "a notebook only (stopped at once)",
            "empty.zip": "an empty zip (stopped at once)"}


def grade(course: Path, subs: Path, work: Path, jobs: int) -> tuple[float, list[dict]]:
    out = work / "results"
    book = work / "grades.csv"
    env = dict(os.environ, PYTHONPATH=str(course))
    env.pop("GQA_FLASH_IMPL", None)
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "gqa_flash.course.grader", *map(str, sorted(subs.iterdir())),
                    "--csv", str(book),
                    "--out", f"{out}/", "--jobs", str(jobs), "--workdir", str(work)], cwd=course, env=env,
                   check=False, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - start
    return wall, list(csv.DictReader(book.open()))


def load() -> float:
    return os.getloadavg()[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("courses", type=Path, nargs="+")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--label", action="append", default=[], help="a name for each course, in order")
    args = parser.parse_args()
    import torch
    import triton

    machine = (f"{platform.processor() or platform.machine()}, no GPU, Triton interpreter, torch {torch.__version__}, "
               f"triton {triton.__version__}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        subs = Path(tmp) / "subs"
        subs.mkdir()
        kinds = submissions(subs)
        for i, course in enumerate(args.courses):
            label = args.label[i] if i < len(args.label) else str(course)
            work = Path(tmp) / f"work{i}"
            work.mkdir()
            before = load()
            wall, graded = grade(course.resolve(), subs, work, args.jobs)
            after = load()
            for row in graded:
                name = Path(row["submission"]).name
                rows.append(dict(date=time.strftime("%Y-%m-%d"), grader=label, machine=machine,
                                 cores=os.cpu_count(), load_1min_before=f"{before:.2f}", load_1min_after=f"{after:.2f}",
                                 jobs=args.jobs, batch_wall_s=f"{wall:.0f}", submission=name, kind=kinds.get(name, ""),
                                 score=row["score"], max_score=row["max_score"], seconds=row["seconds"],
                                 isolation=row.get("isolation", "")))
            print(f"{label}: batch {wall:.0f} s", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
