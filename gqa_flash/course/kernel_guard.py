"""kernel_only: the code inside may compute only in Triton kernels, its own, at addresses it was given.

The graded kernel tests (forward, windows, backward, decode) run the student's entry point under it, in the executor
(gqa_flash.course.grader.executor): PyTorch's attention, softmax and matrix products are refused outright, and any
other PyTorch computation than allocating, viewing and copying tensors (every ATen op, through a dispatch
mode); Triton's own bookkeeping inside a launch is left alone, but the graded file's code run inside a launch
(a grid callable, an interpreted kernel body) is not. It also holds the graded module to its own work
(gqa_flash.course.integrity.own_work) and, in the interpreter, checks every address a kernel loads or stores
(gqa_flash.course.address_check).
"""

from __future__ import annotations

import sys

import torch

from gqa_flash.course.integrity import resolved_file


class KernelOnlyViolation(AssertionError):
    """The Triton kernel path computed attention with PyTorch instead."""


# What a kernel path must not call: attention done by PyTorch instead of Triton.
_FORBIDDEN = [
    (torch.nn.functional, "scaled_dot_product_attention"),
    (torch.nn.functional, "softmax"),
    (torch, "softmax"),
    (torch.Tensor, "softmax"),
    (torch, "matmul"),
    (torch.Tensor, "matmul"),
    (torch.Tensor, "__matmul__"),
    (torch.Tensor, "__rmatmul__"),
    (torch, "bmm"),
    (torch, "baddbmm"),
    (torch, "einsum"),
]


# Tensor operations a kernel's launcher may run itself: allocating outputs,
# views, copies. Anything else (a multiply, a sum, an exp) computed outside
# the Triton kernel is attention done by PyTorch.
_LAUNCHER_OPS = {
    "empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "zeros", "zeros_like",
    "full", "full_like", "zero_", "fill_", "copy_", "set_", "clone", "_to_copy", "to", "view", "_unsafe_view",
    "as_strided", "transpose", "t", "permute", "expand", "detach", "alias", "lift_fresh", "slice", "select",
    "unsqueeze", "squeeze", "contiguous", "reshape", "_reshape_alias", "resize_", "record_stream",
}


# The graded module behind each kernel entry point: kernel_only checks that module's own work.
PART_OF = {"flash_attention_forward": "forward", "flash_attention_backward": "backward", "flash_decode": "decode"}
_INFER = object()


class kernel_only:
    """Context manager: the code inside may compute only in Triton kernels, its own, at addresses it was given.

    ``with kernel_only() as launches: ...`` raises :class:`KernelOnlyViolation`
    as soon as the code inside calls a softmax or a matrix product of
    PyTorch's, or any other PyTorch computation than allocating, viewing and
    copying tensors (checked on every ATen op through a dispatch mode), and
    ``launches.count`` is the number of Triton kernel launches (compiled or
    interpreted) made inside. Inside a launch (Triton's own bookkeeping, the
    autotuner's timing) PyTorch is left alone.

    It also holds the graded module ``part`` (by default the one behind
    ``what``: forward, backward or decode) to its own work
    (:class:`gqa_flash.course.integrity.own_work`: PyTorch's attention, the course's
    kernels, reference and checks raise an ``integrity:`` violation), and in
    the interpreter checks every address a kernel loads or stores
    (:class:`gqa_flash.course.address_check.checked_addresses`), so that a wrong
    address fails the test instead of crashing the run. ``part=None``: no
    integrity check (a test's own probe kernel).
    """

    def __init__(self, what="flash_attention_forward", part=_INFER):
        self.what = what
        self.part = PART_OF.get(what) if part is _INFER else part
        self.count = 0
        self._saved = []
        self._inside_triton = 0
        self._launch_codes: set = set()  # the code of the launch wrappers: where the stack walk stops
        self._mode = None
        self._guards = []

    def _refuse(self, name):
        from gqa_flash.course import integrity

        if integrity.attention_op(name):
            graded = self._guards[0]._graded_frame(sys._getframe(1)) if self.part else None
            if self.part:
                raise self._guards[0]._violation(graded, f"called PyTorch's {name}")
            raise integrity.IntegrityViolation(f"{integrity.PREFIX}{self.what} called PyTorch's {name}")
        raise KernelOnlyViolation(
            f"{self.what} must compute attention in the Triton kernel, but it called {name}"
        )

    def _forbid(self, owner, name):
        def refuse(*args, **kwargs):
            self._refuse(f"{getattr(owner, '__name__', owner)}.{name}")

        return refuse

    def _student_inside_launch(self) -> bool:
        """Whether the running op was called by the graded file's own code inside a Triton launch (its grid
        callable, a launch hook, an interpreted kernel body), not by Triton's bookkeeping: those get no
        exemption. Walks the stack out to the launch."""
        graded = self._guards[0].files if self.part else None  # the graded file and those it builds on
        frame = sys._getframe(2)
        while graded is not None and frame is not None and frame.f_code not in self._launch_codes:
            name = frame.f_code.co_filename
            # The graded file, or code made from a string at run time (which no gate read)
            if resolved_file(name) in graded or (name.startswith("<") and not name.startswith("<frozen")):
                return True
            frame = frame.f_back
        return False

    def _counting(self, run):
        def counted(fn_self, *args, **kwargs):
            if not kwargs.get("warmup", False) and not self._inside_triton:
                self.count += 1
            self._inside_triton += 1
            try:
                return run(fn_self, *args, **kwargs)
            finally:
                self._inside_triton -= 1

        self._launch_codes.add(counted.__code__)
        return counted

    def _dispatch_mode(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        guard = self

        class OnlyLauncherOps(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func.overloadpacket.__name__
                if name not in _LAUNCHER_OPS and guard._inside_triton and guard._student_inside_launch():
                    # PyTorch computed by the student's code inside a launch (a grid callable, a hook, the body
                    # run as Python): never an honest kernel's, so whose work it is, not only where it ran

                    raise guard._guards[0]._violation(guard._guards[0]._graded_frame(sys._getframe(1)),
                                                      f"computed with PyTorch's aten.{name} inside a Triton launch")
                if name not in _LAUNCHER_OPS and not guard._inside_triton:
                    guard._refuse(f"torch op aten.{name}")
                return func(*args, **(kwargs or {}))

        return OnlyLauncherOps()

    def __enter__(self):
        from triton.runtime.autotuner import Autotuner
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction

        from gqa_flash.course.address_check import checked_addresses
        from gqa_flash.course.integrity import own_work

        self._guards = ([own_work(self.part, self.what)] if self.part else []) + [checked_addresses()]
        for guard in self._guards:
            guard.__enter__()
        for owner, name in _FORBIDDEN:
            self._saved.append((owner, name, owner.__dict__.get(name, getattr(owner, name))))
            setattr(owner, name, self._forbid(owner, name))
        for cls in (JITFunction, InterpretedFunction, Autotuner):
            self._saved.append((cls, "run", cls.__dict__["run"]))
            setattr(cls, "run", self._counting(cls.__dict__["run"]))  # the outermost run is the launch
        self._mode = self._dispatch_mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()
        found = None
        for guard in reversed(self._guards):  # each restores what it patched, then may take a violation back out
            try:
                guard.__exit__(*exc)
            except AssertionError as e:  # of Triton's wrapping: raised once all are restored
                found = found or e
        if found is not None:
            raise found from None
        return False
