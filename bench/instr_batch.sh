#!/usr/bin/env bash
# call_many's calling thread in instructions per item (callgrind, that
# thread alone; load-independent), with and without the default logger,
# and the cyclic GC's side: GC-tracked objects left per item and the
# collections of each generation over a batch of N_GC. Each count is of a
# whole process at N=2500 less N=500, over 2,000 (what does not grow with
# N drops out). Usage: bash bench/instr_batch.sh
# (knobs: LOGGERS="none default" LIMIT=64 N_GC=20000 LLMRETRY_BENCH_PORT=18094)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PORT=${LLMRETRY_BENCH_PORT:-18094}
LOGGERS=${LOGGERS:-none default}
LIMIT=${LIMIT:-64}
N_GC=${N_GC:-20000}
log() { printf '%s\n' "$*" >&2; }
# shellcheck source=bench/nginx.sh
. "$ROOT/bench/nginx.sh"
bench_nginx_install
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind >&2; }
make -s build-python >&2
bench_nginx_start "$PORT"
PY=$(python3 -c 'import sys; print(sys.executable)')
export PYTHONHASHSEED=0
URL=${FAST%/chat/completions}
# The calling thread's instructions: callgrind's file of thread 1.
irefs() {
  valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$TMP/cg.%p" \
    "$PY" bench/instr_batch.py --base-url "$URL" --logger "$1" --n "$2" --limit "$LIMIT" \
    >/dev/null 2>&1
  local f
  f=$(ls "$TMP"/cg.*-01)
  sed -n 's/^summary: *//p' "$f"
  rm -f "$TMP"/cg.*
}
echo "| logger | calling thread, instructions an item | GC-tracked objects left an item | GC collections over $N_GC (gen 0/1/2) |"
echo "|---|---:|---:|---:|"
for lg in $LOGGERS; do
  a=$(irefs "$lg" 500)
  b=$(irefs "$lg" 2500)
  gcs=$("$PY" bench/instr_batch.py --base-url "$URL" --logger "$lg" --n "$N_GC" \
        --limit "$LIMIT" --gc-counts | sed -n 's/^GC //p')
  tracked=${gcs%% *}
  colls=${gcs##*collections=}
  echo "| $lg | $(( (b - a) / 2000 )) | ${tracked#tracked=} | $colls |"
done
