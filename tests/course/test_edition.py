"""The student edition (tools/student_edition.py): it leaks no solution line, and it works.

One edition is written into pytest's temporary folder for the whole module,
exactly as ``make student-edition DEST=...`` writes it. Then, in that copy:
no line of any solution region can be read anywhere (sources, notebooks and
their outputs, data, docs); the graded tests score 0 on its stubs, each
failure on one line, and full marks once solutions/*.py are copied over the
stubs; the fast kernels run on the CPU; and ``make lab`` answers.

A re-release (``make student-edition DEST=... UPDATE=1``) into an edition in
use keeps its ``.git`` and the instructor's own files, rewrites the course's
files, removes the ones the course dropped, and says which; ``FORCE=1``
replaces the folder whole.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gqa_flash.course import layout
from gqa_flash.course.grader import grade, sandbox, stubs
from tools_path import student_edition as edition
from gqa_flash.course.grader.report import table
from gqa_flash.course.grader.testrun import Limits
from gqa_flash.course.lab import results

COURSE = layout.COURSE_DIR
SOLUTIONS = stubs.COMPLETED_DIR


@pytest.fixture(scope="module")
def student_edition(tmp_path_factory):
    dest = tmp_path_factory.mktemp("edition") / "gqa-flash"
    files = edition.write(dest).files
    return dest, files


def _env(where: Path, **extra) -> dict:
    """A child's environment: the edition's package first on the path, nothing cached outside it."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "GQA_FLASH_IMPL", "PYTEST_ADDOPTS")}
    env.update(PYTHONPATH=str(where), PYTHONDONTWRITEBYTECODE="1", GQA_FLASH_IMPL="student",
               TRITON_HOME=str(where / ".triton"), TRITON_CACHE_DIR=str(where / ".triton" / "cache"), **extra)
    return env


# --- nothing leaks ----------------------------------------------------------------------------------------------

def test_no_solution_line_can_be_read_in_the_edition(student_edition):
    _, files = student_edition
    found = edition.leaks(files, SOLUTIONS)
    assert not found, "solution lines a student can read in the edition:\n" + "\n".join(found)


def test_the_leak_check_finds_a_planted_line():
    # A check that cannot fail proves nothing: the mutants quote solution lines (which is why the
    # edition leaves them out), and a notebook output that printed one is found too.
    mutants = (COURSE / "tests" / "mutants" / "forward.py").read_bytes()
    assert edition.leaks({"tests/mutants/forward.py": mutants}, SOLUTIONS)
    line = stubs.solution_lines((SOLUTIONS / "forward.py").read_text())["4"][0]
    notebook = {"cells": [{"cell_type": "code", "source": ["print(1)"],
                           "outputs": [{"output_type": "stream", "text": ["  " + line.replace(" ", "  ")]}]}]}
    found = edition.leaks({"notebooks/x.ipynb": json.dumps(notebook).encode()}, SOLUTIONS)
    assert any("notebooks/x.ipynb: forward.py Part 4" in f for f in found), found


def test_a_graded_line_another_stub_hands_out_is_a_leak(tmp_path):
    """A stub's given code is exempt only for its own file's solution lines: the bonus backward once
    decoded its program ids with forward.py Part 1's very lines, which a student could read there."""
    forward_part1 = stubs.solution_lines((SOLUTIONS / "forward.py").read_text())["1"]
    line = next(x for x in forward_part1 if "%" in x)  # the batch/head decode, not the group size's definition
    for source in SOLUTIONS.glob("*.py"):
        (tmp_path / source.name).write_text(source.read_text())
    backward = tmp_path / "backward.py"  # given code (outside every region) that repeats the line
    backward.write_text(backward.read_text() + f"\n\ndef _decode(batch_head_idx, N_Q_HEADS):\n    {line}\n")
    found = edition.leaks({"gqa_flash/backward.py": stubs.student_text(backward).encode()}, tmp_path)
    assert any("gqa_flash/backward.py: forward.py Part 1" in f for f in found), found


def test_the_edition_holds_what_a_student_needs_and_no_instructor_file(student_edition):
    dest, files = student_edition
    for name in ("README.md", "Makefile", "course.mk", ".ci/run", "pyproject.toml", "environment.yml",
                 "tests/graded/conftest.py", "gqa_flash/fast/forward.py", "notebooks/data/h200_forward_main.csv"):
        assert (dest / name).is_file(), f"the edition has no {name}"
    assert os.access(dest / ".ci" / "run", os.X_OK)
    for name in ("solutions", "tests/mutants", "tools", "tests/grader/test_mutants.py", "tests/grader/test_grade.py",
                 "tests/course/test_release.py", "tests/course/test_edition.py", "tests/browser",
                 "tools/release.py", "tools/student_edition.py"):
        assert not (dest / name).exists(), f"the edition holds {name}, an instructor's file"
    # The graded files are the stubs written from solutions/, whatever the instructor's gqa_flash/ holds.
    for path, text in stubs.plan(SOLUTIONS, dest / "gqa_flash").items():
        assert path.read_text() == text, f"{path.name} in the edition is not the stub"
    # Notebooks without outputs, so that their text and their outputs agree.
    for path in sorted((dest / "notebooks").glob("*.ipynb")):
        cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        assert cells and all(not c["outputs"] and c["execution_count"] is None for c in cells), path.name
    # A README for students: the shared blocks, no instructor section.
    readme = (dest / "README.md").read_text()
    for block in edition.readme_blocks((COURSE / "README.md").read_text()).values():
        assert block in readme
    for heading in ("## For instructors", "## The implementation switch", "### Releasing", "### Grading",
                    "## Tests\n"):
        assert heading not in readme, f"the student README has the instructor's section {heading.strip()!r}"
    makefile = (dest / "Makefile").read_text() + (dest / "course.mk").read_text()
    for target in ("lab:", "test-graded:", "grade:", "submission:", "test:"):
        assert re.search(rf"^{target}", makefile, re.M), f"the edition's make has no {target[:-1]} target"


DOC_CITED = re.compile(r"(?<![\w./-])docs/[\w./-]*\w")  # docs/instructors.md, docs/api.md#flash-decode...
README_CITED = re.compile(r"\bREADME(?:\.md)?,? \(?\"([^\"]+)\"")  # (README.md, "How the points are shared")


def test_every_doc_a_shipped_file_cites_is_in_the_edition(student_edition):
    """The edition's graded tests once cited docs/instructors.md, which stays with the instructor: a student
    reading "Points follow harm (docs/instructors.md, ...)" found no such file. Every docs/ path that a file of
    the edition names is in the edition, and every README section it names is in the student README."""
    dest, files = student_edition
    readme = files["README.md"].decode()
    missing = []
    for name, content in sorted(files.items()):
        text = edition._readable(name, content)
        missing += [f"{name} cites {path}" for path in sorted(set(DOC_CITED.findall(text)))
                    if path.split("#")[0] not in files]
        missing += [f'{name} cites the README\'s "{section}"' for section in sorted(set(README_CITED.findall(text)))
                    if not re.search(rf"^#+ {re.escape(section)}$", readme, re.M)]
    assert not missing, "cited in the edition, but not in it:\n" + "\n".join(missing)


def test_the_editions_bench_holds_no_probe_and_its_data_only_what_is_read(student_edition):
    """bench/ keeps RESULTS.md, the shell scripts and the Python scripts that made a file of notebooks/data/;
    the probes, the explorations and bench/record/ stay with the instructor. notebooks/data/ holds what a
    notebook or the README reads (tests/course/test_results.py finds the readers), at most five files not CSV."""
    from test_results import MAX_NOT_CSV, files_read  # tests/course/ is on the path, as for every test file

    dest, files = student_edition
    bench = sorted(name.removeprefix("bench/") for name in files if name.startswith("bench/"))
    probes = [name for name in bench if name.startswith(("probe_", "explore_", "register_report", "record/"))]
    assert not probes, f"the edition's bench/ holds probe scripts or the record: {probes}"
    data_index = (dest / "notebooks" / "data" / "INDEX.csv").read_text()
    scripts = [name for name in bench if name.endswith(".py")]
    assert scripts and all(f"bench/{name}" in data_index for name in scripts), \
        f"a script in the edition's bench/ made no file of notebooks/data/: {scripts}"

    data = sorted(name.removeprefix("notebooks/data/") for name in files if name.startswith("notebooks/data/"))
    indexed = {row["file"] for row in results.index(dest / "notebooks" / "data" / "INDEX.csv").values()}
    assert set(data) == indexed | {"INDEX.csv"}, set(data) ^ (indexed | {"INDEX.csv"})
    unread = [name for name in data if name != "INDEX.csv" and name not in files_read()]
    assert not unread, f"the edition's notebooks/data/ holds files no notebook nor the README reads: {unread}"
    not_csv = [name for name in data if not name.endswith(".csv")]
    assert len(not_csv) <= MAX_NOT_CSV, not_csv


def test_the_edition_command_refuses_a_folder_in_use_and_names_the_make_spelling(student_edition, tmp_path, capsys):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    assert edition.main([str(busy)]) == 2
    err = capsys.readouterr().err
    assert "not empty" in err and (busy / "notes.txt").exists()
    # The spelling that works through make, not `make ... --force` (an option of make itself).
    assert f"make student-edition DEST={busy} UPDATE=1" in err and f"make student-edition DEST={busy} FORCE=1" in err
    assert edition.main([str(busy), "--update"]) == 2  # an update rewrites an edition, not any folder
    assert "holds no student edition" in capsys.readouterr().err and (busy / "notes.txt").exists()
    assert edition.main([str(COURSE / "edition")]) == 2
    assert "inside the course" in capsys.readouterr().err
    assert edition.main([str(COURSE.parent), "--force"]) == 2  # never delete the folder that holds the course
    assert "holds the course" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        edition.main([str(busy), "--update", "--force"])
    # FORCE replaces all DEST holds, .git included.
    (busy / ".git").mkdir()
    _, files = student_edition
    changes = edition.write(busy, force=True, files=files)
    assert not (busy / "notes.txt").exists() and not (busy / ".git").exists()
    assert sorted(changes.added) == sorted(files) and (busy / edition.MANIFEST).is_file()


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_passes_update_and_force_on():
    def command(*args):
        out = subprocess.run(["make", "-n", "-o", ".venv/.installed", "student-edition", *args], cwd=COURSE,
                             capture_output=True, text=True, timeout=60).stdout
        return " ".join(line for line in out.splitlines() if "tools/student_edition.py" in line or "--" in line)

    assert "--update" in command("DEST=../x", "UPDATE=1") and "--force" not in command("DEST=../x", "UPDATE=1")
    assert "--force" in command("DEST=../x", "FORCE=1") and "--update" not in command("DEST=../x", "FORCE=1")
    assert "--" not in command("DEST=../x").split("edition", 1)[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_student_edition_echoes_one_command_line():
    # make echoes each recipe line as written: the command was once continued over two lines, and with
    # neither UPDATE nor FORCE it echoed a backslash and then a line of two spaces.
    for mode in ((), ("UPDATE=1",), ("FORCE=1",)):
        out = subprocess.run(["make", "-n", "-o", ".venv/.installed", "student-edition", "DEST=../x", *mode],
                             cwd=COURSE, capture_output=True, text=True, timeout=60).stdout
        lines = out.splitlines()
        assert not [line for line in lines if not line.strip() or line.rstrip().endswith("\\")], out
        assert [line.split("student_edition.py ", 1)[1] for line in lines if "tools/student_edition.py" in line] == \
            ['"../x"' + {"UPDATE=1": " --update", "FORCE=1": " --force"}.get(next(iter(mode), ""), "")], out


def _published(student_edition, tmp_path) -> Path:
    """A copy of the edition as an instructor publishes it: under git, with a file of the instructor's."""
    dest, _ = student_edition
    published = tmp_path / "published"
    shutil.copytree(dest, published, ignore=shutil.ignore_patterns(".triton", "__pycache__"))
    subprocess.run(["git", "init", "-q"], cwd=published, check=True)
    (published / "TA_NOTES.md").write_text("office hours: Tuesdays\n")
    return published


@pytest.mark.skipif(shutil.which("git") is None, reason="no git")
def test_an_update_keeps_git_and_the_instructors_files_and_says_what_changed(student_edition, tmp_path, capsys):
    _, files = student_edition
    published = _published(student_edition, tmp_path)
    # Since the last release: a course file changed, one was added, and one was dropped by the course.
    (published / "README.md").write_text("an older README\n")
    (published / "course.mk").unlink()
    retired = published / "bench" / "retired" / "old_probe.py"
    retired.parent.mkdir()
    retired.write_text("print('an old probe')\n")
    manifest = json.loads((published / edition.MANIFEST).read_text())
    manifest["files"] += ["bench/retired/old_probe.py", "../outside.txt"]  # a path out of the edition is ignored
    (published / edition.MANIFEST).write_text(json.dumps(manifest))
    (tmp_path / "outside.txt").write_text("not the edition's")

    assert edition.main([str(published), "--update"]) == 0
    out = capsys.readouterr().out
    assert "1 added, 2 changed, 1 removed" in out, out
    for line in ("  added    course.mk", "  changed  README.md", f"  changed  {edition.MANIFEST}",
                 "  removed  bench/retired/old_probe.py", "kept 1 file(s) of yours: TA_NOTES.md",
                 "no solution line can be read"):
        assert line in out, out
    assert (published / ".git" / "HEAD").is_file(), "the update deleted the edition's .git"
    assert (published / "TA_NOTES.md").read_text() == "office hours: Tuesdays\n"
    assert (published / "README.md").read_bytes() == files["README.md"]
    assert (published / "course.mk").read_bytes() == files["course.mk"]
    assert not retired.parent.exists() and (tmp_path / "outside.txt").exists()
    assert (published / edition.MANIFEST).read_bytes() == files[edition.MANIFEST]
    assert os.access(published / ".ci" / "run", os.X_OK)

    again = edition.write(published, update=True, files=files)  # released twice: nothing to commit
    assert not (again.added or again.changed or again.removed) and again.kept == ["TA_NOTES.md"]
    assert "nothing changed" in edition.summary(again, published)[0]


def test_an_update_does_not_overwrite_an_instructors_file_the_course_now_has(student_edition, tmp_path):
    _, files = student_edition
    published = _published(student_edition, tmp_path)
    manifest = json.loads((published / edition.MANIFEST).read_text())
    manifest["files"].remove("course.mk")  # as if the course had just added it, where the instructor had one
    (published / edition.MANIFEST).write_text(json.dumps(manifest))
    (published / "course.mk").write_text("# the instructor's own\n")
    with pytest.raises(FileExistsError, match="course.mk"):
        edition.write(published, update=True, files=files)
    assert (published / "course.mk").read_text() == "# the instructor's own\n"


# --- it works ---------------------------------------------------------------------------------------------------

def _graded_run(where: Path) -> tuple[str, float, dict]:
    """make test-graded's command in a copy: its output, its total (bonus included) and each bonus module's points."""
    result = subprocess.run([sys.executable, "-m", "pytest", "tests/graded", "-p", "no:cacheprovider"], cwd=where,
                            env=_env(where), capture_output=True, text=True, timeout=600)
    out = result.stdout + result.stderr
    total = re.search(r"^\s*total\s+([\d.]+) / 100\b", out, re.M)
    assert total, f"no points table at the end of the graded run:\n{out[-3000:]}"
    bonus_lines = re.findall(r"^\s*(\w+)\.py \(bonus\)\s+([\d.]+) / ([\d.]+)", out, re.M)
    bonus = {m: (float(got), float(full)) for m, got, full in bonus_lines}
    return out, float(total.group(1)), bonus


@pytest.mark.timeout(900)
def test_stubs_score_zero_and_the_solutions_score_full_marks(student_edition, tmp_path):
    dest, _ = student_edition
    out, total, bonus = _graded_run(dest)
    assert total == 0 and all(got == 0 for got, _ in bonus.values()), out[-3000:]
    # Each module still holding its stub is one line, "not started", no traceback (make test-graded without -v).
    assert "Traceback" not in out and "def test_" not in out, out[-3000:]
    rows = re.findall(r"^\s*(\w+)\.py(?: \(bonus\))?\s+0 / [\d.]+\s+not started", out, re.M)
    assert sorted(rows) == sorted(layout.GRADED_MODULES), out[-3000:]

    solved = tmp_path / "solved"
    shutil.copytree(dest, solved, ignore=shutil.ignore_patterns(".triton", "__pycache__"))
    for path in SOLUTIONS.glob("*.py"):
        shutil.copy2(path, solved / "gqa_flash" / path.name)
    out, total, bonus = _graded_run(solved)
    assert bonus and all(got == full for got, full in bonus.values()), (bonus, out[-3000:])
    assert total == 100 + sum(full for _, full in bonus.values()), out[-3000:]  # the total counts the bonus


@pytest.mark.timeout(600)
def test_a_zip_without_a_graded_file_is_graded_with_its_stub_not_the_students_copy(student_edition, tmp_path):
    """In a student's edition the package's graded files are the student's own. A zip that lacks naive.py,
    graded there (``make grade ARGS=x.zip``: "exactly as your instructor will"), must be graded with the stub,
    as the instructor's grader grades it: it once got the student's finished naive.py and its points."""
    dest, _ = student_edition
    course = tmp_path / "edition"
    shutil.copytree(dest / "gqa_flash", course / "gqa_flash", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(dest / "tests", course / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(dest / "pyproject.toml", course / "pyproject.toml")
    shutil.copy2(SOLUTIONS / "naive.py", course / "gqa_flash" / "naive.py")  # the student finished naive.py
    snapshot = sandbox.snapshot(course)
    written = stubs.plan(SOLUTIONS, Path("gqa_flash"))
    for path, text in written.items():
        assert snapshot.files[path.as_posix()] == text.encode(), f"{path.name}: the grader's copy is not the stub"

    submitted = tmp_path / "submitted"  # online_softmax.py, not started; no naive.py
    submitted.mkdir()
    (submitted / "online_softmax.py").write_text(written[Path("gqa_flash/online_softmax.py")])
    report = grade.grade(submitted, course=snapshot, only={"naive", "online_softmax"},
                         limits=Limits(submission_s=300), workdir=tmp_path)
    assert report.part_score("naive")[0] == 0 and report.score == 0, table(report)
    assert any("missing naive.py: graded as the unmodified stub" in note for note in report.notes), report.notes


@pytest.mark.timeout(300)
def test_the_fast_kernels_run_in_the_edition_on_a_cpu(student_edition):
    dest, _ = student_edition
    code = (
        "import torch, gqa_flash\n"
        "assert gqa_flash.course.runtime.INTERPRETER or torch.cuda.is_available()\n"
        "g = torch.Generator().manual_seed(0)\n"
        "q = torch.randn(1, 4, 40, 32, generator=g).half(); k, v = (torch.randn(1, 2, 40, 32, generator=g).half()"
        " for _ in range(2))\n"
        "o = gqa_flash.fast_attention_forward(q, k, v, causal=True)\n"
        "ref, _ = gqa_flash.reference_attention(q, k, v, causal=True)\n"
        "err = (o.double().cpu() - ref).abs().max().item(); assert err < 2e-2, err\n"
        "print('fast kernel ok', gqa_flash.__file__, err)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=dest, env=_env(dest, CUDA_VISIBLE_DEVICES=""),
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"fast kernel ok {dest / 'gqa_flash' / '__init__.py'}" in result.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(180)
def test_make_lab_answers_in_the_edition(student_edition, tmp_path):
    dest, _ = student_edition
    # The edition's own `make lab`, with this environment standing in for the .venv its setup would make
    # (-o: do not set it up again), and Jupyter's state in tmp_path.
    venv = tmp_path / "venv"
    venv.symlink_to(Path(sys.prefix), target_is_directory=True)
    port = _free_port()
    env = _env(dest, JUPYTER_CONFIG_DIR=str(tmp_path / "jcfg"), JUPYTER_DATA_DIR=str(tmp_path / "jdata"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "jrun"), IPYTHONDIR=str(tmp_path / "ipy"), BROWSER="true")
    log = tmp_path / "lab.log"
    with open(log, "w") as out:
        lab = subprocess.Popen(["make", "-o", f"{venv}/.installed", "lab", f"VENV={venv}", f"PORT={port}",
                                "LAB_ARGS=--allow-root --no-browser"],
                               cwd=dest, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        token, deadline = None, time.monotonic() + 120
        while token is None and time.monotonic() < deadline and lab.poll() is None:
            found = re.search(rf"127\.0\.0\.1:{port}/lab\?token=(\w+)", log.read_text())
            token = found.group(1) if found else time.sleep(0.5)
        assert token, f"make lab did not start JupyterLab:\n{log.read_text()[-3000:]}"
        # The URL is printed as the server starts listening; on a loaded machine (two test workers, the
        # browser test's own JupyterLab) the first request was once refused: retry for a few seconds, and
        # if it never answers, show the server's log.
        names, error = None, None
        for _ in range(20):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents?token={token}", timeout=20) as r:
                    names = {item["name"] for item in json.load(r)["content"]}
                break
            except urllib.error.URLError as e:
                error = e
                time.sleep(0.5)
        assert names is not None, f"JupyterLab printed its URL but did not answer ({error}):\n{log.read_text()[-3000:]}"
        assert "00_setup_and_map.ipynb" in names and "data" in names, names
    finally:
        os.killpg(lab.pid, 15)
        lab.wait(timeout=30)


def test_every_bench_file_a_page_of_the_edition_cites_is_in_it_or_said_to_stay_behind(student_edition):
    """docs/performance.md and bench/RESULTS.md cite files of bench/record/ and the probe scripts, which stay
    with the instructor: a student following "bench/record/h100_gluon_route_rerun.csv" found no such file.
    The edition's pages now say, under their title, which cited files stay behind; a page or notebook that
    cites one without that note fails here."""
    dest, files = student_edition
    unsaid = []
    for name, content in sorted(files.items()):
        if not name.endswith((".md", ".ipynb")):
            continue
        text = edition._readable(name, content)
        missing = edition.cited_elsewhere(text, files)
        said = next((line for line in text.splitlines() if line.startswith("> **In the student edition**")), "")
        unsaid += [f"{name} cites {path}" for path in missing if f"`{path}`" not in said]
    assert not unsaid, "cited in the edition, neither in it nor said to stay behind:\n" + "\n".join(unsaid)
    for name, content in files.items():  # the edition has no git history: a `git show` is said to need it
        if name.endswith(".md") and edition.GIT_SHOW.search(content.decode()):
            assert "the course's git history" in content.decode().split("\n\n", 2)[1], name
    performance = files["docs/performance.md"].decode().splitlines()
    assert performance[0].startswith("# ") and performance[2].startswith("> **In the student edition**")
    assert "`bench/record/`" in performance[2]
    assert "In the student edition" not in (COURSE / "docs/performance.md").read_text()  # the course's own copy
