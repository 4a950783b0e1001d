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

from gqa_flash import api, impl
from gqa_flash.reference import reference_decode
from gqa_flash.testing import assert_lse_matches, assert_matches, decode_inputs

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
