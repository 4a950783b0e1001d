"""What the notebooks say, read from their files: verdicts, GPUs, cited files, and the pictures' words.

tests/given/test_notebooks.py runs the notebooks on the stubs, and nbval compares the
check cells with their stored outputs; neither reads the text. These tests read
the stored notebooks (outputs from a run with the solutions) and the pictures'
functions, for what a student reading them would trip on: a check cell that
prints a table where the page promises a verdict, a heading that names one GPU
over numbers from another, a picture whose words disagree with the text, and a
file cited that the student edition does not ship.
"""

import re
import subprocess
import sys

import matplotlib
import nbformat
import pytest

from gqa_flash.course import decode_launch, layout
from tools_path import student_edition as edition
from gqa_flash.course.lab import decode_viz, perf_plots, results

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COURSE = layout.COURSE_DIR
NOTEBOOKS = sorted((COURSE / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
PUZZLE_NOTEBOOKS = ("03b_triton_primer",)  # its kernels are written in the notebook: its stored checks say FAIL
CHECK_MARK = "# NBVAL_CHECK_OUTPUT"
GPU_MODEL = re.compile(r"\b(?:GH|[ABHL])\d{2,3}\b")  # H100, H200, A100, GH200, L40...
CITED = re.compile(r"source: \S+ \(topic (\w+), [\d-]+, ([^)]+)\)")  # results.cite()'s line


def _read(name):
    return nbformat.read(COURSE / "notebooks" / f"{name}.ipynb", as_version=4)


def _printed(cell) -> list[str]:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.output_type == "stream").splitlines()


@pytest.mark.parametrize("notebook", [p for p in NOTEBOOKS if p.stem not in PUZZLE_NOTEBOOKS], ids=lambda p: p.stem)
def test_every_check_cell_shows_a_pass_and_no_fail_with_the_solutions(notebook):
    """make test-browser reads each check cell as a student sees it: PASS alone with the solutions. A table in
    a check cell reads as neither; tables belong in unchecked cells (nbval does not compare those)."""
    nb = nbformat.read(notebook, as_version=4)
    bad = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and cell.source.lstrip().startswith(CHECK_MARK):
            lines = [line.strip() for line in _printed(cell)]
            if not any(line.startswith("PASS") for line in lines) or any(line.startswith("FAIL") for line in lines):
                bad.append(f"cell {i} prints:\n  " + "\n  ".join(lines[:6]))
    assert not bad, f"{notebook.name}: check cells that do not show PASS alone:\n" + "\n".join(bad)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_headings_over_measured_numbers_name_the_gpu_that_measured_them(notebook):
    """A table that cites its file (results.cite: "..., NVIDIA H100 80GB HBM3)") sits under headings (the
    title, its section, its subsection) that name no GPU or name that one: never an H200 title over H100 rows."""
    nb = nbformat.read(notebook, as_version=4)
    headings = {}  # level -> the latest heading of that level
    wrong = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                m = re.match(r"(#{1,3}) ", line)
                if m:
                    level = len(m.group(1))
                    headings = {k: v for k, v in headings.items() if k < level} | {level: line}
            continue
        for line in _printed(cell):
            for topic, gpu in CITED.findall(line):
                model = GPU_MODEL.search(gpu).group(0)
                for heading in headings.values():
                    named = set(GPU_MODEL.findall(heading))
                    if named and model not in named:
                        wrong.append(f"cell {i} prints {topic} ({gpu}) under {heading!r}")
    assert not wrong, f"{notebook.name}:\n" + "\n".join(wrong)


def _titles(fig) -> str:
    return " | ".join([fig._suptitle.get_text() if fig._suptitle else ""] + [ax.get_title() for ax in fig.axes])


def test_every_performance_picture_names_the_gpu_of_its_rows():
    row = dict(provider="course_fast", head_dim="128", seq_len="4096", tflops="400", status="ok", batch="4",
               q_heads="32", kv_heads="8", causal="True", gpu="NVIDIA H100 80GB HBM3", peak_mem_mib="8.0")
    fig, (a, b, c) = plt.subplots(1, 3)
    try:
        perf_plots.plot_roofline([row], a, matmul_tflops=500.0, copy_tbps=2.5)
        perf_plots.plot_throughput([row], b, 128, matmul_tflops=500.0)
        memory_row = {k: v for k, v in row.items() if k != "gpu"}  # the memory sweep's CSV has no gpu column
        perf_plots.plot_memory([memory_row], c, gpu="NVIDIA H100 80GB HBM3")
        for ax in (a, b, c):
            assert "H100" in ax.get_title() and "H200" not in ax.get_title(), ax.get_title()
        with pytest.raises(ValueError, match="pass gpu="):
            perf_plots.plot_memory([memory_row], c)  # a picture without its GPU is refused
        with pytest.raises(ValueError, match="measured on"):
            perf_plots.plot_throughput([row, dict(row, gpu="NVIDIA H200")], b, 128, matmul_tflops=500.0)
    finally:
        plt.close(fig)
    assert perf_plots.gpu("memory") == results.entry("memory")["gpu"]
    decode = results.load("decode_public_api")
    fig = decode_viz.plot_decode_bandwidth(decode)
    try:
        assert {r["gpu"] for r in decode} == {"NVIDIA H100 80GB HBM3"}
        assert "NVIDIA H100 80GB HBM3" in fig._suptitle.get_text()
    finally:
        plt.close(fig)


def test_sm_fill_picture_draws_the_split_count_the_launcher_picks(monkeypatch):
    """Notebook 07's text: split into as many chunks as keep every program in one wave of two a SM. The
    picture counts the same: one wave at batch 1, 32k (it once said "1.9 waves", counting one a SM)."""
    monkeypatch.setattr(decode_launch, "_sm_count", lambda device: decode_viz.H200_SMS)
    for batch in (1, 2, 8, 16, 64):
        for context in (64, 1000, 1024, 8192, 32768, 131072):
            wanted, launched = decode_viz.split_counts(batch, context)
            assert wanted == decode_launch.default_num_splits(batch * 8, context, decode_launch.SPLIT_BLOCK_N, None)
            assert 1 <= launched <= wanted, (batch, context, wanted, launched)
            assert batch * 8 * launched <= 2 * decode_viz.H200_SMS or launched == 1
    assert decode_viz.split_counts(1, 32768) == (33, 32)
    fig = decode_viz.plot_sm_fill(batch=1, kv_heads=8, context=32768)
    try:
        no_split, split = (ax.get_title() for ax in fig.axes)
        assert "1 x 8 x 32 = 256 programs" in split and "one wave" in split, split
        assert "124 SMs idle" in no_split, no_split
        assert not re.search(r"\d\.\d waves", _titles(fig)), _titles(fig)
    finally:
        plt.close(fig)
    assert "2 waves, the last of 56 programs alone" in decode_viz.sm_fill_title(320)  # batch 8, 5 splits


def test_notebook_07_says_where_the_split_heuristic_lives():
    text = "\n".join(c.source for c in _read("07_decoding").cells)
    mentions = [m.group(0) for m in re.finditer(r"`default_num_splits` in `[^`]+`", text)]
    assert mentions and all("gqa_flash/course/decode_launch.py" in m for m in mentions), mentions
    assert "def default_num_splits(" in (COURSE / "gqa_flash" / "course" / "decode_launch.py").read_text()
    assert "splits_on_an_h200" not in text, "the table computes with decode_viz.split_counts, as the picture does"


def _ships(path: str) -> bool:
    """Whether the student edition holds a file, or a folder's files (tools/student_edition.py)."""
    return not path.startswith(edition.LEFT_OUT) and path.startswith(edition.SHIPPED)


@pytest.mark.parametrize("name", [p.stem for p in NOTEBOOKS])
def test_a_notebook_cites_only_files_the_student_has(name):
    """A path in a notebook's text or code is one the student edition ships (bench/record/, the exploration
    and probe scripts stay with the instructor): the course's record is cited by what the student has."""
    nb = _read(name)
    cited = set()
    for cell in nb.cells:
        cited |= {p.rstrip(".") for p in re.findall(r"\b((?:bench|docs|gqa_flash|notebooks|tests|tools|solutions)/"
                                                   r"[\w./-]*)", cell.source)}
    missing = sorted(p for p in cited if not (COURSE / p).exists())
    left_out = sorted(p for p in cited if not _ships(p))
    assert not missing, f"{name} cites paths that do not exist: {missing}"
    assert not left_out, f"{name} cites files the student edition does not ship: {left_out}"


def test_notebook_05_gives_a_laptop_a_path_and_keeps_the_record_in_the_docs():
    nb = _read("05_performance")
    intro = nb.cells[0].source
    markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    sections = sorted(set(re.findall(r"^## (\d)\.", markdown, re.M)))
    assert sections == [str(n) for n in range(1, 7)], sections
    path = [line for line in intro.splitlines() if line.startswith("| ")]
    assert path, "notebook 05 opens with a table: what a student on a laptop reads, skips and runs"
    for n in sections:
        assert any(re.search(rf"\b{n}\. ", line) for line in path), f"the path names no part of section {n}"
    assert any("GPU" in line and line.lstrip("| ").startswith("6.") for line in path), "say that section 6 needs a GPU"
    assert "docs/performance.md" in intro
    # The record (every fixed tile, every Gluon step) is in the docs; the notebook prints none of those files.
    record_topics = ("fast_forward_tiles", "forward_first", "fast_subtiles", "lazy_rescaling",
                     "hopper_forward_one_program_a_tile", "hopper_forward_persistent", "hopper_forward_variants",
                     "hopper_forward_split_release")
    printed = {topic for c in nb.cells if c.cell_type == "code" for line in _printed(c)
               for topic, _ in CITED.findall(line)}
    assert not printed & set(record_topics), sorted(printed & set(record_topics))
    docs = (COURSE / "docs" / "performance.md").read_text()
    record = docs[docs.index("## Notebook 05's record"):]
    for topic in record_topics:
        assert results.path(topic).name in record, f"docs/performance.md's record has no table of {topic}"


def test_notebook_05_and_its_record_are_what_the_generator_writes():
    done = subprocess.run([sys.executable, str(COURSE / "tools" / "make_performance_notebook.py"), "--check"],
                          cwd=COURSE, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "are what tools/make_performance_notebook.py writes" in done.stdout, (
        done.stdout + done.stderr)


@pytest.mark.parametrize("name,generator", [("05_performance", "make_performance_notebook.py"),
                                            ("06_backward_and_training", "make_backward_notebook.py")])
def test_a_generated_notebook_names_its_generator_and_is_what_it_writes(name, generator):
    # 05 and 06 are written by tools/; neither said so, and no test regenerated 06.
    assert _read(name).metadata["gqa_flash"]["generated_by"] == f"tools/{generator}"
    done = subprocess.run([sys.executable, str(COURSE / "tools" / generator), "--check"], cwd=COURSE,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and f"what tools/{generator} writes" in done.stdout, done.stdout + done.stderr


def test_notebook_07s_measured_numbers_are_those_of_its_csvs():
    """Notebook 07's account of the H100 run is prose, typed from notebooks/data/h100_decode_public_api.csv and
    h200_decode.csv; it had drifted from them (eager "0.96-1.21x" where the file gives 0.97-1.21, SDPA's host
    time "15-21" us where it reaches 25). Each number is computed here from the file and looked for in the text."""
    import csv

    text = " ".join(" ".join(c.source.split()) for c in _read("07_decoding").cells if c.cell_type == "markdown")

    def rows_of(name):
        with open(COURSE / "notebooks" / "data" / name) as f:
            return [r for r in csv.DictReader(f) if r["status"] == "ok"]

    def by_shape(rows, provider, cache, timing=None):
        return {(int(r["batch"]), int(r["context"])): r for r in rows if r["provider"] == provider
                and r["cache"] == cache and (timing is None or r["timing"] == timing)}

    def span(values, digits=2, unit="×"):
        lo, hi = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
        return (lo if lo == hi else f"{lo}–{hi}") + unit

    rows = rows_of("h100_decode_public_api.csv")
    graph = by_shape(rows, "flash_decode", "contiguous", "cuda_graph")
    paged = by_shape(rows, "flash_decode", "paged", "cuda_graph")
    plain = by_shape(rows, "flash_decode", "contiguous", "plain")
    sdpa = by_shape(rows, "sdpa_default", "contiguous", "plain")
    ratio = {k: float(r["ratio_to_sdpa_default"]) for k, r in graph.items()}
    long = [v for (b, n), v in ratio.items() if n >= 8192]
    wanted = [f"{span(long)} from 8k tokens at every batch",
              f"{span([v for (b, n), v in ratio.items() if n >= 8192 and b == 1])} at batch 1 from 8k",
              f"{ratio[(1, 1024)]:.2f}× at batch 1, 1k, where a whole step takes "
              f"{float(graph[(1, 1024)]['ms']) * 1000:.0f} microseconds"]
    share = {k: float(graph[k]["ms"]) / float(paged[k]["ms"]) for k in graph}
    usual = [v for v in share.values() if v >= 0.95]
    wanted.append(f"runs at {span(usual, unit='')} of the contiguous speed at {len(usual)} of the {len(share)} shapes, "
                  f"{share[(1, 1024)]:.2f} at batch 1, 1k and {share[(1, 8192)]:.2f} at batch 1, 8k")
    split = [float(r["host_us"]) for k, r in plain.items() if int(r["num_splits"]) > 1 and k != (1, 1024)]
    whole = [float(r["host_us"]) for r in plain.values() if int(r["num_splits"]) == 1]
    wanted.append(f"level with SDPA or ahead at every shape "
                  f"({span([float(r['ratio_to_sdpa_default']) for r in plain.values()])}): a call costs the host "
                  f"about {span(split, 0, '')} microseconds with a split and {span(whole, 0, '')} without (the `host "
                  f"us` column; SDPA's {span([float(r['host_us']) for r in sdpa.values()], 0, '')}; the first "
                  f"shape's {float(plain[(1, 1024)]['host_us']):.0f} is the process warming up)")
    h200 = rows_of("h200_decode.csv")
    flex = {k: float(r["ratio_to_sdpa_default"]) for k, r in by_shape(h200, "flex", "contiguous").items()}
    padded = [float(r["ratio_to_sdpa_default"]) for r in by_shape(h200, "course_prefill_padded", "contiguous").values()]
    wanted += [f"Flex ran at {span([v for (b, n), v in flex.items() if b < 64])} of SDPA at batch 1 and 8 and "
               f"{span([v for (b, n), v in flex.items() if b == 64])} at batch 64 up to 8k",
               f"padded to the whole context it ran at {min(padded):.3f}–{max(padded):.2f}× of SDPA"]
    missing = [w for w in wanted if w not in text]
    assert not missing, "notebook 07's text does not say what its CSVs hold:\n" + "\n".join(missing)


def test_every_signature_a_notebook_shows_is_the_one_in_the_file():
    """Notebook 07 showed `split_partial(..., N_Q, HEAD_DIM, BLOCK_N, ...)` where decode.py has `N_Q, HEAD_DIM,
    N_PAGES, BLOCK_N`: a signature typed into the text drifts from the file. Each `def` a notebook's text shows
    (in a ```python block) must have the parameters of the function of that name in a graded file."""
    import ast

    defined: dict[str, list] = {}
    for path in sorted((COURSE / "solutions").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                defined.setdefault(node.name, []).append([a.arg for a in node.args.args])
    wrong = []
    for notebook in NOTEBOOKS:
        for cell in _read(notebook.stem).cells:
            if cell.cell_type != "markdown":
                continue
            for block in re.findall(r"```python\n(.*?)```", cell.source, re.S):
                try:
                    tree = ast.parse(block)
                except SyntaxError:
                    continue
                for node in ast.walk(tree):
                    if isinstance(node, ast.FunctionDef) and node.name in defined:
                        shown = [a.arg for a in node.args.args]
                        if shown not in defined[node.name]:
                            wrong.append(f"{notebook.stem}: {node.name}({', '.join(shown)}), the file has "
                                         f"({', '.join(defined[node.name][0])})")
    assert not wrong, "\n".join(wrong)
