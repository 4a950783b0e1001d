"""A differentiable FlashAttention: the forward kernel plus the backward kernels, as one autograd op.

``flash_attention(q, k, v)`` behaves like ``F.scaled_dot_product_attention(q, k, v,
is_causal=True, enable_gqa=True)``: use it in a model, call ``loss.backward()``.
The forward saves O and the LSE (O(N) memory); the backward recomputes the
attention probabilities from them tile by tile (``backward.py``).
"""

import torch

from gqa_flash import impl


class FlashAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale, fast=False):
        if fast:  # the course's fastest kernels (not graded)
            from gqa_flash.fast_forward import fast_attention_forward as forward
        else:
            forward = impl.load("forward").flash_attention_forward
        o, lse = forward(q, k, v, causal=causal, sm_scale=sm_scale, return_lse=True)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.sm_scale, ctx.fast = causal, sm_scale, fast
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        if ctx.fast:
            from gqa_flash.fast_backward import fast_attention_backward as backward
        else:
            backward = impl.load("backward").flash_attention_backward
        dq, dk, dv = backward(q, k, v, o, lse, do, causal=ctx.causal, sm_scale=ctx.sm_scale)
        return dq, dk, dv, None, None, None
