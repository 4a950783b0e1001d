"""Where the kernels run: a CUDA GPU, or Triton's interpreter on the CPU.

Triton decides at *definition* time whether an ``@triton.jit`` function is
compiled for a GPU or run by its Python interpreter: ``triton.jit`` reads the
environment variable ``TRITON_INTERPRET`` when the decorator runs. So this
module must run before any kernel module is imported. ``gqa_flash/__init__.py``
imports it first, and the kernel modules import it too, so even
``import gqa_flash.forward`` on its own gets it right.

On a machine with no CUDA device we switch the interpreter on. It runs every
program of the grid one after the other in NumPy: slow, but exact enough to
check a kernel, and it lets a student with a laptop do the whole course.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from dataclasses import dataclass

import torch


def _cuda_usable() -> bool:
    try:
        return torch.cuda.is_available() and torch.cuda.device_count() > 0
    except Exception:  # a broken driver must not stop the CPU path
        return False


# Decide once, at import, before any kernel is defined. A user who sets
# TRITON_INTERPRET themselves (to 1 or to 0) keeps their choice.
if "TRITON_INTERPRET" not in os.environ and not _cuda_usable():
    if "triton" in sys.modules:
        # Triton read the variable when it was imported: its own helpers
        # (tl.max, tl.sum, ...) are already compiled-mode functions, and
        # interpreted kernels that call them fail.
        warnings.warn(
            "triton was imported before gqa_flash on a machine with no GPU: import gqa_flash first "
            "(or set TRITON_INTERPRET=1 before importing triton), then restart the kernel",
            RuntimeWarning,
            stacklevel=2,
        )
    os.environ["TRITON_INTERPRET"] = "1"

INTERPRETER: bool = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
"""True when Triton kernels run in the interpreter (on the CPU)."""

DEVICE: torch.device = torch.device("cuda") if (_cuda_usable() and not INTERPRETER) else torch.device("cpu")
"""Where the course puts its tensors: the GPU when kernels are compiled for it, else the CPU."""


def _index_one_element_arrays() -> None:
    """Triton 3.6's interpreter turns a scalar tensor into a Python int with ``int(array)``; its scalars are
    one-element arrays, which NumPy 2.4 no longer converts ("only 0-dimensional arrays can be converted to
    Python scalars"), so any ``range(0, n, BLOCK)`` whose bound was computed in the kernel fails. Later
    Triton squeezes the array first (``int(data.squeeze())``); do the same whatever the version (the
    compiled path never comes here)."""
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "__wrapped__", None) is not None:
        return

    @functools.wraps(original)
    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    interpreter._patch_lang_tensor = patched


if INTERPRETER:
    _index_one_element_arrays()


def bf16_supported() -> bool:
    """bf16 works in the kernel only when compiled for a GPU that has it.

    The interpreter multiplies the raw bits of bf16 in ``tl.dot`` (triton issue
    #11584), so there we refuse bf16 instead of returning wrong numbers.
    """
    return DEVICE.type == "cuda" and torch.cuda.is_bf16_supported()


def default_dtype() -> torch.dtype:
    """bf16 on a GPU that has it, fp16 elsewhere (the interpreter included)."""
    return torch.bfloat16 if bf16_supported() else torch.float16


def supported_dtypes() -> tuple[torch.dtype, ...]:
    """dtypes the Triton kernel accepts on this machine."""
    if bf16_supported():
        return (torch.float16, torch.bfloat16, torch.float32)
    return (torch.float16, torch.float32)


@functools.lru_cache(maxsize=None)
def gpu_properties(index: int) -> tuple[int, int, int, str]:
    """(SMs, compute capability's major number, bytes of shared memory a block may use, name) of CUDA GPU
    ``index``, as torch and Triton's driver report them: asked once, not at every launch."""
    import triton  # imported here so that the environment above is set first

    props = torch.cuda.get_device_properties(index)
    shared = triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"]
    return props.multi_processor_count, props.major, shared, props.name


def on_gpu(device) -> tuple[int, int, int, str] | None:
    """:func:`gpu_properties` of ``device`` (a ``torch.device``; the current GPU when it has no index),
    or None where kernels run in the interpreter."""
    if INTERPRETER or device.type != "cuda":
        return None
    return gpu_properties(device.index if device.index is not None else torch.cuda.current_device())


def empty_output(shape, dtype, device) -> torch.Tensor:
    """A tensor for a kernel to write its output into.

    In the interpreter it starts as NaN, so an entry the kernel never writes (a stub's placeholder, a
    missing store) reads NaN, the same in every run, instead of whatever the memory held. On a GPU it
    is left uninitialised, as ``torch.empty`` leaves it: a fill would cost a pass over memory."""
    if INTERPRETER or torch.device(device).type != "cuda":
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


@dataclass(frozen=True)
class RuntimeInfo:
    device: str
    interpreter: bool
    default_dtype: str
    torch_version: str
    triton_version: str

    def __str__(self) -> str:
        where = "Triton interpreter on the CPU" if self.interpreter else "compiled Triton kernels"
        return (
            f"device: {self.device} | {where} | default dtype: {self.default_dtype} | "
            f"torch {self.torch_version} | triton {self.triton_version}"
        )


def info() -> RuntimeInfo:
    import triton  # imported here so that the environment above is set first

    if DEVICE.type == "cuda":
        device = f"cuda ({torch.cuda.get_device_name(0)})"
    else:
        device = "cpu"
    return RuntimeInfo(
        device=device,
        interpreter=INTERPRETER,
        default_dtype=str(default_dtype()).replace("torch.", ""),
        torch_version=torch.__version__,
        triton_version=triton.__version__,
    )


def describe() -> str:
    """One line a notebook can print: device, interpreter on/off, versions."""
    return str(info())
