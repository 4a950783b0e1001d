"""forward.py: the Triton FlashAttention forward kernel with GQA (40 points).

On a machine with no GPU the kernel runs in Triton's interpreter, so the
shapes here stay small; tests/gpu/ runs the large ones and bf16 on a GPU.
"""

import pytest
import torch

import gqa_flash
from gqa_flash import testing
from gqa_flash.testing import assert_attention_matches, case_context, kernel_only, peaked_qkv, random_qkv


def check(seed, causal=True, sm_scale=None, dtype=torch.float32, layout="contiguous", lse=False, qkv=None, **shape):
    q, k, v = qkv if qkv is not None else random_qkv(dtype=dtype, layout=layout, seed=seed, **shape)
    # The kernel must do the work: PyTorch's attention, softmax and matmuls are
    # off limits inside, and at least one Triton kernel must be launched.
    with kernel_only() as launches:
        result = gqa_flash.flash_attention_forward(q, k, v, causal=causal, sm_scale=sm_scale, return_lse=lse)
    assert launches.count > 0, "flash_attention_forward must launch the Triton kernel"
    assert_attention_matches(result, q, k, v, causal=causal, sm_scale=sm_scale, return_lse=lse,
                             context=case_context(seed, q, k, causal, f"layout {layout}"))


@pytest.mark.points(3)
@pytest.mark.timeout(120)
def test_forward_causal_mha(seed):
    check(seed, causal=True, batch=1, n_q_heads=2, n_kv_heads=2, seq_len=64, head_dim=32)


@pytest.mark.points(4)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("n_q_heads,n_kv_heads", [(8, 2), (6, 3)])
def test_forward_kv_head_mapping(seed, n_q_heads, n_kv_heads):
    # Each KV head's values are shifted by its index: a program that reads the
    # wrong KV head writes visibly wrong rows.
    check(seed, causal=True, batch=1, n_q_heads=n_q_heads, n_kv_heads=n_kv_heads, seq_len=32, head_dim=16)


@pytest.mark.points(2)
@pytest.mark.timeout(120)
def test_forward_mqa_one_kv_head(seed):
    check(seed, causal=True, batch=1, n_q_heads=4, n_kv_heads=1, seq_len=48, head_dim=16)


@pytest.mark.points(4)
@pytest.mark.timeout(120)
def test_forward_non_causal(seed):
    # 57 keys: the last key block is partly padding, which must be masked.
    check(seed, causal=False, batch=1, n_q_heads=4, n_kv_heads=2, seq_len=57, head_dim=32)


@pytest.mark.points(5)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("seq_len,causal", [(1, True), (17, True), (50, True), (23, False), (50, False)])
def test_forward_ragged_seq_len(seed, seq_len, causal):
    # Sequence lengths that are not a multiple of the tiles: the last query
    # tile and the last key block are partly padding.
    check(seed, causal=causal, batch=1, n_q_heads=2, n_kv_heads=1, seq_len=seq_len, head_dim=16)


@pytest.mark.points(3)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("head_dim", [16, 80, 96, 128])
def test_forward_head_dims(seed, head_dim):
    # 80 and 96 are not powers of two: padded to 128 inside the kernel.
    check(seed, causal=True, batch=1, n_q_heads=2, n_kv_heads=1, seq_len=40, head_dim=head_dim)


@pytest.mark.points(3)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("layout", ["bnhd", "strided"])
def test_forward_non_contiguous_strides(seed, layout):
    # bnhd: a [B, N, H, D] tensor transposed; strided: every dimension strided,
    # the head dim included.
    check(seed, causal=True, layout=layout, batch=2, n_q_heads=4, n_kv_heads=2, seq_len=33, head_dim=32)


@pytest.mark.points(3)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("causal", [True, False])
def test_forward_lse_natural_log(seed, causal):
    # The LSE the backward pass needs: natural log, float32, [B, Hq, N].
    check(seed, causal=causal, lse=True, batch=1, n_q_heads=4, n_kv_heads=2, seq_len=45, head_dim=16)


@pytest.mark.points(2)
@pytest.mark.timeout(120)
def test_forward_fp16(seed):
    check(seed, causal=True, dtype=torch.float16, lse=True, batch=1, n_q_heads=4, n_kv_heads=2,
          seq_len=64, head_dim=64)


@pytest.mark.points(2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sm_scale", [0.05, 0.5])
def test_forward_custom_sm_scale(seed, sm_scale):
    check(seed, causal=True, sm_scale=sm_scale, lse=True, batch=1, n_q_heads=2, n_kv_heads=2, seq_len=40,
          head_dim=32)


@pytest.mark.points(2)
@pytest.mark.timeout(120)
def test_forward_batch_of_three(seed):
    # Programs of different batches must not mix: batch b starts at b * stride_qb.
    check(seed, causal=True, batch=3, n_q_heads=2, n_kv_heads=1, seq_len=24, head_dim=16)


@pytest.mark.points(3)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("causal", [True, False])
def test_forward_peaked_scores(seed, causal):
    # Sharply peaked attention: the scores of the first 64 keys are about 200
    # above all later ones. The running max must never fall (exp2 of a
    # rescale factor of 2^288 overflows), and the LSE must carry the max.
    check(seed, causal=causal, lse=True, qkv=peaked_qkv(seed=seed, block=64))


@pytest.mark.points(4)
@pytest.mark.timeout(180)
def test_forward_causal_skips_key_blocks_past_the_diagonal(seed):
    # The point of the two-phase key loop: a causal query tile never loads a
    # key block after its diagonal. The interpreter counts each program's
    # score tiles (tl.dot of Q with a K tile); a loop that runs on to SEQ_LEN
    # and lets the mask hide the future is right but does twice the work.
    seq_len = 100
    counts, config = testing.score_tiles_per_program(seq_len=seq_len, head_dim=32, causal=True, seed=seed)
    block_m, block_n = config["BLOCK_M"], config["BLOCK_N"]
    assert counts, ("no score tile was seen: compute each key block's scores with tl.dot of the Q tile and "
                    f"the K tile (a [{block_m}, {block_n}] tile)")
    for program, got in counts.items():
        q_tile = int(program.split(",")[0])
        need = testing.key_blocks_needed(q_tile, seq_len, block_m, block_n)
        assert got <= need, (
            f"query tile {q_tile} (rows {q_tile * block_m}..{min((q_tile + 1) * block_m, seq_len) - 1}, "
            f"SEQ_LEN {seq_len}, BLOCK_M {block_m}, BLOCK_N {block_n}) computed {got} score tiles where the "
            f"causal walk needs {need}: key blocks past the diagonal must be skipped, never loaded")
    # Every program computed scores (a program that computed none would not be counted at all).
    assert len(counts) == -(-seq_len // block_m) * 2, f"programs that computed no score tile: {counts}"
