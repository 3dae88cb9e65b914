#!/usr/bin/env bash
# The source rock of `make rock` builds and loads (tools/check-pip-install.sh
# runs this last): tools/make-rock.sh into a temporary directory, `luarocks
# build` of the .src.rock alone (the tarball beside it removed, so the rock
# must carry its source) into a fresh tree for Lua 5.4, then require()
# under lua5.4 (dlopen binds every symbol: a core file missing from the
# rockspec fails here) and the module's VERSION must be the header's.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/llmretry-rock.XXXXXX")"
trap 'rm -rf "$work"' EXIT
command -v luarocks >/dev/null && command -v lua5.4 >/dev/null || "$repo/tools/lua-test.sh" --deps-only

version="$(sed -n 's/^#define LLMRETRY_VERSION "\([^"]*\)"$/\1/p' "$repo/core/include/llmretry.h")"
"$repo/tools/make-rock.sh" "$work/dist" >/dev/null
rock="$work/dist/llmretry-$version-1.src.rock"
rm "$work/dist/llmretry-$version.tar.gz"
if ! (cd "$work" && luarocks --lua-version 5.4 build --tree "$work/tree" "$rock") >"$work/build.log" 2>&1; then
  cat "$work/build.log" >&2
  echo "check-rock: luarocks build $(basename "$rock") failed" >&2
  exit 1
fi
loaded="$(cd "$work" && LUA_PATH="$work/tree/share/lua/5.4/?.lua;$work/tree/share/lua/5.4/?/init.lua" \
  LUA_CPATH="$work/tree/lib/lua/5.4/?.so" lua5.4 -e 'io.write(require("llmretry").VERSION)')"
[ "$loaded" = "$version" ] \
  || { echo "check-rock: the rock's module says VERSION '$loaded', the header $version" >&2; exit 1; }
echo "check-rock: $(basename "$rock") builds and loads under Lua 5.4 (VERSION $loaded)"
