#!/usr/bin/env bash
# Session 3's exploration call (about 8 minutes): the fast forward's ping-pong sub-tiles and lazy
# rescaling against its current tiles (bench/NOTES.md, predictions 4-7), then FlexAttention against
# SDPA's default on the main sweep.
set -uo pipefail
BUDGET=${BUDGET:-480} source bench/device_lib.sh
step 320 python3 bench/explore_fast.py $OUT fwd 2>&1 | grep -v "^  \|^module\|^{-#\|^#-}\|^}\|tt.func" | tee $OUT/explore_fwd.log
step 200 python3 -m gqa_flash.lab.bench --sweep main --providers sdpa_default,flex --out $OUT/bench_flex.csv 2>&1 \
  | tail -40 | tee $OUT/bench_flex.log
echo "done at ${SECONDS}s" | tee -a $OUT/env.txt
