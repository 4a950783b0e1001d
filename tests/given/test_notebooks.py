"""The notebooks on the stubs: every cell runs, and every check of student code says FAIL, never PASS.

A student who has written nothing yet must be able to run every notebook top
to bottom and read one FAIL per exercise, not a stack trace. A check cell is
a cell whose first line is ``# NBVAL_CHECK_OUTPUT``; it checks student code
when it calls ``checks.check_<part>()`` or ``checks.progress()``
(gqa_flash/course/lab/checks/, notebook 06's bonus checks included). Other check
cells (a notebook's own data checks, say) must only run.

The stubs are generated afresh from solutions/ into a temporary copy of the
course (as in test_stubs_fail.py), so a student's own work in gqa_flash/ does
not matter, and each notebook runs there in a fresh kernel with
GQA_FLASH_IMPL=student. In the student edition (no solutions/), the copy holds
the student's own files: every cell must still run and every check must give
a verdict, PASS or FAIL.

(With the solutions, nbval checks the stored outputs of the same cells:
``GQA_FLASH_IMPL=solutions pytest --nbval-lax --nbval-current-env notebooks``.)
"""

import re
import shutil

import nbformat
import pytest
from nbclient import NotebookClient

from gqa_flash.course import layout

COURSE = layout.COURSE_DIR
STUBS_KNOWN = (COURSE / "solutions").is_dir()  # else: the student edition, whose graded files are the student's
EXERCISE_NOTEBOOKS = ("00", "01", "02", "03", "03b", "04", "04b")  # the graded path, 03b's puzzles, 04b's bonus
NOTEBOOKS = sorted((COURSE / "notebooks").glob("[0-9][0-9]*_*.ipynb"))  # 00_... to 07_..., and 03b_triton_primer
CHECK_MARK = "# NBVAL_CHECK_OUTPUT"
STUDENT_CHECK = re.compile(r"\b\w*checks\.(check_\w+|progress)\(")


@pytest.fixture(scope="module")
def stub_course(tmp_path_factory):
    course = tmp_path_factory.mktemp("course")
    ignore = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints")
    shutil.copytree(COURSE / "gqa_flash", course / "gqa_flash", ignore=ignore)
    shutil.copytree(COURSE / "notebooks", course / "notebooks", ignore=ignore)
    if STUBS_KNOWN:
        from gqa_flash.course.grader import stubs

        for path, text in stubs.plan(COURSE / "solutions", course / "gqa_flash").items():
            path.write_text(text)
    return course


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 5, f"expected the course's notebooks in {COURSE / 'notebooks'}"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_on_the_stubs_and_every_check_fails(stub_course, notebook, monkeypatch):
    monkeypatch.setenv("GQA_FLASH_IMPL", "student")
    monkeypatch.setenv("PYTHONPATH", str(stub_course))  # the kernel imports the stub copy of gqa_flash
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # let the package decide, as for a student
    where = stub_course / "notebooks"
    nb = nbformat.read(where / notebook.name, as_version=4)
    client = NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(where)}})
    client.execute()

    errors, n_checks = [], 0
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        outputs = cell.get("outputs", [])
        errors += [f"cell {index}: {o.ename}: {o.evalue}" for o in outputs if o.output_type == "error"]
        if not (cell.source.lstrip().startswith(CHECK_MARK) and STUDENT_CHECK.search(cell.source)):
            continue
        n_checks += 1
        lines = "".join(o.get("text", "") for o in outputs if o.output_type == "stream").splitlines()
        passed = [line for line in lines if line.startswith("PASS")]
        if STUBS_KNOWN:
            assert not passed, f"{notebook.name} cell {index} passes on the stubs: {passed}"
        verdict = "FAIL" if STUBS_KNOWN else ("PASS", "FAIL")
        assert any(line.startswith(verdict) for line in lines), (
            f"{notebook.name} cell {index} printed no {verdict} line:\n" + "\n".join(lines)
        )
    assert not errors, f"{notebook.name} raised on the stubs:\n" + "\n".join(errors)
    if notebook.name.startswith("04_") and STUBS_KNOWN:  # the stubs' address parts fail: a run could crash Python
        printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
        assert "your kernel is not run yet" in printed, "notebook 04 ran the whole kernel on the stubs"
    if notebook.name.split("_")[0] in EXERCISE_NOTEBOOKS:
        assert n_checks > 0, f"{notebook.name} has no check cell of student code (first line {CHECK_MARK!r})"
