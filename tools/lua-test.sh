#!/usr/bin/env bash
# The Lua suite: build the binding with luarocks for Lua 5.4 and for LuaJIT
# (Lua 5.1 ABI) into local trees under build-lua/, then run tests/lua with
# busted under lua5.4 and under luajit, at the same time (each in three parts).
# Fails when any run fails.
#
# Installs what is missing with apt-get (as root, else sudo); lua-socket is
# for tests/lua/channel_spec.lua, which connects to a socket channel; openssl
# makes transport_spec.lua's test certificate (its TLS tests fail without it);
# lua-cjson is what json_spec.lua checks llmretry's null against. LuaJIT comes
# from luajit2 / libluajit2-5.1-dev, not luajit / libluajit-5.1-dev: those
# conflict with Debian's nginx Lua module (libnginx-mod-http-lua replaces libluajit-5.1-2). The mock
# server is the Python package's llmretry.testing, so the Python extension
# must be built (`make build-python`; done here when it is missing).
#
# tools/lua-test.sh --build-only: the same installs and builds, no busted run
# (tools/host-test.sh uses it for the LuaJIT build that Neovim and nginx load).
# tools/lua-test.sh --deps-only: just the installs (and the Python extension
# the mock server needs); tools/check.sh uses it before its own builds.
set -euo pipefail

build_only=0
deps_only=0
case "${1:-}" in
  --build-only) build_only=1 ;;
  --deps-only) deps_only=1 ;;
  "") ;;
  *) echo "usage: tools/lua-test.sh [--build-only|--deps-only]" >&2; exit 2 ;;
esac

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"

debs=(lua5.4 liblua5.4-dev luajit2 libluajit2-5.1-dev liblua5.1-0-dev luarocks lua-busted lua-socket
      curl libcurl4-openssl-dev libcjson-dev libhiredis-dev redis-server gcc make python3 openssl
      lua-cjson)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "lua-test: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The mock server needs the Python package importable, extension included.
if ! PYTHONPATH="$repo/python" python3 -c "import llmretry.testing" 2>/dev/null; then
  echo "lua-test: building the Python extension for the mock server"
  make --no-print-directory build-python
fi
if [ "$deps_only" -eq 1 ]; then exit 0; fi

# The rockspec lists the core's sources one by one: catch a new core/src/*.c
# that it does not build (it would only show as an undefined symbol at load).
# Checked before a build, not by --deps-only: the installs do not depend on it.
rockspec=rockspecs/llmretry-scm-1.rockspec
for src in core/src/*.c bindings/lua/*.c; do
  grep -q "\"$src\"" "$rockspec" || { echo "lua-test: $src is not listed in $rockspec" >&2; exit 1; }
done
# Likewise each pure-Lua module, under the name require() finds it by: the
# suite runs the installed tree, so an unlisted one would only fail there
# (the host tests read lua/ directly and would not notice).
for src in lua/llmretry/*.lua; do
  mod="$(basename "$src" .lua)"
  if [ "$mod" = init ]; then entry="llmretry = \"$src\""; else entry="[\"llmretry.$mod\"] = \"$src\""; fi
  grep -qF "$entry" "$rockspec" || { echo "lua-test: $src is not listed in $rockspec as: $entry" >&2; exit 1; }
done

# No module reads or writes a global it does not own: an undefined name (a
# local renamed away) would only fail when that line runs (an
# init_worker{max_in_flight=...} did, in nginx). luac lists every _ENV access.
allowed='^(require|type|pairs|ipairs|error|tostring|tonumber|setmetatable|getmetatable|rawget|rawset|rawequal|rawlen|pcall|xpcall|select|next|assert|print|unpack|load|collectgarbage|string|table|math|os|io|coroutine|debug|package|utf8|jit|bit|vim|ngx|_G)$'
for src in lua/llmretry/*.lua; do
  stray=$(luac5.4 -l -l -p "$src" | grep -oE '_ENV "[A-Za-z_][A-Za-z0-9_]*"' | cut -d'"' -f2 | sort -u \
          | grep -Ev "$allowed" || true)
  if [ -n "$stray" ]; then
    echo "lua-test: $src uses undefined globals: $(echo $stray)" >&2
    exit 1
  fi
done

# luarocks' builtin build leaves objects next to the sources and the module
# under ./llmretry/: clean them so they cannot be picked up by anything else.
clean_artefacts() {
  rm -f bindings/lua/*.o core/src/*.o
  rm -f llmretry/core.so
  rmdir llmretry 2>/dev/null || true
}
trap clean_artefacts EXIT

mkdir -p build-lua
for v in 5.4 5.1; do
  log="build-lua/build-$v.log"
  if ! luarocks --lua-version "$v" make --tree "build-lua/$v" "$rockspec" >"$log" 2>&1; then
    cat "$log" >&2
    echo "lua-test: luarocks --lua-version $v make failed (log: $log)" >&2
    exit 1
  fi
  clean_artefacts
  # The module exports its C API and luaopen only (issue 33 item 8): the
  # core's internal lr_* functions are hidden (core/src/internal.h).
  so="build-lua/$v/lib/lua/$v/llmretry/core.so"
  exported=$(nm -D --defined-only "$so" | awk '{print $3}')
  stray=$(echo "$exported" | grep -Ev '^(luaopen_|llmretry_)' || true)
  if [ -z "$exported" ] || [ -n "$stray" ]; then
    echo "lua-test: $so exports names beyond llmretry_* and luaopen_*: $(echo $stray | cut -c1-300)" >&2
    exit 1
  fi
  echo "lua-test: built llmretry for Lua $v into build-lua/$v"
done
if [ "$build_only" -eq 1 ]; then exit 0; fi

export LLMRETRY_REPO="$repo"
export PYTHONPATH="$repo/python${PYTHONPATH:+:$PYTHONPATH}"
unset OPENAI_API_KEY OPENAI_BASE_URL

# Package paths go in the environment: busted --lua re-runs itself through a
# shell without quoting, so --lpath/--cpath values cannot hold ';'.
run_busted() { # interpreter abi shard(K/N)
  local lua="$1" v="$2" tree="$repo/build-lua/$2" specs
  local lpath="$tree/share/lua/$v/?.lua;$tree/share/lua/$v/?/init.lua;$repo/tests/lua/?.lua;;"
  local cpath="$tree/lib/lua/$v/?.so;;"
  mapfile -t specs < <(spec_shard "$repo/tests/lua" "${3%/*}" "${3#*/}")
  echo "lua-test: busted --lua=$lua, specs $3: ${specs[*]##*/}"
  LUA_PATH="$lpath" LUA_CPATH="$cpath" LUA_PATH_5_4="$lpath" LUA_CPATH_5_4="$cpath" \
    busted --lua="$lua" "${specs[@]}"
}

# Both interpreters at once, each on three parts of the specs at once
# (tools/jobs.sh: each run's output is printed whole when it ends): four
# runs took 49 s here, two 77 s, one 83 s; in halves the larger half took
# 68 s (faults, bad_input and transport_spec, 57 of the 150 s of one
# interpreter's specs, are all large), in thirds the largest about 58.
. "$repo/tools/jobs.sh"
for shard in 1/3 2/3 3/3; do
  jobs_start "lua5.4 (specs $shard)" run_busted lua5.4 5.4 "$shard"
  jobs_start "luajit (specs $shard)" run_busted luajit 5.1 "$shard"
done
if ! jobs_wait; then
  for run in "${JOBS_FAILED[@]}"; do echo "lua-test: FAILED under $run" >&2; done
  exit 1
fi
