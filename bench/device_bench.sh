#!/usr/bin/env bash
# One device call: the GPU tests (both kernels), then the benchmark sweep and the memory sweep.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GQA_FLASH_IMPL=solutions
SWEEP=${SWEEP:-main}
python3 -m pytest tests/gpu -q -p no:cacheprovider -s 2>&1 | grep -E "max \||relative|passed|failed|Error" | tee $OUT/pytest_gpu.log | tail -8
python3 -m gqa_flash.lab.bench --sweep $SWEEP --providers ${PROVIDERS:-course_graded,course_fast,sdpa_default,sdpa_flash,sdpa_cudnn,naive} \
  --out $OUT/bench_forward_$SWEEP.csv ${MEMORY:+--memory $OUT/bench_memory.csv} 2>&1 | tee $OUT/bench_$SWEEP.log
