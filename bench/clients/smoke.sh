#!/usr/bin/env bash
# Smoke test of the benchmark clients (bench/clients/README.md): installs
# what they need (setup.sh), starts the bench nginx (bench/nginx.sh) and runs
# every client of clients.json once at C=8, N=200 and once at C=1024,
# N=2000 against the 0 ms endpoint, checking that each exits 0 and that its
# last stdout line is the contract's JSON with ok == N. Then every client
# once against a path nginx answers 404, checking that all its requests are
# counted as failed (so the checks above can fail). Last, each client at
# C=1024 against nginx's slow endpoint turned to 10 s, checking with nginx's
# stub_status that 1,024 requests were in flight at once (no pool limit
# below C; 10 s because a CPU-heavy client on a busy machine needs seconds
# to send 1,024). Then, against the project's mock server (llmretry.testing),
# that every client with retries (all but bare_multi and wrk) retries: each
# of 3 requests gets a 503 first and must succeed, the server seeing 6.
# Not part of `make test`; about 8 minutes on 2 cores.
#
#   bash bench/clients/smoke.sh
#
# Knobs: LLMRETRY_SMOKE_PORT=18091 CASES=8x200,1024x2000 ONLY=id,id
# INFLIGHT=1024 (0: skip the last part) PYTHON=python3
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
PORT=${LLMRETRY_SMOKE_PORT:-18091}
CASES=${CASES:-8x200,1024x2000}
ONLY=${ONLY:-}
INFLIGHT=${INFLIGHT:-1024}
PYTHON=${PYTHON:-python3}
log() { printf '%s\n' "$*" >&2; }

# shellcheck source=bench/nginx.sh
. "$ROOT/bench/nginx.sh"
bench_nginx_install
bash "$ROOT/bench/clients/setup.sh"
bench_nginx_start "$PORT"     # sets TMP; stops nginx on exit
log "== nginx on 127.0.0.1:$PORT, load average $(cut -d' ' -f1-3 /proc/loadavg)"

status=0
log "== every client, cases $CASES (0 ms endpoint)"
"$PYTHON" bench/clients/smoke.py --url "http://127.0.0.1:$PORT/v1" --cases "$CASES" \
  --only "$ONLY" || status=1
log "== every client against a 404 endpoint: every request must count as failed"
"$PYTHON" bench/clients/smoke.py --url "http://127.0.0.1:$PORT/no-such/v1" --cases 8x20 \
  --warmup 0 --only "$ONLY" --expect-fail || status=1
if [ "$INFLIGHT" -gt 0 ]; then
  # The slow endpoint answers after 10 s instead of 50 ms (this run's copy of
  # the config, reloaded): long enough for every client to have C out.
  sed -i 's/echo_sleep 0\.05;/echo_sleep 10;/' "$TMP/nginx.conf"
  "$NGINX" -p "$TMP/" -e "$TMP/error.log" -c "$TMP/nginx.conf" -s reload
  sleep 1
  t0=$(date +%s)
  curl -fsS -o /dev/null -X POST -d '{}' "http://127.0.0.1:$PORT/slow/v1/chat/completions"
  [ $(( $(date +%s) - t0 )) -ge 8 ] || { log "smoke: nginx did not reload with a 10 s sleep"; exit 1; }
  log "== every client at C=$INFLIGHT against a 10 s endpoint: $INFLIGHT requests in flight at once?"
  "$PYTHON" bench/clients/smoke.py --url "http://127.0.0.1:$PORT/slow/v1" \
    --cases "${INFLIGHT}x${INFLIGHT}" --warmup 0 --only "$ONLY" \
    --status-url "http://127.0.0.1:$PORT/status" || status=1
fi

log "== every client with retries against the mock server: 3 requests, each failing once"
PYTHONPATH="$ROOT/python" "$PYTHON" -m llmretry.testing --port 0 >"$TMP/mock.port" &
MOCK_PID=$!
trap 'kill "$MOCK_PID" 2>/dev/null || true; bench_nginx_stop' EXIT
for _ in $(seq 100); do [ -s "$TMP/mock.port" ] && break; sleep 0.1; done
MOCK_PORT=$(head -1 "$TMP/mock.port")
[ -n "$MOCK_PORT" ] || { log "smoke: the mock server did not start"; exit 1; }
"$PYTHON" bench/clients/smoke.py --retry-mock "http://127.0.0.1:$MOCK_PORT" --only "$ONLY" ||
  status=1

if [ "$status" -eq 0 ]; then log "smoke: all clients passed"; else log "smoke: FAILED"; fi
exit "$status"
