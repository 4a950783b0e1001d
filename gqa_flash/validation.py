"""Input checks for the public API: bad input gets an error that names the argument.

Every public function runs these before it calls a graded module, so student
code only ever sees well-formed inputs, and a student who passes a wrong shape
reads what is wrong instead of a stack trace from deep inside Triton.
"""

from __future__ import annotations

import math
import numbers

import torch

from gqa_flash import runtime

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def _dtype(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def check_tensor(name: str, t, *, ndim: int | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        allowed = ", ".join(_dtype(d) for d in FLOAT_DTYPES)
        raise TypeError(f"{name} has dtype {_dtype(t.dtype)}; expected one of {allowed}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(
            f"{name} must be {ndim}-D [batch, heads, seq, head_dim]; got shape {_shape(t)}"
        )


def check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def check_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def resolve_sm_scale(sm_scale, head_dim: int) -> float:
    """``1/sqrt(head_dim)`` unless the caller gave a finite number."""
    if sm_scale is None:
        return 1.0 / math.sqrt(head_dim) if head_dim > 0 else 1.0
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
        raise TypeError(f"sm_scale must be a real number or None, got {type(sm_scale).__name__}")
    if not math.isfinite(float(sm_scale)):
        raise ValueError(f"sm_scale must be finite, got {sm_scale!r}")
    return float(sm_scale)


def check_attention_inputs(q, k, v, causal) -> None:
    """Shapes, dtypes and devices that every attention function accepts.

    Layout is PyTorch SDPA's: ``[batch, heads, seq, head_dim]``; ``k`` and ``v``
    have ``n_kv_heads`` heads, and ``n_q_heads`` must be a multiple of it.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, ndim=4)
    check_bool("causal", causal)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            "q, k and v must share one dtype; got "
            f"q {_dtype(q.dtype)}, k {_dtype(k.dtype)}, v {_dtype(v.dtype)}"
        )
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"q, k and v must be on one device; got q on {q.device}, k on {k.device}, v on {v.device}"
        )
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got k {_shape(k)} and v {_shape(v)}")
    (b, hq, n, d), (bk, hkv, nk, dk) = q.shape, k.shape
    if b != bk:
        raise ValueError(f"q and k must have the same batch size; got q {_shape(q)} and k {_shape(k)}")
    if n != nk:
        raise ValueError(
            "q and k must have the same sequence length (self-attention); "
            f"got q {_shape(q)} and k {_shape(k)}"
        )
    if d != dk:
        raise ValueError(f"q and k must have the same head_dim; got q {_shape(q)} and k {_shape(k)}")
    if hq < 1 or hkv < 1:
        raise ValueError(f"q and k need at least one head; got q {_shape(q)} and k {_shape(k)}")
    if hq % hkv != 0:
        raise ValueError(
            f"the number of query heads ({hq}, q {_shape(q)}) must be a multiple of the number "
            f"of key/value heads ({hkv}, k {_shape(k)})"
        )
    if d < 1:
        raise ValueError(f"head_dim must be at least 1; got q {_shape(q)}")


def check_kernel_inputs(q, k, v) -> None:
    """What the Triton kernel needs on top of :func:`check_attention_inputs`."""
    d = q.shape[-1]
    if d > MAX_HEAD_DIM:
        raise ValueError(
            f"the Triton kernel supports head_dim up to {MAX_HEAD_DIM}; got q {_shape(q)}"
        )
    b, hq = q.shape[0], q.shape[1]
    if b * hq > 65535:  # the launch grid's second axis: one program column per (batch, head)
        raise ValueError(
            f"batch * n_q_heads must be at most 65535 for one launch; got q {_shape(q)} "
            f"({b} * {hq} = {b * hq}); split the batch"
        )
    if runtime.DEVICE.type == "cuda":
        if q.device.type != "cuda":
            raise ValueError(
                f"q, k and v are on {q.device} but the kernels are compiled for the GPU; "
                "move them with .cuda() (or run with TRITON_INTERPRET=1 for the CPU interpreter)"
            )
    if q.dtype not in runtime.supported_dtypes():
        allowed = ", ".join(_dtype(d) for d in runtime.supported_dtypes())
        why = (
            " (Triton's interpreter multiplies the raw bits of bf16 in tl.dot, triton issue #11584)"
            if q.dtype == torch.bfloat16 and runtime.INTERPRETER
            else ""
        )
        raise TypeError(
            f"q, k and v have dtype {_dtype(q.dtype)}, which the Triton kernel does not support "
            f"here{why}; use one of {allowed}"
        )
