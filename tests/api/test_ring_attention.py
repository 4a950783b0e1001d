"""Ring attention on CPU processes joined by gloo (gqa_flash.course.lab.ring_run), against the float64 reference.

One run of 2, 3 and 4 processes each goes through every case: causal or not, GQA 4:2 and MHA 2:2, head dims
16 and 24, fp32 and fp16, both layouts; the shards are put back together (unshard_sequence) and compared
with reference_attention on the whole tensors. Also: shard and unshard are inverse and refuse what does not
divide, the inputs are checked, a rank that fails makes the others stop with an error that names it
(not hang), and the plan of which blocks a rank computes balances the zigzag layout.
"""

import pytest
import torch

import gqa_flash
from gqa_flash.course import context_parallel, impl
from gqa_flash.course.lab import ring_run

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built in")


def _cases(world_size):
    cases = []
    for i, (causal, layout, (hq, hkv), d, dtype) in enumerate([
        (True, "zigzag", (4, 2), 16, torch.float32),
        (True, "contiguous", (4, 2), 24, torch.float32),
        (False, "zigzag", (2, 2), 24, torch.float32),
        (False, "contiguous", (4, 2), 16, torch.float32),
        (True, "zigzag", (2, 2), 16, torch.float16),
        (True, "contiguous", (2, 2), 16, torch.float16),
    ]):
        n = 2 * world_size * (3 + i % 2)  # chunks of 3 or 4 positions
        cases.append(dict(seed=100 * world_size + i, batch=2 if i % 3 == 0 else 1, hq=hq, hkv=hkv, n=n, d=d,
                          causal=causal, layout=layout, dtype=dtype))
    return cases


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_attention_on_gloo_matches_the_reference(world_size):
    cases = _cases(world_size)
    results = ring_run.run_on_cpu(ring_run.ring_cases, world_size, cases)
    ring_run.values(results)  # every rank ok, or an error quoting each rank's
    for case, (o, lse, ref_o, ref_lse) in zip(cases, ring_run.whole_outputs(results, cases)):
        tol = 1e-5 if case["dtype"] == torch.float32 else 2e-3  # fp16: O rounded to fp16 at the end
        what = f"{world_size} ranks, case {case}"
        assert o.dtype == case["dtype"], f"{what}: O comes back as {o.dtype}"
        assert torch.allclose(o.double(), ref_o, atol=tol, rtol=0), f"{what}: O differs from the reference"
        assert torch.allclose(lse.double(), ref_lse, atol=1e-5, rtol=0), f"{what}: LSE differs"


@pytest.mark.timeout(120)
def test_a_rank_that_fails_stops_the_others_with_an_error_not_a_hang():
    results = ring_run.run_on_cpu(ring_run.ring_with_a_failed_rank, 3, 1, timeout_s=5, deadline_s=90)
    assert results[1][0] == "error" and "fails on purpose" in results[1][1], results[1]
    for rank in (0, 2):
        status, message = results[rank]
        assert status == "error", f"rank {rank} finished the ring without rank 1: {message}"
        assert "still running" not in message, f"rank {rank} hung: {message}"
        assert f"ring_attention: rank {rank} of 3 got no K/V block from rank" in message, message


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_shard_and_unshard_are_inverse(layout, world_size):
    x = torch.randn(2, 3, 4 * world_size, 5)
    shards = [gqa_flash.shard_sequence(x, world_size, r, layout) for r in range(world_size)]
    assert torch.equal(gqa_flash.unshard_sequence(shards, layout), x)
    if layout == "zigzag" and world_size == 2:  # chunks of 2: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
        assert torch.equal(shards[0], torch.cat([x[:, :, 0:2], x[:, :, 6:8]], dim=2))
        assert torch.equal(shards[1], x[:, :, 2:6])


@pytest.mark.parametrize("call, error, words", [
    (lambda x: gqa_flash.shard_sequence(x[:, :, :7], 2, 0), ValueError, "must divide into 4 equal chunks"),
    (lambda x: gqa_flash.shard_sequence(x, 2, 2), ValueError, "rank must be an integer from 0 to"),
    (lambda x: gqa_flash.shard_sequence(x, 0, 0), ValueError, "world_size must be a positive integer"),
    (lambda x: gqa_flash.shard_sequence(x, 2, 0, layout="striped"), ValueError, "layout must be one of"),
    (lambda x: gqa_flash.shard_sequence(x[0], 2, 0), ValueError, "x must be 4-D"),
    (lambda x: gqa_flash.unshard_sequence([x, x[:, :, :4]]), ValueError, "every shard must have one shape"),
    (lambda x: gqa_flash.unshard_sequence(x), TypeError, "shards must be a non-empty list"),
    (lambda x: gqa_flash.ring_attention(x, x[:, :1], x), ValueError, "k and v must have one shape"),
    (lambda x: gqa_flash.ring_attention(x[:, :, :7], x[:, :, :7], x[:, :, :7]), ValueError, "2 equal chunks"),
    (lambda x: gqa_flash.ring_attention(x, x[:, :2], x[:, :2]), ValueError, "must be a multiple of"),
    (lambda x: gqa_flash.ring_attention(x, x, x.half()), TypeError, "must share one dtype"),
    (lambda x: gqa_flash.ring_attention(x, x, x, causal=1), TypeError, "causal must be True or False"),
    (lambda x: gqa_flash.ring_attention(x, x, x), RuntimeError, "init_process_group first"),
])
def test_bad_arguments_are_named(call, error, words):
    x = torch.randn(1, 3, 8, 4)
    with pytest.raises(error) as info:
        call(x)
    assert words in str(info.value), str(info.value)


@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_zigzag_gives_every_rank_the_same_causal_work_and_contiguous_does_not(world_size):
    """Work = the area of the score blocks a rank computes over the whole ring (a diagonal block counts half)."""
    ring = impl.load("ring")

    def work(layout, rank):
        return sum(0.5 if diagonal else 1.0 for step in range(world_size)
                   for _, _, diagonal in ring.block_pairs(layout, rank, ring.ring_source(rank, step, world_size),
                                                          world_size, True))
    zigzag = [work("zigzag", r) for r in range(world_size)]
    contiguous = [work("contiguous", r) for r in range(world_size)]
    assert len(set(zigzag)) == 1, f"zigzag work per rank: {zigzag}"
    assert contiguous == [r + 0.5 for r in range(world_size)], f"contiguous work per rank: {contiguous}"
    assert sum(zigzag) == 4 * sum(contiguous), "zigzag's chunks are half as long: a quarter of the area each"
    assert context_parallel.chunk_ids(0, world_size, "zigzag") == (0, 2 * world_size - 1)


@pytest.mark.timeout(240)
def test_ranks_start_from_a_script_read_on_stdin():
    """`python -` (or -c) names a main file that does not exist ('<stdin>'): every spawned rank died re-running
    it, and the ring check said FAIL of the student's ring.py."""
    import os
    import subprocess
    import sys

    script = ("from gqa_flash.course.lab import ring_run\n"
              "cases = [dict(seed=1, batch=1, hq=2, hkv=1, n=8, d=8, causal=True, layout='zigzag', "
              "dtype=__import__('torch').float32)]\n"
              "ring_run.values(ring_run.run_on_cpu(ring_run.ring_cases, 2, cases))\n"
              "print('ranks ran')\n")
    env = dict(os.environ, GQA_FLASH_IMPL="solutions")
    done = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, env=env, timeout=200)
    assert done.returncode == 0 and "ranks ran" in done.stdout, done.stderr[-2000:]
