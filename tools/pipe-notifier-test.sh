#!/usr/bin/env bash
# The suites once more with the pipe notifier (core/src/notifier.c), the
# back-end that systems without eventfd (macOS, the BSDs) build: Linux CI
# runs that path too, in trees of its own under build-pipe/ (the regular
# builds are not touched).
#
#   1. C: cmake -DLLMRETRY_PIPE_NOTIFIER=ON into build-pipe/c, then ctest.
#   2. Python: the extension built with -DLLMRETRY_PIPE_NOTIFIER into a copy
#      of python/ (build-pipe/python), then tests/python against it.
#   3. Lua: the module built the same way by luarocks into build-pipe/lua/5.4,
#      then tests/lua under lua5.4 (LuaJIT shares every line of C with it).
# Each build is checked to reference no eventfd symbol, so a test that passes
# cannot have run the eventfd path.
#
# Prerequisites: what `make test` installs (it runs this last).
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
out="$repo/build-pipe"
mkdir -p "$out"
unset OPENAI_API_KEY OPENAI_BASE_URL
DEF="-DLLMRETRY_PIPE_NOTIFIER"

no_eventfd() { # file what
  if nm -A "$1" 2>/dev/null | grep -qw eventfd; then
    echo "pipe-notifier: $2 references eventfd: the pipe notifier was not built" >&2
    exit 1
  fi
}

echo "pipe-notifier: C suite"
# Release (-O3) with -Werror: the optimiser's warnings (maybe-uninitialized)
# that RelWithDebInfo does not see fail here, not in a packager's build.
cmake -S . -B "$out/c" -DCMAKE_BUILD_TYPE=Release -DLLMRETRY_WERROR=ON -DLLMRETRY_PIPE_NOTIFIER=ON >/dev/null
cmake --build "$out/c" -j2 >"$out/c-build.log" 2>&1 || { cat "$out/c-build.log" >&2; exit 1; }
no_eventfd "$out/c/libllmretry.a" "the C library"
(cd "$out/c" && ctest --output-on-failure)

echo "pipe-notifier: Python suite"
pydir="$out/python"
rm -rf "$pydir"
mkdir -p "$pydir/llmretry"
find python/llmretry -maxdepth 1 -type f ! -name '*.so' -exec cp {} "$pydir/llmretry/" \;
if ! CFLAGS="$DEF" python3 setup.py -q build_ext -b "$pydir" -t "$out/python-tmp" --force \
     >"$out/python-build.log" 2>&1; then
  cat "$out/python-build.log" >&2
  echo "pipe-notifier: building the Python extension failed" >&2
  exit 1
fi
so=$(ls "$pydir"/llmretry/_llmretry*.so)
no_eventfd "$so" "the Python extension"
# Left out (they run in `make test`'s pass; here they would only add CI time):
# the Jupyter kernel's notebook and the RSS runs of the CLI (50,000 lines),
# neither of which touches the notifier beyond what test_aio does; the
# pure_python tests (the mock server, mypy); the doc examples and the rate
# limits' pacing (timers, not the notifier: test_aio and the batches cover
# every wait on a channel).
LLMRETRY_PYTHON_DIR="$pydir" PYTHONPATH="$pydir" PYTHONDONTWRITEBYTECODE=1 \
  python3 -m pytest -q -p no:cacheprovider tests/python \
  --deselect tests/python/test_notebook.py \
  --deselect tests/python/test_lazy_batch.py::test_cli_peak_rss_does_not_grow_with_the_lines \
  --deselect tests/python/test_docs.py --deselect tests/python/test_ratelimit.py \
  -m "not pure_python"

echo "pipe-notifier: Lua suite (lua5.4)"
clean_artefacts() {
  rm -f bindings/lua/*.o core/src/*.o
  rm -f llmretry/core.so
  rmdir llmretry 2>/dev/null || true
}
trap clean_artefacts EXIT
clean_artefacts
tree="$out/lua/5.4"
rm -rf "$tree"
luarocks --lua-version 5.4 make --tree "$tree" rockspecs/llmretry-scm-1.rockspec \
  CFLAGS="-O2 -fPIC $DEF" >"$out/lua-build.log" 2>&1 || { cat "$out/lua-build.log" >&2; exit 1; }
clean_artefacts
no_eventfd "$(ls "$tree"/lib/lua/5.4/llmretry/core.so)" "the Lua module"
lpath="$tree/share/lua/5.4/?.lua;$tree/share/lua/5.4/?/init.lua;$repo/tests/lua/?.lua;;"
cpath="$tree/lib/lua/5.4/?.so;;"
LLMRETRY_REPO="$repo" PYTHONPATH="$repo/python" \
  LUA_PATH="$lpath" LUA_CPATH="$cpath" LUA_PATH_5_4="$lpath" LUA_CPATH_5_4="$cpath" \
  busted --lua=lua5.4 --pattern=_spec "$repo/tests/lua"
echo "pipe-notifier: all suites passed with the pipe notifier"
