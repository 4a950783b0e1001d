"""Checks that teach: run one graded piece, compare it with the float64 reference, say what is wrong.

The notebooks call one check after every exercise (``checks.check_naive()``,
``checks.check_block_state()``...). Each check

* reaches your code the way the course does (the public API, or
  ``impl.load(<module>)`` for the pieces the API does not expose), so
  ``GQA_FLASH_IMPL`` is honoured and a file you just saved is re-imported;
* runs it on a few small inputs built to isolate one idea (for instance every
  KV head holds different values, so reading the wrong head shows);
* compares with the float64 reference (``reference.py``), never with your own
  earlier code, and never raises, for a wrong answer or a crash: it prints a
  verdict.

A verdict is one line, ``PASS`` or ``FAIL``, the file and the part, then on a
failure a few indented lines: where the first wrong value is, and (when the
same failure is checked again, or on ``checks.explain()``) the most likely
cause and a hint. The likely cause comes from replaying the usual mistakes (``%``
for ``//``, a missing rescale, a mask off by one, ``exp`` for ``exp2``...) in
float64 and seeing which one your output matches.

One module per lesson:

    common.py         the Verdict, running your code safely, comparing tensors
    triton_errors.py  Triton's usual errors in words (two dtypes in tl.dot, a broadcast on the wrong axis,
                      Python's max/min/sum on blocks)
    cases.py          the inputs, and the GQA head mapping with its mistakes
    naive.py          notebook 01: naive.py
    softmax.py        notebook 02: online_softmax.py
    tiled.py          notebook 03: tiled.py
    primer.py         notebook 03b (practice, not graded): the Triton primer's eight puzzles, each check given
                      your kernel
    primer_launch.py  notebook 03b: launching your kernel, judging what it wrote (and, in puzzle 3, read)
    probes.py         notebooks 04, 04b and 07: tiny kernels that call one helper of forward.py, windows.py or
                      decode.py
    kernel_walk.py    notebook 04: forward.py Parts 1-3 (ids, tile loads, the key loop)
    kernel_parts.py   notebook 04: forward.py Parts 4-6 (update, mask, epilogue), each alone
    kernel.py         notebook 04: the whole kernel, and its error map
    windows.py        notebook 04b (bonus): windows.py's three parts, each alone, and the whole file through the
                      public API
    backward.py       notebook 06 (bonus): backward.py
    backward_walks.py notebook 06 (bonus): backward.py's walks (the rows each program walked, the causal skip
                      counted) and whether training can run yet
    decode_parts.py   notebook 07 (bonus): decode.py's four parts, each alone
    decode.py         notebook 07 (bonus): flash_decode whole, through the public API
    decode_replays.py notebook 07 (bonus): decode.py's Parts 3 and 4 in float64, and their usual mistakes
    traffic.py        notebook 05 (practice, not graded): traffic.py, launch order and an L2 model
    ring.py           notebook 08 (bonus): ring.py's three parts, and the ring on gloo processes

``python -m gqa_flash.course.lab.checks`` prints :func:`progress`: one line per check, or one per graded file
not started yet (still its stub, as the grader judges it), the bonus files (notebooks 04b, 06, 07 and 08) last.
"""

from gqa_flash.course import impl
from gqa_flash.course.lab.checks import backward, decode, decode_parts, kernel, kernel_parts, ring, windows
from gqa_flash.course.lab.checks.backward import check_backward, check_delta, check_dkdv, check_dq, check_gqa_sum
from gqa_flash.course.lab.checks.common import PARTS, Verdict, explain, rel, what_of
from gqa_flash.course.lab.checks.decode import check_decode
from gqa_flash.course.lab.checks.decode_parts import (
    check_decode_group_tile, check_decode_merge, check_decode_pages, check_decode_split,
)
from gqa_flash.course.lab.checks.kernel import (
    KERNEL_BUGS, ErrorMap, check_forward, forward_error_map, kernel_config, simulated_error_map, why_not_run_forward,
)
from gqa_flash.course.lab.checks.kernel_parts import check_epilogue, check_mask_scores, check_online_softmax_update
from gqa_flash.course.lab.checks.kernel_walk import check_key_loop, check_load_tile, check_program_ids
from gqa_flash.course.lab.checks.naive import check_naive
from gqa_flash.course.lab.checks.primer import (
    check_primer_cast, check_primer_dot, check_primer_masked, check_primer_maximum, check_primer_outer_sum,
    check_primer_program_ids, check_primer_softmax, check_primer_where,
)
from gqa_flash.course.lab.checks.ring import (
    check_block_pairs, check_merge_blocks, check_ring_attention, check_ring_source,
)
from gqa_flash.course.lab.checks.softmax import check_block_state, check_merge_states, check_online_softmax
from gqa_flash.course.lab.checks.tiled import check_tiled
from gqa_flash.course.lab.checks.traffic import check_launch_order, check_traffic_model
from gqa_flash.course.lab.checks.windows import (
    check_sink_state, check_window_key_loop, check_window_mask, check_windows,
)

# Every checked graded file, in course order: (module, its checks, the whole-file check that reuses their
# verdicts, or None).
_FILES = (
    ("naive", (check_naive,), None),
    ("online_softmax", (check_block_state, check_merge_states, check_online_softmax), None),
    ("tiled", (check_tiled,), None),
    ("forward", kernel_parts.PART_CHECKS, kernel.check_forward),
    ("windows", windows.PART_CHECKS, windows.check_windows),
    ("backward", backward.PART_CHECKS, backward.check_backward),
    ("decode", decode_parts.PART_CHECKS, decode.check_decode),
    ("ring", ring.PART_CHECKS, ring.check_ring_attention),
)
NOT_STARTED = "not started (still the stub you were given)"  # the grader's words for such a file, too
BONUS_HEADING = "bonus, notebooks 04b, 06, 07 and 08 (beyond the 100 points):"


def not_started() -> set[str]:
    """The graded files the checks run that are still, comments aside, the stub the course hands out (none
    where the stubs are unknown: a file is taken as started unless it surely is not)."""
    try:
        from gqa_flash.course.grader import started  # the grader's judgement, so that both say the same

        prints = started.stub_fingerprints()
    except Exception:  # a course without the grader's stub prints: every file counts as started
        return set()
    fresh = set()
    for module, _, _ in _FILES:
        try:
            text = impl.path_of(module).read_text()
        except (OSError, ValueError):
            continue
        if started.not_started(f"{module}.py", text, prints):
            fresh.add(module)
    return fresh


def verdicts() -> list[Verdict]:
    """Every check's verdict, in course order: the required ones, then the bonus (``verdict.bonus``).

    Each whole-file check (forward.py, windows.py, backward.py, decode.py, ring.py) comes after its parts and
    reuses their verdicts rather than running them twice. A file not started yet (still its stub) is one verdict, worded
    the same for every file, and its checks are not run.
    """
    fresh, out = not_started(), []
    for module, parts, whole in _FILES:
        if module in fresh:
            out.append(Verdict(False, what_of(module, (1, len(PARTS[module]))), NOT_STARTED,
                               hint=f"open {rel(module)} and start with Part 1"))
            continue
        part_verdicts = [check.verdict() for check in parts]
        out += part_verdicts + ([whole.verdict(part_verdicts)] if whole else [])
    return out


def progress() -> None:
    """One line per check (one per file not started yet), in course order: where you stand. The bonus comes
    last, under its own heading."""
    heading = False
    for verdict in verdicts():
        if verdict.bonus and not heading:
            print(BONUS_HEADING)
            heading = True
        print(verdict.headline())


__all__ = [
    "Verdict",
    "explain",
    "ErrorMap",
    "check_naive",
    "check_block_state",
    "check_merge_states",
    "check_online_softmax",
    "check_tiled",
    "check_primer_program_ids",
    "check_primer_outer_sum",
    "check_primer_masked",
    "check_primer_softmax",
    "check_primer_dot",
    "check_primer_where",
    "check_primer_maximum",
    "check_primer_cast",
    "check_program_ids",
    "check_load_tile",
    "check_key_loop",
    "check_online_softmax_update",
    "check_mask_scores",
    "check_epilogue",
    "check_forward",
    "why_not_run_forward",
    "check_window_mask",
    "check_window_key_loop",
    "check_sink_state",
    "check_windows",
    "check_delta",
    "check_dkdv",
    "check_gqa_sum",
    "check_dq",
    "check_backward",
    "check_decode_group_tile",
    "check_decode_pages",
    "check_decode_split",
    "check_decode_merge",
    "check_decode",
    "check_launch_order",
    "check_traffic_model",
    "check_ring_source",
    "check_block_pairs",
    "check_merge_blocks",
    "check_ring_attention",
    "forward_error_map",
    "simulated_error_map",
    "KERNEL_BUGS",
    "kernel_config",
    "progress",
    "verdicts",
    "not_started",
]
