#!/usr/bin/env bash
# The graded tests and the grader on a GPU, with the solutions: what a student with a GPU runs
# (make test-graded) and what an instructor's grader does with a submission (the judge apart,
# the student's code in its executor, under bubblewrap where bwrap is on PATH).
#
#   bash bench/grader_on_gpu.sh [--out DIR] [--budget SECONDS] [--only graded,grader]
#
# Writes grader_on_gpu.log (both steps' output, pytest's slowest tests last) and results.json (the
# grader's, for Gradescope). Needs a CUDA GPU, torch, triton, pytest and pytest-timeout.

set -uo pipefail
PARTS="graded grader"
source "$(dirname "$0")/common.sh" "$@"

only graded && step graded 420 "$PYTHON" -m pytest tests/graded -q -p no:cacheprovider --durations=15 \
    ${ARGS[@]+"${ARGS[@]}"}
only grader && step grader 420 "$PYTHON" -m gqa_flash.course.grader solutions --out "$OUT/results.json"
finish
