#!/usr/bin/env bash
# A short device call (about 6 minutes): the roofline ceilings, the fast backward's dQ adds (per-element
# atomics against the copy engine's bulk add, bench/NOTES.md prediction 1), then the extra forward sweep.
set -uo pipefail
export PYTHONUNBUFFERED=1 GQA_FLASH_IMPL=solutions PYTHONPATH=$PWD
END=$((SECONDS + ${BUDGET:-360}))
step() { local cap=$1; shift; local left=$((END - SECONDS)); [ $left -gt $cap ] && left=$cap
         [ $left -gt 10 ] && timeout $left "$@"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } | tee $OUT/env.txt
step 30 python3 -m gqa_flash.bench --ceilings $OUT/ceilings.csv 2>&1 | tee $OUT/ceilings.log
step 150 python3 bench/explore_fast.py $OUT bwd 2>&1 | grep -v "^  \|^module\|^{-#\|^#-}\|^}\|tt.func" | tee $OUT/explore_bwd.log
step 300 python3 -m gqa_flash.bench --sweep extra --providers course_graded,course_fast,sdpa_default,sdpa_flash \
  --out $OUT/bench_forward_extra.csv 2>&1 | tee $OUT/bench_extra.log
echo "done at ${SECONDS}s" | tee -a $OUT/env.txt
