#!/usr/bin/env bash
# The committed H200 measurements, in two device calls (each under 10 minutes):
#   bash bench/device_final.sh bench      backward, forward main + extra sweeps, peak memory
#   bash bench/device_final.sh notebooks  notebooks 05 and 06 under nbval, then the backward GPU tests
# The second needs the Jupyter wheels (bash ../shared/device/jupyter-wheels.sh; carry .whl).
set -uo pipefail
export PYTHONUNBUFFERED=1 GQA_FLASH_IMPL=solutions PYTHONPATH=$PWD
P=course_graded,course_fast,sdpa_default,sdpa_flash,sdpa_cudnn
if [ "$1" = bench ]; then
  { date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } | tee $OUT/env.txt
  timeout 200 python3 -m gqa_flash.bench --backward --out $OUT/bench_backward.csv 2>&1 | tee $OUT/bench_backward.log
  timeout 140 python3 -m gqa_flash.bench --sweep main --providers $P --out $OUT/bench_forward_main.csv 2>&1 | tee $OUT/bench_main.log
  timeout 215 python3 -m gqa_flash.bench --sweep extra --providers $P --out $OUT/bench_forward_extra.csv \
    --memory $OUT/bench_memory.csv 2>&1 | tee $OUT/bench_extra.log
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
  python3 -m ipykernel install --user --name python3 >/dev/null
  timeout 60 python3 -m gqa_flash.bench --ceilings $OUT/ceilings.csv 2>&1 | tee $OUT/ceilings.log
  timeout 300 python3 -m pytest --nbval-lax --nbval-current-env notebooks/05_performance.ipynb \
    notebooks/06_backward_and_training.ipynb -q -p no:cacheprovider -rf 2>&1 | tail -30 | tee $OUT/nbval_gpu.log
  timeout 240 python3 -m pytest tests/gpu/test_gpu_backward.py -q -p no:cacheprovider -s 2>&1 \
    | grep -E "relative|passed|failed|Error" | tee $OUT/pytest_gpu_backward.log
fi
