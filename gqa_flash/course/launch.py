"""Launching a Triton kernel again with less of the host's time (given code, not graded).

``kernel[grid](*args)`` does a lot of work on the host before the GPU sees
anything: it binds the arguments, works out how to specialise the kernel
(which integers are 1 or multiples of 16, which pointers are aligned), hashes
that into a cache key, looks the compiled kernel up and checks the globals it
used. Measured on an H100 host (bench/probe_decode_host.py), that is about 40
microseconds a launch, where the GPU needs 5 to read a 1k-token KV cache.
A decoding step launches two kernels per layer per token: the host, not the
GPU, would set the pace.

A :class:`Launch` fixes everything of one launch but its tensors (the grid,
the scalar arguments, the constexprs and options), lets Triton do its work
once, keeps the compiled kernel, and from then on goes straight to the
compiled kernel's launcher (``decode_launch`` plans its launches so, once per
signature of the inputs). A serving engine captures its step in a CUDA graph
instead, which removes the host altogether: see ``flash_decode(max_seqlen=...)``.

In Triton's interpreter (a CPU) and with a Triton whose compiled kernels do
not look as expected, it simply calls ``kernel[grid](*args, **meta)``.
"""

from __future__ import annotations

import torch

from gqa_flash.course import runtime

try:
    from triton import knobs
except ImportError:  # an older Triton: the ordinary launch only
    knobs = None

_direct_ok = knobs is not None  # False once this Triton's compiled kernels refuse a direct launch


def cdiv(a: int, b: int) -> int:
    """``triton.cdiv`` for host integers: in Triton 3.6 and later that one is a constexpr function, whose
    call costs microseconds of the host's time; a launcher computing its grid calls it a dozen times."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """``triton.next_power_of_2`` for host integers (see :func:`cdiv`): the least power of 2 >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _tail(kernel, compiled, n_args, meta):
    """The constexpr values a direct launch passes after the ``n_args`` leading arguments, or None
    where this compiled kernel cannot be launched directly (a parameter left to its default)."""
    names = getattr(kernel, "arg_names", None)
    if names is None or not all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata")):
        return None
    if not all(name in meta for name in names[n_args:]):
        return None  # a parameter left to its default: let Triton bind it
    return [meta[name] for name in names[n_args:]]


class Launch:
    """One launch of ``kernel`` whose grid, scalar arguments and options are fixed: only the tensors change.

    ``Launch(kernel, grid, scalars, meta)(*tensors)`` is ``kernel[grid](*tensors, *scalars, **meta)``,
    where the kernel's parameters are its tensors first, then ``scalars``, then ``meta`` (every constexpr
    by name, and the launch options). A *plan* (``decode_launch.DecodePlan``) builds these once for one
    signature of inputs; its key holds the tensors' dtypes and alignments, which is what Triton
    specialises a kernel on, so the compiled kernel of the first call serves every later one: a later
    call goes straight to the compiled kernel's launcher, with no binding and no cache lookup.

    Once that way has worked (``direct``), a pointer argument may also be given as a raw device
    address, an int (the compiled kernel's launcher takes those, as Triton's own does), which is
    how a plan hands over parts of one buffer without making a tensor of each.
    """

    def __init__(self, kernel, grid, scalars, meta):
        self.kernel, self.grid, self.scalars, self.meta = kernel, tuple(grid), tuple(scalars), dict(meta)
        self.hit = None  # what a direct launch needs, once the first call compiled the kernel
        self.direct = False  # True once a call went straight to the compiled kernel's launcher

    def __call__(self, *tensors):
        global _direct_ok
        if self.hit is not None:
            # Triton's own launch, with everything that does not change between calls looked up once
            compiled, run, grid, function, packed, tail = self.hit
            hooks = knobs.runtime
            enter = hooks.launch_enter_hook
            stream = torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())
            metadata = None if enter is None else compiled.launch_metadata(grid, stream, *tensors, *tail)
            try:
                run(grid[0], grid[1], grid[2], stream, function, packed, metadata, enter, hooks.launch_exit_hook,
                    *tensors, *tail)
                self.direct = True
                return
            except TypeError:  # the launcher takes other arguments in this Triton: the ordinary path from now on
                if self.direct:
                    raise  # it took them before: the arguments are wrong, not the launcher
                _direct_ok, self.hit = False, None
        compiled = self.kernel[self.grid](*tensors, *self.scalars, **self.meta)
        if self.hit is None and not runtime.INTERPRETER and _direct_ok:
            tail = _tail(self.kernel, compiled, len(tensors) + len(self.scalars), self.meta)
            if tail is not None:
                grid = self.grid + (1,) * (3 - len(self.grid))
                self.hit = (compiled, compiled.run, grid, compiled.function, compiled.packed_metadata,
                            (*self.scalars, *tail))
