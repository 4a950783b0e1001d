"""What the notebooks say, read from their files: verdicts, GPUs, cited files, and the pictures' words.

tests/test_notebooks.py runs the notebooks on the stubs, and nbval compares the
check cells with their stored outputs; neither reads the text. These tests read
the stored notebooks (outputs from a run with the solutions) and the pictures'
functions, for what a student reading them would trip on: a check cell that
prints a table where the page promises a verdict, a heading that names one GPU
over numbers from another, a picture whose words disagree with the text, and a
file cited that the student edition does not ship.
"""

import re

import matplotlib
import nbformat
import pytest

from gqa_flash import decode_launch, layout
from gqa_flash.grader import edition
from gqa_flash.lab import decode_viz, results

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COURSE = layout.COURSE_DIR


def _read(name):
    return nbformat.read(COURSE / "notebooks" / f"{name}.ipynb", as_version=4)


def _titles(fig) -> str:
    return " | ".join([fig._suptitle.get_text() if fig._suptitle else ""] + [ax.get_title() for ax in fig.axes])


def test_the_decode_bandwidth_picture_names_the_gpu_of_its_rows():
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
    assert mentions and all("gqa_flash/decode_launch.py" in m for m in mentions), mentions
    assert "def default_num_splits(" in (COURSE / "gqa_flash" / "decode_launch.py").read_text()
    assert "splits_on_an_h200" not in text, "the table computes with decode_viz.split_counts, as the picture does"


def _ships(path: str) -> bool:
    """Whether the student edition holds a file, or a folder's files (gqa_flash/grader/edition.py)."""
    return not path.startswith(edition.LEFT_OUT) and (path.startswith(edition.SHIPPED) or path in edition.EDITION_TESTS)


@pytest.mark.parametrize("name", ["07_decoding"])
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
