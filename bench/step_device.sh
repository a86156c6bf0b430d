#!/usr/bin/env bash
# Issue 43's step on the device in one GPU call: the multistep tests against the CPU reference, the
# engine alone at 64 sequences with 1, 8 and 16 decode steps a launch, each with the next launch sent
# before the last one's commit and without (--overlap, --no-overlap; bench/engine_step.py: each
# figure beside its kernel-only ceiling of the same run), one `kern serve` against the engine alone in
# the same run (bench/serve_load.py, whole and streamed, both at --decode-steps K for each K of SERVE_STEPS, default 8), and the
# gate on every target twice (the second warm). Logs under OUT; a short table last.
#
#   bash bench/step_device.sh [OUT]     # OUT defaults to $OUT, else /tmp/kern-step-device
#   STEPS="1 8 16" OVERLAPS="overlap no-overlap" ROUNDS=5 STREAMS=64 TOKENS=256 GATE=1 SERVE=1 TESTS=1 GATE_RUNS=2
#   and each part's time limit in seconds: T_TESTS=300 T_STEP=300 (each K) T_SERVE=400 T_GATE=300 (each run)
#
# Nothing here installs anything: the caller puts kern's dependencies on the path first.
source "$(dirname "$0")/script_env.sh" /tmp/kern-step-device "$@"
STEPS="${STEPS:-1 8 16}" ROUNDS="${ROUNDS:-5}" STREAMS="${STREAMS:-64}" TOKENS="${TOKENS:-256}"
if [ "${TESTS:-1}" = 1 ]; then
  timeout "${T_TESTS:-300}" "$PY" -m pytest -q -n 4 -p no:cacheprovider tests/test_gpu_multistep.py tests/test_multistep.py tests/test_overlap.py \
    > "$OUT/tests.log" 2>&1; echo "tests exit $?" >> "$OUT/tests.log"
fi
for k in $STEPS; do
  for ov in ${OVERLAPS:-overlap no-overlap}; do
    [ "$k" = 1 ] && [ "$ov" = overlap ] && continue  # one step a launch has nothing to overlap
    timeout "${T_STEP:-300}" "$PY" bench/engine_step.py --backend gpu --seqs "$STREAMS" --max-tokens "$TOKENS" --rounds "$ROUNDS" \
      --warmup 1 --pin 2 --decode-steps "$k" "--$ov" > "$OUT/engine-step-k$k-$ov.log" 2>&1
  done
done
if [ "${SERVE:-1}" = 1 ]; then
  for k in ${SERVE_STEPS:-8}; do
    timeout "${T_SERVE:-400}" "$PY" bench/serve_load.py --backend gpu --streams "$STREAMS" --max-tokens "$TOKENS" --rounds 4 \
      --repeats 3 --serve-flag="--decode-steps=$k" > "$OUT/serve-load-k$k.log" 2>&1
  done
fi
if [ "${GATE:-1}" = 1 ]; then
  for run in $(seq "${GATE_RUNS:-2}"); do
    timeout "${T_GATE:-300}" "$PY" -m e2e.cli --backend gpu --out "$OUT/e2e-$run" > "$OUT/gate-$run.log" 2>&1
    echo "gate exit $?" >> "$OUT/gate-$run.log"
  done
fi
"$PY" - "$OUT" <<'PY'
import glob, re, sys
out = sys.argv[1]
for path in sorted(glob.glob(f"{out}/tests.log")):
    print("== tests:", open(path).read().strip().splitlines()[-2:])
for path in sorted(glob.glob(f"{out}/engine-step-k*.log")):
    print(f"== {path.rsplit('/', 1)[1]}")
    for line in open(path):
        if re.search(r"best of|per decode step|ceiling \(|median of", line):
            print(" ", line.strip())
for path in sorted(glob.glob(f"{out}/serve-load-k*.log")):
    print(f"== {path.rsplit('/', 1)[1]}")
    for line in open(path):
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) > 8 and cells[0] in ("engine alone", "HTTP", "HTTP streaming"):
            print(f"  {cells[0]:15} {cells[1]:>9} tok/s  x{cells[2]:>5}  range {cells[3]:>17}")
for path in sorted(glob.glob(f"{out}/gate-*.log")):
    text = open(path).read()
    wall = re.findall(r"wall time: [0-9.]+ s", text)
    rows = re.findall(r"^\| (toy-\S+) .*$", text, re.M)
    print(f"== {path.rsplit('/', 1)[1]}: {wall[:1]} {text.strip().splitlines()[-1]}")
    for t in re.findall(r"- (toy-[a-z0-9-]+) \(from [0-9.]+ s into the gate, ([0-9.]+) s", text):
        print(f"  {t[0]} {t[1]} s")
PY
