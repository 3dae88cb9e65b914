#!/usr/bin/env bash
# llmretry.otel's overhead next to a peer's (issue 34): the official GenAI
# instrumentation of the openai SDK (opentelemetry-instrumentation-openai-v2)
# on the SDK's sync client, in one process with llmretry's call_many, on the
# same OpenTelemetry SDK providers, against the benchmarks' local nginx (0 ms
# endpoint). See bench/bench_otel_peer.py and bench/README.md.
# Usage: bash bench/run_otel_peer.sh > bench/results/otel_peer.md
# (the report in markdown on stdout, each batch's RESULT line on stderr)
# Knobs: N=20000 (llmretry's calls per batch) PEER_N=4000 (the SDK's: a call
# costs it ~30x the CPU) LIMIT=64 (call_many's) PEER_WORKERS="64 1" (the
# peer's pool sizes, a batch each) ROUNDS=5 CENSUS=200 COUNT=500 (calls counted
# in bytecodes, 0: none) LLMRETRY_BENCH_PORT=18094
# BUILD_DIR=build-bench PYTHON=python3 VENV=$BUILD_DIR/venv-otel. About 7
# minutes on 2 cores with the defaults.
#
# The peer and the OpenTelemetry SDK are pip-installed into a venv of the
# same interpreter (as bench/peer_venv.sh does for the async peers), pinned
# to versions that work together: the instrumentation 2.4b0 imports
# util-genai's `instruments` module, which 1.2b0 and later dropped, and
# imports httpx although the openai SDK now runs on httpx2. None of it is a
# dependency of llmretry.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PORT=${LLMRETRY_BENCH_PORT:-18094}
PYTHON=${PYTHON:-python3}
BUILD_DIR=${BUILD_DIR:-build-bench}
VENV=${VENV:-$BUILD_DIR/venv-otel}
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
PINS=(
  "opentelemetry-sdk==1.45.2" "opentelemetry-api==1.45.2"
  "opentelemetry-instrumentation-openai-v2==2.4b0" "opentelemetry-util-genai==1.1b0"
  "opentelemetry-instrumentation==0.66b2" "opentelemetry-semantic-conventions==0.66b2"
  "openai==3.63.0" "httpx==0.29.0" "wrapt==2.5.2"
)
log() { printf '%s\n' "$*" >&2; }

# The venv, holding exactly these pins (bench/peer_venv.sh).
PEER_PKGS=("${PINS[@]}")
PEER_CHECK='
import sys, importlib.metadata as m
for pin in sys.argv[1:]:
    name, _, version = pin.partition("==")
    assert m.version(name) == version, pin
'
PEER_LOG=venv-otel-pip.log
# shellcheck source=bench/peer_venv.sh
. "$ROOT/bench/peer_venv.sh"
"$VPY" -c 'import llmretry.otel, opentelemetry.instrumentation.openai_v2, openai' || {
  log "llmretry, the instrumentation or openai does not import in $VPY"; exit 1; }

# shellcheck source=bench/nginx.sh
. "$ROOT/bench/nginx.sh"
bench_nginx_install
bench_nginx_start "$PORT"     # sets TMP, FAST, SLOW; stops nginx on exit
log "== load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$VPY" bench/bench_otel_peer.py --base-url "${FAST%/chat/completions}" \
  --n "${N:-20000}" --peer-n "${PEER_N:-4000}" --limit "${LIMIT:-64}" \
  --peer-workers "${PEER_WORKERS:-64 1}" --rounds "${ROUNDS:-5}" --census "${CENSUS:-200}" \
  --count "${COUNT:-500}"
