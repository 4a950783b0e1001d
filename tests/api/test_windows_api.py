"""Sliding windows and sinks through the public API, with the solutions behind it (GQA_FLASH_IMPL=solutions).

``flash_attention_forward`` runs windows.py (the bonus, on forward.py's helpers) when a window or sinks are given,
and forward.py otherwise; ``flash_attention`` with ``fast=False`` runs windows.py's forward and the fast backward,
which learns the sinks. (The graded tests judge windows.py itself; tests/given/test_fast_windows.py the fast
kernels.)
"""

import pytest
import torch

import gqa_flash
from gqa_flash.course import impl
from gqa_flash.course.testing import assert_lse_matches, assert_matches, fresh_seed, gradient_error, random_qkv
from gqa_flash.reference import reference_attention, reference_gradients

pytestmark = pytest.mark.skipif(not (impl.SOLUTIONS_DIR / "windows.py").is_file(),
                                reason="the student edition has no solutions/")


@pytest.fixture(autouse=True)
def _solutions(monkeypatch):
    monkeypatch.setenv("GQA_FLASH_IMPL", "solutions")


@pytest.fixture
def loaded(monkeypatch):
    """The graded modules the public API loads, in order."""
    names, real = [], impl.load
    monkeypatch.setattr(impl, "load", lambda name, choice=None: names.append(name) or real(name, choice))
    return names


def test_flash_attention_forward_runs_windows_py_with_a_window_or_sinks(loaded):
    seed = fresh_seed()
    q, k, v = random_qkv(n_q_heads=4, n_kv_heads=2, seq_len=50, head_dim=32, seed=seed)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(seed)).to(q.device)
    for options in (dict(window=7, sink_tokens=2), dict(sinks=sinks), dict(window=3, sinks=sinks)):
        loaded.clear()
        o, lse = gqa_flash.flash_attention_forward(q, k, v, return_lse=True, **options)
        assert "windows" in loaded, (options, loaded)
        ref, ref_lse = reference_attention(q, k, v, **options)
        assert_matches("O", o, ref, q.dtype, f"seed {seed}, {list(options)}")
        assert_lse_matches(lse, ref_lse, f"seed {seed}, {list(options)}")
    loaded.clear()
    gqa_flash.flash_attention_forward(q, k, v)
    assert loaded == ["forward"], loaded


def test_flash_attention_runs_windows_py_forward_and_learns_the_sinks(loaded):
    seed = fresh_seed()
    q, k, v = random_qkv(n_q_heads=4, n_kv_heads=2, seq_len=37, head_dim=32, seed=seed)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 2)).to(q)
    sinks = (torch.randn(4, generator=torch.Generator().manual_seed(seed + 1)) * 2).to(q.device)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, sinks)]
    out = gqa_flash.flash_attention(*leaves[:3], window=6, sink_tokens=2, sinks=leaves[3])
    assert loaded == ["windows"], loaded  # the forward: windows.py; the backward: the fast kernels
    out.backward(do)
    ref = reference_attention(q, k, v, window=6, sink_tokens=2, sinks=sinks)[0]
    assert_matches("O", out, ref, q.dtype, f"seed {seed}")
    want = reference_gradients(q, k, v, do, window=6, sink_tokens=2, sinks=sinks)
    for name, leaf, w in zip(("q", "k", "v", "sinks"), leaves, want):
        err, bound = gradient_error(leaf.grad, w, q.dtype)
        assert err <= bound, f"{name}.grad: error {err:.2e} > {bound:.2e} (seed {seed})"
