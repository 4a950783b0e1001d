#!/usr/bin/env bash
# One device call: backward GPU tests, the backward benchmark, then every notebook under nbval on the GPU.
# Needs the Jupyter wheels: bash ../shared/device/jupyter-wheels.sh, then carry .whl.
set -uo pipefail
export PYTHONUNBUFFERED=1 GQA_FLASH_IMPL=solutions
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
python3 -m ipykernel install --user --name python3 >/dev/null
python3 -m pytest tests/gpu/test_gpu_backward.py -q -p no:cacheprovider -s 2>&1 | grep -E "relative|passed|failed|Error" | tee $OUT/pytest_gpu_backward.log
python3 -m gqa_flash.lab.bench --backward --out $OUT/bench_backward.csv 2>&1 | tee $OUT/bench_backward.log
python3 -m pytest --nbval-lax --nbval-current-env notebooks -q -p no:cacheprovider -rf 2>&1 | tail -40 | tee $OUT/nbval_gpu.log
