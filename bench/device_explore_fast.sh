#!/usr/bin/env bash
# One device call: the fast kernels' configs (forward and backward), then the backward GPU tests.
set -uo pipefail
export PYTHONUNBUFFERED=1 GQA_FLASH_IMPL=solutions PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee $OUT/env.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/env.txt
timeout 330 python3 bench/explore_fast.py $OUT fwd bwd 2>&1 | grep -v "^  \|^module\|^{-#\|^#-}\|^}\|tt.func\|external_resources" | tee $OUT/explore_fast.log
timeout 200 python3 -m pytest tests/gpu/test_gpu_backward.py -q -p no:cacheprovider -s 2>&1 | grep -E "relative|passed|failed|Error" | tee $OUT/pytest_gpu_backward.log
