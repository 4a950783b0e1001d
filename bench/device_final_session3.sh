#!/usr/bin/env bash
# Session 3's measurement call (under 10 minutes): the fast forward (now with two query sub-tiles)
# checked on the GPU at every autotuner config, then the main sweep with every provider (FlexAttention
# included), the extra sweep at N = 4k and 16k, and peak memory up to 128k tokens.
set -uo pipefail
BUDGET=${BUDGET:-575} source bench/device_lib.sh
step 150 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_gpu_forward.py -k "fast" 2>&1 \
  | grep -v "^$" | tail -40 | tee $OUT/pytest_gpu_fast.log
step 170 python3 -m gqa_flash.lab.bench --sweep main --providers course_graded,course_fast,sdpa_default,sdpa_flash,sdpa_cudnn,flex \
  --out $OUT/bench_forward_main.csv 2>&1 | grep -v Warning | tee $OUT/bench_main.log
step 60 python3 -m gqa_flash.lab.bench --sweep none --memory $OUT/bench_memory.csv 2>&1 | tee $OUT/bench_memory.log
step 240 python3 -m gqa_flash.lab.bench --sweep extra --providers course_graded,course_fast,sdpa_default,sdpa_flash \
  --out $OUT/bench_forward_extra.csv 2>&1 | tee $OUT/bench_extra.log
echo "done at ${SECONDS}s" | tee -a $OUT/env.txt
