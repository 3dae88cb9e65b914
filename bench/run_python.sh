#!/usr/bin/env bash
# The Python benchmark: llmretry (call_llm, map_with_concurrency) against the
# openai SDK and httpx + tenacity, all talking to one local nginx (0 ms
# endpoint). See bench/README.md. Usage (from anywhere):
#   bash bench/run_python.sh
#
# Knobs (environment): N=2000 CONC=32 WARMUP=1000 RUNS=3 LLMRETRY_BENCH_PORT=18089
# PYTHON=python3
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
N=${N:-2000}
CONC=${CONC:-32}
WARMUP=${WARMUP:-1000}
RUNS=${RUNS:-3}
PORT=${LLMRETRY_BENCH_PORT:-18089}
PYTHON=${PYTHON:-python3}
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"

log() { printf '%s\n' "$*" >&2; }

# ---- 1. the peers (PyPI) and the extension --------------------------------
if ! "$PYTHON" -c 'import openai, httpx, tenacity' 2>/dev/null; then
  log "== installing openai httpx tenacity (pip)"
  "$PYTHON" -m pip install --quiet openai httpx tenacity >&2
fi
log "== building the extension (make build-python)"
make --no-print-directory build-python PYTHON="$PYTHON" >/dev/null 2>&1 || {
  log "make build-python failed:"; make --no-print-directory build-python PYTHON="$PYTHON" >&2; exit 1; }
"$PYTHON" -c 'import llmretry' || { log "llmretry does not import"; exit 1; }

# ---- 2. nginx on loopback (bench/nginx.sh: install, start, stop on exit) ----
# shellcheck source=bench/nginx.sh
. "$ROOT/bench/nginx.sh"
bench_nginx_install
bench_nginx_start "$PORT"     # sets TMP, FAST, SLOW
BASE="http://127.0.0.1:$PORT/v1"
log "== nginx $("$NGINX" -v 2>&1 | sed 's/.*\///'), port $PORT, $(nproc) cores"
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
if awk -v l="${LOAD0%% *}" 'BEGIN {exit !(l > 0.5)}'; then
  log "WARNING: load average $LOAD0 before the run: other work shares these cores, figures will be noisy"
fi

RESULTS="$TMP/results.txt"
: >"$RESULTS"
run() {   # run COMMAND...: keep its RESULT line
  local out
  if ! out=$("$@"); then
    log "FAILED: $*"; printf '%s\n' "$out" >&2; exit 1
  fi
  printf '%s\n' "$out" | grep '^RESULT' | tee -a "$RESULTS" >&2
}
one() {   # one CLIENT MODE RUN
  run "$PYTHON" "$ROOT/bench/bench_python.py" run "$1" "$2" --base-url "$BASE" \
    --n "$N" --conc "$CONC" --warmup "$WARMUP" --run "$3"
}

# ---- 3. interleaved runs, each client in a fresh process ---------------------
SEQ=(llmretry llmretry-nolog openai httpx-tenacity)
CON=(llmretry llmretry-nolog llmretry-callmany openai httpx-tenacity)
log "== $RUNS runs: $N sequential calls, then $N items at concurrency $CONC, each after $WARMUP warm-up items"
for r in $(seq "$RUNS"); do
  # the order rotates from run to run, so no client always runs first
  k=$(( (r - 1) % ${#SEQ[@]} ))
  for c in "${SEQ[@]:k}" "${SEQ[@]:0:k}"; do one "$c" seq "$r"; done
  k=$(( (r - 1) % ${#CON[@]} ))
  for c in "${CON[@]:k}" "${CON[@]:0:k}"; do one "$c" conc "$r"; done
done
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- 4. the tables -----------------------------------------------------------
echo
"$PYTHON" "$ROOT/bench/bench_python.py" report "$RESULTS" --title \
  "llmretry Python benchmark — $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores ($(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)), Python $("$PYTHON" -c 'import platform; print(platform.python_version())'), libcurl $(pkg-config --modversion libcurl 2>/dev/null || echo '?'), nginx $("$NGINX" -v 2>&1 | sed 's/.*\///') (1 worker), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'). Load average (1/5/15 min) $LOAD0 before, $LOAD1 after."
