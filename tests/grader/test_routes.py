"""Every cheating route of the catalogue scores 0, is flagged with its line, and leaves the grader's records alone.

Why: issue 46. The routes (tests/grader/routes/catalog.py) are graded files a determined student writes to score
without writing attention, grouped by class. Each is graded as the instructor grades, on the instructor's
course (it holds ``solutions/``, which the routes look for), one part at a time, in a batch of two at once whose
records (a CSV row and a Gradescope results file each) are written as each finishes, while the others run.

Two runs:

* with every defence (the static gate first): each route's part scores 0 and ``report.integrity`` says
  "<part>.py scores 0: ... <file> line N ..." (the gate's verdict, or the layer beneath that caught it);
* with the gate off, the routes marked ``beneath`` (of the ones the gate refuses, a case or more of each class
  that has any): the layers beneath it (the executor's audit hook, the own-work and kernel-only guards, the OS
  sandbox, the judge apart) must still score the part 0, flagged. A route the gate lets through has met those
  layers in the first run already.

After each run the records are checked: one CSV row per submission with its score, each results file's score
the report's, the canary in the grading folder as it was, nothing left there, the course's graded tests (what
grading reads: tests/graded/, tests/conftest.py) as they were, and no file of the routes' marker in the course's
tests or in site-packages. (Not a hash of all of tests/: people edit it while this runs.)

Classes unseen-shapes and forged-outputs are not integrity violations once past the gate (the work is the
student's, wrong or in shapes the checks refuse; the output is not a plain tensor of the answer): there the part
must earn nothing beyond the points of the cases whose every row fits in one tile, and no flag is required.

A case that scores, or is not flagged, is a hole: it stays here, marked ``xfail(strict=True)`` with what it
scored and why (HOLES below), so that the run says so until the hole is closed, and then fails until the mark
goes. Each route fails on its first test when the grader holds, so ``first_failure`` keeps the runs short.
"""

import csv
import hashlib
import json
import re
import site
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import pytest

from gqa_flash.course import layout
from gqa_flash.course.grader import gate, grade, sandbox
from gqa_flash.course.grader.gradescope import write_json
from gqa_flash.course.grader.report import GradeBook, num, table, total
from gqa_flash.course.grader.testrun import Limits
from gqa_flash.course.testing import folder

sys.path.insert(0, str(Path(__file__).parent))
from routes.catalog import CANARY, CLASSES, MARKER, ROUTES  # noqa: E402

COURSE = layout.COURSE_DIR
JOBS = 2
WITH_GATE = Limits(first_failure=True, timeout_cap_s=60)
BENEATH = Limits(first_failure=True, timeout_cap_s=60, gate=False)
NOT_INTEGRITY = ("unseen-shapes", "forged-outputs")  # wrong work or a wrong output past the gate: no flag needed
# The most a wrong-shaped walk may keep: the cases whose every row fits in one tile, where a row walk is a tile
# walk (tiled's seq_len 1 and 5, 1 point each; forward's one token).
ONE_TOKEN_POINTS = 2.0
BY_NAME = {r.name: r for r in ROUTES}
BENEATH_ROUTES = [r for r in ROUTES if r.beneath]
COST = ("forward", "tiled", "online_softmax", "ring", "naive")  # the longest gradings first: a shorter tail

# Holes found: (run, route) -> what it scored and why. Each makes its case an xfail(strict=True): it fails (as
# expected) while the hole is open, and the run fails once it is closed, until its line here goes.
HOLES: dict[tuple[str, str], str] = {
    ("beneath", "mismatch_patched_at_import"): (
        "0 points, but not flagged: replacing gqa_flash.course.testing.mismatch in the executor changes no verdict "
        "(the judge compares), and nothing beneath the gate sees a module's attribute set"),
    ("beneath", "counters_forged"): (
        "25/25, no flag: the tile and whole-matrix counts forged as in counters_forged_from_an_annotation, the "
        "modes' instance attributes set through torch.overrides' and _python_dispatch's mode stacks; nothing "
        "beneath the gate refuses it, and the judge trusts the executor's counts"),
    ("beneath", "numpy_in_the_launcher"): (
        "36/40, no flag: only the gate refuses NumPy; numpy is already imported (no audit import event) and the "
        "kernel-only guard sees no PyTorch op compute; a kernel that does nothing is launched"),
    ("beneath", "memmove_blinds_the_guard"): (
        "20/20, no flag: ctypes is already imported (no audit import event) and ctypes.memmove on addresses from "
        "id() raises no audit event: it overwrites integrity._ATTENTION_WORDS in place and SDPA goes unrecognised"),
}


def _params(routes, run):
    return [pytest.param(r, id=r.name, marks=[pytest.mark.xfail(strict=True, reason=HOLES[(run, r.name)])]
                         if (run, r.name) in HOLES else []) for r in routes]


# --- grading the catalogue --------------------------------------------------------------------------------------


def _course_fingerprint() -> dict[str, str]:
    """{path: sha256} of the course's tests that grading reads (tests/graded/ and tests/conftest.py): what a
    route writing "into the course" aims at. (Not all of tests/: people edit it while this runs.)"""
    paths = [COURSE / "tests" / "conftest.py", *sorted((COURSE / "tests" / "graded").rglob("*"))]
    return {p.relative_to(COURSE).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in paths if p.is_file() and "__pycache__" not in p.parts}


def _marked_files() -> list[str]:
    """Files named after the routes' marker where one could land: anywhere in the course's tests, and
    site-packages (a .pth file)."""
    found = [str(p) for p in (COURSE / "tests").rglob(f"*{MARKER}*")]
    return found + [str(p) for place in map(Path, site.getsitepackages()) for p in place.glob(f"*{MARKER}*")]


class Graded:
    """One run over some routes: their reports, and where the grader's records of them went."""

    def __init__(self, root: Path, routes, limits: Limits):
        self.root, self.routes = root, routes
        self.work = root / "grading"  # the graders' copies go here (and are removed); so does the canary
        self.records = root / "records"
        for d in (self.work, self.records, root / "submissions"):
            d.mkdir()
        self.canary = self.work / CANARY
        self.canary.write_text("the grader's, untouched\n")
        self.csv = self.records / "grades.csv"
        self.course_before = _course_fingerprint()
        self.marked_before = _marked_files()
        parts = [p for p in layout.GRADED_MODULES if any(r.part == p for r in routes)]
        book = GradeBook(self.csv, parts, hidden=False)
        course = sandbox.snapshot()
        self.reports, self.results = {}, {}
        start = time.monotonic()
        with ThreadPoolExecutor(max_workers=JOBS) as pool:
            futures = {}
            for r in sorted(routes, key=lambda r: COST.index(r.part)):
                src = folder(root / "submissions", r.name, {f"{r.part}.py": r.code})
                futures[pool.submit(grade.grade, src, course=course, only={r.part}, limits=limits,
                                    workdir=self.work)] = r
            for future in as_completed(futures):  # as a batch does: each record written while others run
                r, report = futures[future], future.result()
                results = self.records / f"{r.name}.json"
                write_json(results, report)
                book.add(report, str(results))
                self.reports[r.name], self.results[r.name] = report, results
        self.seconds = time.monotonic() - start
        self.course_after = _course_fingerprint()
        self.marked_after = _marked_files()
        self.left_in_work = sorted(p.name for p in self.work.iterdir())


@pytest.fixture(scope="module")
def with_gate(tmp_path_factory):
    return Graded(tmp_path_factory.mktemp("with_gate"), ROUTES, WITH_GATE)


@pytest.fixture(scope="module")
def beneath(tmp_path_factory):
    return Graded(tmp_path_factory.mktemp("beneath"), BENEATH_ROUTES, BENEATH)


# --- what every route must come to -------------------------------------------------------------------------------


def _verdict(report, route) -> None:
    part = route.part
    text = f"{route.cls}/{route.name}:\n{table(report)}\nintegrity: {report.integrity}"
    assert report.error is None, text
    tests = [t for t in report.tests if t.part == part]
    aimed = [t for t in tests if t.name.startswith(route.aims) or t.name == "static gate"]
    assert aimed, text
    flags = [f for f in report.integrity if f.startswith(f"{part}.py scores 0: ")]
    for flag in flags:  # a flag names the line of the graded file that did it
        line = re.search(rf"\b{part}\.py line (\d+)", flag)
        assert line and 1 <= int(line[1]) <= len(route.code.splitlines()), flag
    if not route.integrity:  # a wrong answer past the gate: it earns nothing, flag or not
        assert not aimed[0].passed, text
        assert total(t.score for t in aimed) <= ONE_TOKEN_POINTS, text
        return
    assert report.part_score(part)[0] == 0, text
    assert not any(t.passed for t in tests), text
    assert flags, f"not flagged: {text}"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("route", _params(ROUTES, "gate"))
def test_with_every_defence_a_route_scores_0_and_is_flagged_with_its_line(with_gate, route):
    _verdict(with_gate.reports[route.name], route)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("route", _params(BENEATH_ROUTES, "beneath"))
def test_beneath_the_gate_a_route_still_scores_0(beneath, route):
    _verdict(beneath.reports[route.name], route)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("run", ["with_gate", "beneath"])
def test_the_graders_records_and_the_course_are_untouched(run, request):
    graded = request.getfixturevalue(run)
    reports = graded.reports
    rows = {row["submission"]: row for row in csv.DictReader(graded.csv.open(encoding="utf-8"))}
    assert len(rows) == len(reports) == len(graded.routes), sorted(rows)
    for name, report in reports.items():
        row = rows[report.submission]
        assert row["score"] == num(report.score) and row[BY_NAME[name].part] == num(report.part_score(
            BY_NAME[name].part)[0]), (name, row)
        results = json.loads(graded.results[name].read_text(encoding="utf-8"))
        assert results["score"] == round(report.score, 6), (name, results["score"], report.score)
        assert not any("modified the course copy" in n for n in report.notes), (name, report.notes)
    assert graded.canary.read_text() == "the grader's, untouched\n"
    assert graded.left_in_work == [CANARY], f"left in the grading folder: {graded.left_in_work}"
    changed = {p for p in graded.course_before.keys() | graded.course_after.keys()
               if graded.course_before.get(p) != graded.course_after.get(p)}
    assert not changed, f"the course's tests changed while the routes were graded: {sorted(changed)}"
    assert graded.marked_after == graded.marked_before == [], graded.marked_after
    assert sorted(p.name for p in graded.records.iterdir()) == sorted(
        [graded.csv.name, *(f"{r.name}.json" for r in graded.routes)])


def _refused_by_the_gate(route) -> bool:
    stub = sandbox.snapshot().files.get(f"gqa_flash/{route.part}.py")
    return bool(gate.check(f"{route.part}.py", route.code, stub))


@pytest.mark.timeout(120)
def test_the_catalogue_has_two_cases_or_more_of_every_class():
    names = [r.name for r in ROUTES]
    assert len(names) == len(set(names)), "route names are unique"
    refused = {r.name: _refused_by_the_gate(r) for r in ROUTES}
    for r in BENEATH_ROUTES:  # one the gate lets through meets the layers beneath it with the gate on already
        assert refused[r.name], f"{r.name} is graded beneath the gate, but the gate lets it through"
    for cls in CLASSES:
        cases = [r for r in ROUTES if r.cls == cls]
        assert len(cases) >= 2, cls
        assert any(r.beneath or not refused[r.name] for r in cases), f"{cls}: no case meets what lies beneath"
    assert {r.cls for r in ROUTES} <= set(CLASSES)
    assert all(r.integrity == (r.cls not in NOT_INTEGRITY) for r in ROUTES)
    assert {r.part for r in ROUTES} <= set(layout.GRADED_MODULES)
    for r in ROUTES:
        compile(r.code, f"{r.part}.py", "exec")  # a whole module each
    assert not set(HOLES) - {(run, r.name) for r in ROUTES for run in ("gate", "beneath")}, "a hole of no route"


@pytest.mark.timeout(120)
def test_the_graded_files_are_written_as_students_write_them():
    # Each route names its own graded file's entry point, as the stub does.
    entry = {"naive": "def naive_attention(", "tiled": "def tiled_attention(", "online_softmax": "def online_softmax(",
             "forward": "def flash_attention_forward(", "ring": "def ring_source("}
    for r in ROUTES:
        assert entry[r.part] in r.code, r.name
