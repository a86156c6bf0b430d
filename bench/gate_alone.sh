#!/usr/bin/env bash
# Issue 43's gate bars: each target gated alone (`e2e --targets T`, the defaults of this machine),
# then every target at once, on a machine already warm (a first toy-paged gate fills numba's cache
# and is not counted). Prints, per run: the command's wall, the target's own time and where it began
# in the gate (after the hosts or the zygote were warm), and the hosts' warm time; a table last.
#
#   bash bench/gate_alone.sh [OUT] [E2E FLAGS...]      # OUT defaults to $OUT, else /tmp/kern-gate-alone
#   bash bench/gate_alone.sh /tmp/alone --backend gpu
#   TARGETS="toy-paged toy-layers" ALL=0 RUNS=2 bash bench/gate_alone.sh /tmp/alone --backend cpu
#
# Nothing here installs anything: the caller puts kern's dependencies on the path first.
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
source "$(dirname "$0")/script_env.sh" /tmp/kern-gate-alone "${1:-}"
shift 2>/dev/null || true
FLAGS=("$@")
[ ${#FLAGS[@]} -eq 0 ] && FLAGS=(--backend gpu)
TARGETS="${TARGETS:-toy-paged toy-stateful toy-spec toy-stateful-spec toy-big toy-float toy-layers toy-attn toy-layers-pp2 toy-layers-pp3}"
: > "$OUT/alone-table.txt"
one() {  # NAME TARGETS
  local name=$1 targets=$2 t0 rc dt
  t0=$(date +%s%N)
  timeout "${GATE_LIMIT:-300}" "$PY" -m e2e.cli --targets "$targets" "${FLAGS[@]}" --out "$OUT/$name" > "$OUT/$name.log" 2>&1
  rc=$?
  dt=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%-28s rc=%-3s command %6d ms  %s  %s\n' "$name" "$rc" "$dt" \
    "$(grep -o "^- [a-z0-9-]* (from [0-9.]* s into the gate, [0-9.]* s" "$OUT/$name.log" | sed 's/^- //' | tr '\n' ';')" \
    "$(grep -o "hosts: [0-9]*\( of [0-9]*\)\{0,1\} warm in [0-9.]*s\|zygote: warm in [0-9.]*s" "$OUT/$name.log" | tr '\n' ' ')" | tee -a "$OUT/alone-table.txt"
}
"$PY" -m e2e.cli --targets toy-paged "${FLAGS[@]}" --out "$OUT/warm-up" > "$OUT/warm-up.log" 2>&1
for run in $(seq "${RUNS:-1}"); do
  for t in $TARGETS; do one "alone-$run-$t" "$t"; done
  [ "${ALL:-1}" = 1 ] && one "all-$run" "$(echo $TARGETS | tr ' ' ',')"
done
echo "== each target alone, then all"; cat "$OUT/alone-table.txt"
