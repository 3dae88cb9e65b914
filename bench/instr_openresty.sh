#!/usr/bin/env bash
# The transport "cosocket"'s per-call path outside nginx in instructions a
# call (callgrind; load-independent), for comparing commits on a machine too
# noisy for bench/run_openresty.sh to tell a few per cent: the whole LuaJIT
# process at N=3000 less at N=1000, over 2,000 (start-up drops out), RUNS
# times (LuaJIT seeds its string hash per process: a run's count varies by
# up to ~1k). bench/openresty_path.lua is the loop. Usage:
#   bash bench/instr_openresty.sh               (this checkout)
# Knobs: RUNS=3 WINDOW=500 BASELINE=<commit> (also that commit's module,
# built from `git archive`, its counts on a second line).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
RUNS=${RUNS:-3}
WINDOW=${WINDOW:-500}
BASELINE=${BASELINE:-}
log() { printf '%s\n' "$*" >&2; }
for tool in valgrind luajit; do
  command -v "$tool" >/dev/null || {
    log "== installing valgrind luajit2"; apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind luajit2 >&2; break; }
done
TMP=$(mktemp -d "${TMPDIR:-/tmp}/llmretry-instr.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
build() { # repo: the LuaJIT module, when stale
  local so="$1/build-lua/5.1/lib/lua/5.1/llmretry/core.so"
  if [ ! -f "$so" ] || [ -n "$(cd "$1" && find bindings/lua core/src core/include rockspecs lua -type f -newer "$so" | head -n 1)" ]; then
    log "== building the Lua module in $1 (tools/lua-test.sh --build-only)"
    (cd "$1" && tools/lua-test.sh --build-only >&2)
  fi
}
count() { # repo n -> instructions of the whole run
  local t="$1/build-lua/5.1"
  LUA_PATH="$t/share/lua/5.1/?.lua;$t/share/lua/5.1/?/init.lua;;" LUA_CPATH="$t/lib/lua/5.1/?.so;;" \
    valgrind --tool=callgrind --callgrind-out-file="$TMP/cg" luajit "$ROOT/bench/openresty_path.lua" \
    "$2" "$WINDOW" >/dev/null 2>"$TMP/err" || { cat "$TMP/err" >&2; exit 1; }
  sed -n 's/^summary: *//p' "$TMP/cg"
}
per_call() { # repo -> "c1/c2/..." instructions a call
  local out="" r a b
  for r in $(seq "$RUNS"); do
    a=$(count "$1" 1000)
    b=$(count "$1" 3000)
    out+="${out:+/}$(( (b - a) / 2000 ))"
  done
  echo "$out"
}
build "$ROOT"
echo "| module | instructions a call (runs) |"
echo "|---|---|"
echo "| this checkout ($(git rev-parse --short HEAD 2>/dev/null || echo '?')) | $(per_call "$ROOT") |"
if [ -n "$BASELINE" ]; then
  mkdir -p "$TMP/baseline"
  git archive "$BASELINE" | tar -x -C "$TMP/baseline"
  build "$TMP/baseline"
  echo "| $BASELINE | $(per_call "$TMP/baseline") |"
fi
