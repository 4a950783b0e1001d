#!/usr/bin/env bash
# A short device call (about 1 minute): every fast-forward autotuner config against float64 on the GPU
# (ragged lengths, N shorter than a tile, head_dim 64 to 256, MHA and GQA), and strided inputs.
set -uo pipefail
BUDGET=${BUDGET:-200} source bench/device_lib.sh
step 150 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_gpu_forward.py -k "every_fast_config or strides" 2>&1 \
  | grep -v "^$\|^\.$" | tail -30 | tee $OUT/pytest_gpu_fast_configs.log
