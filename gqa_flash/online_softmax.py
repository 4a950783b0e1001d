# Your file: fill in the STUDENT IMPLEMENTATION sections; leave the rest as it is.
# (Written from the course's completed online_softmax.py by its release tool.)
#
#   specification  gqa_flash/reference.py: reference_softmax
#   notebook       notebooks/02_online_softmax.ipynb, checked by checks.check_online_softmax()
#   graded by      tests/graded/test_online_softmax.py: 15 points
#   run them       make test-graded MODULE=online_softmax
"""Online softmax: the softmax of a row you may only read one block at a time.

A safe softmax needs the row's maximum ``m`` before it can take any exponential:

    softmax(x)_j = exp(x_j - m) / l,     l = sum_j exp(x_j - m)

FlashAttention never holds a whole row of scores, so it keeps a running state
``(m, l)`` instead and folds in one block after another. When a block raises
the maximum from ``m_old`` to ``m_new``, every exponential summed so far was
taken against the wrong maximum; multiplying the sum by ``exp(m_old - m_new)``
fixes all of them at once, because exp(x - m_old) * exp(m_old - m_new) =
exp(x - m_new). Nothing is approximated: the final ``(m, l)`` is exactly the
one a two-pass softmax computes.

The same rescaling merges any two partial states, in any order; that is what
lets the kernel split a row over key blocks (and, in Flash-Decoding, over
programs).

A block can be entirely ``-inf`` (masked keys in a causal row). Its state is
``(m, l) = (-inf, 0)``, and the functions below must not turn that into NaN:
``exp(-inf - (-inf))`` is NaN, so use 0 in place of an infinite maximum when you
subtract it.
"""

import torch


def block_state(x_block):
    """The softmax state of one block: ``(m, l)`` over its last dimension.

    ``m`` is the row maximum and ``l`` the sum of the row's exponentials taken
    against it (the definition above, for one block), both shaped like
    ``x_block`` without its last dimension. A row that is entirely ``-inf``
    gets ``(-inf, 0)``.
    """
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 1) ---
    # The state of a single block: m, the maximum over the last dim, and l,
    # the sum over the last dim of the exponentials taken against m.
    # Careful with a row that is all -inf: its m is -inf and its l must be 0,
    # not NaN. Subtract a finite stand-in (0) where m is -inf.
    raise NotImplementedError("Part 1 of online_softmax.py is not implemented yet")
    # --- END OF STUDENT IMPLEMENTATION ---
    return m, l


def merge_states(m_a, l_a, m_b, l_b):
    """Merge two softmax states of disjoint parts of the same rows.

    Returns ``(m, l)``: the larger maximum, and the two sums, each first
    brought from its own maximum to that one, added.
    """
    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 2) ---
    # The new maximum is the larger of the two. Each partial sum was taken
    # against its own maximum: rescale each to the new one before adding.
    # As in Part 1, an infinite new maximum (both parts all -inf) must give
    # l = 0, not NaN.
    raise NotImplementedError("Part 2 of online_softmax.py is not implemented yet")
    # --- END OF STUDENT IMPLEMENTATION ---
    return m, l


def online_softmax(x, block_size):
    """Softmax over the last dimension of ``x``, reading ``block_size`` columns at a time.

    Pass 1 streams the blocks and keeps only the running ``(m, l)`` of each row;
    pass 2 normalises. Computes in float32 and returns ``x``'s dtype.
    """
    x32 = x.float()
    n = x32.shape[-1]
    m = torch.full(x32.shape[:-1], float("-inf"), device=x.device)
    l = torch.zeros(x32.shape[:-1], device=x.device)

    # --- STUDENT IMPLEMENTATION REQUIRED HERE (Part 3) ---
    # Two passes over the row. The first reads it block_size columns at a
    # time (the last block may be shorter) and keeps only the row's running
    # state (m, l): set above to the state of an empty row, it must end as
    # the state of the whole row. The second turns that state into the
    # probabilities, `probs`, the shape of x32, in float32.
    # Invariant: the answer does not depend on block_size.
    # Hint: Parts 1 and 2 are the two operations the first pass needs.
    raise NotImplementedError("Part 3 of online_softmax.py is not implemented yet")
    # --- END OF STUDENT IMPLEMENTATION ---
    return probs.to(x.dtype)
