"""Every load and store of an interpreted kernel, checked against the tensors it was given.

On a GPU a load from a wrong address either faults or returns whatever lies
there. Triton's interpreter is worse for a student: it reads any address it is
handed, and one far enough off kills the whole Python process with a
segmentation fault, taking the notebook kernel or the test run (and its points
table) with it.

``with checked_addresses(): ...`` makes every launch inside (in the
interpreter; on a GPU it does nothing) check each active lane of each
``tl.load``, ``tl.store`` and atomic before it runs: the address must lie
inside one of the tensors passed to that launch (the view's own elements'
span, not merely its storage). A lane outside raises :class:`AddressViolation`,
whose message starts with ``address check:`` and says which kernel, how many
lanes, the tensor the first one is nearest to and how far off it is, and the
line of the kernel that did it. Masked-off lanes may point anywhere: that is
what masks are for.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from gqa_flash.course import runtime

PREFIX = "address check: "


class AddressViolation(AssertionError):
    """An interpreted kernel loaded or stored outside every tensor it was given."""


def _span(t: torch.Tensor) -> tuple[int, int] | None:
    """[first byte, last byte + 1) of the elements of view t (None when it has none)."""
    if t.numel() == 0:
        return None
    size = t.element_size()
    low = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s < 0)
    high = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s > 0)
    return t.data_ptr() + low * size, t.data_ptr() + (high + 1) * size


class _Launch:
    """The tensors of one launch, by argument name, and their spans merged for fast lookup."""

    def __init__(self, name: str, arg_names, args, kwargs):
        self.name = name
        named = dict(zip(arg_names, args))
        named.update(kwargs)
        self.spans = []  # (start, end, argument name)
        for arg_name, value in named.items():
            for t in value if isinstance(value, (tuple, list)) else (value,):
                t = getattr(t, "base", t) if not isinstance(t, torch.Tensor) else t  # a host TensorDescriptor's
                if isinstance(t, torch.Tensor):
                    span = _span(t)
                    if span is not None:
                        self.spans.append((*span, arg_name))
        merged: list[list[int]] = []
        for start, end, _ in sorted(self.spans):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        self.starts = np.array([m[0] for m in merged], dtype=np.uint64)
        self.ends = np.array([m[1] for m in merged], dtype=np.uint64)

    def outside(self, addresses: np.ndarray, nbytes: int) -> np.ndarray:
        """The addresses whose nbytes do not lie inside one tensor."""
        if not len(self.starts):
            return addresses
        i = np.searchsorted(self.starts, addresses, side="right").astype(np.int64) - 1
        inside = (i >= 0) & (addresses + np.uint64(nbytes) <= self.ends[np.maximum(i, 0)])
        return addresses[~inside]

    def nearest(self, address: int, nbytes: int) -> str:
        """Where an address lies, in words: so many elements before or past the end of which tensor."""
        best = None
        for start, end, name in self.spans:
            gap = start - address if address < start else address + nbytes - end
            if best is None or gap < best[0]:
                best = (gap, name, address < start)
        if best is None:
            return "the launch was given no tensor"
        gap, name, before = best
        elements = max(1, -(-gap // nbytes))
        return f"{elements} element{'s' * (elements != 1)} {'before the start' if before else 'past the end'} of {name}"


def _kernel_line() -> str:
    """' (forward.py line 123)': the innermost line of kernel code (not Triton's, numpy's or ours) running now."""
    frame = sys._getframe(2)
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if "triton" not in path.parts and "numpy" not in path.parts and path.name != Path(__file__).name:
            return f" ({path.name} line {frame.f_lineno})"
        frame = frame.f_back
    return ""


class checked_addresses:
    """Context manager: interpreted launches inside check every address they touch (a no-op on a GPU)."""

    def __init__(self):
        self._saved: list = []
        self._launches: list[_Launch] = []

    def _check(self, what: str, ptrs, mask) -> None:
        if not self._launches:
            return
        launch = self._launches[-1]
        addresses = np.asarray(ptrs.data, dtype=np.uint64)
        if mask is not None:
            addresses = addresses[np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)]
        else:
            addresses = addresses.reshape(-1)
        if not addresses.size:
            return
        nbytes = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
        bad = launch.outside(addresses, nbytes)
        if bad.size:
            raise AddressViolation(
                f"{PREFIX}the kernel {launch.name} would {what} {bad.size} lane{'s' * (bad.size != 1)} outside every "
                f"tensor it was given{_kernel_line()}; the first is {launch.nearest(int(bad[0]), nbytes)}. On a GPU "
                "this reads or writes another tensor's memory, or faults: is a mask missing (rows or columns past "
                "the end), or a stride or offset wrong?")

    def _patch(self, cls, name, wrapper):
        original = cls.__dict__[name]
        self._saved.append((cls, name, original))
        setattr(cls, name, wrapper(original))

    def __enter__(self):
        if not runtime.INTERPRETER:
            return self
        from triton.runtime.interpreter import InterpretedFunction, InterpreterBuilder

        guard = self

        def launch(run):
            def checked(fn_self, *args, grid, warmup, **kwargs):
                if warmup:
                    return run(fn_self, *args, grid=grid, warmup=warmup, **kwargs)
                guard._launches.append(_Launch(fn_self.__name__, fn_self.arg_names, args, kwargs))
                try:
                    return run(fn_self, *args, grid=grid, warmup=warmup, **kwargs)
                finally:
                    guard._launches.pop()
            return checked

        # Keywords pass through: a tensor descriptor's load calls these with cache_policy= (an honest kernel that
        # uses TensorDescriptor or tl.make_tensor_descriptor must not fail on the check's own signature).
        def load(original):
            def checked(builder, ptrs, mask, other, *args, **kwargs):
                guard._check("load", ptrs, mask)
                return original(builder, ptrs, mask, other, *args, **kwargs)
            return checked

        def store(original):
            def checked(builder, ptrs, value, mask, *args, **kwargs):
                guard._check("store", ptrs, mask)
                return original(builder, ptrs, value, mask, *args, **kwargs)
            return checked

        def atomic_rmw(original):
            def checked(builder, op, ptrs, value, mask, *args):
                guard._check("update atomically", ptrs, mask)
                return original(builder, op, ptrs, value, mask, *args)
            return checked

        def atomic_cas(original):
            def checked(builder, ptrs, *args):
                guard._check("compare-and-swap", ptrs, None)
                return original(builder, ptrs, *args)
            return checked

        self._patch(InterpretedFunction, "run", launch)
        self._patch(InterpreterBuilder, "create_masked_load", load)
        self._patch(InterpreterBuilder, "create_masked_store", store)
        self._patch(InterpreterBuilder, "create_atomic_rmw", atomic_rmw)
        self._patch(InterpreterBuilder, "create_atomic_cas", atomic_cas)
        return self

    def __exit__(self, exc_type, exc, tb):
        for cls, name, original in reversed(self._saved):
            setattr(cls, name, original)
        self._saved.clear()
        from gqa_flash.course.integrity import unwrap

        found = unwrap(exc)
        if found is not None and found is not exc:
            raise found from None  # the interpreter wraps what a kernel raised: give the student ours
        return False
