# Sourced by the bench/device_*.sh scripts: the environment every device call needs, the record
# of the machine, and step(), which runs one command within what is left of the call's budget.
#   BUDGET=seconds (default 500)   step CAP_SECONDS command args...
export PYTHONUNBUFFERED=1 GQA_FLASH_IMPL=solutions PYTHONPATH=$PWD
END=$((SECONDS + ${BUDGET:-500}))
step() { local cap=$1; shift; local left=$((END - SECONDS)); [ $left -gt $cap ] && left=$cap
         [ $left -gt 10 ] && timeout $left "$@"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } | tee $OUT/env.txt
