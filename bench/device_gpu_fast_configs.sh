BUDGET=200 source bench/device_lib.sh
step 150 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_gpu_forward.py -k "every_fast_config or strides" 2>&1 | grep -v "^$\|^\.$" | tail -30 | tee $OUT/pytest_gpu_fast_configs.log
