"""Notebook 07 (bonus): decode.py as a whole, through the public API.

:func:`check_decode` takes the verdicts of the four parts (decode_parts.py)
and then runs ``gqa_flash.flash_decode`` (the public API, so
``GQA_FLASH_IMPL`` is honoured) against ``gqa_flash.reference_decode`` on
four cases, one aimed at each part. While a part that makes addresses
(1 to 3) fails, flash_decode is not run: a wrong address can crash Python on
a CPU. (In the interpreter its loads and stores are checked against the
tensors it was given, too: gqa_flash.course.address_check.)
"""

import torch

from gqa_flash.course import api, testing
from gqa_flash.course.address_check import checked_addresses
from gqa_flash.course.lab.checks.common import (
    PARTS, Stop, Verdict, at, fail, load, prints_verdict, run_student, shape_problem, tol,
)
from gqa_flash.course.lab.checks.decode_parts import PART_CHECKS
from gqa_flash.reference import reference_decode


# --------------------------------------------------------------------------
# The whole of decode.py, through the public API
# --------------------------------------------------------------------------


def _decode_cases():
    """(name, the part it aims at, inputs, flash_decode's keywords)."""
    return [
        ("GQA 8:2, one new token, lengths 5 and 40, one split", 1,
         dict(n_q_heads=8, n_kv_heads=2, seqlens=(5, 40), seed=1), dict(num_splits=1)),
        ("a paged cache, pages of 8 shuffled in the pool, its table stored transposed, 2 new tokens, 3 splits", 2,
         dict(n_q_heads=4, n_kv_heads=2, n_new=2, seqlens=(9, 37), page_size=8, table_layout="transposed", seed=2),
         dict(num_splits=3)),
        ("the same contiguous inputs with 1 and with 3 splits", 3,
         dict(n_q_heads=8, n_kv_heads=2, n_new=2, seqlens=(17, 45), seed=3), dict(num_splits=(1, 3))),
        ("5 new tokens, fp16, sm_scale 0.3, 4 splits, with the LSE", 4,
         dict(n_q_heads=4, n_kv_heads=1, n_new=5, seqlens=(16, 45), dtype=torch.float16, seed=4),
         dict(num_splits=4, sm_scale=0.3, return_lse=True)),
    ]


def _run_decode(inputs, **kw):
    q, k, v, lengths, table = inputs
    # In the interpreter every load and store is checked against the launch's tensors: a wrong address
    # becomes a FAIL that says where, instead of a crash.
    def checked(*args, **kwargs):
        with checked_addresses():
            return api.flash_decode(*args, **kwargs)

    return run_student("decode", checked, q, k, v, lengths, block_table=table, part=3, **kw)


def _compare(result, inputs, sm_scale, return_lse):
    """None, or the testing.Mismatch of the first of O and the LSE that is wrong."""
    q, k, v, lengths, table = inputs
    ref, ref_lse = reference_decode(q, k, v, lengths, table, sm_scale=sm_scale)
    out, lse = result if return_lse else (result, None)
    shape = shape_problem(out, ref.shape) or (return_lse and shape_problem(lse, ref_lse.shape, "the LSE"))
    if shape:
        raise Stop(fail("decode", None, shape))
    problem = testing.mismatch("O", out, ref, labels=("batch", "query head", "new token", "column"), **tol(q.dtype))
    if problem is None and return_lse:
        problem = testing.mismatch("LSE", lse, ref_lse, labels=("batch", "query head", "new token"),
                                   **testing.LSE_TOLERANCE)
    return problem


_ADDRESS_PARTS = (1, 2, 3)  # they make the addresses the kernel reads: while one is wrong, it is not run


@prints_verdict
def check_decode(part_verdicts=None):
    """decode.py, the whole of it: the four parts, then flash_decode on four cases against the reference."""
    load("decode")
    if part_verdicts is None:
        part_verdicts = [check.verdict() for check in PART_CHECKS]
    by_part = dict(enumerate(part_verdicts, start=1))
    unsafe = next((by_part[p] for p in _ADDRESS_PARTS if not by_part[p].ok), None)
    if unsafe is not None:
        return fail("decode", None, f"not run yet: {unsafe.what} fails its own check above",
                    hint="flash_decode runs once Parts 1 to 3 pass: they make the addresses it reads, and a wrong "
                         "address can read outside the cache (on a CPU that can crash Python)")
    broken = next((v for v in part_verdicts if not v.ok), None)
    for name, part, case, kw in _decode_cases():
        inputs = testing.decode_inputs(**case)
        splits = kw.pop("num_splits")
        for n_splits in (splits if isinstance(splits, tuple) else (splits,)):
            result = _run_decode(inputs, num_splits=n_splits, **kw)
            problem = _compare(result, inputs, kw.get("sm_scale"), kw.get("return_lse", False))
            if problem is None:
                continue
            message = f"{problem.name} of flash_decode does not match the float64 reference"
            where = f"case \"{name}\", with {n_splits} split{'s' if n_splits > 1 else ''}: {at(problem)}"
            if broken is not None:
                return fail("decode", None, f"{message}, and {broken.what} fails its own check above",
                            where=where, cause=broken.cause, hint=broken.hint)
            if part == 3 and n_splits > 1:
                return fail("decode", None, message, where=f"{where} (right with 1 split)",
                            cause="right with one split, wrong with several: the chunks of the splits, or their "
                                  "merge, differ from what the parts' checks tried",
                            hint="look at how a split's chunk is cut (Part 3) and how the splits are merged (Part 4)")
            return fail("decode", None, message, where=where,
                        cause=f"the four parts pass their own checks, but not together: this case aims at Part "
                              f"{part} ({PARTS['decode'][part]})",
                        hint="look at what your helper assumes that the kernel's call does not give it")
    if broken is not None:
        return fail("decode", None, f"flash_decode is right on these cases, but {broken.what} fails its own check",
                    cause=broken.cause, hint=broken.hint)
    return Verdict(True, "decode.py", "flash_decode matches the float64 reference (O and LSE) in 4 cases: GQA "
                   "packing, a shuffled paged cache, 1 and 3 splits, 5 causal new tokens in fp16")
