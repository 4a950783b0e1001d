"""Bonus: decode.py, flash-decoding over a KV cache, contiguous or paged (15 bonus points, beyond the 100).

Each case draws a fresh cache, fills every position at or past cache_seqlens
with NaN (a kernel that reads one, even to multiply it by 0, returns NaN),
fills every block-table entry past a sequence's last page with a page far
outside the pool, and compares O and the LSE with the float64 reference
(gqa_flash.reference_decode), which gathers only the valid positions. On a
machine with no GPU the kernels run in Triton's interpreter, so the shapes
stay small.

Points follow harm (README.md, "How the points are shared"). Ordinary decoding carries 12 of the
15 points, in six cases that each mix what a serving batch holds at once: GQA
groups, ragged lengths in one batch, several splits (so that a short
sequence's later splits are empty), the LSE, fp32 or fp16, and the same batch
run twice, once from a paged cache (shuffled pages, a transposed or strided
block table) and once from a contiguous one (a transposed or strided layout).
A bug that shows in ordinary use fails most of them. The corners share the
other 3: head dims 80, 96 and 256 (Q a view of a wider buffer with NaN past
its head dim), 16 new tokens, a block-table read past a row's end, and bad
input refused by name.
"""

from dataclasses import dataclass

import pytest
import torch

from gqa_flash.course.grader.calls import kernel_only, own_work, student
from gqa_flash.reference import reference_decode
from gqa_flash.course.testing import LSE_TOLERANCE, TOLERANCES, decode_inputs, mismatch


def describe(seed, q, k_cache, cache_seqlens, block_table, num_splits, layout="contiguous", q_layout=None,
             table_layout="contiguous"):
    """How a failing case names itself."""
    if block_table is None:
        cache = f"{layout} cache {list(k_cache.shape)}"
    else:
        cache = (f"paged cache of {k_cache.shape[0]} pages of {k_cache.shape[1]} (pages shuffled), "
                 f"{table_layout} block_table {list(block_table.shape)}")
    n_kv_heads = k_cache.shape[1] if block_table is None else k_cache.shape[2]
    q_text = f"{q_layout} q" if q_layout else "q"
    return (f"seed {seed}, {q_text} {list(q.shape)} with {n_kv_heads} KV heads, cache_seqlens "
            f"{cache_seqlens.tolist()}, {cache}, num_splits={num_splits}, {str(q.dtype).replace('torch.', '')}, "
            "NaN past cache_seqlens")


def check(seed, num_splits=None, lse=False, sm_scale=None, **case):
    q, k, v, seqlens, table = decode_inputs(seed, **case)
    context = describe(seed, q, k, seqlens, table, num_splits, case.get("layout", "contiguous"),
                       case.get("q_layout"), case.get("table_layout", "contiguous"))
    # The kernels must do the work: PyTorch's matmuls and softmax are off limits inside.
    reply = student().call("flash_decode", q, k, v, seqlens, block_table=table, sm_scale=sm_scale,
                           num_splits=num_splits, return_lse=lse, watch=kernel_only("flash_decode"))
    result = reply.value
    assert reply.seen.get("launches", 0) > 0, "flash_decode must launch the Triton kernels"
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


@dataclass(frozen=True)
class Batch:
    """One batch of sequences, decoded twice: from a paged cache and from a contiguous one."""

    name: str
    shape: dict  # decode_inputs' keywords both runs share
    paged: dict  # page_size, table_layout, num_splits of the paged run
    contiguous: dict  # layout (of the cache), num_splits of the contiguous run
    lse: bool = True
    sm_scale: float | None = None

    def run(self, seed):
        for cache in (self.paged, self.contiguous):
            cache = dict(cache)
            check(seed, num_splits=cache.pop("num_splits"), lse=self.lse, sm_scale=self.sm_scale,
                  **self.shape, **cache)


# Every ordinary batch: GQA with several KV heads, a short sequence beside long ragged ones, several splits
# in at least one of its two runs (the short sequence's later splits are empty), non-contiguous layouts.
# With several new tokens, a chunk of a split run starts among a sequence's new tokens (interpreter: chunks
# of 16 or 32 keys), so the first of them see no key of that chunk's first block: their rows stay empty.
ORDINARY = [
    Batch("gqa8:2-one-new-token-fp32",
          dict(batch=3, n_q_heads=8, n_kv_heads=2, head_dim=32, seqlens=(1, 29, 64), capacity=64),
          dict(page_size=16, table_layout="transposed", num_splits=3), dict(layout="bnhd", num_splits=1)),
    Batch("gqa4:2-3-new-tokens-scale0.3",
          dict(batch=3, n_q_heads=4, n_kv_heads=2, n_new=3, head_dim=16, seqlens=(5, 34, 70), capacity=72),
          dict(page_size=8, table_layout="strided", num_splits=4), dict(layout="strided", num_splits=2),
          sm_scale=0.3),
    Batch("gqa6:2-2-new-tokens-d96-padded-q",
          dict(n_q_heads=6, n_kv_heads=2, n_new=2, head_dim=96, seqlens=(17, 47), capacity=48, q_layout="padded"),
          dict(page_size=5, table_layout="transposed", num_splits=2), dict(layout="contiguous", num_splits=3)),
    Batch("gqa8:2-2-new-tokens-fp16",
          dict(batch=3, n_q_heads=8, n_kv_heads=2, n_new=2, head_dim=64, seqlens=(3, 33, 48), capacity=48,
               dtype=torch.float16),
          dict(page_size=16, table_layout="strided", num_splits=2), dict(layout="bnhd", num_splits=3)),
    Batch("gqa12:4-4-new-tokens-d80-fp16-no-lse",
          dict(n_q_heads=12, n_kv_heads=4, n_new=4, head_dim=80, seqlens=(6, 35), capacity=40,
               dtype=torch.float16),
          dict(page_size=8, table_layout="contiguous", num_splits=3), dict(layout="strided", num_splits=1),
          lse=False),
    Batch("gqa4:2-2-new-tokens-bnhd-q",
          dict(batch=3, n_q_heads=4, n_kv_heads=2, n_new=2, seqlens=(2, 33, 50), capacity=56, q_layout="bnhd"),
          dict(page_size=5, table_layout="transposed", num_splits=1), dict(layout="contiguous", num_splits=2)),
]


@pytest.mark.points(12)
@pytest.mark.timeout(180)
@pytest.mark.parametrize("batch", ORDINARY, ids=lambda b: b.name)
def test_decode_ordinary_batches(seed, batch):
    # Ordinary decoding, paged and contiguous: see ORDINARY. The two runs of a batch count as one case.
    batch.run(seed)


@pytest.mark.points(1.5)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("head_dim,page_size", [(80, 8), (96, None), (256, 16)])
def test_decode_head_dims(seed, head_dim, page_size):
    # Q is a view of a wider buffer with NaN past the head dim: columns past HEAD_DIM are never loaded.
    check(seed, num_splits=2, lse=True, n_q_heads=4, n_kv_heads=2, head_dim=head_dim, seqlens=(3, 30),
          capacity=32, page_size=page_size, q_layout="padded")


@pytest.mark.points(0.5)
@pytest.mark.timeout(120)
def test_decode_sixteen_new_tokens(seed):
    # A draft model's 16 new tokens in 45 positions, cut into chunks of 16: the first new tokens see no key of
    # the last chunk. MQA: 4 query heads x 16 tokens = 64 rows of one KV head.
    check(seed, num_splits=3, lse=True, n_new=16, page_size=8, n_q_heads=4, n_kv_heads=1, seqlens=(16, 45),
          capacity=64)


@pytest.mark.points(0.5)
@pytest.mark.timeout(120)
def test_decode_table_reads_stay_in_the_table(seed):
    # Capacity 40 (5 pages of 8) is not a multiple of the 16-key block, and the table is stored transposed
    # (a row's entries are 2 apart): a table entry read for a position past the sequence's last page (the
    # rest of the last key block, the block after it) lies past the table's storage. The address check
    # (testing.kernel_only) fails any load outside the launch's tensors.
    check(seed, num_splits=2, lse=True, batch=2, n_q_heads=4, n_kv_heads=2, seqlens=(40, 13), capacity=40,
          page_size=8, table_layout="transposed")


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


@pytest.mark.points(0.5)
@pytest.mark.timeout(120)
def test_decode_refuses_bad_input(seed):
    # A right answer first (an input check alone earns nothing), then each bad input refused by name.
    check(seed, seqlens=(4, 20), capacity=24, head_dim=16)
    q, k, v, seqlens, _ = decode_inputs(seed, seqlens=(4, 20), capacity=24, head_dim=16)
    table = torch.arange(6, dtype=torch.int32, device=q.device).view(2, 3)
    for what, args, error, word in _bad_inputs(q, k, v, seqlens, table):
        with pytest.raises(error) as info:
            student().call("flash_decode", *args[:4], block_table=args[4], watch=own_work("decode", "flash_decode"))
        assert word in str(info.value), f"{what}: the {error.__name__} should name {word!r}; got: {info.value}"
