"""Gradescope's autograder bundle: ``python -m gqa_flash.course.grader --gradescope-bundle autograder.zip``.

The zip holds the course as the student edition does (support modules, the *stubs* of the graded modules, the
graded tests and the stubs' fingerprints; never the completed files), an instructor's hidden tests if any, and two
scripts:

* ``setup.sh`` (run once, when Gradescope builds the image): a virtual environment with CPU-only torch (the image
  has no GPU, so kernels run in Triton's interpreter, in fp16 and fp32), triton, numpy, pytest and
  pytest-timeout. ``TORCH_INDEX_URL`` (default PyTorch's CPU index, empty for pip's own) and
  ``TORCH_REQUIREMENT`` choose torch;
* ``run_autograder``: ``python -m gqa_flash.course.grader /autograder/submission
  --out /autograder/results/results.json`` (:mod:`gqa_flash.course.grader.gradescope` writes that file).

``AUTOGRADER_ROOT`` moves ``/autograder`` (both scripts) and ``GQA_FLASH_PYTHON`` overrides run_autograder's
Python, so that the course's own tests can run the bundle in a temporary folder (tests/grader/test_gradescope_layout.py:
run_autograder with the current Python on every ``make test``; setup.sh and three submissions with
``make test-gradescope``).

The assignment's total on Gradescope is the instructor's to set, and the tests' maxima do not give it: they add
up to 160 (100 required, 60 bonus). :func:`total_note` says what to set (100, plus any hidden tests' points), and
:func:`write_bundle` prints it on stderr when it writes the zip.
"""

from __future__ import annotations

import stat
import sys
import zipfile
from pathlib import Path

from gqa_flash.course.grader import grade, sandbox, started
from gqa_flash.course.grader.report import num, total

TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

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
    if started.stub_fingerprints(course_dir):  # how the grader in the bundle tells a module not started
        files[started.STUB_PRINTS] = started.stub_manifest(course_dir)
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
