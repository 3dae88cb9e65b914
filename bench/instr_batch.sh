#!/usr/bin/env bash
# call_many's calling thread in instructions per item (callgrind, that
# thread alone; load-independent), with and without the default logger,
# and the cyclic GC's side: the objects it counts that a batch makes and
# keeps, per item, and each generation's collections over a batch of N_GC.
# A count is a whole process's less the same process without the batch
# (--no-batch: the client, the bodies), at N=2500 less at N=500, over
# 2,000 (what does not grow with N drops out). Usage: bash bench/instr_batch.sh
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
irefs() {   # irefs LOGGER N [--no-batch]
  valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$TMP/cg.%p" \
    "$PY" bench/instr_batch.py --base-url "$URL" --logger "$1" --n "$2" --limit "$LIMIT" \
    ${3:-} >/dev/null 2>&1
  local f
  f=$(ls "$TMP"/cg.*-01)
  sed -n 's/^summary: *//p' "$f"
  rm -f "$TMP"/cg.*
}
echo "| logger | calling thread, instructions an item | objects the GC counts, kept, an item | GC collections over $N_GC (gen 0/1/2) |"
echo "|---|---:|---:|---:|"
a0=$(irefs none 500 --no-batch)
b0=$(irefs none 2500 --no-batch)
for lg in $LOGGERS; do
  a=$(( $(irefs "$lg" 500) - a0 ))
  b=$(( $(irefs "$lg" 2500) - b0 ))
  gcs=$("$PY" bench/instr_batch.py --base-url "$URL" --logger "$lg" --n "$N_GC" \
        --limit "$LIMIT" --gc-counts | sed -n 's/^GC //p')
  kept=${gcs%% *}
  colls=${gcs##*collections=}
  echo "| $lg | $(( (b - a) / 2000 )) | ${kept#kept=} | $colls |"
done
