"""The decode benchmark (gqa_flash/course/lab/bench_decode.py) on a CPU: its bookkeeping, its arguments, its refusal
without a GPU, and its sweep's logic run small in Triton's interpreter with the timer stubbed out."""

import csv

import pytest
import torch

from gqa_flash.course import runtime
from gqa_flash.course.lab import bench, bench_decode as bd

ON_GPU = runtime.DEVICE.type == "cuda"


def test_the_bytes_are_k_and_v_at_every_valid_position_of_every_kv_head():
    # K and V, 8 KV heads, 1k positions, head dim 128, 2 bytes: 4 MiB per sequence.
    assert bd.kv_bytes(1, 1024) == 2 * 8 * 1024 * 128 * 2 == 4 * 2**20
    assert bd.kv_bytes(64, 131072) == 64 * 128 * bd.kv_bytes(1, 1024)
    assert bd.kv_bytes(1, 1024, kv_heads=1, head_dim=64, elem_bytes=4) == 2 * 1024 * 64 * 4


def test_the_sweep_is_the_stated_grid_and_prefill_runs_only_where_affordable():
    shapes = bd.plan()
    assert [(b, c) for b, c, _ in shapes] == [(b, c) for b in (1, 8, 64) for c in (1024, 8192, 32768, 131072)]
    for batch, context, rows in shapes:
        assert rows[0] == ("sdpa_default", "contiguous")
        assert {("flash_decode", "contiguous"), ("flash_decode", "paged"), ("flex", "contiguous"),
                ("course_prefill", "contiguous")} <= set(rows)
        padded = ("course_prefill_padded", "contiguous") in rows
        assert padded == (bd.prefill_flop(batch, context) <= bd.PREFILL_MAX_FLOP)
    assert ("course_prefill_padded", "contiguous") in shapes[0][2]  # batch 1, 1k: a prefill of 8.6 GFLOP
    assert ("course_prefill_padded", "contiguous") not in shapes[-1][2]  # batch 64, 128k: 281 PFLOP


@pytest.mark.parametrize("block, steps, warps", bd.STREAM_READ_TILES[:2])
def test_the_read_ceiling_kernel_reads_every_element_once(block, steps, warps):
    """The Triton read stream behind the read ceiling: each program sums its own STEPS * BLOCK elements,
    the last one masked, so the sums add up to the whole tensor's (a kernel that skipped or doubled a
    block would be timed as faster or slower than the memory)."""
    n = 3 * block * steps + 5  # a ragged last program
    x = torch.randn(n, generator=torch.Generator().manual_seed(0)).to(torch.float16).to(runtime.DEVICE)
    sums = torch.empty(-(-n // (block * steps)), dtype=torch.float32, device=runtime.DEVICE)
    bd._stream_read_kernel[(sums.numel(),)](x, sums, n, BLOCK=block, STEPS=steps, num_warps=warps)
    expected = x.float().view(-1)
    for i in range(sums.numel()):
        part = expected[i * block * steps:(i + 1) * block * steps].sum().item()
        assert sums[i].item() == pytest.approx(part, abs=1e-2), f"program {i}"


def test_every_row_carries_the_environment_and_the_columns_the_notebook_reads():
    assert set(bench.ENVIRONMENT) <= set(bd.FIELDS)
    assert {"provider", "cache", "batch", "context", "tbps", "read_ceiling_tbps", "status", "num_splits", "timing",
            "api", "host_us",
            "ratio_to_sdpa_default", "ratio_to_read_ceiling", "max_abs_err_vs_sdpa"} <= set(bd.FIELDS)


@pytest.mark.parametrize("argv,message", [
    ([], "--out"),
    (["--out", "x.csv", "--contexts", "1000"], "multiple of the page size"),
    (["--out", "x.csv", "--budget", "0"], "positive"),
    (["--out", "x.csv", "--batches", "1,-8"], "positive integers"),
    (["--out", "x.csv", "--providers", "sdpa_default,vllm"], "no provider vllm"),
])
def test_bad_arguments_are_refused_by_name(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bd.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_arguments_parse_and_sdpa_is_always_timed():
    args = bd.parse_args(["--out", "x.csv", "--budget", "300", "--batches", "1,8", "--contexts", "1024",
                          "--providers", "flash_decode"])
    assert (args.budget, args.batches, args.contexts) == (300.0, (1, 8), (1024,))
    assert args.providers == ("sdpa_default", "flash_decode")  # the reference of every check and ratio


@pytest.mark.skipif(ON_GPU, reason="checks the no-GPU path")
def test_without_a_gpu_it_refuses_and_writes_nothing(tmp_path, capsys):
    assert bd.main(["--out", str(tmp_path / "decode.csv")]) == 1
    assert "refused: timings need a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "decode.csv").exists()


@pytest.mark.skipif(ON_GPU, reason="runs the sweep's logic in the interpreter, on the CPU")
def test_the_paged_pool_holds_the_contiguous_cache_page_by_page(monkeypatch):
    monkeypatch.setattr(bd, "DEVICE", "cpu")
    monkeypatch.setattr(bd, "DTYPE", torch.float32)
    q, k, v, seqlens, kp, vp, table = bd.inputs(batch=2, context=48)
    assert seqlens.tolist() == [48, 48] and table.dtype == torch.int32 and table.shape == (2, 3)
    assert sorted(table.flatten().tolist()) == list(range(6))  # every page of the pool used once
    p = torch.arange(48)
    for b in range(2):
        pages, slots = table[b, p // bd.PAGE_SIZE].long(), p % bd.PAGE_SIZE
        assert torch.equal(kp[pages, slots], k[b].transpose(0, 1))
        assert torch.equal(vp[pages, slots], v[b].transpose(0, 1))


def _on_the_cpu(monkeypatch):
    """The sweep's logic in the interpreter: fp32 on the CPU, a fixed environment and fixed ceilings."""
    monkeypatch.setattr(bd, "DEVICE", "cpu")
    monkeypatch.setattr(bd, "DTYPE", torch.float32)
    monkeypatch.setattr(bd, "environment", lambda: dict(date="today", gpu="none", driver="-", torch="t",
                                                        triton="t", impl="x"))
    monkeypatch.setattr(bd, "ceilings", lambda log=print: (4.0, 4.25))


@pytest.mark.timeout(300)
@pytest.mark.skipif(ON_GPU, reason="runs the sweep's logic in the interpreter, on the CPU")
def test_a_small_sweep_checks_then_times_every_provider_and_writes_its_rows(monkeypatch, tmp_path):
    _on_the_cpu(monkeypatch)
    timed = []

    def fake_time(fn, timing, rep_ms):
        timed.append((fn, timing))
        return (0.5 if timing == "cuda_graph" else 0.8)

    monkeypatch.setattr(bd, "time_once", fake_time)
    out = tmp_path / "decode.csv"
    rows = bd.run(out, batches=(1,), contexts=(32,), names=("sdpa_default", "flash_decode", "course_prefill"),
                  rounds=2, log=lambda *a: None)
    with open(out, newline="") as f:
        written = list(csv.DictReader(f))
    assert [(r["provider"], r["cache"], r["timing"]) for r in written] == [
        (name, cache, timing) for name, cache in (("sdpa_default", "contiguous"), ("flash_decode", "contiguous"),
                                                  ("flash_decode", "paged"), ("course_prefill", "contiguous"))
        for timing in ("cuda_graph", "plain")]
    by = {(r["provider"], r["cache"], r["timing"]): r for r in rows}
    sdpa = by["sdpa_default", "contiguous", "cuda_graph"]
    assert sdpa["status"] == "ok" and sdpa["ms"] == 0.5 and sdpa["tbps"] == round(bd.kv_bytes(1, 32) / 0.5e-3 / 1e12, 3)
    assert sdpa["ratio_to_sdpa_default"] == 1.0 and sdpa["read_ceiling_tbps"] == 4.0
    assert by["sdpa_default", "contiguous", "plain"]["ms"] == 0.8 and sdpa["host_us"] > 0
    for cache in ("contiguous", "paged"):  # right with the solutions; the stubs' zeros are wrong and not timed
        for timing in ("cuda_graph", "plain"):
            row = by["flash_decode", cache, timing]
            assert row["status"] in ("ok", "wrong result") and row["api"] == "public"
            if row["status"] == "ok":  # ratios compare rows timed the same way
                assert row["ratio_to_sdpa_default"] == 1.0 and row["host_us"] > 0
    assert by["course_prefill", "contiguous", "plain"]["status"].startswith("unsupported: q and k must have the same")
    n_ok = sum(r["status"] == "ok" for r in rows)
    assert len(timed) == 2 * n_ok  # every checked row, in each of the 2 rounds
    assert all(r["date"] == "today" and r["impl"] == "x" for r in written)


@pytest.mark.skipif(ON_GPU, reason="checks the capture-failure path on the CPU")
def test_a_call_that_cannot_be_captured_says_so_and_keeps_its_plain_row(monkeypatch, tmp_path):
    _on_the_cpu(monkeypatch)

    def fake_time(fn, timing, rep_ms):
        if timing == "cuda_graph":
            raise RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture")
        return 0.8

    monkeypatch.setattr(bd, "time_once", fake_time)
    rows = bd.run(tmp_path / "decode.csv", batches=(1,), contexts=(32,), names=("sdpa_default",), rounds=1,
                  log=lambda *a: None)
    by = {r["timing"]: r for r in rows}
    assert by["cuda_graph"]["status"].startswith("capture in a CUDA graph failed: RuntimeError: Cannot copy")
    assert by["plain"]["status"] == "ok" and by["plain"]["ms"] == 0.8
