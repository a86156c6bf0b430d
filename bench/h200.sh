#!/usr/bin/env bash
# One build-check-measure cycle on a GPU machine, as the closing notes' H200 figures were taken:
# the GPU tests, the gate on every shipped target at 256 tokens, decode with and without CUDA
# graphs, and the pipeline rows. Each step's log goes under OUT; a table of steps is printed last.
#
#   bash bench/h200.sh [OUT]          # OUT defaults to $OUT, else /tmp/kern-h200
#
# Nothing here installs anything: the caller puts kern's dependencies on the path first.
source "$(dirname "$0")/script_env.sh" /tmp/kern-h200 "$@"
: > "$OUT/table.txt"

step() {  # step NAME LIMIT_S CMD...: run CMD under a time limit, log it, add a row to the table
  local name=$1 limit=$2; shift 2
  local t0=$EPOCHREALTIME
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  local dt; dt=$("$PY" -c "print(f'{$EPOCHREALTIME - $t0:.1f}')")
  printf '%-12s rc=%-4s %7s s   %s\n' "$name" "$rc" "$dt" "$(tail -n 1 "$OUT/$name.log" | cut -c1-120)" | tee -a "$OUT/table.txt"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
step gpu-tests 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu -n 4
step gate 180 "$PY" -c "from e2e.cli import main; main()" --backend gpu --max-tokens 256 --jobs 9 --out "$OUT/e2e"
step graphs 110 "$PY" bench/serve.py --backend gpu --graphs both --targets toy-paged --concurrency 1 64
step stages 110 "$PY" bench/serve.py --backend gpu --stages 1 2 3
echo "== the gate's summary"; sed -n '1,40p' "$OUT/e2e/summary.md" 2>/dev/null
echo "== graphs"; tail -n 25 "$OUT/graphs.log"
echo "== stages"; tail -n 12 "$OUT/stages.log"
echo "== steps"; cat "$OUT/table.txt"
