#!/usr/bin/env bash
# The gate's wall time by how its servers run: each a process of its own (--hosts 0: forked from the
# zygote, one CUDA context each) against N hosts (threads of N warm processes, one context each).
# Runs the gate once per value, in the order given (the first run on a fresh machine also compiles
# and caches the kernels: give a warm-up value first), and prints a table of wall times last.
#
#   bash bench/gate_hosts.sh [OUT] [VALUES] [E2E FLAGS...]
#   bash bench/gate_hosts.sh /tmp/hosts "8 0 8 4 16" --backend gpu --max-tokens 256
#
# Nothing here installs anything: the caller puts kern's dependencies on the path first.
set -uo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
OUT="${1:-${OUT:-/tmp/kern-hosts}}"
VALUES="${2:-8 0 8}"
shift 2 2>/dev/null || shift $#
FLAGS=("$@")
[ ${#FLAGS[@]} -eq 0 ] && FLAGS=(--backend gpu --max-tokens 256)
TARGETS="${TARGETS:-toy-paged,toy-stateful,toy-spec,toy-stateful-spec,toy-big,toy-float,toy-layers}"
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
: > "$OUT/hosts-table.txt"
i=0
for n in $VALUES; do
  i=$((i + 1))
  t0=$EPOCHREALTIME
  timeout "${GATE_LIMIT:-300}" "$PY" -c "from e2e.cli import main; main()" --targets "$TARGETS" --hosts "$n" "${FLAGS[@]}" \
    --out "$OUT/gate-$i-hosts$n" > "$OUT/gate-$i-hosts$n.log" 2>&1
  rc=$?
  dt=$("$PY" -c "print(f'{$EPOCHREALTIME - $t0:.1f}')")
  verdict=$(grep -m1 -E '^\| (toy|all)' "$OUT/gate-$i-hosts$n/summary.md" >/dev/null 2>&1 && \
            grep -cE '\| all pass' "$OUT/gate-$i-hosts$n/summary.md")
  printf 'run %-2s hosts=%-3s rc=%-4s wall %6s s   targets all passing: %s\n' "$i" "$n" "$rc" "$dt" "${verdict:-?}" \
    | tee -a "$OUT/hosts-table.txt"
done
echo "== steps"; cat "$OUT/hosts-table.txt"
