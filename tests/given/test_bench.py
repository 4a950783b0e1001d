"""The benchmark's bookkeeping, its clean exit on a machine with no GPU, and the plots' inputs."""

import csv
import math
import types

import pytest
import torch

from gqa_flash.course import impl, runtime
from gqa_flash.course.lab import bench, perf_plots


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
               q_heads="32", kv_heads="8", causal="True", gpu="NVIDIA H200")
    fig, (a, b) = plt.subplots(1, 2)
    try:
        perf_plots.plot_throughput([row], a, 128, matmul_tflops=500.0)
        assert a.get_ylim()[1] == pytest.approx(525.0)
        perf_plots.plot_roofline([row], b, matmul_tflops=500.0, copy_tbps=2.5)
        roof = b.get_lines()[0].get_ydata()
        assert max(roof) == pytest.approx(500.0)
    finally:
        plt.close(fig)


def test_interleaved_rounds_start_one_provider_further_along_each_round():
    """Each round times every provider once; the first one timed moves along, so that a drift of the
    machine (clocks ramping, a neighbour) does not always land on the same provider."""
    calls = []
    steps = {name: name for name in ("a", "b", "c")}
    times, errors = bench.interleaved_times(steps, rounds=4, time_one=lambda fn: calls.append(fn) or len(calls))
    assert calls == list("abc" "bca" "cab" "abc")
    assert times == {"a": [1, 6, 8, 10], "b": [2, 4, 9, 11], "c": [3, 5, 7, 12]} and errors == {}
    assert bench.median(times["a"]) == 7.0 and bench.median([]) != bench.median([])  # NaN when never timed


def test_a_provider_that_raises_while_timed_is_reported_and_the_others_go_on():
    attempts = []

    def time_one(fn):
        attempts.append(fn)
        if fn == "bad" and len(attempts) > 2:
            raise RuntimeError("illegal memory access")
        return 1.0

    times, errors = bench.interleaved_times({"good": "good", "bad": "bad"}, rounds=3, time_one=time_one)
    assert times == {"good": [1.0, 1.0, 1.0], "bad": []}
    assert errors == {"bad": "error while timing: RuntimeError: illegal memory access"}
    assert attempts == ["good", "bad", "bad", "good", "good"]  # once it raised, never timed again


def test_only_steps_that_ran_and_matched_are_timed():
    """The device probes check every step first: one that raises is reported, one whose output is wrong
    is left out, and neither is timed, so a broken tile cannot win a probe."""
    def fails():
        raise RuntimeError("out of resources: shared memory")

    said = []
    times, failed, errors = bench.checked_interleaved_times(
        {"right": lambda: 0.001, "wrong": lambda: 0.5, "raises": fails}, error=abs, tol=0.01, rounds=2,
        time_one=lambda fn: 1.0, say=said.append)
    assert times == {"right": [1.0, 1.0]} and failed == {}
    assert errors["right"] == 0.001 and errors["wrong"] == 0.5 and errors["raises"] != errors["raises"]  # NaN
    assert said == ["raises: RuntimeError: out of resources: shared memory"]


def test_the_tiles_column_names_what_the_autotuner_picked():
    triton = pytest.importorskip("triton")
    tuner = types.SimpleNamespace(best_config=triton.Config(dict(BLOCK_M=32, BLOCK_N=128, FLAT=True),
                                                            num_warps=4, num_stages=3))
    assert bench.tile_text(tuner) == "32x128 flat w4 s3"
    tuner.best_config = triton.Config(dict(BLOCK_M=128, BLOCK_N=64, SUBTILES=2, FLAT=False), num_warps=4,
                                      num_stages=2)
    assert bench.tile_text(tuner) == "128x64 sub2 w4 s2"
    tuner.best_config = triton.Config(dict(BLOCK_M=128, BLOCK_N=32), num_warps=8, num_stages=3, maxnreg=128)
    assert bench.tile_text(tuner) == "128x32 w8 s3 regs128"
    assert bench.tile_text(types.SimpleNamespace()) == "" and bench.tile_text(None) == ""


def _cpu_sweep(monkeypatch, times, hosts=None):
    """The sweeps' logic on a CPU: small fp32 inputs, no CUDA memory statistics, and a timer that runs
    the step once and returns the next of ``times[provider]`` (a list, a time a round; an exception
    there is raised) for whichever provider ran (each appends its name to the list this returns). The
    host's launch time: ``hosts[provider]`` (default 0.5 ms; an exception is raised), its call unlisted."""
    ran = []

    def time_one(fn, rep_ms=bench.REP_MS):
        fn()
        value = times[ran[-1]].pop(0)
        if isinstance(value, Exception):
            raise value
        return value

    def host_one(fn, calls=bench.HOST_CALLS):
        fn()
        value = (hosts or {}).get(ran.pop(), 0.5)
        if isinstance(value, Exception):
            raise value
        return value

    monkeypatch.setattr(bench, "environment", lambda: dict(date="d", gpu="cpu", driver="-", torch="t", triton="t",
                                                           impl="solutions"))
    monkeypatch.setattr(bench, "inputs", lambda case, seed=0: tuple(
        torch.randn(1, h, 16, 8, generator=torch.Generator().manual_seed(seed + h)) for h in (4, 2, 2)))
    monkeypatch.setattr(bench, "_peak_memory", lambda fn, q, k, v, causal: (fn(q, k, v, causal), 1.0))
    monkeypatch.setattr(bench, "picked_tiles", lambda name, backward=False: f"tile of {name}")
    monkeypatch.setattr(bench, "do_bench_ms", time_one)
    monkeypatch.setattr(bench, "host_launch_ms", host_one)
    return ran


def _sdpa(q, k, v, causal):
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


def test_the_forward_sweep_checks_then_times_every_right_provider_interleaved(monkeypatch, tmp_path):
    ran = _cpu_sweep(monkeypatch, dict(sdpa_default=[1.0, 1.0, 1.0], course_fast=[1.0, 5.0, 2.0]))

    def provider(name, output):
        def forward(q, k, v, causal):
            ran.append(name)
            return output(q, k, v, causal)

        return forward

    def stub(q, k, v, causal):
        raise NotImplementedError("student stub")

    table = dict(sdpa_default=provider("sdpa_default", _sdpa), course_fast=provider("course_fast", _sdpa),
                 course_graded=provider("course_graded", lambda q, k, v, causal: torch.zeros_like(q)),
                 naive=provider("naive", stub))
    monkeypatch.setattr(bench, "providers", lambda: table)
    logged = []
    rows = bench.run([bench.Case(torch.float32, True, 8, 16)], ["course_fast", "course_graded", "naive", "flex"],
                     tmp_path / "forward.csv", rounds=3, log=logged.append)
    by = {r["provider"]: r for r in rows}
    assert list(by) == ["sdpa_default", "course_fast", "course_graded", "naive"]
    assert "(no such provider here): flex" in logged[0]
    # every provider checked once, then the right ones timed in three rounds, each starting further along
    assert ran == ["sdpa_default"] * 2 + ["course_fast", "course_graded", "naive"] + [
        "sdpa_default", "course_fast", "course_fast", "sdpa_default", "sdpa_default", "course_fast"]
    fast = by["course_fast"]
    assert (fast["status"], fast["ratio_to_sdpa_default"], fast["ms_median"]) == ("ok", 0.5, 2.0)
    assert fast["rounds_ms"] == "1.0000;5.0000;2.0000" and fast["tiles"] == "tile of course_fast"  # the median
    assert by["course_graded"]["status"] == "wrong result" and by["course_graded"]["rounds_ms"] == ""
    assert by["course_graded"]["tiles"] == by["naive"]["tiles"] == ""  # a failed call's pick would be stale
    assert fast["host_launch_ms"] == 0.5 and math.isnan(by["course_graded"]["host_launch_ms"])
    assert by["naive"]["status"] == "error: NotImplementedError: student stub"
    with open(tmp_path / "forward.csv") as f:
        assert [r["provider"] for r in csv.DictReader(f)] == list(by)


def test_the_backward_sweep_checks_the_gradients_then_times_them_interleaved(monkeypatch, tmp_path):
    ran = _cpu_sweep(monkeypatch, dict(sdpa_default=[1.0, 1.0], course_fast=[4.0, 4.0]))

    def provider(name, scale):
        def prepare(q, k, v, causal):
            q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
            o = _sdpa(q, k, v, causal) * scale

            def step():
                ran.append(name)
                return torch.autograd.grad(o, (q, k, v), torch.ones_like(o), retain_graph=True)

            return step

        return prepare

    table = dict(sdpa_default=provider("sdpa_default", 1.0), course_fast=provider("course_fast", 1.0),
                 course_graded=provider("course_graded", 3.0))  # gradients three times too large
    monkeypatch.setattr(bench, "backward_providers", lambda: table)
    rows = bench.run_backward([bench.Case(torch.float32, True, 8, 16)], tmp_path / "backward.csv", rounds=2,
                              log=lambda msg: None)
    by = {r["provider"]: r for r in rows}
    assert ran == ["sdpa_default", "course_fast", "course_graded"] + [
        "sdpa_default", "course_fast", "course_fast", "sdpa_default"]
    fast = by["course_fast"]
    assert (fast["status"], fast["ratio_to_sdpa_default"], fast["rounds_ms"]) == ("ok", 0.25, "4.0000;4.0000")
    assert by["course_graded"]["status"] == "wrong result" and by["course_graded"]["rounds_ms"] == ""
    assert by["sdpa_default"]["tiles"] == "tile of sdpa_default" and fast["host_launch_ms"] == 0.5
    assert math.isnan(by["course_graded"]["host_launch_ms"])
    assert fast["flops_counted_as"] == "2.5 * 4*B*Hq*N^2*D / 2 (causal)"


def test_a_provider_returning_nothing_is_reported_and_the_sweep_goes_on(monkeypatch, tmp_path):
    _cpu_sweep(monkeypatch, dict(sdpa_default=[1.0], course_fast=[1.0]))
    table = dict(sdpa_default=_sdpa, course_fast=lambda q, k, v, causal: None)  # a stub that returns nothing
    monkeypatch.setattr(bench, "providers", lambda: table)
    rows = bench.run([bench.Case(torch.float32, True, 8, 16)], ["course_fast"], tmp_path / "forward.csv", rounds=1,
                     log=lambda msg: None)
    fast = rows[1]
    assert fast["status"].startswith("error: AttributeError") and fast["tiles"] == "" and fast["rounds_ms"] == ""


def test_when_sdpa_fails_the_backward_sweep_times_nothing_against_another_reference(monkeypatch, tmp_path):
    ran = _cpu_sweep(monkeypatch, dict(sdpa_default=[], course_fast=[]))

    def broken(q, k, v, causal):
        raise RuntimeError("no kernel for this shape")

    def fast(q, k, v, causal):
        q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
        o = _sdpa(q, k, v, causal)
        return lambda: ran.append("course_fast") or torch.autograd.grad(o, (q, k, v), torch.ones_like(o),
                                                                         retain_graph=True)

    monkeypatch.setattr(bench, "backward_providers", lambda: dict(sdpa_default=broken, course_fast=fast))
    rows = bench.run_backward([bench.Case(torch.float32, True, 8, 16)], tmp_path / "backward.csv", rounds=2,
                              log=lambda msg: None)
    by = {r["provider"]: r for r in rows}
    assert by["sdpa_default"]["status"] == "error: RuntimeError: no kernel for this shape"
    assert by["course_fast"]["status"] == "no reference (sdpa_default failed)" and by["course_fast"]["tiles"] == ""
    assert ran == ["course_fast"]  # checked once, never timed


def test_the_host_launch_time_is_the_mean_over_calls_queued_without_waiting(monkeypatch):
    synced, calls, clock = [], [], iter([10.0, 10.003])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: synced.append(len(calls)))
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(clock))
    ms = bench.host_launch_ms(lambda: calls.append(1), calls=3)
    assert calls == [1, 1, 1] and synced == [0, 3]  # waits only before and after the calls, not between
    assert ms == pytest.approx(1.0)  # 3 ms for 3 calls


def test_host_times_skip_the_steps_that_failed_and_report_those_that_raise(monkeypatch):
    monkeypatch.setattr(bench, "host_launch_ms", lambda fn: fn())

    def fails():
        raise RuntimeError("illegal memory access")

    hosts, errors = bench.host_times({"a": lambda: 0.25, "b": fails, "c": lambda: 1 / 0}, skip={"c"})
    assert set(hosts) == {"a", "b"} and hosts["a"] == 0.25 and math.isnan(hosts["b"])
    assert errors == {"b": "error while timing the host: RuntimeError: illegal memory access"}


def test_a_sweep_row_says_when_its_host_timing_failed(monkeypatch, tmp_path):
    ran = _cpu_sweep(monkeypatch, dict(sdpa_default=[1.0, 1.0], course_fast=[1.0, RuntimeError("lost")],
                                       flex=[2.0, 2.0]), hosts=dict(flex=RuntimeError("launch failed")))

    def provider(name):
        def forward(q, k, v, causal):
            ran.append(name)
            return _sdpa(q, k, v, causal)

        return forward

    monkeypatch.setattr(bench, "providers", lambda: {name: provider(name) for name in ("sdpa_default", "course_fast",
                                                                                       "flex")})
    rows = bench.run([bench.Case(torch.float32, True, 8, 16)], ["course_fast", "flex"], tmp_path / "f.csv",
                     rounds=2, log=lambda msg: None)
    by = {r["provider"]: r for r in rows}
    assert by["sdpa_default"]["host_launch_ms"] == 0.5
    assert by["course_fast"]["status"] == "error while timing: RuntimeError: lost"
    assert math.isnan(by["course_fast"]["host_launch_ms"])  # raised while timed: its host is not timed
    assert by["flex"]["status"] == "error while timing the host: RuntimeError: launch failed"
    assert math.isnan(by["flex"]["host_launch_ms"]) and by["flex"]["ms_median"] == 2.0
