#!/usr/bin/env bash
# Make every benchmark client of bench/clients/clients.json runnable on a
# fresh Debian 12/13 machine; quiet and idempotent (a second run only checks).
#
#   bash bench/clients/setup.sh
#
# - Debian packages, when missing: wrk, Lua 5.4 and LuaJIT with headers and
#   luarocks (luajit2 / libluajit2-5.1-dev, not luajit: see tools/lua-test.sh),
#   the C toolchain and libcurl/cJSON headers, GNU time (smoke.py takes each client's peak RSS from it).
# - Python packages, when missing: openai with its aiohttp extra, httpx,
#   tenacity, aiohttp (pip, as tools/ensure-deps.sh does).
# - The Python extension (make build-python) when it is not built.
# - build-bench/bare_multi from bench/bare_multi.c.
# - The Lua module for Lua 5.4 and LuaJIT (5.1 ABI), with the luarocks command
#   of tools/lua-test.sh, into build-bench/lua/5.4 and build-bench/lua/5.1,
#   plus the benchclock helper (bench/clients/lua_clock.c) next to each. The
#   build runs in a scratch copy of the sources: luarocks leaves objects next
#   to them, and other work in this tree must not see those.
# Rebuilds happen only when a source is newer than what was built.
# Knobs: PYTHON=python3 BUILD_DIR=build-bench
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-python3}
BUILD_DIR=${BUILD_DIR:-build-bench}
log() { printf 'clients/setup: %s\n' "$*" >&2; }
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo

# ---- Debian packages -----------------------------------------------------------
debs=(gcc make pkg-config libcurl4-openssl-dev libcjson-dev libhiredis-dev wrk lua5.4 liblua5.4-dev
      luajit2 libluajit2-5.1-dev liblua5.1-0-dev luarocks time)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# ---- Python packages -------------------------------------------------------------
# The aiohttp transport of the openai SDK is checked by making one (it raises
# without the extra), not only by importing aiohttp.
if ! "$PYTHON" - 2>/dev/null <<'EOF'
import aiohttp, httpx, openai, tenacity
openai.DefaultAioHttpClient()
EOF
then
  log "pip installing openai[aiohttp] httpx tenacity aiohttp"
  pip_log=$(mktemp)
  if ! "$PYTHON" -m pip install -q "openai[aiohttp]" httpx tenacity aiohttp >"$pip_log" 2>&1; then
    cat "$pip_log" >&2
    rm -f "$pip_log"
    log "pip install failed"
    exit 1
  fi
  rm -f "$pip_log"
fi

# ---- the Python extension ----------------------------------------------------------
if ! compgen -G "python/llmretry/_llmretry*.so" >/dev/null; then
  log "building the Python extension (make build-python)"
  build_log=$(mktemp)
  if ! make --no-print-directory build-python PYTHON="$PYTHON" >"$build_log" 2>&1; then
    cat "$build_log" >&2
    rm -f "$build_log"
    log "make build-python failed"
    exit 1
  fi
  rm -f "$build_log"
fi

# ---- bare_multi -----------------------------------------------------------------------
mkdir -p "$BUILD_DIR"
bare="$BUILD_DIR/bare_multi"
if [ ! -x "$bare" ] || [ bench/bare_multi.c -nt "$bare" ]; then
  log "building $bare"
  # shellcheck disable=SC2046
  gcc -O2 -Wall -Wextra -o "$bare.tmp" bench/bare_multi.c \
    $(pkg-config --cflags --libs libcurl libcjson) -lpthread
  mv -f "$bare.tmp" "$bare"   # a rename: a run of the old binary is not disturbed
fi

# ---- the Lua module and benchclock, per ABI ---------------------------------------------
lua_sources=(rockspecs/llmretry-scm-1.rockspec core/src/*.c core/src/*.h core/include/*.h
             bindings/lua/*.c lua/llmretry/*.lua)
stale() {   # stale TARGET SOURCE...: TARGET missing or older than a source
  local target=$1 s
  shift
  [ -e "$target" ] || return 0
  for s in "$@"; do [ "$s" -nt "$target" ] && return 0; done
  return 1
}
for v in 5.4 5.1; do
  tree="$ROOT/$BUILD_DIR/lua/$v"
  core_so="$tree/lib/lua/$v/llmretry/core.so"
  if stale "$core_so" "${lua_sources[@]}"; then
    log "building the Lua module for Lua $v into $BUILD_DIR/lua/$v"
    scratch=$(mktemp -d "${TMPDIR:-/tmp}/llmretry-lua.XXXXXX")
    mkdir -p "$scratch/bindings"
    cp -r core lua rockspecs "$scratch/"
    cp -r bindings/lua "$scratch/bindings/"
    if ! (cd "$scratch" && luarocks --lua-version "$v" make --tree "$tree" \
          rockspecs/llmretry-scm-1.rockspec) >"$scratch/build.log" 2>&1; then
      cat "$scratch/build.log" >&2
      log "luarocks --lua-version $v make failed"
      rm -rf "$scratch"
      exit 1
    fi
    rm -rf "$scratch"
    touch "$core_so"   # luarocks keeps the object's time; stale() compares to the build
  fi
  if stale "$tree/benchclock.so" bench/clients/lua_clock.c; then
    gcc -O2 -Wall -Wextra -shared -fPIC -I"/usr/include/lua$v" -o "$tree/benchclock.so" \
      bench/clients/lua_clock.c
  fi
done

# ---- check -------------------------------------------------------------------------------
PYTHONPATH="$ROOT/python" "$PYTHON" -c 'import llmretry' ||
  { log "llmretry does not import with PYTHONPATH=python"; exit 1; }
for lua in lua5.4 luajit; do
  command -v "$lua" >/dev/null || { log "$lua not found after the installs"; exit 1; }
done
command -v wrk >/dev/null || { log "wrk not found after the installs"; exit 1; }
