"""The float64 reference's sliding windows and attention sinks (issue: attention as current models run it): the
specification the kernels will be held to, checked against the most direct statement of each rule."""

import math

import pytest
import torch

from gqa_flash import reference


def _inputs(b=2, hq=4, hkv=2, n=13, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=torch.float64) for h in (hq, hkv, hkv)]


def _explicit(q, k, v, mask, sinks=None):
    """Attention written out row by row: softmax over the keys ``mask`` keeps (and a sink logit), P @ V."""
    group = q.shape[1] // k.shape[1]
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for i in range(q.shape[2]):
                keys = [j for j in range(k.shape[2]) if mask[i, j]]
                s = torch.stack([q[b, h, i] @ k[b, h // group, j] / math.sqrt(q.shape[-1]) for j in keys])
                logits = s if sinks is None else torch.cat([s, sinks[h].reshape(1)])
                p = torch.softmax(logits, 0)[: len(keys)]
                out[b, h, i] = sum(p[t] * v[b, h // group, j] for t, j in enumerate(keys))
    return out


@pytest.mark.parametrize("window,sink_tokens", [(1, 0), (3, 0), (5, 2), (4, 4), (20, 0), (3, 1)])
def test_a_window_keeps_the_last_w_keys_and_the_sink_tokens(window, sink_tokens):
    q, k, v = _inputs()
    n = q.shape[2]
    mask = torch.tensor([[(j <= i and j > i - window) or (j <= i and j < sink_tokens) for j in range(n)]
                         for i in range(n)])
    o, _ = reference.reference_attention(q, k, v, window=window, sink_tokens=sink_tokens)
    torch.testing.assert_close(o, _explicit(q, k, v, mask), rtol=1e-10, atol=1e-12)


def test_a_window_as_long_as_the_sequence_is_causal_attention_and_w_1_is_v():
    q, k, v = _inputs()
    n = q.shape[2]
    for window in (n, n + 5):
        causal = reference.reference_attention(q, k, v)
        for got, want in zip(reference.reference_attention(q, k, v, window=window), causal):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    o, _ = reference.reference_attention(q, k, v, window=1)
    torch.testing.assert_close(o, v.repeat_interleave(2, dim=1), rtol=0, atol=1e-14)


def test_a_learned_sink_joins_each_rows_softmax_and_none_of_its_weight_reaches_o():
    q, k, v = _inputs()
    n = q.shape[2]
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float64)
    o, lse = reference.reference_attention(q, k, v, window=5, sinks=sinks)
    mask = torch.tensor([[j <= i and j > i - 5 for j in range(n)] for i in range(n)])
    torch.testing.assert_close(o, _explicit(q, k, v, mask, sinks), rtol=1e-10, atol=1e-12)
    o0, lse0 = reference.reference_attention(q, k, v, window=5)
    torch.testing.assert_close(lse, torch.logaddexp(lse0, sinks[None, :, None].expand_as(lse0)), rtol=0, atol=1e-12)
    assert (o.abs().sum(-1) < o0.abs().sum(-1) + 1e-12).all()  # a sink only takes weight away


def test_a_sink_of_minus_infinity_is_no_sink():
    q, k, v = _inputs()
    none = torch.full((4,), float("-inf"), dtype=torch.float64)
    for got, want in zip(reference.reference_attention(q, k, v, sinks=none), reference.reference_attention(q, k, v)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_the_sinks_gradient_is_autograds_a_sum_over_its_heads_rows():
    q, k, v = _inputs(n=7)
    do = torch.randn_like(q)
    sinks = torch.tensor([0.3, -0.7, 1.1, 0.0], dtype=torch.float64, requires_grad=True)
    dq, dk, dv, dsink = reference.reference_gradients(q, k, v, do, window=3, sink_tokens=1, sinks=sinks)
    assert dsink.shape == (4,) and dq.shape == q.shape and dk.shape == dv.shape == k.shape
    # dsink from the closed form: each row gives -P_sink * (dO . O), summed over the head's rows.
    o, lse = reference.reference_attention(q, k, v, window=3, sink_tokens=1, sinks=sinks)
    p_sink = torch.exp(sinks.detach()[None, :, None] - lse)
    torch.testing.assert_close(dsink, -(p_sink * (do * o).sum(-1)).sum((0, 2)), rtol=1e-10, atol=1e-12)
    assert len(reference.reference_gradients(q, k, v, do)) == 3  # no sinks: dQ, dK, dV as before


def test_the_gradients_with_a_window_and_sinks_pass_gradcheck():
    q, k, v = _inputs(b=1, hq=2, hkv=1, n=5, d=4)
    sinks = torch.tensor([0.2, -0.4], dtype=torch.float64)

    def loss(q_, k_, v_, s_):  # the reference's forward, differentiable: the maths reference_gradients runs
        scores = (q_ @ k_.repeat_interleave(2, 1).transpose(-1, -2)) / 2 + reference._bias(5, 5, True, 3, 1)
        return reference._attend(scores, v_.repeat_interleave(2, 1), s_)[0]

    inputs = [t.clone().requires_grad_(True) for t in (q, k, v, sinks)]
    assert torch.autograd.gradcheck(loss, inputs)
    do = torch.randn_like(q)
    want = torch.autograd.grad(loss(*inputs), inputs, do)
    got = reference.reference_gradients(q, k, v, do, window=3, sink_tokens=1, sinks=sinks)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_decode_with_a_window_sees_the_last_w_positions_and_the_sink_tokens():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 2, 8, generator=g, dtype=torch.float64)
    k_cache, v_cache = (torch.randn(2, 2, 20, 8, generator=g, dtype=torch.float64) for _ in range(2))
    lens = torch.tensor([20, 9])
    o, lse = reference.reference_decode(q, k_cache, v_cache, lens, window=4, sink_tokens=2)
    for b, n in enumerate(lens.tolist()):
        # the same tokens as the last rows of a prefill of the sequence
        full_q = torch.zeros(1, 4, n, 8, dtype=torch.float64)
        full_q[0, :, n - 2:] = q[b]
        want, want_lse = reference.reference_attention(full_q, k_cache[b:b + 1, :, :n], v_cache[b:b + 1, :, :n],
                                                       window=4, sink_tokens=2)
        torch.testing.assert_close(o[b], want[0, :, n - 2:], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(lse[b], want_lse[0, :, n - 2:], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kwargs,named", [
    (dict(window=0), "window"), (dict(window=2.5), "window"), (dict(window=True), "window"),
    (dict(window=3, causal=False), "causal"), (dict(sink_tokens=-1), "sink_tokens"),
    (dict(sinks=torch.zeros(3)), "sinks"),
])
def test_bad_window_or_sink_arguments_are_named(kwargs, named):
    q, k, v = _inputs()
    with pytest.raises(ValueError, match=named):
        reference.reference_attention(q, k, v, **kwargs)


def test_without_a_mask_queries_and_keys_may_differ_in_number():
    """Notebook 03 attends 12 queries to each half of 12 keys, unmasked: the reference takes any key count."""
    q, k, v = _inputs(n=12)
    o_a, lse_a = reference.reference_attention(q, k[:, :, :6], v[:, :, :6], causal=False)
    o_b, lse_b = reference.reference_attention(q, k[:, :, 6:], v[:, :, 6:], causal=False)
    o, lse = reference.reference_attention(q, k, v, causal=False)
    torch.testing.assert_close(torch.logaddexp(lse_a, lse_b), lse, rtol=0, atol=1e-12)
