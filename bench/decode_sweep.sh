#!/usr/bin/env bash
# Decoding on a GPU: flash_decode (decode.py, contiguous and paged caches) against SDPA, FlexAttention and
# the course's prefill kernel, as achieved K/V bandwidth (python -m gqa_flash.course.lab.bench_decode; notebook 07
# draws the committed file).
#
#   bash bench/decode_sweep.sh [--out DIR] [--budget SECONDS] [bench_decode's options...]
#
# Parts, each with the file it writes [and the committed H200 file it makes]:
#   decode    bf16, 32 query heads on 8 KV heads, head_dim 128, one new token; batch 1, 8, 64; context 1k, 8k,
#             32k, 128k; the read and copy ceilings first -> decode.csv [h200_decode.csv, topic decode_h200]
# Also writes environment.txt and decode_sweep.log (common.sh). Any other option goes to the Python module,
# for instance --batches 1 --contexts 1024,8192 for a short run, or --rounds 3. flash_decode is whatever
# GQA_FLASH_IMPL points to (common.sh: solutions where solutions/ exists).
#
# With a budget, the sweep itself is told to start no shape it cannot finish 30 s before the step's limit
# (its rows then say "skipped"), so the CSV is closed cleanly. Not yet timed on the H200 with this script;
# the prototype's timing loop over the same 12 shapes (SDPA and flash_decode only) took 72 s there, and
# FlexAttention compiles once per shape on top. One 10-minute device call:
#   bash bench/decode_sweep.sh --budget 570
# Needs a CUDA GPU, torch and triton; on a machine without a GPU the module refuses (exit 1) and writes nothing.

set -uo pipefail
PARTS="decode"
source "$(dirname "$0")/common.sh" "$@"
CAP=570
SWEEP_BUDGET=()
if [ -n "${BUDGET:-}" ]; then
    left=$((START + BUDGET - SECONDS))
    [ "$left" -lt "$CAP" ] && CAP=$left
    [ "$CAP" -gt 40 ] && SWEEP_BUDGET=(--budget $((CAP - 30)))
fi

only decode && step decode "$CAP" "$PYTHON" -m gqa_flash.course.lab.bench_decode --out "$OUT/decode.csv" \
    ${SWEEP_BUDGET[@]+"${SWEEP_BUDGET[@]}"} ${ARGS[@]+"${ARGS[@]}"}
finish
