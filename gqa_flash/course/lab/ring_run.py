"""Running a function on several CPU processes joined by torch.distributed (gloo): notebook 08 and the tests.

``run_on_cpu(fn, world_size, *args)`` starts ``world_size`` fresh Python
processes (``torch.multiprocessing``, spawn), joins them into one gloo
process group through a ``file://`` rendezvous in a folder of their own, and
calls ``fn(rank, world_size, *args)`` in each. It returns one
``(status, value)`` a rank: ``("ok", what fn returned)`` or ``("error",
message)``. A rank that hangs past the deadline is stopped and reported; no
rank can keep the caller waiting. ``fn`` must be importable by name (a
module's top-level function), as spawned processes find it so.
"""

from __future__ import annotations

import contextlib
import datetime
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

DEFAULT_TIMEOUT_S = 30  # the process group's timeout: how long a rank waits for a peer


def _worker(rank, world_size, folder, timeout_s, fn, args):
    import torch.distributed as dist

    result = Path(folder) / f"rank{rank}.pt"
    try:
        dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank,
                                world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
        try:
            value = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        torch.save(("ok", value), result)
    except BaseException as e:  # reported to the caller, never lost in a child's stderr
        torch.save(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"), result)


def run_on_cpu(fn, world_size, *args, timeout_s=DEFAULT_TIMEOUT_S, deadline_s=None):
    """``fn(rank, world_size, *args)`` on ``world_size`` gloo processes; a list of ``(status, value)``, rank order.

    ``timeout_s`` is the process group's (a rank waiting on a failed peer
    raises after it); ``deadline_s`` (default: twice that, plus a minute for
    starting Python and torch) bounds the whole run.
    """
    import torch.multiprocessing as mp

    deadline_s = 2 * timeout_s + 60 if deadline_s is None else deadline_s
    with tempfile.TemporaryDirectory(prefix="gqa_flash_ring_") as folder:
        context = mp.get_context("spawn")
        processes = [context.Process(target=_worker, args=(rank, world_size, folder, timeout_s, fn, args))
                     for rank in range(world_size)]
        with _main_without_a_phantom_file():
            for p in processes:
                p.start()
        stop = time.monotonic() + deadline_s
        for p in processes:
            p.join(max(0.0, stop - time.monotonic()))
        results = []
        for rank, p in enumerate(processes):
            if p.is_alive():
                p.kill()
                p.join()
                results.append(("error", f"rank {rank} was still running after {deadline_s} s and was stopped"))
                continue
            path = Path(folder) / f"rank{rank}.pt"
            if path.exists():
                results.append(torch.load(path, weights_only=False))
            else:
                results.append(("error", f"rank {rank} ended (exit code {p.exitcode}) without a result"))
        return results


@contextlib.contextmanager
def _main_without_a_phantom_file():
    """A spawned process re-runs the parent's ``__main__`` from its file. A script read from stdin (``python -``)
    or given with ``-c`` names a file that does not exist ('<stdin>'), and every rank died of it before its
    first line: hide such a name while the ranks start (the workers are this module's, and need no main)."""
    main = sys.modules.get("__main__")
    named = getattr(main, "__file__", None) if main is not None else None
    phantom = isinstance(named, str) and not Path(named).is_file()
    saved = main.__file__ if phantom else None
    if phantom:
        del main.__file__
    try:
        yield
    finally:
        if phantom:
            main.__file__ = saved


def values(results):
    """The ranks' values; a RuntimeError that quotes every rank's error if any rank failed."""
    errors = [f"rank {r}: {value}" for r, (status, value) in enumerate(results) if status != "ok"]
    if errors:
        raise RuntimeError("a rank failed:\n" + "\n".join(errors))
    return [value for _, value in results]


# --- Cases of the ring: inputs from a seed, outputs put back together -----------


def case_inputs(case):
    """The whole q, k, v of a case (a dict: seed, batch, hq, hkv, n, d, dtype), from its seed: the same on every
    rank and in the caller."""
    gen = torch.Generator().manual_seed(case["seed"])
    return tuple(torch.randn(case["batch"], h, case["n"], case["d"], generator=gen, dtype=case["dtype"])
                 for h in (case["hq"], case["hkv"], case["hkv"]))


def whole_outputs(results, cases):
    """For each case run by :func:`ring_cases` (every rank's result ok): ``(o, lse, ref_o, ref_lse)``, the O
    and LSE put back together from every rank's shards and the float64 reference's on the whole tensors."""
    from gqa_flash.course import context_parallel
    from gqa_flash.reference import reference_attention

    out = []
    for i, case in enumerate(cases):
        o = context_parallel.unshard_sequence([value[i][0] for _, value in results], case["layout"])
        lse = context_parallel.unshard_sequence([value[i][1][..., None] for _, value in results], case["layout"])
        out.append((o, lse[..., 0], *reference_attention(*case_inputs(case), causal=case["causal"])))
    return out


# --- Workers (top-level, so that spawned processes can find them) -------------


def ring_cases(rank, world_size, cases, own_work=False):
    """For each case (a dict: seed, batch, hq, hkv, n, d, causal, layout, dtype), build the whole q, k, v from
    the seed (the same on every rank), take this rank's shards and run ``gqa_flash.ring_attention``; returns
    the (O, LSE) shards. ``own_work``: under ``gqa_flash.course.integrity.own_work("ring")``, as the graded tests
    run it."""
    import contextlib

    import gqa_flash
    from gqa_flash.course import integrity

    out = []
    for case in cases:
        shards = [gqa_flash.shard_sequence(t, world_size, rank, case["layout"]) for t in case_inputs(case)]
        with integrity.own_work("ring", "ring_attention") if own_work else contextlib.nullcontext():
            out.append(gqa_flash.ring_attention(*shards, causal=case["causal"], layout=case["layout"],
                                                return_lse=True))
    return out


def ring_with_a_failed_rank(rank, world_size, failing_rank):
    """Rank ``failing_rank`` raises before the ring; the others call ``ring_attention`` and must not hang."""
    import torch.distributed as dist

    import gqa_flash

    dist.barrier()  # every rank has joined the group: the failure comes after, not during, the rendezvous
    if rank == failing_rank:
        raise RuntimeError(f"rank {rank} fails on purpose, before the ring")
    q = torch.randn(1, 2, 4 * world_size, 8)
    shard = gqa_flash.shard_sequence(q, world_size, rank)
    return gqa_flash.ring_attention(shard, shard, shard)
