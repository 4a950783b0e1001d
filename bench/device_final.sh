#!/usr/bin/env bash
# The committed H200 measurements in one device call (under 10 minutes), most needed first:
# roofline ceilings, backward, forward main sweep, the extra forward sweep and peak memory, then
# notebooks 05 and 06 executed on the GPU. Needs the Jupyter wheels: bash ../shared/device/jupyter-wheels.sh,
# then carry .whl. Each step gets what is left of the budget, so a slow step cuts the later ones short.
set -uo pipefail
BUDGET=${BUDGET:-500} source bench/device_lib.sh
P=course_graded,course_fast,sdpa_default,sdpa_flash
step 40 python3 -m gqa_flash.lab.bench --ceilings $OUT/ceilings.csv 2>&1 | tee $OUT/ceilings.log
step 160 python3 -m gqa_flash.lab.bench --backward --out $OUT/bench_backward.csv 2>&1 | tee $OUT/bench_backward.log
step 120 python3 -m gqa_flash.lab.bench --sweep main --providers $P --out $OUT/bench_forward_main.csv 2>&1 | tee $OUT/bench_main.log
step 200 python3 -m gqa_flash.lab.bench --sweep extra --providers $P --out $OUT/bench_forward_extra.csv \
  --memory $OUT/bench_memory.csv 2>&1 | tee $OUT/bench_extra.log
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
python3 -m ipykernel install --user --name python3 >/dev/null
# Execute notebooks 05 and 06 as committed (they read the committed CSVs) on the GPU; nbval runs
# them on a CPU in make test.
step 150 python3 - <<'PY' 2>&1 | tee $OUT/notebooks_gpu.log
import nbformat, time
from nbclient import NotebookClient
for path in ("notebooks/05_performance.ipynb", "notebooks/06_backward_and_training.ipynb"):
    nb = nbformat.read(path, as_version=4)
    start = time.time()
    NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    lines = [l for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
             for l in o.get("text", "").splitlines() if "PASS" in l or "FAIL" in l or "last step" in l]
    print(f"{path}: ran on the GPU in {time.time() - start:.0f} s", *lines, sep="\n  ")
PY
echo "done at ${SECONDS}s" | tee -a $OUT/env.txt
