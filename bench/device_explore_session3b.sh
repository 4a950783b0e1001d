#!/usr/bin/env bash
# Session 3's second exploration call (about 5 minutes): ping-pong tiles around the two winners of
# the first call (256x64 w8 at D128, 128x64 w4 at D64; stages, warp specialization, 32-key tiles),
# then FlexAttention again with the recompile limit raised (the first call hit it at D128 N=8k).
set -uo pipefail
BUDGET=${BUDGET:-420} source bench/device_lib.sh
step 260 python3 bench/explore_fast.py $OUT fwd 2>&1 | grep -v "^  \|^module\|^{-#\|^#-}\|^}\|tt.func" | tee $OUT/explore_fwd.log
step 150 python3 -m gqa_flash.lab.bench --sweep main --providers sdpa_default,flex --out $OUT/bench_flex.csv 2>&1 \
  | grep -v Warning | tail -30 | tee $OUT/bench_flex.log
echo "done at ${SECONDS}s" | tee -a $OUT/env.txt
