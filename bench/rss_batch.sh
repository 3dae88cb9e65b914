#!/usr/bin/env bash
# Peak RSS of `llmretry batch` on a big input (issue 18, item 5): N lines
# against the local nginx of bench/nginx.sh, then the same stopped half-way
# (SIGINT) and resumed; bench/rss_batch.py measures each child's own peak
# (os.wait4) and checks the results file (N lines, in input order, all ok).
# Not run by make test. Usage (from anywhere):  bash bench/rss_batch.sh
#
# Knobs (environment): N=1000000 LIMIT=64 MAX_MB=150 LLMRETRY_BENCH_PORT=18089
# PYTHON=python3 RESUME=1 (0: skip the resumed run)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
N=${N:-1000000}
LIMIT=${LIMIT:-64}
MAX_MB=${MAX_MB:-150}
RESUME=${RESUME:-1}
PORT=${LLMRETRY_BENCH_PORT:-18089}
PYTHON=${PYTHON:-python3}

log() { printf '%s\n' "$*" >&2; }

# shellcheck source=bench/nginx.sh
. "$ROOT/bench/nginx.sh"
bench_nginx_install
log "== building the extension (make build-python)"
make --no-print-directory build-python PYTHON="$PYTHON" >/dev/null 2>&1 || {
  log "make build-python failed:"
  make --no-print-directory build-python PYTHON="$PYTHON" >&2; exit 1; }
bench_nginx_start "$PORT"     # sets TMP (removed on exit)
BASE="http://127.0.0.1:$PORT/v1"

log "== llmretry batch, $N lines, --limit $LIMIT"
mkdir -p "$TMP/run1"
"$PYTHON" bench/rss_batch.py --lines "$N" --limit "$LIMIT" --base-url "$BASE" \
  --max-mb "$MAX_MB" --folder "$TMP/run1"
if [ "$RESUME" = 1 ]; then
  log "== the same, stopped half-way, then --resume"
  mkdir -p "$TMP/run2"
  "$PYTHON" bench/rss_batch.py --lines "$N" --limit "$LIMIT" --base-url "$BASE" \
    --max-mb "$MAX_MB" --folder "$TMP/run2" --resume-half
fi
