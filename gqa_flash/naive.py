# Your file: fill in the STUDENT IMPLEMENTATION sections; leave the rest as it is.
# (Written from the course's completed naive.py by its release tool.)
#
#   specification  gqa_flash/reference.py: reference_attention
#   notebook       notebooks/01_naive_attention.ipynb, checked by checks.check_naive()
#   graded by      tests/graded/test_naive.py: 20 points
#   run them       make test-graded MODULE=naive
"""Naive attention in plain PyTorch: the definition every faster version must match.

    O = softmax(Q K^T * sm_scale + mask) V

Shapes follow PyTorch's ``scaled_dot_product_attention``: ``q`` is
``[B, Hq, N, D]``; ``k`` and ``v`` are ``[B, Hkv, N, D]``.

Grouped-query attention (GQA) lets several query heads share one key/value
head: with ``Hq = 32`` and ``Hkv = 8`` (Llama 3 8B) each group of
``Hq // Hkv = 4`` consecutive query heads reads the same K and V, so the KV
cache is 4x smaller. MHA is the case ``Hkv = Hq``; MQA is ``Hkv = 1``.

This version builds the whole ``N x N`` score matrix: memory grows as N^2,
which is exactly what FlashAttention removes. It is the blueprint, not the
fast path.

The public API (``gqa_flash.naive_attention``) checks the inputs before it
calls this function, so here the shapes and dtypes are valid.
"""

import torch


def naive_attention(q, k, v, causal=True, sm_scale=None):
    if sm_scale is None:
        sm_scale = q.shape[-1] ** -0.5
    n_q_heads, n_kv_heads, seq_len = q.shape[1], k.shape[1], q.shape[2]

    # Work in float32 whatever the input dtype: fp16 scores overflow easily,
    # and the exponentials need the extra precision.
    q32, k32, v32 = q.float(), k.float(), v.float()

    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 1) ---
    # GQA as a head mapping. Query head h reads key/value head
    # h // (n_q_heads // n_kv_heads): heads 0..3 share KV head 0, 4..7 share
    # KV head 1, and so on (with 4 query heads per group).
    # Give k32 and v32 one head per *query* head, so that head h of the
    # result is the KV head that query head h reads:
    #   k32, v32: [B, Hkv, N, D] -> [B, Hq, N, D]
    # Hint: tensors can be indexed by a tensor of indices, one per query head.
    raise NotImplementedError("Part 1 of naive.py is not implemented yet")
    # --- END OF STUDENT IMPLEMENTATION ---

    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 2) ---
    # The scaled scores S = Q K^T * sm_scale, [B, Hq, N, N], and, when
    # `causal`, the causal mask: query i may look at keys j <= i only, so set
    # S[..., i, j] = -inf for every j > i (the diagonal stays visible).
    # Hint: the future is the part of an N x N boolean matrix strictly above
    # its diagonal; torch has a function that keeps one triangle of a matrix.
    raise NotImplementedError("Part 2 of naive.py is not implemented yet")
    # --- END OF STUDENT IMPLEMENTATION ---

    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 3) ---
    # Softmax over the keys (the last dimension), then the weighted sum of V.
    # Leave the result in `out`, [B, Hq, N, D] in float32: the return below
    # casts it to q's dtype.
    # Hint: a safe softmax subtracts the row maximum before exp; torch.softmax does.
    raise NotImplementedError("Part 3 of naive.py is not implemented yet")
    # --- END OF STUDENT IMPLEMENTATION ---
    return out.to(q.dtype)
