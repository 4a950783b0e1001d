"""The executor: the one process that runs a student's graded code, and sends back only tensors.

``python -m gqa_flash.course.grader.executor`` is started by the judge
(:mod:`gqa_flash.course.grader.calls`), in a sandbox where the machine has one
(:mod:`gqa_flash.course.grader.isolation`), in a folder that holds the course's
package with the student's graded files and nothing else: no tests, no
completed files, no results. It reads requests on its standard input and
answers on its standard output, in :mod:`gqa_flash.course.grader.wire`'s format
(no pickle either way); whatever the student's code prints goes to standard
error. A request is one of

* ``call``: an entry point (``naive_attention``, ``ring.ring_source``...), its
  arguments, and what to watch while it runs (:func:`watching`): whose work it
  is (``gqa_flash.course.integrity.own_work``), kernels only
  (``gqa_flash.course.testing.kernel_only``), the score products counted, whole-row
  reductions refused;
* ``score_tiles``, ``probe`` and ``ring``: the course's own harnesses, run on
  the student's module (the causal-skip count of the forward's kernel or, with
  ``"kernel": "windows"``, the window's skip of windows.py's, or with
  ``"kernel": "backward"``, of the backward's two, notebook 04's probes of one
  helper, ring attention on gloo processes).

The reply is ``{"ok": True, "value": ..., "seen": {...}}`` or ``{"ok": False,
"error": {...}, "seen": {...}}``: the value dense (plain tensors, numbers,
tuples), the error as text with its kind. The judge decides everything from
there; nothing here awards a point or writes a record. Whatever the student's
code does to this process (patching the guards, exiting, crashing) it does to
this process alone.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import traceback
from pathlib import Path

ENTRIES = ("naive_attention", "online_softmax", "merge_softmax_states", "tiled_attention",
           "flash_attention_forward", "flash_attention_backward", "flash_decode", "ring_attention")
MODULE_ENTRIES = {"online_softmax": ("block_state",), "ring": ("ring_source", "block_pairs", "merge_blocks")}
PROBES = ("gqa_flash.course.lab.checks.kernel_walk:load_tile_masked_lanes_problem",
          "gqa_flash.course.lab.checks.kernel_walk:load_tile_offsets_problem",
          "gqa_flash.course.lab.checks.kernel_parts:epilogue_offsets_problem")
MESSAGE_CHARS = 2000


def entry(name: str):
    """The function a call names: a public entry point, or a graded module's own function ("ring.block_pairs")."""
    import gqa_flash
    from gqa_flash.course import impl

    module, _, function = name.rpartition(".")
    if not module and name in ENTRIES:
        return getattr(gqa_flash, name)
    if function in MODULE_ENTRIES.get(module, ()):
        return getattr(impl.load(module), function)
    raise ValueError(f"the executor runs no entry point {name!r}")


# Reductions, by ATen name: what online_softmax may not take over more than block_size columns at once.
REDUCTIONS = {"amax", "amin", "max", "min", "sum", "nansum", "mean", "prod", "logsumexp", "_softmax", "_log_softmax",
              "softmax", "log_softmax", "cumsum", "cumprod", "cummax", "cummin", "logcumsumexp", "norm",
              "linalg_vector_norm", "std", "var", "aminmax", "sort", "topk", "kthvalue", "median", "mode"}


# Reductions in disguise: ops that combine many values into one but are not named as reductions (a pool, a
# convolution with ones, a product with a column of ones, a scatter into one slot). online_softmax never needs
# one; on rows longer than its block each is refused outright. (Matched by the ATen name, or a part of it.)
DISGUISED = {"mm", "bmm", "matmul", "addmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "linear", "einsum",
             "tensordot", "_scaled_mm", "embedding_bag", "_embedding_bag", "index_add", "index_reduce",
             "segment_reduce", "histc", "histogram", "bincount", "trapz", "trapezoid", "bucketize", "searchsorted",
             "scatter_add", "scatter_reduce"}
DISGUISED_PARTS = ("pool", "conv", "fft", "loss", "entropy", "kl_div", "nll")


def _disguised(name: str, kwargs) -> bool:
    if name in DISGUISED or any(part in name for part in DISGUISED_PARTS):
        return True
    return name.startswith("index_put") and bool(kwargs.get("accumulate"))


def _reduced_dims(x, args, kwargs) -> list[int] | None:
    """The dimensions of x a reduction op reduces, as its ``dim`` argument names them (None: it names none, so
    all of them); out-of-range names dropped."""
    dims = kwargs.get("dim", args[1] if len(args) > 1 else None)
    if isinstance(dims, int):
        dims = [dims]
    if not isinstance(dims, (list, tuple)) or not dims:
        return None
    return [d for d in dims if isinstance(d, int) and -x.dim() <= d < x.dim()]


def _reduced(args, kwargs) -> int:
    """How many elements one result of a reduction op combines: the product of the sizes of the dimensions it
    reduces (all of them when it names none)."""
    import torch

    x = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if x is None or x.dim() == 0:
        return 1
    dims = _reduced_dims(x, args, kwargs)
    return x.numel() if dims is None else math.prod(x.shape[d] for d in dims)


def whole_rows_mode(n: int, block_size: int):
    """A dispatch mode (it sees every ATen op, however it was called: a method, a view, a reshape into blocks)
    that refuses any reduction combining more than block_size elements, when rows are n > block_size long."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class WholeRows(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func.overloadpacket.__name__
            reduced = _reduced(args, kwargs) if n > block_size and name in REDUCTIONS else 0
            if reduced > block_size:
                raise AssertionError(
                    f"online_softmax took {name} over {reduced} values at once (rows of {n} "
                    f"columns); it must read them block_size={block_size} columns at a time, keeping only the "
                    "running (m, l)")
            if n > block_size and _disguised(name, kwargs):
                raise AssertionError(
                    f"online_softmax ran {name}, which combines many values at once (a reduction in another "
                    f"name); it must read rows of {n} columns block_size={block_size} at a time with max, exp and "
                    "sum, keeping only the running (m, l)")
            return func(*args, **kwargs)

    return WholeRows()


class Largest:
    """A dispatch mode that keeps the most elements any floating-point result of an op held (every op, also
    those run by a broadcast multiply and a sum, which no matrix-product count sees), and the largest result of
    an elementwise op that broadcast its inputs into more numbers than each of them held: an outer product,
    scores computed without a matrix product (honest tile code broadcasts only into a tensor it already has)."""

    def __new__(cls, head_dim: int):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        class Mode(TorchDispatchMode):
            largest = 0
            broadcast = 0
            scores = [0, 0, 0, 0]  # reductions over the head dim (a multiply and a sum): n, elements, rows, keys

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                name = func.overloadpacket.__name__
                x = args[0] if args and isinstance(args[0], torch.Tensor) else None
                if name in REDUCTIONS and x is not None and x.dim() >= 2 and isinstance(out, torch.Tensor):
                    if any(x.shape[d] == head_dim for d in _reduced_dims(x, args, kwargs or {}) or ()):
                        rows, keys = tuple(out.shape[-2:]) if out.dim() >= 2 else (1, out.numel())
                        self.scores = [self.scores[0] + 1, self.scores[1] + out.numel(),
                                       max(self.scores[2], rows), max(self.scores[3], keys)]
                for t in out if isinstance(out, (tuple, list)) else (out,):
                    if isinstance(t, torch.Tensor) and t.is_floating_point():
                        self.largest = max(self.largest, t.numel())
                        if torch.Tag.pointwise in func.tags:
                            inputs = [a.numel() for a in args if isinstance(a, torch.Tensor)]
                            if len(inputs) >= 2 and t.numel() > max(inputs):
                                self.broadcast = max(self.broadcast, t.numel())
                return out

        return Mode()


@contextlib.contextmanager
def watching(watch: dict, seen: dict):
    """The guards a call runs under, outermost first; what they counted goes into ``seen`` as it ends."""
    from gqa_flash.course import integrity, testing, tile_counts

    launches = counted = largest = None
    with contextlib.ExitStack() as stack:
        if "kernel_only" in watch:  # kernel_only holds the part to its own work too
            what, part = watch["kernel_only"]
            launches = stack.enter_context(testing.kernel_only(str(what), part=part))
        elif "own_work" in watch:
            part, what = watch["own_work"]
            stack.enter_context(integrity.own_work(str(part), str(what)))
        if "score_products" in watch:
            counted = stack.enter_context(tile_counts.ScoreProducts(int(watch["score_products"])))
            largest = stack.enter_context(Largest(int(watch["score_products"])))
        if "whole_rows" in watch:
            stack.enter_context(whole_rows_mode(*(int(x) for x in watch["whole_rows"])))
        try:
            yield
        finally:
            if launches is not None:
                seen["launches"] = launches.count
            if counted is not None:
                seen.update(products=counted.products, elements=counted.elements, largest=list(counted.largest))
            if largest is not None:
                seen["largest_output"], seen["broadcast_output"] = largest.largest, largest.broadcast
                n, elements, rows, keys = largest.scores  # scores by a multiply and a sum count as products
                if n and counted is not None:
                    seen.update(products=seen["products"] + n, elements=seen["elements"] + elements,
                                largest=[max(seen["largest"][0], rows), max(seen["largest"][1], keys)])


def dense(value):
    """``value`` with every plain tensor made a contiguous CPU copy: run inside the watches, so that a result
    whose values are computed only when read is computed under them too."""
    import torch

    if type(value) is torch.Tensor:
        return value.detach().to("cpu").contiguous()
    if type(value) in (list, tuple):
        return type(value)(dense(v) for v in value)
    return value


def where(exc: BaseException) -> str | None:
    """Where a graded file raised it: "naive.py, line 40" (the deepest frame in one, through the exceptions it
    was raised from), or None."""
    from gqa_flash.course.grader.audit import is_students

    from gqa_flash.course.lab.checks.triton_errors import compile_error_line, exception_chain

    found = None
    for e in exception_chain(exc):  # outermost first (Triton's interpreter re-raises at the launch): the
        for frame in traceback.extract_tb(e.__traceback__):  # innermost exception's deepest graded frame wins
            if is_students(frame.filename) and not frame.filename.startswith("<"):
                found = e, Path(frame.filename), frame.lineno
    if found is None:
        return None
    e, path, line = found
    # A kernel that does not compile on a GPU raises at its launch: the line is the compiler's.
    return f"{path.name}, line {compile_error_line(path, e) or line}"


def error(exc: BaseException) -> dict:
    """What the judge is told of an exception: its kind, its type's name, its message, where."""
    from gqa_flash.course import integrity, testing

    found = integrity.unwrap(exc)
    if found is not None:
        kind = "integrity" if integrity.is_violation(found) else "address"
        return {"kind": kind, "type": "AssertionError", "message": str(found)[:MESSAGE_CHARS]}
    if isinstance(exc, testing.KernelOnlyViolation):
        return {"kind": "kernel_only", "type": "AssertionError", "message": str(exc)[:MESSAGE_CHARS]}
    reply = {"kind": "raised", "type": type(exc).__name__, "message": str(exc)[:MESSAGE_CHARS], "where": where(exc)}
    if isinstance(exc, SyntaxError):
        reply.update(file=Path(exc.filename or "?").name, line=exc.lineno or 0, text=str(exc.msg)[:300])
    return reply


def _interpreter_only(op: str) -> None:
    """The harnesses that count a kernel's work run it in Triton's interpreter: on a GPU machine the judge
    sends them to an executor with the GPU hidden (calls.Executor.in_interpreter), never to this one."""
    from gqa_flash.course import runtime

    if not runtime.INTERPRETER:
        raise RuntimeError(f"{op} runs only in an executor in Triton's interpreter (TRITON_INTERPRET=1)")


def handle(request: dict) -> dict:
    """One request's reply (never raises for the student's code: that is the reply's error)."""
    from gqa_flash.course.grader import audit

    op, seen = request.get("op"), {}
    try:
        if op == "call":
            with audit.graded_call(), watching(request.get("watch") or {}, seen):
                value = dense(entry(str(request["entry"]))(*request.get("args", ()), **request.get("kwargs", {})))
            return {"ok": True, "value": value, "seen": seen}
        if op == "score_tiles":  # the skip, counted: the forward's kernel, windows.py's, or the backward's two
            from gqa_flash.course import tile_counts

            kernel = request.get("kernel", "forward")
            if kernel not in ("forward", "windows", "backward"):
                raise ValueError(f"the executor counts the score tiles of no kernel {kernel!r}")
            _interpreter_only(op)
            with audit.graded_call():
                if kernel == "forward":
                    counts, config = tile_counts.score_tiles_per_program(**request["kwargs"])
                elif kernel == "windows":
                    counts, config = tile_counts.windowed_score_tiles_per_program(**request["kwargs"])
                else:  # under kernel_only, its default guard: the graded file's own kernels
                    counts, config = tile_counts.backward_score_tiles_per_program(
                        **{k: v for k, v in request["kwargs"].items() if k != "guard"})
            return {"ok": True, "value": [counts, dict(config)], "seen": seen}
        if op == "probe":
            from gqa_flash.course import interpreter

            if request["function"] not in PROBES:
                raise ValueError(f"the executor runs no probe {request['function']!r}")
            _interpreter_only(op)
            with audit.graded_call():
                return {"ok": True, "value": interpreter.in_interpreter(request["function"]), "seen": seen}
        if op == "ring":
            return {"ok": True, "value": ring(int(request["world_size"]), request["cases"]), "seen": seen}
        raise ValueError(f"the executor has no request {op!r}")
    except BaseException as exc:  # the student's code raised (or exited): the judge reads what and where
        return {"ok": False, "error": error(exc), "seen": seen}


def ring(world_size: int, cases: list) -> list:
    """ring_attention on ``world_size`` gloo processes (each one runs the student's ring.py under own_work):
    per rank, ["ok", [(O shard, LSE shard) per case]] or ["error", message]."""
    from gqa_flash.course.lab import ring_run

    results = ring_run.run_on_cpu(ring_run.ring_cases, world_size, cases, True, timeout_s=30)
    return [[status, dense(value) if status == "ok" else str(value)[:MESSAGE_CHARS]] for status, value in results]


def one_config_per_autotuner() -> None:
    """On a GPU a graded call checks what a kernel computes, not how fast it is: the autotuner's search (a
    compile and a benchmark of every candidate, for each new shape, ~25 s a forward test on an H100) buys
    nothing there. Each autotuner runs the first candidate its own pruning leaves, and, where that one does not
    fit the GPU (its shared memory or registers, as a search would have found), the next: a kernel whose
    search finds a candidate that fits is never failed for the first one's size."""
    from triton.compiler.errors import CompileTimeAssertionFailure
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.errors import OutOfResources, PTXASError

    pruned, run = Autotuner.prune_configs, Autotuner.run

    def one(self, *args, **kwargs):
        candidates = pruned(self, *args, **kwargs)
        self._grading_candidates = len(candidates)
        return candidates[min(getattr(self, "_grading_skip", 0), len(candidates) - 1):][:1]

    def first_that_fits(self, *args, **kwargs):
        self._grading_skip = 0
        while True:
            try:
                return run(self, *args, **kwargs)
            except (OutOfResources, PTXASError, CompileTimeAssertionFailure):
                failed = getattr(self, "best_config", None)
                if failed is None or self._grading_skip + 1 >= getattr(self, "_grading_candidates", 1):
                    raise
                # Forget the shapes that chose it, and take the next candidate.
                self.cache = {key: config for key, config in self.cache.items() if config is not failed}
                self._grading_skip += 1
            finally:
                self.nargs = None

    Autotuner.prune_configs, Autotuner.run = one, first_that_fits


def main() -> int:
    from gqa_flash.course.grader import wire

    # The replies get the real standard output; print() in the student's code goes to standard error.
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    import torch  # noqa: F401  (before any request: its import is no call's time)

    import gqa_flash  # noqa: F401
    from gqa_flash.course import integrity

    integrity.warm_up()
    from gqa_flash.course import runtime

    if not runtime.INTERPRETER:
        one_config_per_autotuner()
    from gqa_flash.course.grader import audit

    audit.install(Path.cwd())  # before any graded module is imported: no graded code runs without it
    wire.send(replies, {"ok": True, "ready": os.getpid()})
    while True:
        try:
            request = wire.recv(requests)
        except EOFError:
            return 0
        except Exception as e:  # arguments this machine cannot hold (a GPU tensor here, say): that call fails
            wire.send(replies, {"ok": False, "error": error(e)})
            continue
        reply = handle(request if isinstance(request, dict) else {})
        try:
            wire.send(replies, reply, dense=True)
        except wire.WireError as e:  # a value the wire cannot carry: the call fails, the executor goes on
            wire.send(replies, {"ok": False, "error": {"kind": "raised", "type": "TypeError",
                                                       "message": f"the result could not be sent back: {e}"}})


if __name__ == "__main__":
    sys.exit(main())
