"""Notebook 06's checks name each classic backward.py bug of tests/mutants/backward.py.

Each mutant (solutions/backward.py with one bug put in) is loaded in place of the graded file; the check of
the part the bug is in must FAIL and give the cause written for that mistake, so that a student who makes it
reads what is wrong and where, then why, not only that something is. Walks whose bounds are computed in other
ways than the catalog's are named too; the causal skip is counted as the graded test counts it; and notebook 06
runs the whole file's check, and trains only once forward.py is done.
"""

import json
import sys
from pathlib import Path

import pytest
import torch

from gqa_flash.course import impl, layout, tile_counts
from gqa_flash.course.lab.checks import backward, backward_walks
from gqa_flash.course.lab import tiny_model
from gqa_flash.course.lab.checks.cases import LOG2E

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/, where mutants/ is
from mutants.catalog import MUTANTS, _m, serve  # noqa: E402


def _cause(part, bug, name):
    """The cause the check gives for ``bug`` in ``part``, found in ``name`` (dQ, dK or dV)."""
    return backward._mistake_text({m.bug: m.cause for m in backward._MISTAKES[part]}[bug], name, part)


# Each classic backward.py bug: the check that must catch it, and the cause it must give.
EXPECTED = {
    "backward_no_group_sum": ("check_gqa_sum", _cause(3, "group_first", "dV")),
    "backward_gqa_heads_interleaved": ("check_gqa_sum", _cause(3, "group_mod", "dV")),
    "backward_lse_natural_base": ("check_dkdv", _cause(2, "lse_base", "dV")),
    "backward_dq_no_log2e": ("check_dq", _cause(4, "qk_no_log2e", "dQ")),
    "backward_dq_no_causal_mask": ("check_dq", _cause(4, "no_mask", "dQ")),
    "backward_dkdv_no_causal_mask": ("check_dkdv", _cause(2, "no_mask", "dV")),
    "backward_dkdv_starts_late": ("check_dkdv", backward.DKDV_LATE),
    "backward_dkdv_walks_every_block": ("check_dkdv", backward_walks.SKIP_CAUSE[2]),
    "backward_dq_walks_every_block": ("check_dq", backward_walks.SKIP_CAUSE[4]),
    "backward_dq_stops_early": ("check_dq", backward.DQ_EARLY),
    "backward_dq_no_scale": ("check_dq", backward._factor_cause("dQ", 4.0, 0.25)[0]),
    "backward_dk_no_scale": ("check_dkdv", backward._factor_cause("dK", 4.0, 0.25)[0]),
    "backward_dk_qk_scale": ("check_dkdv", backward._factor_cause("dK", LOG2E, 0.25)[0]),
    "backward_dv_assigned": ("check_dkdv", _cause(2, "assign", "dV")),
    "backward_no_key_mask": ("check_dq", backward.NO_KEY_MASK),
    "backward_delta_zero": ("check_dkdv", _cause(2, "no_delta", "dK")),
    "backward_delta_fp16": ("check_delta", backward.DELTA_FP16),
}
BACKWARD_MUTANTS = [m for m in MUTANTS if m.file == "backward.py"]


def test_every_backward_mutant_has_its_expected_cause():
    assert {m.name for m in BACKWARD_MUTANTS} == set(EXPECTED), "a backward.py mutant was added or renamed: say " \
                                                                 "which check names it, with which cause"


def test_the_scale_causes_name_the_scale():
    # A gradient off by exactly one factor is a scale mistake, and the check says which (head dim 16: sm_scale 1/4).
    assert backward._factor_cause("dQ", 4.0, 0.25)[0] == backward.SCALE_MISSING.format(name="dQ", operand="Q")
    assert backward._factor_cause("dK", 0.25, 0.25)[0] == backward.SCALE_TWICE.format(name="dK", acc="dk")
    assert backward._factor_cause("dV", 0.25, 0.25)[0] == backward.SCALE_ON_DV
    assert backward._factor_cause("dK", 3.0, 0.25)[0] is None


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mutant", BACKWARD_MUTANTS, ids=lambda m: m.name)
def test_the_check_names_the_mistake(mutant, tmp_path, monkeypatch, capsys):
    serve(mutant.imported(tmp_path), "backward", monkeypatch)
    check_name, cause = EXPECTED[mutant.name]
    verdict = getattr(backward, check_name).verdict()
    printed = capsys.readouterr().out
    assert not verdict.ok, f"{check_name} passes {mutant.name} ({mutant.bug}): {printed}"
    assert verdict.cause == cause, f"{mutant.name} ({mutant.bug}): {check_name} gave {verdict}"
    # Step one says what is wrong and where, in words: no code, and not the cause.
    assert "tl." not in verdict.message + (verdict.where or "") and verdict.cause not in (verdict.where or "")


# --- walks whose bounds are none of the catalog's: found from the output, each program a window of rows --------

_START = "start_m = (n_block_idx * BLOCK_N // BLOCK_M) * BLOCK_M"
_END = "end_n = tl.minimum((q_block_idx + 1) * BLOCK_M, SEQ_LEN)"
WALKS = [  # (mutant, check, the cause's start, hint)
    (_m("dkdv_start_rounded_up", "backward.py", "the walk's first query block rounded up, not down",
        (_START, "start_m = tl.cdiv(n_block_idx * BLOCK_N, BLOCK_M) * BLOCK_M")),
     "check_dkdv", "the walk over queries starts late: key block 1 (keys 16-31", backward_walks.LATE_HINT),
    (_m("dkdv_start_next_key_block", "backward.py", "the walk starts at the query block of the next key block",
        (_START, "start_m = ((n_block_idx + 1) * BLOCK_N // BLOCK_M) * BLOCK_M")),
     "check_dkdv", "the walk over queries starts late: key block 1 (keys 16-31", backward_walks.LATE_HINT),
    (_m("dq_starts_at_block_1", "backward.py", "the walk over key blocks starts at the second",
        ("for n0 in range(0, end_n, BLOCK_N):", "for n0 in range(BLOCK_N, end_n, BLOCK_N):")),
     "check_dq", "the walk over keys starts late: query block 0 (rows 0-31", backward_walks.DQ_START_HINT),
    (_m("dq_ends_one_key_block_in", "backward.py", "the walk over key blocks ends one key block into the query block",
        (_END, "end_n = tl.minimum(q_block_idx * BLOCK_M + BLOCK_N, SEQ_LEN)")),
     "check_dq", "the walk over keys stops early: query block 0 (rows 0-31", backward_walks.DQ_END_HINT),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mutant,check_name,cause,hint", WALKS, ids=[w[0].name for w in WALKS])
def test_a_walk_that_leaves_out_rows_is_named(mutant, check_name, cause, hint, tmp_path, monkeypatch):
    # Once "none of the usual mistakes": a bound computed another way than the replayed mistakes compute it.
    serve(mutant.imported(tmp_path), "backward", monkeypatch)
    verdict = getattr(backward, check_name).verdict()
    assert not verdict.ok and (verdict.cause or "").startswith(cause) and verdict.hint == hint, verdict


# --- the causal skip, counted --------------------------------------------------------------------------------

CONFIG = {"BLOCK_M": 32, "BLOCK_N": 16}


def _counts(dkdv_start, dq_end, n=100, per_block=2):
    """The score tiles of one head whose walks start (dK/dV) and end (dQ) where these functions say."""
    n_m, n_n = -(-n // 32), -(-n // 16)
    return {"dkdv": {f"{j},0,0": per_block * (n_m - dkdv_start(j)) for j in range(n_n)},
            "dq": {f"{t},0,0": per_block * dq_end(t) for t in range(n_m)}}


def test_the_walk_problem_counts_the_blocks_past_the_diagonal():
    right = _counts(lambda j: j * 16 // 32, lambda t: tile_counts.key_blocks_needed(t, 100, 32, 16))
    assert tile_counts.backward_walk_problem(right, CONFIG, 100, 1, 1) is None
    # Tiles a block do not matter (three products, or S alone): the program that sees every block says how many.
    assert tile_counts.backward_walk_problem(_counts(lambda j: j * 16 // 32, lambda t: min(2 * t + 2, 7), per_block=3),
                                         CONFIG, 100, 1, 1) is None
    every = _counts(lambda j: 0, lambda t: 7)
    problem = tile_counts.backward_walk_problem(every, CONFIG, 100, 1, 1)
    # The graded test's message, told in blocks as notebook 06's check tells it. It said "computed 8 score
    # tiles where its causal walk computes 6: query blocks 1-3 (rows 32 on), at 2 a block as key block 0's
    # program computes them".
    assert problem["part"] == 2 and problem["kind"] == "excess" and problem["where"].startswith(
        "key block 2's program (keys 32-47) visited all 4 query blocks (0-3), where it needs 3"), problem
    assert "score tile" not in problem["where"] + problem["fix"], problem
    problem = tile_counts.backward_walk_problem(every, CONFIG, 100, 1, 1, parts=(4,))
    assert problem["part"] == 4 and problem["where"].startswith(
        "query block 0's program (rows 0-31) visited all 7 key blocks (0-6), where it needs 2"), problem
    grouped = {k: {f"{b},{h},0": n for b, n in ((int(p.split(",")[0]), n) for p, n in v.items()) for h in (0, 1)}
               for k, v in every.items()}
    assert "query head 0, batch 0; SEQ_LEN 100" in tile_counts.backward_walk_problem(grouped, CONFIG, 100, 4, 2,
                                                                                    parts=(4,))["where"]
    assert "KV head 0, batch 0, 2 query heads a KV head; SEQ_LEN 100" in tile_counts.backward_walk_problem(
        grouped, CONFIG, 100, 4, 2)["where"]
    assert tile_counts.backward_walk_problem({"dkdv": {}, "dq": {}}, CONFIG, 100, 1, 1)["kind"] == "none"


@pytest.mark.parametrize("part,where,hint", [
    (2, "key block 2's program (keys 32-47) visited all 4 query blocks (0-3), where it needs 3: query blocks 1-3 "
        "(rows 32-99). It should skip query block 0 (rows 0-31), which lies entirely above the diagonal",
     "start the loop over query blocks at query block 1 (row 32), the one that holds this key block's first key"),
    (4, "query block 0's program (rows 0-31) visited all 7 key blocks (0-6), where it needs 2: key blocks 0-1 "
        "(keys 0-31). It should skip key blocks 2-6 (keys 32-99), which lie entirely above the diagonal",
     "end the loop over key blocks after key block 1, the one that holds this query block's last row (31): stop "
     "at key 32"),
])
def test_a_walk_over_every_block_is_told_in_blocks(part, where, hint, monkeypatch):
    # It said "computed 8 score tiles where its causal walk computes 6: query blocks 1-3 (rows 32 on), at 2 a block
    # as key block 0's program computes them": counted the same way, told as blocks visited and blocks needed.
    every = _counts(lambda j: 0, lambda t: 7)
    monkeypatch.setattr(tile_counts, "backward_score_tiles_per_program", lambda **kw: (every, CONFIG))
    verdict = backward_walks.skip_verdict(part)
    assert not verdict.ok and verdict.what.startswith(f"backward.py Part {part}"), verdict
    assert verdict.where.startswith(where) and verdict.hint.startswith(hint), verdict
    assert "score tile" not in verdict.where + verdict.hint and "tl." not in verdict.where, verdict


@pytest.mark.timeout(300)
def test_the_solutions_skip_and_a_walk_over_every_block_does_not():
    counts, config = tile_counts.backward_score_tiles_per_program(seq_len=70, head_dim=40, n_q_heads=4, n_kv_heads=2)
    assert tile_counts.backward_walk_problem(counts, config, 70, 4, 2) is None, counts
    assert len(counts["dkdv"]) == 5 * 2 and len(counts["dq"]) == 3 * 4, counts  # every program of both kernels
    assert counts["dkdv"]["0,1,0"] == 2 * 2 * 3  # S and dP, two query heads, all three query blocks


# --- notebook 06: the whole file's check, and training once the forward is done -------------------------------

NOTEBOOK = layout.COURSE_DIR / "notebooks" / "06_backward_and_training.ipynb"


def _code_cells():
    return ["".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"]


def test_notebook_06_runs_the_whole_files_check_after_the_parts_and_before_training():
    cells = _code_cells()
    at = {name: next(i for i, c in enumerate(cells) if name in c)
          for name in ("checks.check_dq()", "checks.check_backward()", "tiny_model.train(")}
    assert at["checks.check_dq()"] < at["checks.check_backward()"] < at["tiny_model.train("], at
    assert "NBVAL_CHECK_OUTPUT" in cells[at["checks.check_backward()"]]


@pytest.mark.timeout(300)
def test_a_probability_tile_left_in_fp32_passes_the_parts_and_fails_the_whole_files_check(tmp_path, monkeypatch):
    # The parts' cases are fp32: only check_backward's fp16 case (as the graded tests' fp16 cases) shows it.
    mutant = _m("dv_probabilities_fp32", "backward.py", "P^T dO with P left in fp32",
                ("dv += tl.dot(pT.to(do.dtype), do", "dv += tl.dot(pT, do"))
    serve(mutant.imported(tmp_path), "backward", monkeypatch)
    assert backward.check_dkdv.verdict().ok
    verdict = backward.check_backward.verdict()
    assert not verdict.ok and verdict.what.startswith("backward.py Part 2") and "two dtypes" in verdict.message, verdict


def test_notebook_06_trains_only_once_the_forward_is_done_and_says_how_long_it_takes():
    cells = _code_cells()
    train = next(c for c in cells if "tiny_model.train(" in c)
    assert train.index("why_not_train()") < train.index("tiny_model.train("), train
    # The text's CPU run is the code's.
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    text = " ".join(" ".join("".join(c["source"]).split()) for c in cells if c["cell_type"] == "markdown")
    assert "steps=300 if on_gpu else 10, batch=64 if on_gpu else 2" in train
    assert "10 steps of 2 sequences, about 5 s of one CPU core" in text


def test_the_stub_forward_stops_training_with_a_reason_that_names_it(monkeypatch, capsys):
    serve(impl.load("forward", "student"), "forward", monkeypatch)
    reason = backward_walks.why_not_train()
    assert reason is not None and reason.startswith("forward.py is not done yet, and every training step calls it "
                                                    "first"), reason
    assert "backward" not in reason


@pytest.mark.timeout(300)
def test_a_forward_right_on_one_block_only_stops_training_too(monkeypatch, tmp_path):
    # The tiny model's 12 tokens fit in one key block, so a forward that never rescales acc let training run
    # and the loss curves agree, with forward.py not done. The gate now runs a case of several blocks too.
    mutant = next(m for m in MUTANTS if m.name == "forward_no_acc_rescale")
    serve(mutant.imported(tmp_path), "forward", monkeypatch)
    reason = backward_walks.why_not_train()
    assert reason is not None and "on several query and key blocks" in reason, reason
    assert "[B, N, H, D] layout, its output does not match" in reason, reason  # it ran on: "layout its output"
    assert "checks.check_forward()" in reason and "backward" not in reason.split("(the forward pass)")[1], reason


def test_the_training_verdict_blames_the_backward_only_once_the_forward_is_right():
    assert backward_walks.training_verdict([2.0, 1.5], [2.0, 1.5]).startswith("PASS")
    verdict = backward_walks.training_verdict([2.0, 1.5], [2.0, 1.7])
    assert verdict.startswith("FAIL") and "checks.check_backward()" in verdict


def test_the_tiny_model_trains_on_one_cpu_thread_and_gives_the_rest_back():
    # Its ops are a few thousand numbers: on every core (torch's default), 100 steps took 13.7-16.4 s of CPU time on
    # two busy cores against 1.6-2.6 s on one, and notebook 07's "a few seconds" were 15-61 s on laptops.
    before = torch.get_num_threads()
    seen = []

    def attention(q, k, v):
        seen.append(torch.get_num_threads())
        return tiny_model.sdpa_attention(q, k, v)

    losses = tiny_model.train(attention, steps=1, batch=2, digits=3, cfg=tiny_model.Config(dim=16, layers=1))
    assert seen == [1] and len(losses) == 1 and torch.get_num_threads() == before
    with tiny_model.one_cpu_thread("meta"):  # not the CPU: left alone
        assert torch.get_num_threads() == before


def test_d_without_its_row_sum_is_named(tmp_path, monkeypatch):
    # A student's trial: D = o * do with no tl.sum raised "ValueError: Expected pointer argument to have shape
    # [32, 32] but got [32]" at the given store, and the check's second run said "none known".
    mutant = _m("delta_unsummed", "backward.py", "D = O * dO, never summed over the head dim",
                ("delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)",
                 "delta = o.to(tl.float32) * do.to(tl.float32)"))
    serve(mutant.imported(tmp_path), "backward", monkeypatch)
    verdict = backward.check_delta.verdict()
    assert not verdict.ok and verdict.message.startswith("the block stored has shape ["), verdict
    assert "a sum over that axis (tl.sum(x, 1)) is missing" in verdict.cause, verdict
