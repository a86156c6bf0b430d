#!/usr/bin/env bash
# The gate's wall time in two checkouts, interleaved: this one (B) against another (A, e.g. the commit
# before a change, made with `git worktree add` or `git archive`), ROUNDS rounds of A then B (the
# order swapped every other round), each run timed from outside. A warm-up run of each checkout comes
# first, not counted (numba compiles and caches each checkout's kernels on its first run). Prints one
# line per run and last, per checkout, the median with the runs' spread and B's median over A's.
#
#   bash bench/gate_ab.sh OTHER_CHECKOUT [OUT] [E2E FLAGS...]
#   ROUNDS=3 bash bench/gate_ab.sh /tmp/before /tmp/ab --backend cpu
#   bash bench/gate_ab.sh /tmp/before /tmp/ab --backend gpu --max-tokens 256
#
# ROUNDS (default 3); WARM=0 skips the warm-ups (both checkouts already ran on this machine).
# Nothing here installs anything: the caller puts kern's dependencies on the path first (PYTHONPATH
# is kept after each checkout's own root).
set -uo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ] || [ $# -lt 1 ]; then
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  [ $# -lt 1 ] && exit 2 || exit 0
fi
A="$(cd "$1" && pwd)" || { echo "gate_ab: no checkout at $1" >&2; exit 2; }
B="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${2:-${OUT:-/tmp/kern-gate-ab}}"
shift 2 2>/dev/null || shift $#
FLAGS=("$@")
ROUNDS="${ROUNDS:-3}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
: > "$OUT/ab-runs.txt"
export PYTHONUNBUFFERED=1

gate() {  # gate LABEL TREE NAME: one timed run; appends "LABEL seconds rc" to ab-runs.txt unless NAME is warm*
  local label=$1 tree=$2 name=$3 t0 rc dt
  t0=$EPOCHREALTIME
  (cd "$tree" && PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" timeout "${GATE_LIMIT:-400}" "$PY" -m e2e.cli \
    "${FLAGS[@]}" --out "$OUT/$name" > "$OUT/$name.log" 2>&1)
  rc=$?
  dt=$("$PY" -c "print(f'{$EPOCHREALTIME - $t0:.1f}')")
  printf '%-10s %-2s rc=%-3s %7s s  (%s)\n' "$name" "$label" "$rc" "$dt" "$tree"
  case $name in warm*) ;; *) echo "$label $dt $rc" >> "$OUT/ab-runs.txt" ;; esac
}

if [ "${WARM:-1}" != 0 ]; then gate A "$A" warm-A; gate B "$B" warm-B; fi
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then gate A "$A" "r$r-A"; gate B "$B" "r$r-B"; else gate B "$B" "r$r-B"; gate A "$A" "r$r-A"; fi
done
"$PY" - "$OUT/ab-runs.txt" "$A" "$B" <<'EOF'
import statistics, sys
runs = [line.split() for line in open(sys.argv[1])]
med = {}
for label, tree in (("A", sys.argv[2]), ("B", sys.argv[3])):
    ts = [float(t) for l, t, rc in runs if l == label]
    bad = sum(rc != "0" for l, t, rc in runs if l == label)
    med[label] = statistics.median(ts) if ts else float("nan")
    print(f"{label} {tree}: median {med[label]:.1f} s over {len(ts)} runs ({min(ts, default=0):.1f}-{max(ts, default=0):.1f}), "
          f"{bad} not exit 0")
print(f"B/A: {med['B'] / med['A']:.3f}")
EOF
