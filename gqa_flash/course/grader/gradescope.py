"""Gradescope: the ``results.json`` it reads, and the autograder bundle it runs.

Gradescope runs ``run_autograder`` once per submission in a container where
the bundle is unpacked at ``/autograder/source`` and the student's files are
in ``/autograder/submission``; it reads ``/autograder/results/results.json``
(https://gradescope-autograders.readthedocs.io/en/latest/specs/). The bundle
written here holds the course as the student edition does (support modules,
the *stubs* of the graded modules, the graded tests; never ``solutions/``),
an instructor's hidden tests if any, and two scripts:

* ``setup.sh`` (run once, when Gradescope builds the image): a virtual
  environment with CPU-only torch (the image has no GPU, so kernels run in
  Triton's interpreter, in fp16 and fp32), triton, numpy, pytest and
  pytest-timeout. ``TORCH_INDEX_URL`` (default PyTorch's CPU index, empty for
  pip's own) and ``TORCH_REQUIREMENT`` choose torch;
* ``run_autograder``: ``python -m gqa_flash.course.grader /autograder/submission
  --out /autograder/results/results.json``.

``AUTOGRADER_ROOT`` moves ``/autograder`` (both scripts) and ``GQA_FLASH_PYTHON``
overrides run_autograder's Python, so that the course's own tests can run the
bundle in a temporary folder (tests/grader/test_gradescope_layout.py: run_autograder
with the current Python on every ``make test``; setup.sh and three submissions
with ``make test-gradescope``).

The fields of results.json written here, as Gradescope's specification names
them: ``score``, ``execution_time``, ``output``, ``visibility``,
``stdout_visibility`` and ``tests``, each test with ``name``, ``score``,
``max_score``, ``status``, ``output`` and ``visibility``; and one of the
course's own, ``submission``, the file the results are of (not a field of
Gradescope's; a batch's folder of results files needs it). Test points are
whole hundredths that add up exactly to each part's points
(``plugin.shares``): no 0.6667 on Gradescope, and no total of 134.9999.
A module the student has not started (still its stub: ``grade.not_started``) is one entry, "not
started", worth its module's points, not a red entry per test: a student who
skips the bonus sees two lines, not some thirty failures. The bundle holds its
stubs' fingerprints (``grade.STUB_PRINTS``) to tell.

The assignment's total on Gradescope is the instructor's to set, and the
tests' maxima do not give it: they add up to 145 (100 required, 45 bonus).
:func:`total_note` says what to set (100, plus any hidden tests' points), and
:func:`write_bundle` prints it on stderr when it writes the zip.
"""

from __future__ import annotations

import stat
import sys
import zipfile
from pathlib import Path

from gqa_flash.course.grader import sandbox

HIDDEN = "after_due_date"  # Gradescope shows hidden tests' results once the due date has passed
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def results_json(report) -> dict:
    """Gradescope's results.json for one graded submission (a grade.Report)."""
    tests = []
    for part in report.parts().values():
        if all(t.not_started for t in part):
            tests.append(_not_started(part))
            continue
        for t in part:
            tests.append(
                dict(
                    name=_name(t),
                    score=round(t.score, 6),
                    max_score=round(t.max_score, 6),
                    status="passed" if t.passed else "failed",
                    output=t.message,
                    visibility=HIDDEN if t.hidden else "visible",
                )
            )
    return dict(
        submission=report.submission,  # which file these results are of (the batch's CSV says it too)
        score=round(report.score, 6),
        execution_time=int(round(report.seconds)),
        output=report.summary(),
        visibility="visible",
        stdout_visibility="hidden",
        tests=tests,
    )


def _name(test, name: str | None = None) -> str:
    if test.hidden:
        return f"hidden ({test.part}): {test.name}"
    return f"{test.part}.py{' (bonus)' if test.bonus else ''}: {name or test.name}"


def _not_started(tests) -> dict:
    """One entry for a module still holding its stub: its points, and what to do."""
    from gqa_flash.course.grader.report import total  # report imports this module
    from gqa_flash.course.grader.report import NOT_HANDED_IN

    first = tests[0]
    missing = first.message == NOT_HANDED_IN
    what = (f"{first.part}.py was not handed in: it is graded as the stub you were given" if missing else
            f"{first.part}.py is not started: it is the stub you were given")
    return dict(
        name=_name(first, "not handed in" if missing else "not started"),
        score=0,
        max_score=total(t.max_score for t in tests),
        status="failed",
        output=(f"{what}, so none of its {len(tests)} tests can pass."
                + (" It is a bonus: its points come on top of the 100." if first.bonus else "")),
        visibility="visible",
    )


# --- the autograder bundle -------------------------------------------------------

SETUP_SH = """\
#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image.
# Written by `python -m gqa_flash.course.grader --gradescope-bundle`. Settings (all optional):
#   AUTOGRADER_ROOT    where the layout is (default /autograder; the course's own test uses a temporary folder)
#   TORCH_INDEX_URL    where torch comes from (default PyTorch's CPU wheels; set it empty for pip's own index)
#   TORCH_REQUIREMENT  which torch (default {torch}, the course's range)
set -euo pipefail
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
if ! python3 -c "import ensurepip, venv" 2>/dev/null; then  # Ubuntu's base image may lack venv and pip
    apt-get update -q
    apt-get install -y -q python3 python3-venv python3-pip
fi
python3 -m venv "$ROOT/venv"
"$ROOT/venv/bin/python" -m pip install --upgrade pip
# The image has no GPU: CPU wheels of torch (the CUDA ones are gigabytes), and
# Triton runs its kernels in its interpreter.
INDEX="${{TORCH_INDEX_URL-{torch_index}}}"
"$ROOT/venv/bin/python" -m pip install ${{INDEX:+--index-url "$INDEX"}} "${{TORCH_REQUIREMENT:-{torch}}}"
"$ROOT/venv/bin/python" -m pip install -r "$ROOT/source/requirements.txt"
# The student's code runs in a process of its own, shut away (gqa_flash/course/grader/isolation.py): in bubblewrap's
# namespaces where the container allows them, else as this unprivileged user, who cannot read the results.
if [ "$(id -u)" -eq 0 ]; then
    apt-get install -y -q bubblewrap 2>/dev/null || (apt-get update -q && apt-get install -y -q bubblewrap) || true
    id -u gqa-flash-executor >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin \
        gqa-flash-executor
    chmod -R a+rX "$ROOT/venv" "$ROOT/source"
fi
"""

RUN_AUTOGRADER = """\
#!/usr/bin/env bash
# Gradescope runs this for every submission. Written by `python -m gqa_flash.course.grader --gradescope-bundle`.
# AUTOGRADER_ROOT and GQA_FLASH_PYTHON override /autograder and its Python (to try the bundle locally).
set -uo pipefail
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
PYTHON="${{GQA_FLASH_PYTHON:-$ROOT/venv/bin/python}}"
RESULTS="$ROOT/results/results.json"
mkdir -p "$ROOT/results"
chmod 700 "$ROOT/results"  # the grader's alone: the student's code runs as another user (or sandboxed)
cd "$ROOT/source"
PYTHONPATH="$ROOT/source" "$PYTHON" -m gqa_flash.course.grader "$ROOT/submission" --out "$RESULTS" \\
    --timeout {timeout}{extra}
if [ ! -s "$RESULTS" ]; then  # the grader itself failed: say so (in JSON) rather than leave Gradescope guessing
    cat > "$RESULTS" <<'JSON'
{{"score": 0, "visibility": "visible", "tests": [],
 "output": "The autograder failed before it could grade this submission. Please tell your instructor."}}
JSON
fi
"""


def _requirements(course_dir: Path) -> tuple[str, list[str]]:
    """torch's requirement, and the others, from pyproject.toml (pytest and pytest-timeout from the extras)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        return "torch", ["triton", "numpy", "pytest", "pytest-timeout"]
    project = tomllib.loads((course_dir / "pyproject.toml").read_text())["project"]
    deps = list(project["dependencies"])
    deps += [d for d in project.get("optional-dependencies", {}).get("course", []) if d.startswith("pytest")]
    torch = next((d for d in deps if d.replace(" ", "").startswith("torch")), "torch")
    return torch, [d for d in deps if d != torch]


def total_note(course: sandbox.Course) -> str:
    """What to set the assignment's total points to on Gradescope, and why not the sum of the tests' maxima."""
    from gqa_flash.course.grader import grade  # grade imports this module
    from gqa_flash.course.grader.report import num, total

    parts = grade.not_graded(course, course.tests_of(), "")  # a part each, worth its tests' points, never run
    required = [t for t in parts if not t.bonus and not t.hidden]
    bonus, hidden = [t for t in parts if t.bonus], [t for t in parts if t.hidden]
    worth = total(t.max_score for t in required + hidden)

    def listing(tests) -> str:
        return ", ".join(f"{t.part} {num(t.max_score)}" for t in tests)

    lines = [f"On Gradescope, set the assignment's total points to {num(worth)}, the required modules' "
             f"({listing(required)}" + (f"; hidden tests {num(total(t.max_score for t in hidden))}" if hidden else "")
             + ")."]
    if bonus:
        most = total(t.max_score for t in parts)
        lines.append(f"The bonus modules' points ({listing(bonus)}) come on top, so a submission scores up to "
                     f"{num(most)} / {num(worth)}; {num(most)}, the sum of the tests' maxima, is not the total to set.")
    return " ".join(lines)


def write_bundle(dest: Path, course_dir: Path = sandbox.COURSE_DIR, extra_tests: Path | None = None,
                 timeout_s: float = 540, say=lambda line: print(line, file=sys.stderr)) -> list[str]:
    """Write the autograder zip; returns the names in it. ``say`` (None: quiet) gets the line that tells
    the instructor what to set the assignment's total to (:func:`total_note`)."""
    course = sandbox.snapshot(course_dir)
    torch, others = _requirements(course_dir)
    extra = ' \\\n    --extra-tests "$ROOT/source/hidden_tests"' if extra_tests else ""
    files: dict[str, bytes] = dict(course.files)
    from gqa_flash.course.grader import grade  # grade imports this module

    if grade.stub_fingerprints(course_dir):  # how the grader in the bundle tells a module not started
        files[grade.STUB_PRINTS] = grade.stub_manifest(course_dir)
    if extra_tests:
        files.update(sandbox.read_tree(Path(extra_tests), "hidden_tests"))
    files["requirements.txt"] = ("\n".join(others) + "\n").encode()
    scripts = {
        "setup.sh": SETUP_SH.format(torch_index=TORCH_CPU_INDEX, torch=torch),
        "run_autograder": RUN_AUTOGRADER.format(timeout=int(timeout_s), extra=extra),
    }
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in scripts.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFREG | 0o755) << 16  # executable, as Gradescope requires
            archive.writestr(info, text)
        for name, content in sorted(files.items()):
            archive.writestr(name, content)
    if say is not None:
        say(f"{dest}: {total_note(sandbox.snapshot(course_dir, extra_tests=extra_tests))}")
    return sorted([*scripts, *files])
