"""Bad input gets a clear error that names the argument; empty input gives an empty result."""

import pytest
import torch

import gqa_flash
from gqa_flash.course import runtime

FNS = {
    "naive": gqa_flash.naive_attention,
    "tiled": gqa_flash.tiled_attention,
    "forward": gqa_flash.flash_attention_forward,
    "fast": gqa_flash.fast_attention_forward,
}


def qkv(b=1, hq=4, hkv=2, n=8, d=16, dtype=torch.float32):
    dev = runtime.DEVICE
    return (torch.randn(b, hq, n, d, dtype=dtype, device=dev), torch.randn(b, hkv, n, d, dtype=dtype, device=dev),
            torch.randn(b, hkv, n, d, dtype=dtype, device=dev))


@pytest.fixture(params=sorted(FNS))
def fn(request):
    return FNS[request.param]


def expect(exc, match, fn, *args, **kwargs):
    with pytest.raises(exc, match=match):
        fn(*args, **kwargs)


def test_wrong_rank_names_the_argument_and_shape(fn):
    q, k, v = qkv()
    expect(ValueError, r"q must be 4-D .* got shape \[4, 8, 16\]", fn, q[0], k, v)
    expect(ValueError, r"v must be 4-D", fn, q, k, v[..., 0])


def test_heads_not_a_multiple(fn):
    q, k, v = qkv(hq=6, hkv=4)
    expect(ValueError, r"query heads \(6.*multiple.*key/value heads \(4", fn, q, k, v)


def test_head_dims_differ(fn):
    q, _, _ = qkv(d=16)
    _, k, v = qkv(d=32)
    expect(ValueError, r"same head_dim.*q \[1, 4, 8, 16\].*k \[1, 2, 8, 32\]", fn, q, k, v)


def test_k_and_v_shapes_differ(fn):
    q, k, v = qkv()
    expect(ValueError, r"k and v must have the same shape", fn, q, k, v[:, :1])


def test_sequence_lengths_differ(fn):
    q, k, v = qkv()
    expect(ValueError, r"same sequence length", fn, q[:, :, :4], k, v)


def test_batch_sizes_differ(fn):
    q, k, v = qkv(b=2)
    expect(ValueError, r"same batch size", fn, q, k[:1], v[:1])


@pytest.mark.parametrize("dtype", [torch.int32, torch.float64])
def test_unsupported_dtype(fn, dtype):
    q, k, v = (t.to(dtype) for t in qkv())
    expect(TypeError, r"q has dtype " + str(dtype)[6:], fn, q, k, v)


def test_mixed_dtypes(fn):
    q, k, v = qkv()
    expect(TypeError, r"one dtype.*q float32, k float16", fn, q, k.half(), v)


def test_not_a_tensor(fn):
    q, k, v = qkv()
    expect(TypeError, r"k must be a torch.Tensor, got list", fn, q, [1, 2], v)


def test_causal_must_be_a_bool(fn):
    q, k, v = qkv()
    expect(TypeError, r"causal must be True or False", fn, q, k, v, causal="yes")


def test_sm_scale_must_be_a_finite_number(fn):
    q, k, v = qkv()
    expect(TypeError, r"sm_scale must be a real number", fn, q, k, v, sm_scale="0.1")
    expect(ValueError, r"sm_scale must be finite", fn, q, k, v, sm_scale=float("nan"))


@pytest.mark.parametrize("shape", [(0, 4, 8, 16), (2, 4, 0, 16)])
def test_empty_batch_or_sequence_gives_empty_result(fn, shape):
    b, hq, n, d = shape
    q, k, v = qkv(b=b, hq=hq, n=n, d=d)
    out = fn(q, k, v)
    assert out.shape == q.shape and out.dtype == q.dtype


def test_empty_result_with_lse():
    q, k, v = qkv(n=0)
    for f in (gqa_flash.tiled_attention, gqa_flash.flash_attention_forward):
        o, lse = f(q, k, v, return_lse=True)
        assert o.shape == q.shape and lse.shape == (1, 4, 0) and lse.dtype == torch.float32


def test_tiled_block_sizes_must_be_positive_ints():
    q, k, v = qkv()
    expect(ValueError, r"block_m must be a positive integer, got 0", gqa_flash.tiled_attention, q, k, v, block_m=0)
    expect(ValueError, r"block_n must be a positive integer, got 2.5", gqa_flash.tiled_attention, q, k, v, block_n=2.5)


def test_kernel_head_dim_limit():
    q, k, v = qkv(d=272)
    expect(ValueError, r"head_dim up to 256", gqa_flash.flash_attention_forward, q, k, v)


@pytest.mark.skipif(not runtime.INTERPRETER, reason="bf16 is refused only in Triton's interpreter")
def test_bf16_is_refused_in_the_interpreter_with_the_reason():
    q, k, v = (t.bfloat16() for t in qkv())
    expect(TypeError, r"bfloat16.*interpreter.*11584.*float16, float32", gqa_flash.flash_attention_forward, q, k, v)


@pytest.mark.skipif(runtime.DEVICE.type != "cuda", reason="needs kernels compiled for a GPU")
def test_cpu_tensors_are_refused_when_kernels_run_on_the_gpu():
    q, k, v = (t.cpu() for t in qkv())
    expect(ValueError, r"kernels are compiled for the GPU.*\.cuda\(\)", gqa_flash.flash_attention_forward, q, k, v)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_mixed_devices():
    q, k, v = qkv()
    expect(ValueError, r"one device", gqa_flash.naive_attention, q.cuda(), k.cpu(), v.cpu())


def test_online_softmax_arguments():
    x = torch.randn(3, 10)
    expect(ValueError, r"block_size must be a positive integer, got 0", gqa_flash.online_softmax, x, 0)
    expect(TypeError, r"x has dtype int64", gqa_flash.online_softmax, torch.arange(10), 4)
    expect(ValueError, r"at least one dimension", gqa_flash.online_softmax, torch.tensor(1.0), 4)
    assert gqa_flash.online_softmax(torch.empty(3, 0), 4).shape == (3, 0)


def test_merge_states_shapes_must_agree():
    a = torch.zeros(3)
    expect(ValueError, r"share one shape.*m_b \[4\]", gqa_flash.merge_softmax_states, a, a, torch.zeros(4), a)


@pytest.mark.parametrize("backward", [gqa_flash.flash_attention_backward, gqa_flash.fast_attention_backward],
                         ids=["graded", "fast"])
def test_backward_checks_its_extra_arguments(backward):
    q, k, v = qkv(dtype=runtime.default_dtype())
    o, lse, do = torch.zeros_like(q), torch.zeros(q.shape[:3], device=q.device), torch.zeros_like(q)
    expect(ValueError, r"o must have q's shape \[1, 4, 8, 16\]; got \[1, 4, 8, 8\]",
           backward, q, k, v, o[..., :8], lse, do)
    expect(ValueError, r"do must have q's shape", backward, q, k, v, o, lse, do[:, :2])
    expect(ValueError, r"lse must be \[batch, q_heads, seq\] = \[1, 4, 8\]; got \[1, 4, 7\]", backward, q, k, v, o,
           lse[..., :7], do)
    empty = [t[:, :, :0] for t in (q, k, v, o, lse, do)]
    assert all(g.shape[2] == 0 for g in backward(*empty))
