#!/usr/bin/env bash
# Serving speed in one call, as issue 27's figures are taken on a GPU machine: the engine alone's
# decode step split (bench/engine_step.py), the gate's time on the seven single-process targets, and
# one `kern serve` under a closed loop of streams against the engine alone in the same run
# (bench/serve_load.py, RUNS times), then the scheduler's iterations traced in both (bench/serve_timeline.py),
# and the front end's CPU per whole answer over a socket under each HTTP parser (bench/frontend_socket.py).
# Each step's log goes under OUT; a short table is printed last.
#
#   bash bench/serving.sh [OUT]    # OUT defaults to $OUT, else /tmp/kern-serving
#   BACKEND=gpu STREAMS=64 TOKENS=256 ROUNDS="4 16" (serve_load at each) REPEATS=3 RUNS=2 FRONTENDS="1 2"
#   (serve_load with each --frontends) (the defaults);
#   WORKERS=n client processes
#   (default: serve_load's, one per CPU the clients get when pinned); TIMELINE=0 skips serve_timeline.py
#
# Nothing here installs anything: the caller puts kern's dependencies on the path first.
source "$(dirname "$0")/script_env.sh" /tmp/kern-serving "$@"
BACKEND="${BACKEND:-gpu}" STREAMS="${STREAMS:-64}" TOKENS="${TOKENS:-256}" ROUNDS="${ROUNDS:-4 16}"
REPEATS="${REPEATS:-3}" RUNS="${RUNS:-2}" FRONTENDS="${FRONTENDS:-1 2}"
TARGETS=toy-paged,toy-stateful,toy-spec,toy-stateful-spec,toy-big,toy-float,toy-layers

timeout 300 "$PY" bench/engine_step.py --backend "$BACKEND" --seqs "$STREAMS" --max-tokens "$TOKENS" --rounds 3 \
  > "$OUT/engine-step.log" 2>&1
timeout 300 "$PY" -m e2e.cli --backend "$BACKEND" --max-tokens "$TOKENS" --targets "$TARGETS" --out "$OUT/e2e" \
  > "$OUT/gate.log" 2>&1
echo "gate exit $?" >> "$OUT/gate.log"
for f in $FRONTENDS; do  # one front-end process, then more (kern serve --frontends)
  for r in $ROUNDS; do  # a few rounds: the clients' waves still together; many: as they drift apart
    for i in $(seq 1 "$RUNS"); do
      timeout 600 "$PY" bench/serve_load.py --backend "$BACKEND" --streams "$STREAMS" --max-tokens "$TOKENS" \
        ${WORKERS:+--workers "$WORKERS"} --rounds "$r" --repeats "$REPEATS" --serve-flag="--frontends=$f" \
        > "$OUT/serve-load-f$f-r$r-$i.log" 2>&1
    done
  done
done
if [ "${TIMELINE:-1}" = 1 ]; then  # where a served round loses to the engine alone, iteration by iteration
  timeout 300 "$PY" bench/serve_timeline.py --backend "$BACKEND" --streams "$STREAMS" --max-tokens "$TOKENS" \
    --rounds "${ROUNDS##* }" --runs 1 --out "$OUT/timeline" > "$OUT/timeline.log" 2>&1
fi

timeout 120 "$PY" bench/frontend_socket.py --seconds 2 --rounds 1 > "$OUT/frontend-socket.log" 2>&1  # the front end alone

"$PY" - "$OUT" <<'PY'
import glob, re, sys
out = sys.argv[1]
step = open(f"{out}/engine-step.log").read()
print("== the engine alone (bench/engine_step.py)")
for line in step.splitlines():
    if re.search(r"best of|per decode step|staging share", line):
        print(" ", line.strip())
print("== the gate, seven targets")
gate = open(f"{out}/gate.log").read()
print(" ", (re.findall(r"wall time: [0-9.]+ s", open(f"{out}/e2e/summary.md").read()) or ["no summary"])[0]
      if glob.glob(f"{out}/e2e/summary.md") else "no summary", "|", gate.strip().splitlines()[-1])
for path in sorted(glob.glob(f"{out}/serve-load-*.log")):
    print(f"== {path.rsplit('/', 1)[1]}")
    for line in open(path):
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) > 8 and cells[0] in ("engine alone", "HTTP", "HTTP streaming"):
            print(f"  {cells[0]:15} {cells[1]:>9} tok/s  x{cells[2]:>5}  range {cells[3]:>17}  ITL p50 {cells[6]:>5}"
                  f"  {cells[9]}")
if glob.glob(f"{out}/frontend-socket.log"):
    print("== the front end over a socket, server CPU (bench/frontend_socket.py)")
    for line in open(f"{out}/frontend-socket.log"):
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == 5 and cells[1][:1].isdigit():
            print(f"  {cells[0]:21} {cells[1]:>7} us a whole answer (floor/server {cells[2]})"
                  f"  {cells[3]:>6} us a stream chunk (floor/server {cells[4]})")
if glob.glob(f"{out}/timeline.log"):
    print("== the scheduler's iterations (bench/serve_timeline.py)")
    for line in open(f"{out}/timeline.log"):
        if re.match(r"(alone|http|stream)-[0-9]+ +[0-9.]+ ms", line):
            print(" ", line.rstrip())
PY
