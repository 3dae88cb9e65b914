#!/usr/bin/env bash
# LLM calls inside a Ray Data job against one per-key limit (issue 29,
# bench/bench_cluster.py): llmretry.ray.map_calls with a shared budget,
# ray.data.llm's HTTP processor (qps = limit / actors) and a hand-written
# map_batches UDF with the openai SDK, 3,000 rows on 2 actors. Ray Data, the
# openai SDK and aiohttp (ray.data.llm's) come from tools/ensure-deps.sh and
# pip; the extension is built in place and found through PYTHONPATH (the
# actors' too). Prints markdown; about 3 minutes on 2 cores. Usage:
#   bash bench/run_cluster.sh > bench/results/cluster.md
# It runs twice: against the limit alone, then with an outage in the middle
# (503s for OUTAGE_MS from 5 s after the first request).
# Knobs (environment): ROWS=3000 RPS=100 LATENCY_MS=50 RUNS=1 OUTAGE_MS=8000
# CLIENTS=llmretry,ray-data-llm,openai-udf PYTHON=python3
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
log() { echo "$*" >&2; }
log "== building the extension (make build-python)"
make --no-print-directory build-python PYTHON="$PYTHON" >/dev/null
tools/ensure-deps.sh >&2
"$PYTHON" -c 'import ray.data.llm, openai, aiohttp' 2>/dev/null || {
  log "== installing openai and aiohttp (pip)"; "$PYTHON" -m pip install -q openai aiohttp >&2; }
echo "llmretry cluster benchmark — $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores" \
     "(load average $(cut -d' ' -f1-3 /proc/loadavg) before), commit $(git rev-parse --short HEAD)."
echo
for outage in 0 "${OUTAGE_MS:-8000}"; do
  PYTHONPATH="$PWD/python" "$PYTHON" bench/bench_cluster.py --rows "${ROWS:-3000}" \
    --rps "${RPS:-100}" --latency-ms "${LATENCY_MS:-50}" --runs "${RUNS:-1}" \
    --outage-ms "$outage" --clients "${CLIENTS:-llmretry,ray-data-llm,openai-udf}" \
    2>/dev/null | grep -v '^RESULT'
done
echo
echo "(load average $(cut -d' ' -f1-3 /proc/loadavg) after)"
