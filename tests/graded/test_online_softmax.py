"""online_softmax.py: streaming softmax with a running max and sum (15 points)."""

import pytest
import torch

from gqa_flash.course.grader.calls import own_work, student, whole_rows
from gqa_flash.reference import reference_softmax
from gqa_flash.course.testing import mismatch

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
    # Under online_softmax.py's own work, and never a reduction over a whole row of x at once.
    out = student().call("online_softmax", x, block_size,
                         watch=own_work("online_softmax") | whole_rows(x.shape[-1], block_size)).value
    assert type(out) is torch.Tensor and out.dtype == x.dtype, (
        f"online_softmax must return a tensor of x's dtype ({str(x.dtype).replace('torch.', '')}), as its docstring "
        f"says; got {type(out).__name__} of {getattr(out, 'dtype', None)}")
    tol = 1e-5 if x.dtype == torch.float32 else 2e-3
    problem = mismatch(f"softmax (block_size={block_size}, {x.shape[-1]} columns, {str(x.dtype)[6:]})", out,
                       reference_softmax(x), atol=tol, rtol=tol, labels=("row", "col"))
    if problem is not None:
        raise AssertionError(f"{problem}; seed {seed}")


@pytest.mark.points(2)
@pytest.mark.timeout(60)
def test_block_state_of_one_block(seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 16, generator=gen) * 3
    x[2] = NEG_INF  # a fully masked row: (m, l) = (-inf, 0), not NaN
    x[4, :5] = NEG_INF  # partly masked
    m, l = student().call("online_softmax.block_state", x, watch=own_work("online_softmax", "block_state")).value
    m_ref, l_ref = reference_state(x)
    assert_close("block_state m", m, m_ref, seed, labels=("row",))
    assert_close("block_state l", l, l_ref, seed, labels=("row",))


@pytest.mark.points(3)
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
    watch = own_work("online_softmax", "merge_states")
    m, l = student().call("merge_softmax_states", m_a.float(), l_a.float(), m_b.float(), l_b.float(),
                          watch=watch).value
    m2, l2 = student().call("merge_softmax_states", m_b.float(), l_b.float(), m_a.float(), l_a.float(),
                            watch=watch).value
    m_ref, l_ref = reference_state(x)
    assert_close("merged m", m, m_ref, seed, labels=("row",))
    assert_close("merged l", l, l_ref, seed, labels=("row",))
    # The merge is symmetric: merging (b, a) gives the same state.
    assert_close("merged m, parts swapped", m2, m_ref, seed, labels=("row",))
    assert_close("merged l, parts swapped", l2, l_ref, seed, labels=("row",))


@pytest.mark.points(4)
@pytest.mark.timeout(60)
@pytest.mark.parametrize("block_size,dtype", [(1, torch.float32), (7, torch.float16), (16, torch.float32),
                                              (64, torch.float16)])
def test_online_softmax_any_block_size(seed, block_size, dtype):
    # 50 columns: 7 and 16 leave a ragged last block, 64 is larger than the row. fp16 in, fp16 out. As in
    # attention, some rows start with masked (-inf) columns: whole blocks of them for the smaller blocks.
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 5, 50, generator=gen) * 2
    x[0, 1:4, :20] = NEG_INF
    check_softmax(x.to(dtype), block_size, seed)


@pytest.mark.points(3)
@pytest.mark.timeout(60)
def test_online_softmax_masked_blocks(seed):
    # Causal rows: the leading blocks are visible, the trailing ones all -inf; 45 columns, a ragged last block.
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(45, 45, generator=gen)
    future = torch.ones(45, 45, dtype=torch.bool).triu(diagonal=1)
    x = x.masked_fill(future, NEG_INF)
    x[20, :16] = NEG_INF  # and a row whose first two blocks are all -inf
    check_softmax(x, 8, seed)


@pytest.mark.points(3)
@pytest.mark.timeout(60)
def test_online_softmax_growing_maximum(seed):
    # Large scores that grow from block to block: exp overflows unless each
    # block's sum is rescaled to the new maximum. 60 columns: a ragged last block.
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 60, generator=gen) + torch.linspace(0, 400, 60)
    check_softmax(x, 8, seed)
    check_softmax(x.flip(-1), 8, seed)
