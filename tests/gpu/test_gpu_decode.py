"""flash_decode on a GPU: bf16 (which the interpreter cannot check), fp16 and fp32, against float64.

Skipped without a CUDA device (conftest.py). Run on the device with
GQA_FLASH_IMPL=solutions. The cases cover what issue 16 asks of decoding:
ragged cache_seqlens down to one position, contiguous and paged caches
(pages shuffled in the pool, NaN in every unused position, a poison page
index in every unused table entry; tables contiguous, transposed and
strided), Q strided or a view of a wider buffer with NaN past head dims 80
and 96, GQA ratios 1, 2, 3, 4 and 32, one new token and several, one split
(the split kernel writes O itself) and several (the merge kernel runs,
launched normally and with programmatic dependent launch), and the
launcher's own choice of split and tile.
"""

import pytest
import torch

from gqa_flash.course import api, impl
from gqa_flash.reference import reference_decode
from gqa_flash.course.testing import assert_lse_matches, assert_matches, decode_inputs

pytestmark = pytest.mark.gpu

CASES = [
    # (Hq, Hkv, Nq, D, page_size, num_splits, block-table layout, q layout)
    (32, 8, 1, 128, None, None, None, None),
    (32, 8, 1, 128, 16, None, "contiguous", None),
    (32, 8, 4, 128, 256, None, "transposed", None),
    (32, 8, 16, 128, None, 7, None, "bnhd"),
    (32, 1, 1, 128, 16, None, "strided", None),
    (8, 4, 3, 64, 16, 1, "transposed", None),
    (16, 16, 1, 96, None, 1, None, "padded"),
    (12, 4, 2, 80, 16, 3, "strided", "padded"),
    (64, 2, 2, 256, 64, 5, "contiguous", None),
]


def _case_id(c):
    cache = f"paged{c[4]}-{c[6]}-table" if c[4] else "contiguous"
    return f"h{c[0]}:{c[1]}-nq{c[2]}-d{c[3]}-{cache}-splits{c[5]}" + (f"-{c[7]}-q" if c[7] else "")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=lambda t: str(t)[6:])
@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_decode_matches_float64_on_gpu(case, dtype, seed):
    hq, hkv, nq, d, page_size, splits, table_layout, q_layout = case
    q, k, v, seqlens, table = decode_inputs(seed, batch=3, n_q_heads=hq, n_kv_heads=hkv, n_new=nq, head_dim=d,
                                            seqlens=(nq, 700, 1500), capacity=1536, page_size=page_size,
                                            dtype=dtype, device="cuda", q_layout=q_layout,
                                            table_layout=table_layout or "contiguous")
    o, lse = api.flash_decode(q, k, v, seqlens, block_table=table, num_splits=splits, return_lse=True)
    ref, ref_lse = reference_decode(q, k, v, seqlens, table)
    err = (o.double().cpu() - ref).abs().max().item()
    lse_err = (lse.double().cpu() - ref_lse).abs().max().item()
    print(f"\n{case} {dtype}: max |O - ref| {err:.2e}, max |LSE - ref| {lse_err:.2e}")
    assert_matches("O", o, ref, dtype)  # the course's tolerances: absolute plus relative (V reaches 16 here)
    assert_lse_matches(lse, ref_lse)
    # The serving path (max_seqlen): planned on the first call, then straight to the compiled kernels with
    # tensors, then with raw addresses into one buffer; new values of the same signature each time.
    for round_ in range(3):
        q, k, v, seqlens, table = decode_inputs(seed + 1 + round_, batch=3, n_q_heads=hq, n_kv_heads=hkv, n_new=nq,
                                                head_dim=d, seqlens=(nq, 700, 1500), capacity=1536,
                                                page_size=page_size, dtype=dtype, device="cuda", q_layout=q_layout,
                                                table_layout=table_layout or "contiguous")
        o, lse = api.flash_decode(q, k, v, seqlens, block_table=table, num_splits=splits, return_lse=True,
                                  max_seqlen=1536)
        ref, ref_lse = reference_decode(q, k, v, seqlens, table)
        assert_matches("O", o, ref, dtype, f"served call {round_ + 1}")
        assert_lse_matches(lse, ref_lse)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl"])
def test_decode_merge_launch_on_gpu(pdl, seed):
    """The merge kernel reads what the split kernel wrote, whether it is launched after it or early (PDL)."""
    decode = impl.load("decode")
    q, k, v, seqlens, table = decode_inputs(seed, batch=2, n_q_heads=32, n_kv_heads=8, head_dim=128,
                                            seqlens=(1, 4000), capacity=4096, page_size=16,
                                            dtype=torch.bfloat16, device="cuda")
    config = dict(BLOCK_N=64, num_warps=4, num_stages=3, pdl=pdl)
    o = decode.flash_decode(q, k, v, seqlens, block_table=table, num_splits=16, max_seqlen=4000, config=config)
    ref, _ = reference_decode(q, k, v, seqlens, table)
    assert_matches("O", o, ref, torch.bfloat16)


def _serving_inputs(seed, paged, batch=3, capacity=2048, page_size=16, hq=32, hkv=8, d=128, dtype=torch.bfloat16):
    """A cache full of values everywhere (a serving loop's: every page of every table row valid, the pool
    holding two spare pages) and lengths short of capacity, so the steps have room to grow."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    if paged:
        pages = capacity // page_size
        k, v = (torch.randn(batch * pages + 2, page_size, hkv, d, device="cuda", dtype=dtype, generator=gen)
                for _ in range(2))
        table = torch.randperm(batch * pages + 2, device="cuda", generator=gen)[: batch * pages]
        table = table.view(batch, pages).to(torch.int32)
    else:
        k, v = (torch.randn(batch, hkv, capacity, d, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
        table = None
    seqlens = torch.tensor([1, 700, 1500][:batch], dtype=torch.int32, device="cuda")
    return k, v, seqlens, table


@pytest.mark.timeout(300)
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_a_decode_step_captured_in_a_cuda_graph_replays_after_in_place_changes(paged, seed):
    """One serving step (append the new token's K and V, attend) captured once with max_seqlen, then
    replayed 6 times while cache_seqlens grows in place, q, k_new and v_new change, and (paged) the
    table is rewritten in place. Each replay's output and the cache equal an uncaptured, checked call's."""
    capacity, hq, hkv, d = 2048, 32, 8, 128
    k, v, seqlens, table = _serving_inputs(seed, paged, capacity=capacity)
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    q = torch.randn(3, hq, 1, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k_new, v_new = (torch.randn(3, hkv, 1, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    step = lambda: api.flash_decode(q, k, v, seqlens, block_table=table, max_seqlen=capacity,  # noqa: E731
                                    k_new=k_new, v_new=v_new)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and warm up outside the capture
        step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for i in range(6):
        seqlens += torch.tensor([1, 1 + 50 * i, 3], dtype=torch.int32, device="cuda")  # grows, unevenly
        q.copy_(torch.randn(q.shape, device="cuda", dtype=q.dtype, generator=gen))
        k_new.copy_(torch.randn(k_new.shape, device="cuda", dtype=k_new.dtype, generator=gen))
        v_new.copy_(torch.randn(v_new.shape, device="cuda", dtype=v_new.dtype, generator=gen))
        if paged and i == 3:  # sequence 1 given other pages: its table row rewritten in place
            table[1] = table[1].flip(0)
        k_ref, v_ref = k.clone(), v.clone()
        want = api.flash_decode(q, k_ref, v_ref, seqlens, block_table=table, k_new=k_new, v_new=v_new)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(k, k_ref) and torch.equal(v, v_ref), f"replay {i}: the cache after the append differs"
        ref, _ = reference_decode(q, k_ref, v_ref, seqlens, table)
        assert_matches("O", out, ref, torch.bfloat16, f"replay {i}, lengths {seqlens.tolist()}")
        assert (out.float() - want.float()).abs().max().item() < 2e-2, f"replay {i}: graph and plain call differ"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_bad_lengths_and_pages_do_not_fault_on_gpu(paged, seed):
    """With max_seqlen nothing is checked on the host; the kernels clamp. Lengths negative and far past
    the cache, pages far outside the pool and negative: the GPU reports no fault, later work runs, and
    the sequence whose values are right gets its right rows."""
    k, v, seqlens, table = _serving_inputs(seed, paged, batch=3, capacity=1000 if not paged else 1024)
    capacity = k.shape[2] if not paged else table.shape[1] * k.shape[1]
    seqlens.copy_(torch.tensor([700, -100, 2**30], dtype=torch.int32))
    if paged:
        table[1, :] = 2**30
        table[2, :] = -(2**30)
    q = torch.randn(3, 32, 2, 128, device="cuda", dtype=torch.bfloat16)
    k_new, v_new = (torch.randn(3, 8, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for splits in (None, 1, 7):
        o = api.flash_decode(q, k, v, seqlens, block_table=table, max_seqlen=capacity, num_splits=splits,
                             k_new=k_new, v_new=v_new)
        torch.cuda.synchronize()  # a fault would raise here
        ref, _ = reference_decode(q[:1], k if paged else k[:1], v if paged else v[:1], seqlens[:1],
                                  None if table is None else table[:1])
        assert_matches("O of the sequence whose values are right", o[:1], ref, torch.bfloat16, f"splits {splits}")
    assert torch.ones(4, device="cuda").sum().item() == 4.0  # the context still works


@pytest.mark.timeout(120)
def test_served_calls_go_straight_to_the_compiled_kernels_and_agree(seed):
    """decode_launch.serve keeps one plan a signature; from its second call the plan's launches go to the
    compiled kernels' launchers directly, and from its third they pass raw addresses into one buffer for
    the LSE and the partial states. Every call, with new values, must give what the reference gives."""
    from gqa_flash.course import decode_launch

    decode_launch._plans.clear()
    for round_ in range(4):
        q, k, v, seqlens, table = decode_inputs(seed + round_, batch=2, n_q_heads=32, n_kv_heads=8, head_dim=128,
                                                seqlens=(5, 3000), capacity=3072, page_size=16,
                                                dtype=torch.bfloat16, device="cuda")
        o, lse = api.flash_decode(q, k, v, seqlens, block_table=table, max_seqlen=3072, return_lse=True)
        ref, ref_lse = reference_decode(q, k, v, seqlens, table)
        assert_matches("O", o, ref, torch.bfloat16, f"round {round_}")
        assert_lse_matches(lse, ref_lse)
    (plan,) = decode_launch._plans.values()
    assert plan.merge is not None, "batch 2 at 3k should split (the merge kernel runs)"
    assert plan.split.direct and plan.merge.direct, "the direct launch was refused by this Triton"
