"""Greedy generation with a KV cache (gqa_flash/course/lab/generate.py), small, on a CPU in Triton's interpreter.

The cached generators must write the tokens that the model run on the whole sequence every step writes
(SDPA, no cache), with the same logits up to rounding, and leave in their cache the keys and values that
the model without a cache computes. The flash_decode generator goes through ``gqa_flash.flash_decode``,
so it runs whatever the implementation switch chooses (``make test``: the solutions); on the stubs it
fails. The model is a seeded, untrained TinyGQATransformer in fp32: its tokens mean nothing, but its logits
differ from one token to the next, so a wrong attention shows.
"""

import csv
import importlib.util

import pytest
import torch

from gqa_flash.course import layout, runtime
from gqa_flash.course.lab import bench, generate, tiny_model

BATCH, PROMPT, NEW, CAPACITY = 2, 8, 6, 16


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = tiny_model.Config(dim=32, q_heads=4, kv_heads=2, layers=2, max_len=CAPACITY)
    return tiny_model.TinyGQATransformer(cfg, tiny_model.sdpa_attention).to(runtime.DEVICE).eval()


@pytest.fixture(scope="module")
def prompt():
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, tiny_model.VOCAB, (BATCH, PROMPT), generator=gen).to(runtime.DEVICE)


@pytest.fixture(scope="module")
def reference(model, prompt):
    return generate.generate_without_cache(model, prompt, NEW)


@pytest.mark.parametrize("attention, page_size", [("flash_decode", None), ("flash_decode", 4), ("sdpa", None)],
                         ids=["flash_decode-contiguous", "flash_decode-paged", "sdpa-contiguous"])
def test_cached_generation_writes_the_tokens_and_cache_of_the_model_without_a_cache(model, prompt, reference,
                                                                                      attention, page_size):
    ref_tokens, ref_logits = reference
    # NaN wherever nothing was written yet: flash_decode must never read past cache_seqlens (SDPA's mask
    # multiplies what it hides by 0, and 0 * NaN is NaN, so its cache starts at 0).
    fill = float("nan") if attention == "flash_decode" else 0.0
    gen = generate.CachedGenerator(model, BATCH, CAPACITY, attention, page_size=page_size, fill=fill)
    if page_size is not None:
        table = gen.cache.block_table.flatten().tolist()
        assert sorted(table) == list(range(len(table))) and table != sorted(table)  # every page once, shuffled
    tokens, logits = gen.generate(prompt, NEW)

    assert tokens.tolist() == ref_tokens.tolist()
    assert torch.allclose(logits, ref_logits, atol=1e-5, rtol=0), (logits - ref_logits).abs().max().item()
    fed = PROMPT + NEW - 1  # the last token is written, never fed back
    assert gen.cache.seqlens.tolist() == [fed] * BATCH
    expected = generate.keys_and_values(model, torch.cat([prompt, tokens[:, :-1]], dim=1))
    for layer, (k, v) in enumerate(expected):
        got_k, got_v = gen.cache.read(layer, fed)
        assert torch.allclose(got_k, k, atol=1e-5, rtol=0), f"layer {layer}: K"
        assert torch.allclose(got_v, v, atol=1e-5, rtol=0), f"layer {layer}: V"


def test_the_reference_writes_varied_tokens(reference):
    """A model that wrote one token over and over would make the comparisons above weak."""
    tokens, _ = reference
    assert all(len(set(row)) >= 3 for row in tokens.tolist()), tokens.tolist()


def test_a_generation_past_the_capacity_is_refused(model, prompt):
    gen = generate.CachedGenerator(model, BATCH, CAPACITY, "sdpa")
    with pytest.raises(ValueError, match="need 17 positions; the cache holds 16"):
        gen.generate(prompt, CAPACITY - PROMPT + 2)


@pytest.mark.parametrize("kwargs, message", [
    (dict(attention="flex"), "attention must be one of"),
    (dict(attention="sdpa", page_size=4), "contiguous cache"),
    (dict(cuda_graph=True), "cuda_graph needs the model on a CUDA GPU"),
])
def test_bad_options_are_refused_by_name(model, kwargs, message):
    if runtime.DEVICE.type == "cuda" and kwargs.get("cuda_graph"):
        pytest.skip("the model is on a GPU here")
    with pytest.raises(ValueError, match=message):
        generate.CachedGenerator(model, BATCH, CAPACITY, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("attention, page_size", [("flash_decode", None), ("flash_decode", 16), ("sdpa", None)])
def test_a_cuda_graph_replays_the_step_and_writes_the_same_tokens(model, prompt, reference, attention, page_size):
    gen = generate.CachedGenerator(model, BATCH, CAPACITY, attention, page_size=page_size, cuda_graph=True)
    tokens, logits = gen.generate(prompt, NEW)
    assert gen.graph is not None
    assert tokens.tolist() == reference[0].tolist()
    assert torch.allclose(logits, reference[1], atol=1e-4, rtol=0)


def _bench_script():
    spec = importlib.util.spec_from_file_location("generate_tokens", layout.COURSE_DIR / "bench" / "generate_tokens.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(runtime.DEVICE.type == "cuda", reason="checks the CPU's smoke run (a GPU runs all five loops)")
def test_the_gpu_benchmark_runs_its_eager_loops_on_a_cpu_and_writes_checked_rows(tmp_path):
    """bench/generate_tokens.py --smoke: a tiny model, the eager loops only; the rows the notebook reads."""
    script = _bench_script()
    out = tmp_path / "generate_tokens.csv"
    script.main([str(out), "--smoke", "--batches", "2", "--prompts", "6", "--new-tokens", "3",
                 "--check-tokens", "2", "--rounds", "1"])
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert set(bench.ENVIRONMENT) <= set(rows[0])
    assert [(r["provider"], r["launch"]) for r in rows] == [("sdpa", "eager"), ("flash_decode", "eager")]
    assert all(r["status"] == "ok" and r["tokens_equal_no_cache_fp32"] == "True" for r in rows), rows
    assert all(float(r["tokens_per_s"]) > 0 for r in rows)
    table = generate.tokens_table(rows).splitlines()
    assert table[0].split()[:4] == ["batch", "prompt", "SDPA", "eager"]
    assert table[1].split()[:2] == ["2", "6"] and table[1].split()[-1] == "yes"
    assert table[1].split().count("-") == 3  # the three graph loops need a GPU


@pytest.mark.skipif(runtime.DEVICE.type == "cuda", reason="checks the no-GPU path")
def test_the_gpu_benchmark_refuses_without_a_gpu(tmp_path, capsys):
    assert _bench_script().main([str(tmp_path / "x.csv")]) == 1
    assert "refused: timings need a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()
