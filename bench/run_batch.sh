#!/usr/bin/env bash
# The batch benchmark (issue 6): llmretry.call_many against the bare libcurl
# multi loop, both talking to one local nginx, then call_many against the
# 50 ms endpoint. See bench/README.md ("Batch
# benchmark"). Usage (from anywhere):  bash bench/run_batch.sh
#
# Knobs (environment): N=20000 LIMIT=64 RUNS=3 SLOW_N=2000
# PY_WARMUP=0 LLMRETRY_BENCH_PORT=18089 BUILD_DIR=build-bench PYTHON=python3
# BASELINE=<commit>: also measure that commit's call_many (logger=None) in the
# same rounds (built from `git archive` into the run's temp folder), for a
# "does not regress" verdict that this machine's noise cannot fake
#   (e.g. BASELINE=d3301c9, the last commit before the engine restructure)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
N=${N:-20000}
LIMIT=${LIMIT:-64}
RUNS=${RUNS:-3}
SLOW_N=${SLOW_N:-2000}
PY_WARMUP=${PY_WARMUP:-0}
PORT=${LLMRETRY_BENCH_PORT:-18089}
BUILD_DIR=${BUILD_DIR:-build-bench}
PYTHON=${PYTHON:-python3}
BASELINE=${BASELINE:-}
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"

log() { printf '%s\n' "$*" >&2; }

# ---- 1. nginx (Debian packages), the extension, the bare loop ----------------
# shellcheck source=bench/nginx.sh
. "$ROOT/bench/nginx.sh"
bench_nginx_install

log "== building the extension (make build-python)"
make --no-print-directory build-python PYTHON="$PYTHON" >/dev/null 2>&1 || {
  log "make build-python failed:"; make --no-print-directory build-python PYTHON="$PYTHON" >&2; exit 1; }
"$PYTHON" -c 'import llmretry' || { log "llmretry does not import"; exit 1; }

log "== building $BUILD_DIR/bare_multi"
mkdir -p "$BUILD_DIR"
DEPS=$(pkg-config --cflags --libs libcurl libcjson)
# shellcheck disable=SC2086
gcc -O2 -Wall -Wextra -o "$BUILD_DIR/bare_multi" bench/bare_multi.c $DEPS -lpthread

# ---- 2. nginx on loopback (bench/nginx.sh: start, stop on exit) ---------------
bench_nginx_start "$PORT"     # sets TMP, FAST, SLOW
BASE="http://127.0.0.1:$PORT/v1"
SLOW_BASE="http://127.0.0.1:$PORT/slow/v1"
log "== nginx $("$NGINX" -v 2>&1 | sed 's/.*\///'), port $PORT, $(nproc) cores"
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
if awk -v l="${LOAD0%% *}" 'BEGIN {exit !(l > 0.5)}'; then
  log "WARNING: load average $LOAD0 before the run: other work shares these cores, figures will be noisy"
fi

if [ -n "$BASELINE" ]; then
  log "== building the baseline $BASELINE's extension"
  mkdir -p "$TMP/baseline"
  git -C "$ROOT" archive "$BASELINE" | tar -x -C "$TMP/baseline"
  (cd "$TMP/baseline" && "$PYTHON" setup.py -q build_ext --inplace >/dev/null 2>&1) || {
    log "the baseline $BASELINE does not build"; exit 1; }
fi

RESULTS="$TMP/results.txt"
: >"$RESULTS"
accepts() { curl -fsS "http://127.0.0.1:$PORT/status" | sed -n '3p' | awk '{print $1}'; }
run() {   # run "TAGS" COMMAND...: keep its RESULT line, add TAGS and the connections
  local tags=$1 out a0 a1     # nginx accepted while it ran (pconns)
  shift
  a0=$(accepts)
  if ! out=$("$@"); then
    log "FAILED: $*"; printf '%s\n' "$out" >&2; exit 1
  fi
  a1=$(accepts)
  printf '%s\n' "$out" | grep '^RESULT' | sed "s/\$/ $tags pconns=$((a1 - a0 - 1))/" |
    tee -a "$RESULTS" >&2
}
one() {   # one CLIENT ENDPOINT RUN
  local url=$BASE n=$N
  [ "$2" = fast ] || { url=$SLOW_BASE; n=$SLOW_N; }
  case $1 in
    bare)
      local full=$FAST
      [ "$2" = fast ] || full=$SLOW
      run "endpoint=$2 run=$3" "$BUILD_DIR/bare_multi" "$full" "$n" "$LIMIT" ;;
    bare-shards)    # the bare loop with the engine's connection caches of 64
      run "endpoint=$2 run=$3" env LLMRETRY_BENCH_SHARDS=64 "$BUILD_DIR/bare_multi" "$FAST" "$n" \
        "$LIMIT" ;;
    baseline)
      run "" env LLMRETRY_BENCH_TREE="$TMP/baseline/python" "$PYTHON" "$ROOT/bench/bench_batch.py" \
        run callmany-nolog --tag @baseline --base-url "$url" --n "$n" --limit "$LIMIT" \
        --warmup "$PY_WARMUP" --run "$3" --endpoint "$2" ;;
    *)
      run "" "$PYTHON" "$ROOT/bench/bench_batch.py" run "$1" --base-url "$url" --n "$n" \
        --limit "$LIMIT" --warmup "$PY_WARMUP" --run "$3" --endpoint "$2" ;;
  esac
}

# ---- 3. interleaved runs, each client in a fresh process ------------------------
FASTC=(bare callmany-nolog callmany map callmany-nolog-gcoff)
# Past 64 in flight the engine spreads its connections over caches of 64
# (core/src/conn_shards.c); the bare loop doing the same is the fair ceiling.
[ "$LIMIT" -le 64 ] || FASTC+=(bare-shards)
[ -z "$BASELINE" ] || FASTC+=(baseline)
SLOWC=(bare callmany-nolog callmany)
log "== warming nginx (2,000 requests of the bare loop, not counted)"
"$BUILD_DIR/bare_multi" "$FAST" 2000 "$LIMIT" >/dev/null
LOADS=()
for r in $(seq "$RUNS"); do
  LOADS+=("$(cut -d' ' -f1 /proc/loadavg)")
  log "== round $r of $RUNS (load average ${LOADS[-1]}): $N requests, $LIMIT in flight, 0 ms server"
  # the order rotates from round to round, so no client always runs first
  k=$(( (r - 1) % ${#FASTC[@]} ))
  for c in "${FASTC[@]:k}" "${FASTC[@]:0:k}"; do one "$c" fast "$r"; done
  log "== round $r: $SLOW_N requests, $LIMIT in flight, 50 ms server"
  k=$(( (r - 1) % ${#SLOWC[@]} ))
  for c in "${SLOWC[@]:k}" "${SLOWC[@]:0:k}"; do one "$c" slow "$r"; done
done
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- 4. the tables -------------------------------------------------------------
echo
"$PYTHON" "$ROOT/bench/bench_batch.py" report "$RESULTS" --limit "$LIMIT" --title \
  "llmretry batch benchmark — $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores ($(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)), Python $("$PYTHON" -c 'import platform; print(platform.python_version())'), libcurl $(pkg-config --modversion libcurl 2>/dev/null || echo '?'), nginx $("$NGINX" -v 2>&1 | sed 's/.*\///') (1 worker), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')${BASELINE:+ (baseline $BASELINE)}. Load average (1/5/15 min) $LOAD0 before, $LOAD1 after; 1-min load at the start of each round: $(IFS=/; echo "${LOADS[*]}")."
