#!/usr/bin/env bash
# The asyncio benchmark (issue 17): llmretry's acall_llm / acall_many next to
# AsyncOpenAI (httpx2 and aiohttp transports), raw httpx, httpx2 and aiohttp,
# and llmretry's sync call_many, at several concurrencies, all against one
# local nginx (0 ms endpoint). See bench/README.md ("asyncio benchmark").
# Usage (from anywhere):  bash bench/run_async.sh
#
# Knobs (environment): N=20000 (items per llmretry run) PEER_N=2000 (items per
# peer run: they are 5-200x slower) CONCS="64 256 1024" RUNS=3 WARMUP=-1
# (items before each window; -1: max(C, 1000)) SHAPE=workers (or gather: one
# task per item under a Semaphore(C)) CLIENTS="<subset of the rows>"
# ENDPOINT=fast (0 ms; slow: 50 ms) LLMRETRY_BENCH_PORT=18089 BUILD_DIR=build-bench PYTHON=python3
# VENV=$BUILD_DIR/venv-async (the peers are pip-installed there, not into PYTHON)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
N=${N:-20000}
PEER_N=${PEER_N:-2000}
CONCS=${CONCS:-"64 256 1024"}
RUNS=${RUNS:-3}
WARMUP=${WARMUP:--1}
SHAPE=${SHAPE:-workers}
PORT=${LLMRETRY_BENCH_PORT:-18089}
BUILD_DIR=${BUILD_DIR:-build-bench}
PYTHON=${PYTHON:-python3}
VENV=${VENV:-$BUILD_DIR/venv-async}
ALL_CLIENTS="llmretry-acall llmretry-acall-many llmretry-call-many openai-httpx openai-aiohttp openai-llmretry httpx httpx2 aiohttp"
read -r -a CLIENTS <<<"${CLIENTS:-$ALL_CLIENTS}"
read -r -a CS <<<"$CONCS"
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"

log() { printf '%s\n' "$*" >&2; }

# ---- 1. the extension (with PYTHON) and the peers (PyPI, in a venv) ---------
. "$ROOT/bench/peer_venv.sh"
if ! "$VPY" -c 'import llmretry; llmretry.Client.acall_llm; llmretry.Client.acall_many' 2>/dev/null; then
  log "WARNING: this llmretry has no acall_llm/acall_many: their rows are skipped"
  KEEP=()
  for c in "${CLIENTS[@]}"; do case $c in llmretry-acall*) ;; *) KEEP+=("$c") ;; esac; done
  CLIENTS=("${KEEP[@]}")
fi

# 1,024 sockets per client process plus nginx's own
MAXC=$(printf '%s\n' "${CS[@]}" | sort -n | tail -1)
ulimit -n "$(( MAXC * 2 + 256 > 4096 ? MAXC * 2 + 256 : 4096 ))" 2>/dev/null || {
  log "WARNING: cannot raise the open-file limit (ulimit -n $(ulimit -n)): C=$MAXC may fail"; }

# ---- 2. nginx on loopback (bench/nginx.sh: install, start, stop on exit) ----
# shellcheck source=bench/nginx.sh
. "$ROOT/bench/nginx.sh"
bench_nginx_install
bench_nginx_start "$PORT"     # sets TMP, FAST, SLOW
# ENDPOINT=slow: nginx's 50 ms endpoint instead of the 0 ms one.
case ${ENDPOINT:-fast} in
  fast) BASE="http://127.0.0.1:$PORT/v1" ;;
  slow) BASE="http://127.0.0.1:$PORT/slow/v1" ;;
  *) log "ENDPOINT must be fast or slow"; exit 2 ;;
esac
log "== nginx $("$NGINX" -v 2>&1 | sed 's/.*\///'), port $PORT, ulimit -n $(ulimit -n), $(nproc) cores"
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
if awk -v l="${LOAD0%% *}" 'BEGIN {exit !(l > 0.5)}'; then
  log "WARNING: load average $LOAD0 before the run: other work shares these cores, figures will be noisy"
fi

RESULTS="$TMP/results.txt"
: >"$RESULTS"
one() {   # one CLIENT C RUN: one fresh process, keep its RESULT line
  local n=$PEER_N out
  case $1 in llmretry-*) n=$N ;; esac
  if ! out=$(timeout 900 "$VPY" "$ROOT/bench/bench_async.py" run "$1" --base-url "$BASE" \
      --n "$n" --conc "$2" --warmup "$WARMUP" --run "$3" --shape "$SHAPE"); then
    log "FAILED: $1 C=$2 run $3"; printf '%s\n' "$out" >&2; exit 1
  fi
  printf '%s\n' "$out" | grep '^RESULT' | tee -a "$RESULTS" >&2
}

# ---- 3. interleaved rounds, each client in a fresh process -------------------
log "== warming nginx (2,000 requests, not counted)"
"$VPY" "$ROOT/bench/bench_async.py" run aiohttp --base-url "$BASE" --n 2000 --conc 64 \
  --warmup 0 >/dev/null
LOADS=()
for r in $(seq "$RUNS"); do
  LOADS+=("$(cut -d' ' -f1 /proc/loadavg)")
  for c in "${CS[@]}"; do
    log "== round $r of $RUNS (load average ${LOADS[-1]}), C=$c"
    # the order rotates from round to round, so no client always runs first
    k=$(( (r - 1) % ${#CLIENTS[@]} ))
    for cl in "${CLIENTS[@]:k}" "${CLIENTS[@]:0:k}"; do one "$cl" "$c" "$r"; done
  done
done
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- 4. the tables -----------------------------------------------------------
vers=$("$VPY" -c 'from importlib.metadata import version as v
print(", ".join(f"{p} {v(p)}" for p in ("openai", "httpx2", "httpx", "aiohttp", "pydantic")))')
echo
"$VPY" "$ROOT/bench/bench_async.py" report "$RESULTS" --title \
  "llmretry asyncio benchmark — $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores ($(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)), Python $("$VPY" -c 'import platform; print(platform.python_version())'), libcurl $(pkg-config --modversion libcurl 2>/dev/null || echo '?'), nginx $("$NGINX" -v 2>&1 | sed 's/.*\///') (1 worker), $vers, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'). N=$N items per llmretry run, PEER_N=$PEER_N per peer run, warm-up $WARMUP (-1: max(C, 1000)) items first, shape $SHAPE, endpoint ${ENDPOINT:-fast}. Load average (1/5/15 min) $LOAD0 before, $LOAD1 after; 1-min load at the start of each round: $(IFS=/; echo "${LOADS[*]}")."
