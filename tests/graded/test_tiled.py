"""tiled.py: FlashAttention in PyTorch with explicit tiles, O and LSE (25 points).

Points follow harm (README, "How the points are shared"). Every test asks for O and the LSE, and all but
one judge O alone; test_tiled_lse_natural_log judges O and then the LSE, and carries the LSE's share, 5 of
the 25 points. The LSE matters only to the backward pass and to merges, so a bug in it alone (base 2, the
max left out), with O right, loses those 5 points and keeps the other 20.
"""

import pytest
import torch

from gqa_flash.course import tile_counts
from gqa_flash.course.grader.calls import own_work, score_products, student
from gqa_flash.course.testing import (
    assert_attention_matches, assert_output_matches, case_context, peaked_qkv, random_qkv,
)


def check(seed, causal=True, sm_scale=None, dtype=torch.float32, block_m=16, block_n=8, lse=False, qkv=None,
          **shape):
    """Run tiled_attention on one input, asking for O and the LSE; judge O, and with ``lse`` the LSE too."""
    q, k, v = qkv if qkv is not None else random_qkv(dtype=dtype, seed=seed, device="cpu", **shape)
    # tiled.py's own code does the work (not the reference, not naive attention), one tile of scores at a
    # time: every case counts the score products (each case's head dim is no other size of it).
    reply = student().call("tiled_attention", q, k, v, causal=causal, sm_scale=sm_scale, block_m=block_m,
                           block_n=block_n, return_lse=True,
                           watch=own_work("tiled", "tiled_attention") | score_products(q.shape[-1]))
    result, counted = reply.value, Counted(reply.seen)
    context = case_context(seed, q, k, causal, f"block_m={block_m}, block_n={block_n}")
    assert_walks_tiles(counted, block_m, block_n, q.shape[2], context)
    assert_no_whole_matrix(reply.seen, q, block_m, block_n, context)
    assert_output_matches(lse, result, q, k, v, causal=causal, sm_scale=sm_scale, context=context)


class Counted:
    """What the executor's ScoreProducts counted: products, elements, and the largest (rows, keys)."""

    def __init__(self, seen):
        self.products, self.elements = int(seen.get("products", 0)), int(seen.get("elements", 0))
        self.largest = tuple(seen.get("largest", (0, 0)))


def assert_no_whole_matrix(seen, q, block_m, block_n, context):
    """No op may hold more numbers than the output or a tile of scores per head: a whole score matrix (by a
    broadcast multiply and a sum, say, which no count of matrix products sees) is more than either."""
    batch, heads, n, d = q.shape
    broadcast = int(seen.get("broadcast_output", 0))
    assert not broadcast, (
        f"an elementwise operation broadcast its inputs into {broadcast} numbers, more than either held: an outer "
        f"product, as when scores are computed by a broadcast multiply and a sum; compute each tile of scores as "
        f"q_tile @ k_tile^T; {context}")
    bound = batch * heads * max(n * d, block_m * block_n)
    got = int(seen.get("largest_output", 0))
    assert got <= bound, (
        f"an operation produced {got} numbers at once, more than the output ({batch * heads * n * d}) or one "
        f"{block_m}x{block_n} tile of scores per head: were the scores of a whole row, or the whole matrix, computed "
        f"at once? tiled_attention walks tiles; {context}")


def assert_walks_tiles(counted, block_m, block_n, seq_len, context):
    assert counted.products > 0, (
        "no tile of scores was computed with a matrix product: compute each one as q_tile @ k_tile^T "
        f"(the @ operator or torch.matmul), as the kernel will with tl.dot; {context}")
    rows, keys = counted.largest
    assert rows <= block_m and keys <= block_n, (
        f"scores were computed {rows} queries by {keys} keys at once, where tiled_attention walks tiles of at "
        f"most block_m={block_m} queries by block_n={block_n} keys (seq_len {seq_len}): the tile walk is the "
        f"exercise; {context}")


@pytest.mark.points(2)
@pytest.mark.timeout(60)
def test_tiled_causal_mha(seed):
    check(seed, causal=True, batch=2, n_q_heads=2, n_kv_heads=2, seq_len=64, head_dim=24)


@pytest.mark.points(2)
@pytest.mark.timeout(60)
def test_tiled_non_causal(seed):
    check(seed, causal=False, batch=1, n_q_heads=6, n_kv_heads=3, seq_len=45, head_dim=24)


@pytest.mark.points(3)
@pytest.mark.timeout(60)
@pytest.mark.parametrize("n_q_heads,n_kv_heads", [(8, 2), (4, 1)])
def test_tiled_gqa_head_mapping(seed, n_q_heads, n_kv_heads):
    check(seed, causal=True, batch=1, n_q_heads=n_q_heads, n_kv_heads=n_kv_heads, seq_len=37,
          head_dim=24)


@pytest.mark.points(4)
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "seq_len,block_m,block_n,causal",
    [(37, 16, 8, True), (37, 8, 16, True), (50, 32, 32, False), (5, 16, 16, True), (1, 4, 4, True)],
)
def test_tiled_ragged_tiles(seed, seq_len, block_m, block_n, causal):
    # Sequence lengths that are not multiples of the tiles, tiles of different
    # heights and widths, and tiles larger than the whole sequence.
    check(seed, causal=causal, block_m=block_m, block_n=block_n, batch=1, n_q_heads=2, n_kv_heads=1,
          seq_len=seq_len, head_dim=24)


@pytest.mark.points(5)
@pytest.mark.timeout(60)
@pytest.mark.parametrize("causal,dtype,sm_scale,seq_len", [(True, torch.float32, None, 40),
                                                            (False, torch.float16, 0.3, 37)])
def test_tiled_lse_natural_log(seed, causal, dtype, sm_scale, seq_len):
    # The LSE (the other tests judge O alone): LSE = log(sum_j exp(scaled score_ij)), the natural log, with
    # the max carried, float32, [B, Hq, N]. Grouped heads, two batches, a length no tile divides.
    check(seed, causal=causal, dtype=dtype, sm_scale=sm_scale, lse=True, batch=2, n_q_heads=4, n_kv_heads=2,
          seq_len=seq_len, head_dim=24)


@pytest.mark.points(2)
@pytest.mark.timeout(60)
def test_tiled_fp16_custom_sm_scale(seed):
    check(seed, causal=True, sm_scale=0.3, dtype=torch.float16, batch=1, n_q_heads=4, n_kv_heads=2,
          seq_len=45, head_dim=32)


@pytest.mark.points(3)
@pytest.mark.timeout(60)
@pytest.mark.parametrize("causal", [True, False])
def test_tiled_peaked_scores(seed, causal):
    # Sharply peaked attention: every row's scores in the first key block are
    # about 200 above those in later blocks. The running max must stay the
    # largest score seen so far; a "max" that drops to a later block's makes
    # exp(m_old - m_new) = exp(200), which overflows float32.
    check(seed, causal=causal, qkv=peaked_qkv(seed=seed, block=16, head_dim=24, device="cpu"))


# --- Causal skipping, counted (not timed) ------------------------------------------------

@pytest.mark.points(4)
@pytest.mark.timeout(60)
def test_tiled_causal_skips_future_key_tiles(seed):
    # A causal query tile must skip the key tiles past its diagonal, not mask
    # them: masking gives the right answer for about twice the work. Count the
    # scores computed. head_dim 24 is no other size of the case, so only the
    # score products (q_tile @ k_tile^T) are counted, never P @ V.
    batch, n_q_heads, seq_len, head_dim, block_m, block_n = 1, 2, 50, 24, 16, 8
    q, k, v = random_qkv(batch=batch, n_q_heads=n_q_heads, n_kv_heads=1, seq_len=seq_len, head_dim=head_dim,
                         seed=seed, device="cpu")
    reply = student().call("tiled_attention", q, k, v, causal=True, block_m=block_m, block_n=block_n,
                           watch=own_work("tiled", "tiled_attention") | score_products(head_dim))
    out, counted = reply.value, Counted(reply.seen)
    assert_no_whole_matrix(reply.seen, q, block_m, block_n, case_context(seed, q, k, True, f"block_m={block_m}"))
    assert counted.products > 0, (
        "no tile of scores was computed with a matrix product: compute each one as q_tile @ k_tile^T "
        "(the @ operator or torch.matmul), as the kernel will with tl.dot")
    needed = tile_counts.score_elements_needed(batch, n_q_heads, seq_len, block_m, block_n)
    assert counted.elements <= needed, (
        f"the causal walk computed {counted.elements} score elements where it needs {needed} "
        f"(every key tile would be {batch * n_q_heads * seq_len * seq_len}), with block_m={block_m}, "
        f"block_n={block_n}, seq_len={seq_len}: key tiles past the diagonal must be skipped, not masked")
    assert_attention_matches(out, q, k, v, causal=True, sm_scale=None, return_lse=False,
                             context=case_context(seed, q, k, True, f"block_m={block_m}, block_n={block_n}"))
