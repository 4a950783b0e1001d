"""The memory the fast kernels read and write: the layouts the TMA can read, and the shared memory a
program may hold. The Triton kernel (``forward.py``, ``backward.py``) and the Gluon kernel
(``hopper_forward.py``) both take them from here."""

import torch
import triton

from gqa_flash.course import runtime

SHARED_MEMORY = 232_448  # bytes of shared memory a program may hold on sm_90 (an H100 or H200)


def shared_memory(device=None) -> int:
    """Bytes of shared memory a program may hold on ``device`` (the current GPU when None), as the
    driver reports it (``runtime.on_gpu``); ``SHARED_MEMORY`` where kernels run in the interpreter."""
    gpu = runtime.on_gpu(device if device is not None else torch.device("cuda"))
    return SHARED_MEMORY if gpu is None else gpu[2]


def tma_can_read(t) -> bool:
    """The TMA's rules: unit stride on the last dim, 16-byte aligned base and strides."""
    size = t.element_size()
    return t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all((s * size) % 16 == 0 for s in t.stride()[:-1])


def empty_readable(shape, dtype, device):
    """An uninitialised tensor of ``shape`` that the TMA can read and write: contiguous,
    with each row padded to a multiple of 16 bytes when it is not one already (a view of the
    first ``shape[-1]`` columns then)."""
    per_16_bytes = 16 // dtype.itemsize
    width = triton.cdiv(shape[-1], per_16_bytes) * per_16_bytes
    t = torch.empty((*shape[:-1], width), dtype=dtype, device=device)
    return t if width == shape[-1] else t[..., :shape[-1]]


def readable(t):
    """``t`` itself when the TMA can read it, else a copy of it in a layout it can."""
    if tma_can_read(t):
        return t
    return empty_readable(t.shape, t.dtype, t.device).copy_(t)
