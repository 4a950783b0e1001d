# Sourced by the bench/*.sh scripts, never run on its own: what every GPU run needs.
#
#   PARTS="a b c"; source "$(dirname "$0")/common.sh" "$@"   parse the options, record the machine
#   only a && step NAME CAP_SECONDS command args...          run one command into the script's log
#   finish                                                   the summary; exit 1 if a step failed or was skipped
#
# Options of every script (anything else is left, in order, in the array ARGS for the script):
#   --out DIR       where the results go; else $OUT if set (the device tool sets it); else bench/out/
#                   in the repository, which git ignores
#   --only A,B      run only the parts named (PARTS, listed in each script's header); default: all
#   --budget SECS   finish within SECS seconds (also BUDGET=SECS): each step then gets at most its own
#                   CAP_SECONDS and what is left of the budget, and is skipped when 10 s or less are
#                   left. Without a budget nothing is cut short. (A 10-minute device call: --budget 570.)
#   -h, --help      print the script's header
#
# Environment: GQA_FLASH_IMPL (the implementation switch, gqa_flash/course/impl.py) defaults to solutions where
# solutions/ exists, else student; set it to choose. The repository goes first on PYTHONPATH, so the
# scripts run from a plain checkout on a machine that has torch and triton but never ran
# `pip install -e .` (as the lent H200 does). PYTHON picks the interpreter (default python3).
# Every script writes $OUT/environment.txt (date, GPU, driver, Python, torch, triton, the switch, the
# commit, then one line per step) and $OUT/<script>.log (the same, with every step's output).

ARGS=()
ONLY=""
while [ $# -gt 0 ]; do
    case $1 in
        --out) OUT=$2; shift 2 ;;
        --out=*) OUT=${1#--out=}; shift ;;
        --only) ONLY=$2; shift 2 ;;
        --only=*) ONLY=${1#--only=}; shift ;;
        --budget) BUDGET=$2; shift 2 ;;
        --budget=*) BUDGET=${1#--budget=}; shift ;;
        -h|--help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) ARGS+=("$1"); shift ;;
    esac
done
for part in ${ONLY//,/ }; do
    if [[ " ${PARTS:-} " != *" $part "* ]]; then
        echo "$(basename "$0"): no part '$part'; its parts: ${PARTS:-none}" >&2
        exit 2
    fi
done

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SCRIPT=$(basename "$0" .sh)
OUT=${OUT:-$REPO/bench/out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 1  # before the cd below: --out is relative to the caller
cd "$REPO" || exit 1
LOG=$OUT/$SCRIPT.log
PYTHON=${PYTHON:-python3}
if [ -z "${GQA_FLASH_IMPL:-}" ]; then
    if [ -d "$REPO/solutions" ]; then GQA_FLASH_IMPL=solutions; else GQA_FLASH_IMPL=student; fi
fi
export GQA_FLASH_IMPL PYTHONUNBUFFERED=1 PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}

START=$SECONDS
STEPS=()
FAILED=0

{
    echo "# bench/$SCRIPT.sh${ONLY:+ --only $ONLY}${ARGS[*]+ ${ARGS[*]}}  (out: $OUT${BUDGET:+, budget ${BUDGET}s})"
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
    "$PYTHON" -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, \
'triton', triton.__version__, 'cuda', torch.cuda.is_available())" 2>&1
    echo "GQA_FLASH_IMPL=$GQA_FLASH_IMPL"
    if commit=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null); then
        git -C "$REPO" diff --quiet HEAD 2>/dev/null || commit="$commit, with uncommitted changes"
        echo "commit $commit"
        # The tree of the files as they are here, whatever git's own metadata says (a copy of a checkout
        # can carry a stale HEAD): equal to `git rev-parse COMMIT^{tree}` for the commit this tree is.
        index=$(mktemp) && GIT_INDEX_FILE=$index git -C "$REPO" read-tree HEAD 2>/dev/null \
            && GIT_INDEX_FILE=$index git -C "$REPO" add -A . 2>/dev/null \
            && echo "tree $(GIT_INDEX_FILE=$index git -C "$REPO" write-tree 2>/dev/null || echo unknown)" \
            || echo "tree unknown"
        rm -f "$index"
    else
        echo "commit unknown (not a git checkout)"
    fi
} 2>&1 | tee "$OUT/environment.txt" > "$LOG"
cat "$OUT/environment.txt"

# only PART: true when --only named PART, or when there was no --only.
only() { [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]; }

# step NAME CAP_SECONDS command args...: run the command, its output into the log and the terminal.
# With a budget, the command gets at most CAP_SECONDS and what is left of the budget.
step() {
    local name=$1 cap=$2 limit="" rc began=$SECONDS
    shift 2
    if [ -n "${BUDGET:-}" ]; then
        limit=$((START + BUDGET - SECONDS))
        [ "$limit" -gt "$cap" ] && limit=$cap
        if [ "$limit" -le 10 ]; then
            STEPS+=("$name: skipped, the budget was spent"); FAILED=1
            echo "=== $name: skipped, the budget was spent" | tee -a "$LOG"
            return 0
        fi
    fi
    echo "=== $name: $*${limit:+  (at most ${limit}s)}" | tee -a "$LOG"
    if [ -n "$limit" ]; then
        timeout "$limit" "$@" 2>&1 | tee -a "$LOG"
    else
        "$@" 2>&1 | tee -a "$LOG"
    fi
    rc=${PIPESTATUS[0]}
    case $rc in
        0) STEPS+=("$name: ok in $((SECONDS - began))s") ;;
        124) STEPS+=("$name: cut at its time limit after $((SECONDS - began))s"); FAILED=1 ;;
        *) STEPS+=("$name: failed (exit $rc) after $((SECONDS - began))s"); FAILED=1 ;;
    esac
}

# finish: one line per step and the total, into the log and environment.txt; exit 1 if a step failed
# or was skipped.
finish() {
    {
        echo "=== bench/$SCRIPT.sh done in $((SECONDS - START))s"
        printf '  %s\n' ${STEPS[@]+"${STEPS[@]}"}
    } | tee -a "$LOG" "$OUT/environment.txt"
    exit $FAILED
}
