#!/usr/bin/env bash
# A short device call (about 6 minutes): the roofline ceilings, the fast backward's dQ adds (per-element
# atomics against the copy engine's bulk add, bench/NOTES.md prediction 1), then the extra forward sweep.
set -uo pipefail
BUDGET=${BUDGET:-360} source bench/device_lib.sh
step 30 python3 -m gqa_flash.lab.bench --ceilings $OUT/ceilings.csv 2>&1 | tee $OUT/ceilings.log
step 150 python3 bench/explore_fast.py $OUT bwd 2>&1 | grep -v "^  \|^module\|^{-#\|^#-}\|^}\|tt.func" | tee $OUT/explore_bwd.log
step 300 python3 -m gqa_flash.lab.bench --sweep extra --providers course_graded,course_fast,sdpa_default,sdpa_flash \
  --out $OUT/bench_forward_extra.csv 2>&1 | tee $OUT/bench_extra.log
echo "done at ${SECONDS}s" | tee -a $OUT/env.txt
