#!/usr/bin/env bash
# Session 3's last call (about 4 minutes): every fast-forward autotuner config checked on the GPU
# (the measurement call ran out of time before that test), then the main sweep again for the fast
# kernel with the shorter config list, printing which config the autotuner chose for each shape.
set -uo pipefail
BUDGET=${BUDGET:-300} source bench/device_lib.sh
step 130 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_gpu_forward.py -k "every_fast_config or strides" 2>&1 \
  | grep -v "^$\|^\.$" | tail -30 | tee $OUT/pytest_gpu_fast_configs.log
step 150 python3 - <<'PY' 2>&1 | tee $OUT/bench_main_fast.log
import os
from pathlib import Path
from gqa_flash import bench, fast_forward
out = Path(os.environ["OUT"])
bench.run(bench.sweep("main"), ["sdpa_default", "course_fast"], out / "bench_forward_main_fast.csv")
for key, config in fast_forward._kernel().cache.items():
    print("autotuner:", key, config)
PY
echo "done at ${SECONDS}s" | tee -a $OUT/env.txt
