#!/usr/bin/env bash
# The openai SDK on llmretry's engine (issue 30): AsyncOpenAI over
# llmretry.httpx2.AsyncTransport next to AsyncOpenAI with its default
# transport (httpx2) and with aiohttp, at C=64 and C=256, against nginx's
# 0 ms and 50 ms endpoints: req/s and CPU per request, each row a fresh
# process, rounds interleaved (bench/run_async.sh does the work).
# Usage: bash bench/run_sdk.sh > bench/results/sdk.md
# Knobs: PEER_N (items per run, default 2000), RUNS (default 3), CONCS.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CLIENTS="openai-httpx openai-aiohttp openai-llmretry"
export CONCS=${CONCS:-"64 256"}
for endpoint in fast slow; do
  echo "## Endpoint: $endpoint ($([ $endpoint = fast ] && echo 0 || echo 50) ms)"
  echo
  ENDPOINT=$endpoint bash "$ROOT/bench/run_async.sh"
  echo
done
