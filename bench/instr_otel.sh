#!/usr/bin/env bash
# llmretry.otel's share with the SDK in instructions (cachegrind, every
# thread; load-independent), beside run_otel.sh's CPU times. Each mode of
# bench/instr_otel.py runs at N=500 and N=2500 against the benchmarks' local
# nginx; the difference over 2,000 is a call's. Usage: bash bench/instr_otel.sh
# (knobs: MODES="off record on sdk harness" LLMRETRY_BENCH_PORT=18093; valgrind
# is Debian's package: installed here when missing). ~5 minutes.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PORT=${LLMRETRY_BENCH_PORT:-18093}
MODES=${MODES:-off record on sdk harness}
log() { printf '%s\n' "$*" >&2; }
# shellcheck source=bench/nginx.sh
. "$ROOT/bench/nginx.sh"
bench_nginx_install
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind >&2; }
make -s build-python >&2
bench_nginx_start "$PORT"
# The interpreter itself, not a launcher script (pyenv's shims are bash).
PY=$(python3 -c 'import sys; print(sys.executable)')
export PYTHONHASHSEED=0
irefs() {
  valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \
    "$PY" bench/instr_otel.py --base-url "${FAST%/chat/completions}" --mode "$1" --n "$2" 2>&1 \
    | sed -n 's/.*I *refs: *//p' | tr -d ,
}
declare -A per
for mode in $MODES; do
  a=$(irefs "$mode" 500)
  b=$(irefs "$mode" 2500)
  per[$mode]=$(( (b - a) / 2000 ))
  log "$mode: ${per[$mode]} instructions a call"
done
echo "| mode | instructions a call |"
echo "|---|---:|"
for mode in $MODES; do echo "| \`$mode\` | ${per[$mode]} |"; done
if [ -n "${per[on]:-}" ] && [ -n "${per[off]:-}" ] && [ -n "${per[sdk]:-}" ] && [ -n "${per[harness]:-}" ]; then
  echo
  echo "llmretry's share with the SDK, \`on\` less \`off\` less the SDK alone (\`sdk\` less its replay loop, \`harness\`): $(( per[on] - per[off] - per[sdk] + per[harness] )) instructions a call (the SDK alone: $(( per[sdk] - per[harness] )))."
fi
