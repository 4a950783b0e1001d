"""naive.py: attention in plain PyTorch (20 points)."""

import pytest
import torch

from gqa_flash.course.grader.calls import own_work, student
from gqa_flash.reference import reference_attention
from gqa_flash.course.testing import assert_matches, random_qkv


def check(seed, causal=True, sm_scale=None, dtype=torch.float32, **shape):
    q, k, v = random_qkv(dtype=dtype, seed=seed, device="cpu", **shape)
    # In the executor, under naive.py's own work: its own PyTorch, not SDPA nor the reference.
    out = student().call("naive_attention", q, k, v, causal=causal, sm_scale=sm_scale,
                         watch=own_work("naive", "naive_attention")).value
    ref, _ = reference_attention(q, k, v, causal=causal, sm_scale=sm_scale)
    assert type(out) is torch.Tensor, f"naive_attention must return a plain torch.Tensor, got {type(out).__name__}"
    assert out.dtype == q.dtype, f"the output must have q's dtype {q.dtype}, got {out.dtype}"
    ctx = f"seed {seed}, shape {list(q.shape)} with {k.shape[1]} KV heads, causal={causal}, {dtype}"
    assert_matches("O", out, ref, dtype, ctx)


@pytest.mark.points(4)
@pytest.mark.timeout(60)
def test_naive_causal_mha(seed):
    check(seed, causal=True, batch=2, n_q_heads=3, n_kv_heads=3, seq_len=33, head_dim=16)


@pytest.mark.points(3)
@pytest.mark.timeout(60)
def test_naive_non_causal(seed):
    check(seed, causal=False, batch=2, n_q_heads=4, n_kv_heads=2, seq_len=40, head_dim=24)


@pytest.mark.points(5)
@pytest.mark.timeout(60)
@pytest.mark.parametrize("n_q_heads,n_kv_heads", [(8, 2), (6, 3)])
def test_naive_gqa_head_mapping(seed, n_q_heads, n_kv_heads):
    # Each KV head's values are shifted by its index, so reading the wrong head shows.
    check(seed, causal=True, batch=1, n_q_heads=n_q_heads, n_kv_heads=n_kv_heads, seq_len=20, head_dim=16)


@pytest.mark.points(2)
@pytest.mark.timeout(60)
def test_naive_mqa_one_kv_head(seed):
    check(seed, causal=True, batch=2, n_q_heads=4, n_kv_heads=1, seq_len=17, head_dim=8)


@pytest.mark.points(3)
@pytest.mark.timeout(60)
@pytest.mark.parametrize("sm_scale", [0.05, 1.0])
def test_naive_custom_sm_scale(seed, sm_scale):
    check(seed, causal=True, sm_scale=sm_scale, batch=1, n_q_heads=4, n_kv_heads=2, seq_len=25, head_dim=32)


@pytest.mark.points(3)
@pytest.mark.timeout(60)
def test_naive_fp16_inputs(seed):
    check(seed, causal=True, dtype=torch.float16, batch=1, n_q_heads=4, n_kv_heads=2, seq_len=48, head_dim=64)
