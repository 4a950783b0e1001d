"""online_softmax.py: streaming softmax with a running max and sum (15 points)."""

import pytest
import torch

import gqa_flash
from gqa_flash import impl
from gqa_flash.reference import reference_softmax
from gqa_flash.testing import mismatch

NEG_INF = float("-inf")


def reference_state(x):
    """(m, l) of the rows of x in float64: m = max, l = sum(exp(x - m)); (-inf, 0) for an all -inf row."""
    x = x.double()
    m = x.amax(dim=-1)
    l = torch.exp(x - m.nan_to_num(neginf=0.0)[..., None]).sum(dim=-1)
    return m, l


def assert_close(what, got, ref, seed, labels=("row", "col")):
    problem = mismatch(what, got, ref, atol=1e-5, rtol=1e-5, labels=labels)
    if problem is not None:
        raise AssertionError(f"{problem}; seed {seed}")


def check_softmax(x, block_size, seed):
    out = gqa_flash.online_softmax(x, block_size)
    assert isinstance(out, torch.Tensor) and out.dtype == x.dtype, "online_softmax must return a tensor of x's dtype"
    assert_close(f"softmax (block_size={block_size}, {x.shape[-1]} columns)", out, reference_softmax(x), seed)


@pytest.mark.points(3)
@pytest.mark.timeout(60)
def test_block_state_of_one_block(seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 16, generator=gen) * 3
    x[2] = NEG_INF  # a fully masked row: (m, l) = (-inf, 0), not NaN
    x[4, :5] = NEG_INF  # partly masked
    m, l = impl.load("online_softmax").block_state(x)
    m_ref, l_ref = reference_state(x)
    assert_close("block_state m", m, m_ref, seed, labels=("row",))
    assert_close("block_state l", l, l_ref, seed, labels=("row",))


@pytest.mark.points(4)
@pytest.mark.timeout(60)
def test_merge_states_rescales_both_sums(seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 40, generator=gen) * 4
    x[1, :25] = NEG_INF  # the first part of row 1 is all masked
    x[3] = NEG_INF  # row 3 is all masked in both parts
    x[5, :25] += 20.0  # row 5's maximum is in the first part, row 6's in the second
    x[6, 25:] += 20.0
    a, b = x[:, :25], x[:, 25:]
    m_a, l_a = reference_state(a)
    m_b, l_b = reference_state(b)
    m, l = gqa_flash.merge_softmax_states(m_a.float(), l_a.float(), m_b.float(), l_b.float())
    m_ref, l_ref = reference_state(x)
    assert_close("merged m", m, m_ref, seed, labels=("row",))
    assert_close("merged l", l, l_ref, seed, labels=("row",))
    # The merge is symmetric: merging (b, a) gives the same state.
    m2, l2 = gqa_flash.merge_softmax_states(m_b.float(), l_b.float(), m_a.float(), l_a.float())
    assert_close("merged m, parts swapped", m2, m_ref, seed, labels=("row",))
    assert_close("merged l, parts swapped", l2, l_ref, seed, labels=("row",))


@pytest.mark.points(4)
@pytest.mark.timeout(60)
@pytest.mark.parametrize("block_size", [1, 7, 16, 64])
def test_online_softmax_any_block_size(seed, block_size):
    # 50 columns: 7 leaves a ragged last block, 64 is larger than the row.
    gen = torch.Generator().manual_seed(seed)
    check_softmax(torch.randn(2, 5, 50, generator=gen) * 2, block_size, seed)


@pytest.mark.points(2)
@pytest.mark.timeout(60)
def test_online_softmax_masked_blocks(seed):
    # Causal rows: the leading blocks are visible, the trailing ones all -inf.
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(24, 48, generator=gen)
    future = torch.ones(24, 48, dtype=torch.bool).triu(diagonal=1)
    x = x.masked_fill(future, NEG_INF)
    x[20, :16] = NEG_INF  # and a row whose first two blocks are all -inf
    check_softmax(x, 8, seed)


@pytest.mark.points(2)
@pytest.mark.timeout(60)
def test_online_softmax_growing_maximum(seed):
    # Large scores that grow from block to block: exp overflows unless each
    # block's sum is rescaled to the new maximum.
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 64, generator=gen) + torch.linspace(0, 400, 64)
    check_softmax(x, 8, seed)
    check_softmax(x.flip(-1), 8, seed)
