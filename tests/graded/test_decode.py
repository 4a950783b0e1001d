"""Bonus: decode.py, flash-decoding over a KV cache, contiguous or paged (15 bonus points, beyond the 100).

Each case draws a fresh cache, fills every position at or past cache_seqlens
with NaN (a kernel that reads one, even to multiply it by 0, returns NaN), and
compares O and the LSE with the float64 reference (gqa_flash.reference_decode),
which gathers only the valid positions. On a machine with no GPU the kernels
run in Triton's interpreter, so the shapes stay small.
"""

import pytest
import torch

import gqa_flash
from gqa_flash.reference import reference_decode
from gqa_flash.testing import LSE_TOLERANCE, TOLERANCES, decode_inputs, kernel_only, mismatch


def describe(seed, q, k_cache, cache_seqlens, block_table, num_splits, layout="contiguous"):
    """How a failing case names itself."""
    if block_table is None:
        cache = f"{layout} cache {list(k_cache.shape)}"
    else:
        cache = (f"paged cache of {k_cache.shape[0]} pages of {k_cache.shape[1]} (pages shuffled), "
                 f"block_table {list(block_table.shape)}")
    n_kv_heads = k_cache.shape[1] if block_table is None else k_cache.shape[2]
    return (f"seed {seed}, q {list(q.shape)} with {n_kv_heads} KV heads, cache_seqlens {cache_seqlens.tolist()}, "
            f"{cache}, num_splits={num_splits}, {str(q.dtype).replace('torch.', '')}, NaN past cache_seqlens")


def check(seed, num_splits=None, lse=False, sm_scale=None, **case):
    q, k, v, seqlens, table = decode_inputs(seed, **case)
    context = describe(seed, q, k, seqlens, table, num_splits, case.get("layout", "contiguous"))
    # The kernels must do the work: PyTorch's matmuls and softmax are off limits inside.
    with kernel_only("flash_decode") as launches:
        result = gqa_flash.flash_decode(q, k, v, seqlens, block_table=table, sm_scale=sm_scale,
                                        num_splits=num_splits, return_lse=lse)
    assert launches.count > 0, "flash_decode must launch the Triton kernels"
    ref, ref_lse = reference_decode(q, k, v, seqlens, table, sm_scale=sm_scale)
    if lse:
        assert isinstance(result, tuple) and len(result) == 2, "with return_lse=True, return (O, LSE)"
        out, got_lse = result
        assert isinstance(got_lse, torch.Tensor) and got_lse.dtype == torch.float32, "the LSE must be float32"
        problem = mismatch("LSE", got_lse, ref_lse, labels=("batch", "query head", "new token"), **LSE_TOLERANCE)
        assert problem is None, f"{problem}; {context}"
    else:
        out = result
    assert isinstance(out, torch.Tensor) and out.dtype == q.dtype, f"O must be a tensor of q's dtype {q.dtype}"
    problem = mismatch("O", out, ref, labels=("batch", "query head", "new token", "col"), **TOLERANCES[q.dtype])
    assert problem is None, f"{problem}; {context}"


@pytest.mark.points(2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_one_new_token_ragged_lengths(seed, num_splits):
    # Lengths 1 (the new token alone), 29 (a ragged last key block) and 64 (the cache full).
    check(seed, num_splits=num_splits, batch=3, n_q_heads=4, n_kv_heads=2, seqlens=(1, 29, 64), capacity=64)


@pytest.mark.points(2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("n_q_heads,n_kv_heads,n_new", [(2, 2, 1), (4, 2, 1), (8, 2, 1), (32, 1, 2)])
def test_decode_gqa_group_packing(seed, n_q_heads, n_kv_heads, n_new):
    # Group sizes 1, 2, 4 and 32: a program's rows are its KV head's query heads times the new tokens.
    check(seed, n_q_heads=n_q_heads, n_kv_heads=n_kv_heads, n_new=n_new, head_dim=16, seqlens=(7, 33),
          capacity=48)


@pytest.mark.points(3)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("page_size,num_splits", [(16, 1), (8, 3), (5, 2)])
def test_decode_paged_cache(seed, page_size, num_splits):
    # Pages shuffled in the pool; page size 5 is not a divisor of any key block.
    check(seed, num_splits=num_splits, batch=3, n_q_heads=8, n_kv_heads=2, seqlens=(1, 37, 70), capacity=80,
          page_size=page_size)


@pytest.mark.points(3)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("n_new,page_size,num_splits", [(2, None, 1), (5, None, 4), (16, 8, 3)])
def test_decode_new_tokens_are_causal(seed, n_new, page_size, num_splits):
    # New token i sits at position cache_seqlens - n_new + i and sees no later one. With 16 new
    # tokens in 45 positions, cut into chunks of 16, the first new tokens see no key of the last chunk.
    check(seed, num_splits=num_splits, n_new=n_new, page_size=page_size, n_q_heads=4, n_kv_heads=2,
          seqlens=(16, 45), capacity=64)


@pytest.mark.points(2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_splits", [2, 5, 64])
def test_decode_split_merge_and_lse(seed, num_splits):
    # The splits' partial states merged with the log-sum-exp merge: chunks past the short sequence
    # are empty, and 64 splits (more than there are key blocks) shrink to one per block.
    check(seed, num_splits=num_splits, lse=True, sm_scale=0.3, batch=2, n_q_heads=4, n_kv_heads=2, n_new=2,
          seqlens=(9, 80), capacity=80)


@pytest.mark.points(1)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("page_size", [None, 16])
def test_decode_fp16(seed, page_size):
    check(seed, num_splits=2, lse=True, dtype=torch.float16, n_q_heads=8, n_kv_heads=2, n_new=3, head_dim=64,
          seqlens=(5, 47), capacity=48, page_size=page_size)


@pytest.mark.points(1)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("layout", ["bnhd", "strided"])
def test_decode_cache_strides(seed, layout):
    # Any strides: the cache as FlashAttention lays it out ([B, S, H, D], "bnhd", seen transposed), and every
    # dimension strided.
    check(seed, num_splits=2, layout=layout, n_q_heads=4, n_kv_heads=2, n_new=2, seqlens=(3, 30), capacity=32)


def _bad_inputs(q, k, v, seqlens, table):
    """(what is wrong, the call's arguments, the error expected, a word its message must hold)."""
    pool_k = torch.zeros((table.max().item() + 1, 8, k.shape[1], k.shape[3]), dtype=k.dtype, device=k.device)
    return [
        ("3 query heads on 2 KV heads", (q[:, :3], k, v, seqlens, None), ValueError, "heads"),
        ("cache_seqlens of int64", (q, k, v, seqlens.long(), None), TypeError, "cache_seqlens"),
        ("cache_seqlens longer than the cache", (q, k, v, seqlens + k.shape[2], None), ValueError, "cache_seqlens"),
        ("more new tokens than a sequence holds", (q.expand(-1, -1, 3, -1), k, v, seqlens.clamp(max=2), None),
         ValueError, "cache_seqlens"),
        ("17 new tokens", (q.expand(-1, -1, 17, -1), k, v, seqlens.clamp(min=17), None), ValueError, "q"),
        ("a block table of the wrong shape", (q, pool_k, pool_k, seqlens, table[:1]), ValueError, "block_table"),
        ("a block table of int64", (q, pool_k, pool_k, seqlens, table.long()), TypeError, "block_table"),
    ]


@pytest.mark.points(1)
@pytest.mark.timeout(120)
def test_decode_refuses_bad_input(seed):
    # A right answer first (an input check alone earns nothing), then each bad input refused by name.
    check(seed, seqlens=(4, 20), capacity=24, head_dim=16)
    q, k, v, seqlens, _ = decode_inputs(seed, seqlens=(4, 20), capacity=24, head_dim=16)
    table = torch.arange(6, dtype=torch.int32, device=q.device).view(2, 3)
    for what, args, error, word in _bad_inputs(q, k, v, seqlens, table):
        with pytest.raises(error) as info:
            gqa_flash.flash_decode(*args[:4], block_table=args[4])
        assert word in str(info.value), f"{what}: the {error.__name__} should name {word!r}; got: {info.value}"
