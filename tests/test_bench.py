"""The benchmark's bookkeeping, its clean exit on a machine with no GPU, and the plots' inputs."""

import types

import pytest
import torch

from gqa_flash import impl, runtime
from gqa_flash.lab import bench, perf_plots


def test_flops_are_counted_as_stated():
    case = bench.Case(torch.bfloat16, causal=True, head_dim=128, seq_len=4096)
    assert case.batch == 4
    assert case.flops == 4 * 4 * 32 * 4096**2 * 128 / 2
    assert bench.Case(torch.bfloat16, False, 64, 1024).flops == 4 * 16 * 32 * 1024**2 * 64


def test_main_sweep_is_the_anchor_grid():
    cases = bench.sweep("main")
    lengths = (1024, 2048, 4096, 8192, 16384)
    assert {(c.head_dim, c.seq_len) for c in cases} == {(d, n) for d in (64, 128) for n in lengths}
    assert all(c.causal and c.dtype == torch.bfloat16 and (c.q_heads, c.kv_heads) == (32, 8) for c in cases)
    extra = bench.sweep("extra")
    assert {(c.q_heads, c.kv_heads) for c in extra} >= {(32, 32), (32, 1)} and any(not c.causal for c in extra)


def test_the_graded_providers_are_what_the_switch_points_to(monkeypatch):
    """The benchmark times whatever GQA_FLASH_IMPL chooses: it never names an implementation itself."""
    asked = []

    def load(name, choice=None):
        asked.append((name, choice))
        return types.SimpleNamespace(flash_attention_forward=lambda q, k, v, causal: ("forward", q),
                                     naive_attention=lambda q, k, v, causal: ("naive", q))

    monkeypatch.setattr(impl, "load", load)
    table = bench.providers()
    assert sorted(asked) == [("forward", None), ("naive", None)]
    assert table["course_graded"]("q", "k", "v", True) == ("forward", "q")
    assert table["naive"]("q", "k", "v", True) == ("naive", "q")


def test_every_csv_row_says_which_implementation_was_timed():
    for fields in (bench.FIELDS, bench.MEMORY_FIELDS):
        assert {"date", "gpu", "driver", "torch", "triton", "impl"} <= set(fields)


@pytest.mark.skipif(runtime.DEVICE.type == "cuda", reason="checks the no-GPU path")
def test_without_a_gpu_it_says_so_and_exits_cleanly(capsys, tmp_path):
    assert bench.main(["--out", str(tmp_path / "x.csv")]) == 0
    assert "timings need a CUDA GPU" in capsys.readouterr().out
    assert not (tmp_path / "x.csv").exists()


def test_ceilings_are_returned_not_stored(tmp_path):
    """A plot depends on the ceilings it is given, not on which notebook cell ran first."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = tmp_path / "ceilings.csv"
    path.write_text("matmul_bf16_tflops,copy_tbps\n500.0,2.5\n")
    before = dict(vars(perf_plots))
    assert perf_plots.read_ceilings(path) == (500.0, 2.5)
    assert dict(vars(perf_plots)) == before
    committed = perf_plots.read_ceilings(perf_plots.DATA_DIR / "h200_ceilings.csv")
    assert 700 < committed.matmul_tflops < 900 and 3 < committed.copy_tbps < 6

    row = dict(provider="course_fast", head_dim="128", seq_len="4096", tflops="400", status="ok", batch="4",
               q_heads="32", kv_heads="8", causal="True")
    fig, (a, b) = plt.subplots(1, 2)
    try:
        perf_plots.plot_throughput([row], a, 128, matmul_tflops=500.0)
        assert a.get_ylim()[1] == pytest.approx(525.0)
        perf_plots.plot_roofline([row], b, matmul_tflops=500.0, copy_tbps=2.5)
        roof = b.get_lines()[0].get_ydata()
        assert max(roof) == pytest.approx(500.0)
    finally:
        plt.close(fig)
