# The start the GPU-machine scripts share (bench/h200.sh, bench/serving.sh), sourced as
#   source "$(dirname "$0")/script_env.sh" DEFAULT_OUT "$@"
# OUT: the script's first argument, else $OUT, else DEFAULT_OUT (made); the working directory this
# checkout, first on the path; PY: $PYTHON, else python3.
set -uo pipefail
OUT="${2:-${OUT:-$1}}"
mkdir -p "$OUT"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
