"""The benchmark's bookkeeping, and its clean exit on a machine with no GPU."""

import pytest
import torch

from gqa_flash import runtime
from gqa_flash.lab import bench


def test_flops_are_counted_as_stated():
    case = bench.Case(torch.bfloat16, causal=True, head_dim=128, seq_len=4096)
    assert case.batch == 4
    assert case.flops == 4 * 4 * 32 * 4096**2 * 128 / 2
    assert bench.Case(torch.bfloat16, False, 64, 1024).flops == 4 * 16 * 32 * 1024**2 * 64


def test_main_sweep_is_the_anchor_grid():
    cases = bench.sweep("main")
    assert {(c.head_dim, c.seq_len) for c in cases} == {(d, n) for d in (64, 128) for n in (1024, 2048, 4096, 8192, 16384)}
    assert all(c.causal and c.dtype == torch.bfloat16 and (c.q_heads, c.kv_heads) == (32, 8) for c in cases)
    extra = bench.sweep("extra")
    assert {(c.q_heads, c.kv_heads) for c in extra} >= {(32, 32), (32, 1)} and any(not c.causal for c in extra)


@pytest.mark.skipif(runtime.DEVICE.type == "cuda", reason="checks the no-GPU path")
def test_without_a_gpu_it_says_so_and_exits_cleanly(capsys, tmp_path):
    assert bench.main(["--out", str(tmp_path / "x.csv")]) == 0
    assert "timings need a CUDA GPU" in capsys.readouterr().out
    assert not (tmp_path / "x.csv").exists()
