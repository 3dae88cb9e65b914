#!/usr/bin/env bash
# The streaming benchmark (issue 15): llmretry.stream_llm against the openai
# SDK's sync and async streaming and a bare libcurl SSE loop, all reading
# the same local SSE server (bench/sse_server.py, its own process) in one
# run: CPU per chunk, delay per chunk, memory per open stream, a slow
# consumer on a 50 MiB stream. See bench/README.md ("Streaming benchmark").
# Usage (from anywhere):  bash bench/run_stream.sh
#
# Knobs (environment): RUNS=3 CHUNKS=20000 PACED=500 EVERY_MS=20 STREAMS=1000
# BIG_MIB=50 PAUSE=1 SLOW_SLEEP_MS=4 LLMRETRY_STREAM_PORT=18091
# BUILD_DIR=build-bench PYTHON=python3
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
RUNS=${RUNS:-3}
CHUNKS=${CHUNKS:-20000}
PACED=${PACED:-500}
EVERY_MS=${EVERY_MS:-20}
STREAMS=${STREAMS:-1000}
BIG_MIB=${BIG_MIB:-50}
PAUSE=${PAUSE:-1}
SLOW_SLEEP_MS=${SLOW_SLEEP_MS:-4}
PORT=${LLMRETRY_STREAM_PORT:-18091}
BUILD_DIR=${BUILD_DIR:-build-bench}
PYTHON=${PYTHON:-python3}
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"

log() { printf '%s\n' "$*" >&2; }

# ---- 1. the peer (PyPI), the extension, the bare loop ------------------------
if ! "$PYTHON" -c 'import openai' 2>/dev/null; then
  log "== installing openai (pip)"
  "$PYTHON" -m pip install --quiet openai >&2
fi
log "== building the extension (make build-python)"
make --no-print-directory build-python PYTHON="$PYTHON" >/dev/null 2>&1 || {
  log "make build-python failed:"; make --no-print-directory build-python PYTHON="$PYTHON" >&2; exit 1; }
"$PYTHON" -c 'import llmretry' || { log "llmretry does not import"; exit 1; }
log "== building $BUILD_DIR/bare_sse"
mkdir -p "$BUILD_DIR"
DEPS=$(pkg-config --cflags --libs libcurl libcjson)
# shellcheck disable=SC2086
gcc -O2 -Wall -Wextra -o "$BUILD_DIR/bare_sse" bench/bare_sse.c $DEPS

# 1,000 open streams: a socket each, in the client and in the server.
ulimit -n "$(( STREAMS * 2 + 256 > 4096 ? STREAMS * 2 + 256 : 4096 ))" 2>/dev/null || {
  log "WARNING: cannot raise the open-file limit (ulimit -n $(ulimit -n)): the $STREAMS-stream runs may fail"; }

# ---- 2. the SSE server (its own process; stopped on exit) --------------------
TMP=$(mktemp -d "${TMPDIR:-/tmp}/llmretry-stream.XXXXXX")
SERVER_PID=""
stop() {
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$TMP"
}
trap stop EXIT
"$PYTHON" "$ROOT/bench/sse_server.py" --port "$PORT" --ready "$TMP/ready" 2>"$TMP/server.log" &
SERVER_PID=$!
for _ in $(seq 100); do [ -s "$TMP/ready" ] && break; sleep 0.05; done
[ -s "$TMP/ready" ] || { log "the SSE server did not start (port $PORT busy? set LLMRETRY_STREAM_PORT)"; cat "$TMP/server.log" >&2; exit 1; }
BASE="http://127.0.0.1:$PORT/v1"
URL="$BASE/chat/completions"
log "== SSE server on port $PORT (pid $SERVER_PID), $(nproc) cores"
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
if awk -v l="${LOAD0%% *}" 'BEGIN {exit !(l > 0.5)}'; then
  log "WARNING: load average $LOAD0 before the run: other work shares these cores, figures will be noisy"
fi

RESULTS="$TMP/results.txt"
: >"$RESULTS"
run() {   # run RUN COMMAND...: keep its RESULT line, tagged with the run
  local r=$1 out
  shift
  if ! out=$("$@" 2>&1); then
    log "FAILED: $*"; printf '%s\n' "$out" >&2; exit 1
  fi
  printf '%s\n' "$out" | grep '^RESULT' | sed "s/\$/ run=$r/" | tee -a "$RESULTS" >&2
}
py() { "$PYTHON" "$ROOT/bench/bench_stream.py" "$@" --base-url "$BASE"; }
one() {   # one MEASURE CLIENT RUN
  case $1/$2 in
    cpu/bare)       run "$3" "$BUILD_DIR/bare_sse" cpu "$URL" "fast-$CHUNKS" fast-200 ;;
    cpu/bare-parse) run "$3" "$BUILD_DIR/bare_sse" cpu "$URL" "fast-$CHUNKS" fast-200 parse ;;
    latency/bare)   run "$3" "$BUILD_DIR/bare_sse" latency "$URL" "paced-$PACED-$EVERY_MS" ;;
    rss/bare)       run "$3" "$BUILD_DIR/bare_sse" rss "$URL" hold-10 \
                      "http://127.0.0.1:$PORT/release" "$STREAMS" ;;
    cpu/*)     run "$3" py cpu "$2" --chunks "$CHUNKS" ;;
    latency/*) run "$3" py latency "$2" --paced "$PACED" --every-ms "$EVERY_MS" ;;
    rss/*)     run "$3" py rss "$2" --streams "$STREAMS" ;;
    slow/*)    run "$3" py slow "$2" --big-mib "$BIG_MIB" --pause "$PAUSE" \
                 --slow-sleep-ms "$SLOW_SLEEP_MS" ;;
  esac
}
rotated() {   # rotated ROUND ITEM...: the items, starting at (ROUND-1) mod count
  local r=$1; shift
  local a=("$@") k=$(( (r - 1) % $# ))
  printf '%s\n' "${a[@]:k}" "${a[@]:0:k}"
}

# ---- 3. interleaved rounds, each client in a fresh process --------------------
CPUC=(bare bare-parse llmretry llmretry-text openai openai-async)
LATC=(bare llmretry openai openai-async)
RSSC=(bare llmretry openai-async)
SLOWC=(llmretry openai)
log "== warming the server (the prebuilt $CHUNKS-chunk answer; not counted)"
"$BUILD_DIR/bare_sse" cpu "$URL" "fast-$CHUNKS" fast-200 >/dev/null
LOADS=()
for r in $(seq "$RUNS"); do
  LOADS+=("$(cut -d' ' -f1 /proc/loadavg)")
  log "== round $r of $RUNS (load average ${LOADS[-1]})"
  for c in $(rotated "$r" "${CPUC[@]}"); do one cpu "$c" "$r"; done
  for c in $(rotated "$r" "${LATC[@]}"); do one latency "$c" "$r"; done
  for c in $(rotated "$r" "${RSSC[@]}"); do one rss "$c" "$r"; done
  for c in $(rotated "$r" "${SLOWC[@]}"); do one slow "$c" "$r"; done
done
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- 4. the tables ------------------------------------------------------------
echo
"$PYTHON" "$ROOT/bench/stream_report.py" "$RESULTS" --runs "$RUNS" --every-ms "$EVERY_MS" \
  --pause "$PAUSE" --title \
  "llmretry streaming benchmark — $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores ($(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)), Python $("$PYTHON" -c 'import platform; print(platform.python_version())'), libcurl $(pkg-config --modversion libcurl 2>/dev/null || echo '?'), openai $("$PYTHON" -c 'import openai; print(openai.__version__)'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'). Server: \`bench/sse_server.py\` (asyncio, its own process; its CPU is not counted), one HTTP chunk per SSE event. Load average (1/5/15 min) $LOAD0 before, $LOAD1 after; 1-min load at the start of each round: $(IFS=/; echo "${LOADS[*]}")."
