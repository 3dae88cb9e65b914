#!/usr/bin/env bash
# The OpenTelemetry overhead benchmark (issue 34): call_many of N calls with
# llmretry.otel on and off, against the benchmarks' local nginx (0 ms
# endpoint). Usage: bash bench/run_otel.sh > bench/results/otel.md
# (the report in markdown on stdout, each batch's RESULT line on stderr;
# knobs: N=20000 LIMIT=64 ROUNDS=3 MODES=all LLMRETRY_BENCH_PORT=18092 PYTHON=python3;
# the report splits the CPU by thread and makes the SDK's floor from the calls
# a batch item made: see bench/bench_otel.py)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PORT=${LLMRETRY_BENCH_PORT:-18092}
PYTHON=${PYTHON:-python3}
log() { printf '%s\n' "$*" >&2; }
# shellcheck source=bench/nginx.sh
. "$ROOT/bench/nginx.sh"
bench_nginx_install
make -s build-python >&2
bench_nginx_start "$PORT"
"$PYTHON" bench/bench_otel.py --base-url "${FAST%/chat/completions}" \
  --n "${N:-20000}" --limit "${LIMIT:-64}" --rounds "${ROUNDS:-3}" \
  ${MODES:+--modes "$MODES"}
