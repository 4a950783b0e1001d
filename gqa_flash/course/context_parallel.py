"""Context parallelism's plumbing (given code, not graded): layouts, the ring's transfers, one block's attention.

Each rank of a process group holds a slice of the sequence: its *shard* of
Q, K and V, ``[B, H, N_local, D]``. The sequence is cut into equal chunks and
each rank holds one chunk or two, in a layout:

    contiguous   world_size chunks; rank r holds chunk r
    zigzag       2 * world_size chunks; rank r holds chunk r and chunk
                 2 * world_size - 1 - r (one from each end), in that order

Under the causal mask the contiguous layout is unbalanced: rank r's queries
see r + 1 chunks of keys, so the last rank works world_size times as long as
the first. Zigzag pairs an early chunk with a late one, and every rank sees
the same number of keys.

:class:`Ring` passes a rank's K and V on to the next rank (r to r + 1, the
last to 0) with ``torch.distributed.batch_isend_irecv``, on whatever backend
the group has (gloo on CPUs, NCCL on GPUs). :func:`block_attention` is the
attention of some query rows against one block of keys that the ring
brought, with its LSE: the course's fast kernel on a GPU, plain PyTorch on a
CPU (fast enough for the small checks there). ``ring.py`` is the loop that
uses them.
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.distributed as dist

LAYOUTS = ("contiguous", "zigzag")


def check_layout(layout) -> int:
    """The number of chunks a rank holds under ``layout``; a ValueError that names it if it is not one."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(repr(x) for x in LAYOUTS)}; got {layout!r}")
    return 1 if layout == "contiguous" else 2


def chunk_ids(rank: int, world_size: int, layout: str) -> tuple[int, ...]:
    """The global chunks that ``rank`` holds, in the order its shard holds them (see the module's docstring)."""
    if check_layout(layout) == 1:
        return (rank,)
    return (rank, 2 * world_size - 1 - rank)


def chunk_length(n: int, world_size: int, layout: str, what: str) -> int:
    """The length of one chunk of a sequence of ``n`` positions; a ValueError if ``n`` does not divide."""
    parts = world_size * check_layout(layout)
    if n % parts:
        raise ValueError(f"{what} must divide into {parts} equal chunks for layout={layout!r} on {world_size} "
                         f"rank(s) ({world_size} x {check_layout(layout)}); got {n} positions")
    return n // parts


def _check_world(world_size, rank=None) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, numbers.Integral)
                             or not 0 <= rank < world_size):
        raise ValueError(f"rank must be an integer from 0 to world_size - 1 = {world_size - 1}, got {rank!r}")


def _check_4d(name: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 4:
        raise ValueError(f"{name} must be 4-D [batch, heads, seq, head_dim]; got shape {list(x.shape)}")


def shard_sequence(x, world_size, rank, layout="zigzag"):
    """Rank ``rank``'s shard of ``x`` [B, H, N, D]: its chunks of the sequence (dim 2), in layout order."""
    _check_4d("x", x)
    _check_world(world_size, rank)
    c = chunk_length(x.shape[2], world_size, layout, "x's sequence (dim 2)")
    return torch.cat([x[:, :, i * c:(i + 1) * c] for i in chunk_ids(rank, world_size, layout)], dim=2)


def unshard_sequence(shards, layout="zigzag"):
    """The whole [B, H, N, D] tensor from every rank's shard, ``shards[r]`` being rank r's."""
    if isinstance(shards, torch.Tensor) or not hasattr(shards, "__len__") or len(shards) == 0:
        raise TypeError("shards must be a non-empty list of tensors, shards[r] being rank r's shard")
    for r, s in enumerate(shards):
        _check_4d(f"shards[{r}]", s)
        if s.shape != shards[0].shape:
            raise ValueError(f"every shard must have one shape; shards[0] is {list(shards[0].shape)}, "
                             f"shards[{r}] is {list(s.shape)}")
    world_size, per = len(shards), check_layout(layout)
    n_local = shards[0].shape[2]
    if n_local % per:
        raise ValueError(f"a shard of layout={layout!r} holds {per} equal chunks; got {n_local} positions a shard")
    c = n_local // per
    pieces = [None] * (world_size * per)
    for rank, s in enumerate(shards):
        for j, chunk in enumerate(chunk_ids(rank, world_size, layout)):
            pieces[chunk] = s[:, :, j * c:(j + 1) * c]
    return torch.cat(pieces, dim=2)


def check_ring_inputs(q, k, v, causal, layout, return_lse) -> None:
    """What ``ring_attention`` accepts: this rank's shards q [B, Hq, n, D], k and v [B, Hkv, n, D] of one
    dtype and device, Hq a multiple of Hkv, n a whole number of the layout's chunks."""
    from gqa_flash.course import validation

    for name, t in (("q", q), ("k", k), ("v", v)):
        validation.check_tensor(name, t, ndim=4)
    validation.check_bool("causal", causal)
    validation.check_bool("return_lse", return_lse)
    chunks = check_layout(layout)
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must share one dtype; got {q.dtype}, {k.dtype} and {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k and v must be on one device; got {q.device}, {k.device} and {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape; got {list(k.shape)} and {list(v.shape)}")
    (b, hq, n, d), (bk, hkv, nk, dk) = q.shape, k.shape
    if (b, n, d) != (bk, nk, dk):
        raise ValueError(f"q {list(q.shape)} and k {list(k.shape)} must share batch, shard length (dim 2) and "
                         "head_dim: a rank's shards of Q, K and V cover the same positions")
    if hkv < 1 or hq % hkv:
        raise ValueError(f"the query heads ({hq}, q {list(q.shape)}) must be a multiple of the key/value heads "
                         f"({hkv}, k {list(k.shape)})")
    if n % chunks:
        raise ValueError(f"a shard of layout={layout!r} holds {chunks} equal chunks; q's shard has {n} positions "
                         "(shard_sequence makes shards of the right length)")


class Ring:
    """The ring of a process group: rank r sends to r + 1 and receives from r - 1 (both modulo the size).

    ``start(tensors)`` posts the sends of ``tensors`` and the receives of
    the previous rank's, all at once, and returns at once: the transfer runs
    while this rank computes. ``wait(step)`` waits for the received tensors
    and returns them; a peer that failed, or never called, ends the wait
    after the group's timeout with an error that says which rank and step.
    """

    def __init__(self, group=None):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("ring_attention needs torch.distributed's default process group: call "
                               "torch.distributed.init_process_group first (gloo on CPUs, nccl on GPUs)")
        self.group = group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        peer = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
        self.next, self.prev = peer((self.rank + 1) % self.world_size), peer((self.rank - 1) % self.world_size)
        self._works, self._received = [], []

    def start(self, tensors, step: int):
        if tensors[0].is_cuda and dist.get_backend(self.group) == "gloo":
            raise RuntimeError("ring_attention: gloo cannot send CUDA tensors (its TCP transport reads host memory: "
                               "'writev ... Bad address'); use the nccl backend, one process per GPU, or CPU "
                               "tensors")
        self._received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group) for t in self._received]
        try:
            self._works = dist.batch_isend_irecv(ops)
        except RuntimeError as e:
            raise self._lost(step, e) from e

    def wait(self, step: int):
        try:
            for work in self._works:
                work.wait()
        except RuntimeError as e:
            raise self._lost(step, e) from e
        return self._received

    def _lost(self, step, error):
        return RuntimeError(
            f"ring_attention: rank {self.rank} of {self.world_size} got no K/V block from rank {self.prev} for step "
            f"{step}, or could not send its own to rank {self.next}: a rank failed, or never called ring_attention "
            f"(a wait lasts the process group's timeout at most). {type(error).__name__}: {error}")


def block_attention(q, k, v, causal: bool, sm_scale: float):
    """(O, LSE) of query rows ``q`` [B, Hq, n, D] against one block of keys ``k``, ``v`` [B, Hkv, n, D], in fp32.

    ``causal`` masks the block as the diagonal block of a causal attention
    (query i sees keys 0..i); otherwise every query sees every key. The
    course's fast kernel on a GPU; on a CPU, PyTorch (in fp32, or in float64
    for float64 inputs).
    """
    if q.is_cuda:  # the blocks are the ring's own, already checked: the kernel without the API's checks
        from gqa_flash import fast

        o, lse = fast.fast_attention_forward(q, k, v, causal=causal, sm_scale=sm_scale, return_lse=True)
        return o.float(), lse.float()
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    group = q.shape[1] // k.shape[1]
    k, v = (t.to(dtype).repeat_interleave(group, dim=1) for t in (k, v))
    s = q.to(dtype) @ k.transpose(-1, -2) * sm_scale
    if causal:
        n_q, n_k = s.shape[-2:]
        s = s.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).triu(1), -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    return torch.softmax(s, dim=-1) @ v, lse
