"""Notebook 04b's pictures and counts (gqa_flash/course/lab/window_viz.py): each figure builds, and the counts of
the work agree with the specification, ``reference.visible``, tile by tile."""

import matplotlib
import pytest
import torch

from gqa_flash.course.lab import viz, window_viz
from gqa_flash.reference import visible

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# (seq_len, block_m, block_n, window, sink_tokens): ragged lengths, W = 1, W past the sequence, sink tokens inside
# and outside the window, a block of sink tokens only, BLOCK_M below, at and above BLOCK_N
CASES = [(96, 32, 16, None, 0), (83, 32, 16, 9, 0), (83, 32, 16, 9, 3), (100, 16, 16, 1, 1), (70, 16, 32, 20, 16),
         (64, 32, 16, 200, 5), (129, 64, 16, 40, 17), (5, 32, 16, 2, 1), (150, 32, 32, 33, 40)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "n{}-{}x{}-w{}-s{}".format(*c))
def test_the_tiles_a_query_tile_needs_are_those_its_rows_see(case):
    seq_len, block_m, block_n, window, sink_tokens = case
    kinds = window_viz.tile_kinds(seq_len, block_m, block_n, window, sink_tokens)
    pos = torch.arange(seq_len)
    seen = visible(pos, pos, True, window, sink_tokens)
    for qt in range(kinds.shape[0]):
        rows = seen[qt * block_m:(qt + 1) * block_m]
        for kb in range(kinds.shape[1]):
            tile = rows[:, kb * block_n:(kb + 1) * block_n]
            full = tile.shape[1] == block_n and bool(tile.all())
            want = 1 if full else (2 if bool(tile.any()) else 0)
            assert kinds[qt, kb] == want, f"{case}: query tile {qt}, key block {kb}: {kinds[qt, kb]}, want {want}"
    counts = window_viz.score_tiles(seq_len, block_m, block_n, window, sink_tokens)
    assert counts == (kinds > 0).sum(axis=1).tolist(), case


def test_causal_counts_are_notebook_04s():
    for seq_len, block_m, block_n in ((96, 16, 16), (128, 32, 16), (96, 32, 32)):
        assert (window_viz.tile_kinds(seq_len, block_m, block_n) == viz.tile_kinds(seq_len, block_m, block_n)).all()


def test_a_window_costs_n_w_and_causal_n_squared_over_2():
    n, block_m, block_n, window = 131072, 128, 64, 4096
    causal = sum(window_viz.score_tiles(n, block_m, block_n))
    windowed = sum(window_viz.score_tiles(n, block_m, block_n, window))
    assert causal == sum(2 * t + 2 for t in range(n // block_m))  # two key blocks a query tile, to the diagonal
    per_tile = -(-(window + block_m - 1) // block_n) + 1  # W + BM - 1 keys, not aligned to a block: one more
    assert windowed <= n // block_m * per_tile
    assert window_viz.score_tiles(n, block_m, block_n, n) == window_viz.score_tiles(n, block_m, block_n)
    lines = window_viz.work_table(seq_lens=(4096, 131072), windows=(128, window))
    assert lines[-1].split()[:2] == ["128k", f"{causal:,d}"] and f"{windowed:,d}" in lines[-1]


@pytest.mark.parametrize("draw", [window_viz.plot_masks, window_viz.plot_key_blocks, window_viz.plot_work,
                                  window_viz.plot_sink], ids=lambda f: f.__name__)
def test_the_figures_build(draw):
    fig = draw()
    try:
        fig.canvas.draw()
        assert fig.axes
    finally:
        plt.close(fig)
