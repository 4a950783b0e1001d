"""gqa-flash: FlashAttention with grouped-query attention, built step by step.

Importing the package first settles where kernels run (``runtime``): on a
machine with no CUDA device it switches Triton to its interpreter before any
kernel is defined.

The public API dispatches to the graded modules the implementation switch
chooses (``GQA_FLASH_IMPL``, :mod:`gqa_flash.course.impl`): by default the
files in this package, yours; or the course's completed files, where the
instructor's copy has them.
"""

from gqa_flash.course import runtime  # first: sets TRITON_INTERPRET when there is no GPU
from gqa_flash.course.api import (
    flash_attention,
    fast_attention_backward,
    flash_attention_backward,
    flash_decode,
    fast_attention_forward,
    flash_attention_forward,
    merge_softmax_states,
    naive_attention,
    online_softmax,
    ring_attention,
    shard_sequence,
    tiled_attention,
    unshard_sequence,
)
from gqa_flash.reference import reference_attention, reference_decode, reference_gradients
from gqa_flash.course.runtime import describe

__all__ = [
    "naive_attention",
    "online_softmax",
    "merge_softmax_states",
    "tiled_attention",
    "flash_attention_forward",
    "fast_attention_forward",
    "flash_attention",
    "fast_attention_backward",
    "flash_attention_backward",
    "flash_decode",
    "ring_attention",
    "shard_sequence",
    "unshard_sequence",
    "reference_attention",
    "reference_decode",
    "reference_gradients",
    "describe",
    "runtime",
]
