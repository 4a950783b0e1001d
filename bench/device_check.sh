#!/usr/bin/env bash
# One device call: versions, the whole test suite with the solutions (GPU tests included),
# then the graded kernel's tile configs against SDPA. Everything lands in $OUT.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GQA_FLASH_IMPL=solutions
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } | tee $OUT/env.txt
python3 -m pytest tests -q -p no:cacheprovider -rs -s --ignore=tests/test_notebooks.py -k "not test_grade and not mutant" 2>&1 \
  | grep -v "^\.\|^$" | tee $OUT/pytest_gpu.log | tail -40
python3 bench/explore_forward.py $OUT 2>&1 | tee $OUT/explore.log
