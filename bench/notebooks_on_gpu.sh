#!/usr/bin/env bash
# The notebooks on a GPU: every notebook (or those named) executed from top to bottom under nbval, with
# the kernels compiled for the GPU instead of run by Triton's interpreter; each check cell must print
# what is stored in the notebook (PASS), as `make test` checks on a CPU. Nothing in notebooks/ is
# rewritten.
#
#   bash bench/notebooks_on_gpu.sh [--out DIR] [--budget SECONDS] [notebooks/NN_name.ipynb ...]
#
# Writes notebooks_on_gpu.log (nbval's verdict per cell, the slowest cells last) and environment.txt.
# Needs what `pip install -e '.[course]'` installs (nbval, ipykernel). On a GPU machine without Jupyter
# and without a network (the lent H200), set WHEELS to a folder of wheels carried along (a path from the
# repository's root); they are installed into a temporary folder put first on PYTHONPATH, and nothing
# else is touched. Make that folder on a machine with a network, for the GPU machine's Python (3.12 on
# x86-64 here), then delete the wheels of what the GPU machine already has (pytest, pluggy, iniconfig,
# packaging, pygments, psutil, ...) so that its own versions stay in charge:
#   python3 -m pip download --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     --platform any -d .whl nbval ipykernel nbclient
#   WHEELS=.whl bash bench/notebooks_on_gpu.sh        (the device tool: carry [".whl"], which git ignores)
#
# Time on the H200: not measured with this script and not recorded in a committed run; start with
# --budget 570 in a 10-minute device call, and name fewer notebooks if the step is cut.

set -uo pipefail
PARTS="notebooks"
source "$(dirname "$0")/common.sh" "$@"

if [ -n "${WHEELS:-}" ]; then
    SITE=$(mktemp -d)
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl \
        || { echo "could not install the wheels in $WHEELS" | tee -a "$LOG"; exit 1; }
    export PYTHONPATH=$SITE:$PYTHONPATH JUPYTER_DATA_DIR=$SITE/jupyter
    "$PYTHON" -m ipykernel install --user --name python3 > /dev/null  # into JUPYTER_DATA_DIR, inside $SITE
fi
NOTEBOOKS=(${ARGS[@]+"${ARGS[@]}"})
[ ${#NOTEBOOKS[@]} -gt 0 ] || NOTEBOOKS=(notebooks)

only notebooks && step notebooks 600 "$PYTHON" -m pytest --nbval-lax --nbval-current-env -p no:cacheprovider -q -rf \
    --durations=15 "${NOTEBOOKS[@]}"
finish
