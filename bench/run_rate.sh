#!/usr/bin/env bash
# The rate-limit benchmark (issue 18): a batch against the mock server
# enforcing a request and a token limit (llmretry.testing, a fresh process per
# run): llmretry's call_many with rpm/tpm configured and with the limits
# learned from the headers, the openai SDK's retries in threads, and a
# cookbook-style asyncio processor (bench/clients/cookbook_processor.py).
# See bench/README.md ("Rate-limit benchmark"). Usage (from anywhere):
#   bash bench/run_rate.sh > bench/results/rate.md
#
# Knobs (environment): N=3000 BLOCK=375 RPW=100 TPW=16667 WINDOW_MS=1000
# (requests and tokens per sliding window: 6,000 and 1,000,020 a minute)
# LATENCY_MS=100 LIMIT=64 RUNS=3 CAP_S=60 (the peers start nothing after it:
# the cookbook processor would take many minutes)
# CLIENTS="llmretry-rpm llmretry-learned openai-threads openai-llmretry cookbook
# llmretry-rpm-noheaders" (the last a diagnostic: the configured limits with a
# mock that sends no x-ratelimit-* headers) BUILD_DIR=build-bench
# PYTHON=python3 VENV=$BUILD_DIR/venv-async (openai, aiohttp: the venv of
# bench/run_async.sh, made here when missing)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
N=${N:-3000}
BLOCK=${BLOCK:-375}
RPW=${RPW:-100}
TPW=${TPW:-16667}
WINDOW_MS=${WINDOW_MS:-1000}
LATENCY_MS=${LATENCY_MS:-100}
LIMIT=${LIMIT:-64}
RUNS=${RUNS:-3}
CAP_S=${CAP_S:-60}
BUILD_DIR=${BUILD_DIR:-build-bench}
PYTHON=${PYTHON:-python3}
VENV=${VENV:-$BUILD_DIR/venv-async}
read -r -a CLIENTS <<<"${CLIENTS:-llmretry-rpm llmretry-learned openai-threads openai-llmretry cookbook llmretry-rpm-noheaders}"
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"

log() { printf '%s\n' "$*" >&2; }

# ---- 1. the extension (with PYTHON) and the peers (PyPI, in a venv) ---------
. "$ROOT/bench/peer_venv.sh"
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
if awk -v l="${LOAD0%% *}" 'BEGIN {exit !(l > 0.5)}'; then
  log "WARNING: load average $LOAD0 before the run: other work shares these cores, figures will be noisy"
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
RESULTS="$TMP/results.txt"
: >"$RESULTS"
keep() {   # keep COMMAND...: run it, keep its RESULT line
  local out
  if ! out=$("$@"); then
    log "FAILED: $*"; printf '%s\n' "$out" >&2; exit 1
  fi
  printf '%s\n' "$out" | grep '^RESULT' | tee -a "$RESULTS" >&2
}

# ---- 2. the mock's own ceiling, then interleaved rounds (fresh processes) ---
log "== the mock without limits"
keep "$VPY" "$ROOT/bench/bench_rate.py" mockcap --limit "$LIMIT"
LOADS=()
for r in $(seq "$RUNS"); do
  LOADS+=("$(cut -d' ' -f1 /proc/loadavg)")
  log "== round $r of $RUNS (load average ${LOADS[-1]}): $N items, $LIMIT in flight"
  # the order rotates from round to round, so no client always runs first
  k=$(( (r - 1) % ${#CLIENTS[@]} ))
  for c in "${CLIENTS[@]:k}" "${CLIENTS[@]:0:k}"; do
    keep timeout 900 "$VPY" "$ROOT/bench/bench_rate.py" run "$c" --n "$N" --block "$BLOCK" \
      --rpw "$RPW" --tpw "$TPW" --window-ms "$WINDOW_MS" --latency-ms "$LATENCY_MS" \
      --limit "$LIMIT" --cap-s "$CAP_S" --run "$r"
  done
done
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- 3. the table -------------------------------------------------------------
vers=$("$VPY" -c 'from importlib.metadata import version as v
print(", ".join(f"{p} {v(p)}" for p in ("openai", "aiohttp")))')
echo
"$VPY" "$ROOT/bench/bench_rate.py" report "$RESULTS" --title \
  "llmretry rate-limit benchmark — $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores ($(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)), Python $("$VPY" -c 'import platform; print(platform.python_version())'), libcurl $(pkg-config --modversion libcurl 2>/dev/null || echo '?'), $vers, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'). The mock answers after $LATENCY_MS ms; peers capped at $CAP_S s. Load average (1/5/15 min) $LOAD0 before, $LOAD1 after; 1-min load at the start of each round: $(IFS=/; echo "${LOADS[*]}")."
