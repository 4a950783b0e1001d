#!/usr/bin/env bash
# The forward pass on a GPU: the course's kernels against PyTorch's attention, peak memory, and the
# roofline's two ceilings (python -m gqa_flash.course.lab.bench; bench/RESULTS.md says what the H200 gave).
#
#   bash bench/forward_sweep.sh [--out DIR] [--only PARTS] [--budget SECONDS]
#
# Parts, in the order they run, each with the file it writes [and the committed H200 file it made]:
#   ceilings  an 8192^3 bf16 matmul's TFLOP/s and a 1 GiB copy's TB/s
#             -> ceilings.csv [h200_ceilings.csv]
#   main      bf16, causal, GQA 32:8, head_dim 64 and 128, N = 1k..16k, every provider but naive
#             -> forward_main.csv [h200_forward_main.csv]
#   memory    peak memory of one call, the course kernels and naive, N = 1k..128k
#             -> memory.csv [h200_memory.csv]
#   extra     MHA, MQA, non-causal, fp16, head_dim 96 and 256, at N = 4k and 16k
#             -> forward_other_shapes.csv [h200_forward_other_shapes.csv]
# Also writes environment.txt and forward_sweep.log (common.sh). PROVIDERS overrides the main sweep's
# providers (default course_graded,course_fast,sdpa_default,sdpa_flash,sdpa_cudnn,flex); the extra
# sweep times course_graded,course_fast,sdpa_default,sdpa_flash. The graded kernel is whatever
# GQA_FLASH_IMPL points to (common.sh: solutions where solutions/ exists).
#
# The timed parts check every provider, then time them in interleaved rounds (python -m
# gqa_flash.course.lab.bench --rounds, default 5) and record the autotuners' picks (the tiles column).
# Time on the H200, measured with this script on 2026-12-03 (before the rounds): ceilings 5 s, main
# 2 min (118 s; with the rounds 114 s on 2026-12-04, h200_forward_main_interleaved.csv), memory
# 1.5 min (83 s, up to 128k); extra was not timed with it, and fitted in a 240 s step when it made the
# committed file. All four: about 7.5 minutes, so one 10-minute device call holds them:
#   bash bench/forward_sweep.sh --budget 570
# Needs a CUDA GPU, torch and triton (pip install -e . or a machine that has them); on a machine
# without a GPU every part says so and writes nothing.

set -uo pipefail
PARTS="ceilings main memory extra"
source "$(dirname "$0")/common.sh" "$@"
BENCH=("$PYTHON" -m gqa_flash.course.lab.bench)

only ceilings && step ceilings 60 "${BENCH[@]}" --ceilings "$OUT/ceilings.csv"
only main && step main 240 "${BENCH[@]}" --sweep main \
    --providers "${PROVIDERS:-course_graded,course_fast,sdpa_default,sdpa_flash,sdpa_cudnn,flex}" \
    --out "$OUT/forward_main.csv"
only memory && step memory 150 "${BENCH[@]}" --sweep none --memory "$OUT/memory.csv"
only extra && step extra 330 "${BENCH[@]}" --sweep extra --providers course_graded,course_fast,sdpa_default,sdpa_flash \
    --out "$OUT/forward_other_shapes.csv"
finish
