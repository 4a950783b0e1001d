#!/usr/bin/env bash
# The GPU test suite, tests/gpu: both forward kernels against float64 (bf16, fp16, fp32; head_dim 64 to 256;
# ragged N; MHA, GQA, MQA; causal and not), strided inputs, every autotuner config of the fast forward,
# both backward kernels' gradients, and flash_decode (bf16, fp16, fp32; contiguous and paged; one split and
# several; 26 tests in 65 s, h200_gpu_tests_decode.log). Every case prints its error (pytest -s), so the log
# is the record.
#
#   bash bench/gpu_tests.sh [--out DIR] [--budget SECONDS] [-k EXPRESSION] [other pytest arguments]
#
# Writes gpu_tests.log (pytest's output, the slowest tests last) and environment.txt.
# Time on the H200: over 5 minutes in all. The forward float64 and stride tests alone took 5 min 46 s
# (24 tests, bench/record/h200_gpu_tests_forward.log); every fast config, the strides and the fast forward's
# layouts 3 min 50 s with one slow graded fp32 D256 case (15 tests, h200_gpu_tests_fast_configs.log);
# the backward tests and 9 graded float64 cases took 340 s (h200_gpu_tests_backward_and_graded_forward.log). Within
# 10-minute device calls, run it in parts with -k (pytest matches file and test names):
#   BUDGET=570 bash bench/gpu_tests.sh -k forward     # tests/gpu/test_gpu_forward.py
#   BUDGET=570 bash bench/gpu_tests.sh -k backward    # tests/gpu/test_gpu_backward.py
#   bash bench/gpu_tests.sh -k decode                 # tests/gpu/test_gpu_decode.py, about 1 minute
#   bash bench/gpu_tests.sh -k "every_fast_config or strides"    # about 2 minutes (the first: 84 s, 2026-12-04)
#   bash bench/gpu_tests.sh -k strides                             # 24 s (2026-12-03, this script)
# Needs a CUDA GPU, torch, triton, pytest and pytest-timeout; without a GPU every test is skipped.

set -uo pipefail
PARTS="tests"
source "$(dirname "$0")/common.sh" "$@"

only tests && step tests 600 "$PYTHON" -m pytest tests/gpu -q -s -rs -p no:cacheprovider --durations=15 \
    ${ARGS[@]+"${ARGS[@]}"}
finish
