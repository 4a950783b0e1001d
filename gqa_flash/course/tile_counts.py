"""Counting the kernels' work: the causal skip, graded by counting, not timing.

A kernel that walks every key block and lets the mask zero the rest gives the right answer with about
twice the work. Timing would show it only on a GPU, and noisily; counting shows it anywhere. Triton's
interpreter runs one program at a time and knows which, so :func:`score_tiles_per_program` (the forward),
:func:`windowed_score_tiles_per_program` (windows.py's forward, whose skip makes a window O(N W))
and :func:`backward_score_tiles_per_program` (dK/dV and dQ) count each program's score tiles, and
:func:`key_blocks_needed` and :func:`query_blocks_needed` say how many a causal walk needs. In PyTorch
(tiled.py), :class:`ScoreProducts` counts the matrix products that compute scores. The graded tests,
the notebook checks and the grader's executor all count with these.
"""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

from gqa_flash.course import interpreter, runtime
from gqa_flash.course.kernel_guard import kernel_only
from gqa_flash.course.testing import random_qkv


# --------------------------------------------------------------------------
# Counting the kernel's work: causal skipping, graded by counting, not timing
# --------------------------------------------------------------------------


def score_tiles_per_program(seq_len=100, head_dim=32, causal=True, batch=1, n_q_heads=2, n_kv_heads=1, seed=0):
    """Run the forward kernel once in Triton's interpreter; count its score tiles program by program.

    A score tile (:func:`_score_tiles_recorded`) is one [BLOCK_M, BLOCK_N] tile of Q K^T: one per key block a
    program visits (P @ V contracts BLOCK_N: choose a head dim whose padding differs from BLOCK_N). Returns
    ``({(query tile, batch * head): count}, config)`` with the kernel's INTERPRETER_CONFIG. The interpreter
    runs programs one at a time and knows which one is running; a GPU does not, so on a GPU machine this
    runs in a child process with the GPU hidden.
    """
    if not runtime.INTERPRETER:
        return interpreter.in_interpreter(f"{__name__}:score_tiles_per_program", seq_len=seq_len, head_dim=head_dim,
                                       causal=causal, batch=batch, n_q_heads=n_q_heads, n_kv_heads=n_kv_heads,
                                       seed=seed)
    import gqa_flash

    return _count_forward_tiles("forward", kernel_only(),  # the student's own kernel
                                lambda q, k, v: gqa_flash.flash_attention_forward(q, k, v, causal=causal),
                                batch, n_q_heads, n_kv_heads, seq_len, head_dim, seed)


def windowed_score_tiles_per_program(seq_len=96, head_dim=32, window=5, sink_tokens=0, batch=1, n_q_heads=2,
                                     n_kv_heads=1, seed=0):
    """:func:`score_tiles_per_program` for windows.py's kernel: ``gqa_flash.flash_attention_forward`` with a
    sliding ``window`` and ``sink_tokens``, run once in the interpreter under ``kernel_only`` held to windows.py's
    own work (forward.py's helpers included). Returns ``({"query tile,batch * head": count}, config)`` with
    windows.py's INTERPRETER_CONFIG; which key blocks a tile's rows see is the caller's to say
    (``gqa_flash.reference.visible``)."""
    kwargs = dict(seq_len=seq_len, head_dim=head_dim, window=window, sink_tokens=sink_tokens, batch=batch,
                  n_q_heads=n_q_heads, n_kv_heads=n_kv_heads, seed=seed)
    if not runtime.INTERPRETER:
        return interpreter.in_interpreter(f"{__name__}:windowed_score_tiles_per_program", **kwargs)
    import gqa_flash

    return _count_forward_tiles(
        "windows", kernel_only("flash_attention_forward", part="windows"),
        lambda q, k, v: gqa_flash.flash_attention_forward(q, k, v, window=window, sink_tokens=sink_tokens),
        batch, n_q_heads, n_kv_heads, seq_len, head_dim, seed)


def _count_forward_tiles(module, watch, run, batch, n_q_heads, n_kv_heads, seq_len, head_dim, seed):
    """The counting both forward counters share: fresh fp32 inputs on the CPU, ``run(q, k, v)`` under ``watch``
    (a ``kernel_only`` guard) with each score tile recorded against its program. ``module`` names the graded file
    whose INTERPRETER_CONFIG sets the tiles. Returns ``({"query tile,batch * head": count}, config)``."""
    from gqa_flash.course import impl

    config = impl.load(module).INTERPRETER_CONFIG
    q, k, v = random_qkv(batch=batch, n_q_heads=n_q_heads, n_kv_heads=n_kv_heads, seq_len=seq_len,
                         head_dim=head_dim, dtype=torch.float32, seed=seed, device="cpu")
    counts: dict = {}

    def record(builder):
        program = tuple(int(i) for i in builder.grid_idx[:2])
        counts[program] = counts.get(program, 0) + 1

    with _score_tiles_recorded(head_dim, config, record), watch:
        run(q, k, v)
    return {f"{t},{bh}": n for (t, bh), n in sorted(counts.items())}, config


@contextlib.contextmanager
def _score_tiles_recorded(head_dim, config, record):
    """While active, ``record(builder)`` for each ``tl.dot`` the interpreter runs that computes one score tile:
    a [BLOCK_M, BLOCK_N] result (either way round) whose inner dimension is ``head_dim`` padded as the kernels
    pad it (at least 16, a power of two); ``builder.grid_idx`` is the running program."""
    from triton.runtime.interpreter import InterpreterBuilder

    block_m, block_n = config["BLOCK_M"], config["BLOCK_N"]
    inner = max(16, 1 << (head_dim - 1).bit_length())
    original = InterpreterBuilder.create_dot

    def counting(builder, a, b, *args, **kwargs):
        (rows, a_inner), (b_inner, cols) = a.data.shape[-2:], b.data.shape[-2:]
        if a_inner == b_inner == inner and {rows, cols} == {block_m, block_n}:
            record(builder)
        return original(builder, a, b, *args, **kwargs)

    InterpreterBuilder.create_dot = counting
    try:
        yield
    finally:
        InterpreterBuilder.create_dot = original


def key_blocks_needed(q_tile, seq_len, block_m, block_n, causal=True):
    """How many key blocks query tile ``q_tile`` must visit: up to its diagonal under the causal mask."""
    kv_end = min((q_tile + 1) * block_m, seq_len) if causal else seq_len
    return -(-kv_end // block_n)


def score_elements_needed(batch, n_q_heads, seq_len, block_m, block_n, causal=True):
    """The scores a tile walk computes: each query tile's rows against the key blocks it needs
    (key_blocks_needed), the last of them counted whole (block_n keys, but none past seq_len)."""
    total = 0
    for q_tile in range(-(-seq_len // block_m)):
        rows = min(block_m, seq_len - q_tile * block_m)
        total += rows * min(key_blocks_needed(q_tile, seq_len, block_m, block_n, causal) * block_n, seq_len)
    return batch * n_q_heads * total


# --------------------------------------------------------------------------
# The backward's walks, counted the same way: dK/dV and dQ
# --------------------------------------------------------------------------

BACKWARD_KERNELS = {"backward_dkdv": "dkdv", "backward_dq": "dq"}
"""The backward kernels whose score tiles are counted (their names in backward.py) and their short names."""


def backward_score_tiles_per_program(seq_len=100, head_dim=64, causal=True, batch=1, n_q_heads=2, n_kv_heads=1,
                                     seed=0, guard=None):
    """Run the backward kernels once in Triton's interpreter; count the score tiles of each program.

    A score tile (:func:`_score_tiles_recorded`) is S = Q K^T or dP = dO V^T of one (query block, key block)
    pair, so two for each pair a program visits (in dK/dV, for each query head of the group). The products
    with P and dS contract BLOCK_M or BLOCK_N (the padded head dim must differ from both tiles).
    O and the LSE come from the float64 reference. Returns
    ``({"dkdv": {"key block,KV head,batch": count}, "dq": {"query block,query head,batch": count}}, config)``
    with backward.py's INTERPRETER_CONFIG. On a GPU machine this runs in a child process with the GPU hidden.
    The backward runs under ``guard()``, by default :class:`kernel_only` (the graded file's own kernels); a
    notebook check passes its own (own_work for the file it loaded). A child process takes the default.
    """
    kwargs = dict(seq_len=seq_len, head_dim=head_dim, causal=causal, batch=batch, n_q_heads=n_q_heads,
                  n_kv_heads=n_kv_heads, seed=seed)
    if not runtime.INTERPRETER:
        return interpreter.in_interpreter(f"{__name__}:backward_score_tiles_per_program", **kwargs)
    import gqa_flash
    from gqa_flash.course import impl
    from gqa_flash.reference import reference_attention
    from triton.runtime.interpreter import GridExecutor

    config = dict(impl.load("backward").INTERPRETER_CONFIG)
    inner = max(16, 1 << (head_dim - 1).bit_length())
    if inner in (config["BLOCK_M"], config["BLOCK_N"]):
        raise ValueError(f"head_dim {head_dim} pads to {inner}, a tile size of {config}: choose a head dim that "
                         "pads to neither BLOCK_M nor BLOCK_N, or the products with P and dS count as scores too")
    q, k, v = random_qkv(batch=batch, n_q_heads=n_q_heads, n_kv_heads=n_kv_heads, seq_len=seq_len,
                         head_dim=head_dim, dtype=torch.float32, seed=seed, device="cpu")
    o, lse = reference_attention(q, k, v, causal=causal)
    o, lse = o.to(torch.float32), lse.to(torch.float32)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1))
    counts: dict = {name: {} for name in BACKWARD_KERNELS.values()}
    running: list = []  # the kernel being interpreted (a launch runs its programs one at a time)
    original_launch = GridExecutor.__call__

    def launching(grid_executor, *args, **kw):
        running.append(BACKWARD_KERNELS.get(getattr(grid_executor.fn, "__name__", ""), None))
        try:
            return original_launch(grid_executor, *args, **kw)
        finally:
            running.pop()

    def record(builder):
        kernel = running[-1] if running else None
        if kernel:
            program = ",".join(str(int(i)) for i in builder.grid_idx)
            counts[kernel][program] = counts[kernel].get(program, 0) + 1

    GridExecutor.__call__ = launching
    try:
        with _score_tiles_recorded(head_dim, config, record), (
                guard() if guard is not None else kernel_only("flash_attention_backward", part="backward")):
            gqa_flash.flash_attention_backward(q, k, v, o, lse, do, causal=causal)
    finally:
        GridExecutor.__call__ = original_launch
    return counts, config


def query_blocks_needed(key_block, seq_len, block_m, block_n, causal=True):
    """How many query blocks key block ``key_block``'s dK/dV program must visit: under the causal mask, from the
    one that holds the key block's first key (its diagonal) to the end; without it, all of them."""
    first = key_block * block_n // block_m if causal else 0
    return -(-seq_len // block_m) - first


def backward_walk_problem(counts, config, seq_len, n_q_heads, n_kv_heads, parts=(2, 4)):
    """The first backward program that computes more score tiles than its causal walk needs, or None.

    ``counts`` and ``config`` are :func:`backward_score_tiles_per_program`'s, of a causal run. A program needs
    :func:`query_blocks_needed` query blocks (dK/dV) or :func:`key_blocks_needed` key blocks (dQ), each worth
    the tiles a block is worth to the program of the same head and batch that needs every block: key block
    0's (dK/dV), the last query block's (dQ). ``parts``: Part 2's walk (dK/dV), Part 4's (dQ), or both.
    Returns ``dict(part=2 or 4, kind="excess" or "none" (no score tile counted), where=..., fix=...)``, told
    in blocks: which the program visited, which it needs, which it should skip and where its loop must start
    (dK/dV) or stop (dQ).
    """
    bm, bn = config["BLOCK_M"], config["BLOCK_N"]
    n_m, n_n = -(-seq_len // bm), -(-seq_len // bn)
    for kernel, part, whole, full, tile in (("dkdv", 2, 0, n_m, "the K tile and the Q tile"),
                                            ("dq", 4, n_m - 1, n_n, "the Q tile and the K tile")):
        if part not in parts:
            continue
        programs = counts.get(kernel) or {}
        if not programs:
            return dict(part=part, kind="none", where=f"no score tile was seen in _backward_{kernel}",
                        fix=f"compute each block's scores with tl.dot of {tile} (inner dimension: the padded head dim)")
        for program, got in sorted(programs.items(), key=lambda item: [int(i) for i in item[0].split(",")]):
            block, head, batch = (int(i) for i in program.split(","))
            per_block = programs.get(f"{whole},{head},{batch}", 0) / full
            if per_block == 0:
                reference = "key block 0's program" if part == 2 else "the last query block's program"
                return dict(part=part, kind="none",
                            where=f"{reference} computed no score tile, though it must visit every block",
                            fix=f"compute each block's scores with tl.dot of {tile}")
            need = (query_blocks_needed if part == 2 else key_blocks_needed)(block, seq_len, bm, bn)
            if got > per_block * need + 1e-9:
                group = n_q_heads // n_kv_heads
                heads = (f"{'KV' if part == 2 else 'query'} head {head}, batch {batch}"
                         + f", {group} query heads a KV head" * (part == 2 and group > 1))
                words = _walk_words(part, block, got / per_block, need, seq_len, bm, bn, heads)
                return dict(part=part, kind="excess", **words)
    return None


def _span(kind, first, last, unit, lo, hi):
    """'query block 0 (rows 0-31)' or 'key blocks 2-6 (keys 32-99)'."""
    blocks = f"{kind} block {first}" if first == last else f"{kind} blocks {first}-{last}"
    return f"{blocks} ({unit} {lo}-{hi})"


def _walk_words(part, block, visited, need, seq_len, bm, bn, heads):
    """where and fix, in blocks, for a program of Part ``part`` that visited ``visited`` blocks and needs ``need``."""
    n_m, n_n = -(-seq_len // bm), -(-seq_len // bn)
    if part == 2:  # key block `block`: query blocks first..n_m-1 see its keys
        first, lo, hi = n_m - need, block * bn, min((block + 1) * bn, seq_len) - 1
        owner = f"key block {block}'s program (keys {lo}-{hi})"
        needed = _span("query", first, n_m - 1, "rows", first * bm, seq_len - 1)
        extra = _span("query", 0, first - 1, "rows", 0, first * bm - 1)
        many, total, walked = first > 1, n_m, "query blocks"
        why = f"each of {'their' if many else 'its'} rows comes before key {lo}, this key block's first key"
        fix = (f"start the loop over query blocks at query block {first} (row {first * bm}), the one that holds "
               f"this key block's first key (key {lo}), not at query block 0: the first key's index rounded down "
               "to a multiple of BLOCK_M. The loop still runs to SEQ_LEN")
    else:  # query block `block`: key blocks 0..need-1 hold the keys its rows see
        lo, hi = block * bm, min((block + 1) * bm, seq_len) - 1
        owner = f"query block {block}'s program (rows {lo}-{hi})"
        needed = _span("key", 0, need - 1, "keys", 0, min(need * bn, seq_len) - 1)
        extra = _span("key", need, n_n - 1, "keys", need * bn, seq_len - 1)
        many, total, walked = n_n - need > 1, n_n, "key blocks"
        why = f"each of {'their' if many else 'its'} keys comes after row {hi}, this query block's last row"
        fix = (f"end the loop over key blocks after key block {need - 1}, the one that holds this query block's "
               f"last row ({hi}): stop at key {min(need * bn, seq_len)}, (q_block_idx + 1) * BLOCK_M or SEQ_LEN "
               "if that comes first, not at SEQ_LEN")
    visits = (f"all {total} {walked} (0-{total - 1})" if abs(visited - total) < 1e-9
              else f"{visited:g} of the {total} {walked}")
    where = (f"{owner} visited {visits}, where it needs {need}: {needed}. It should skip {extra}, which "
             f"{'lie' if many else 'lies'} entirely above the diagonal ({why}, so the causal mask hides every "
             f"(query, key) pair in {'them' if many else 'it'}; {heads}; SEQ_LEN {seq_len}, BLOCK_M {bm}, "
             f"BLOCK_N {bn})")
    return dict(where=where, fix=fix)


# torch's matrix products, by name: the @ operator, torch.matmul and its relatives as
# functions and as Tensor methods, einsum, tensordot and F.linear.
_PRODUCTS = {"matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "addmm", "baddbmm", "einsum", "tensordot",
             "linear", "inner"}


class ScoreProducts(TorchFunctionMode):
    """While active, count the scores computed in PyTorch: every matrix product that contracts the head dim.

    A tile of scores, q_tile @ k_tile^T, takes two operands that carry the
    head dim and returns a result that does not; P @ V returns rows of the
    head dim, so it is not counted. (That needs a head dim that differs from
    every other size in the case: batch, heads, tile sizes and length.)
    ``products`` counts such products, ``elements`` sums their sizes. The
    graded tiled.py test and notebook 03's check both count with it.
    """

    def __init__(self, head_dim):
        super().__init__()
        self.head_dim, self.products, self.elements = head_dim, 0, 0
        self.largest = (0, 0)  # the most rows and the most keys of any score product: its tile

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if getattr(func, "__name__", "") in _PRODUCTS and isinstance(result, torch.Tensor):
            flat = [x for arg in (*args, *kwargs.values()) for x in (arg if isinstance(arg, (list, tuple)) else [arg])]
            with_head_dim = [x for x in flat if isinstance(x, torch.Tensor) and self.head_dim in x.shape]
            if len(with_head_dim) >= 2 and self.head_dim not in result.shape:
                self.products += 1
                self.elements += result.numel()
                rows, keys = result.shape[-2:] if result.dim() >= 2 else (1, result.shape[-1])
                self.largest = (max(self.largest[0], rows), max(self.largest[1], keys))
        return result
