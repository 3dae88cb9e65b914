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
#      then tests/lua under lua5.4 (LuaJIT shares every line of C with it);
#      this part runs while the other two do.
# Each build is checked to reference no eventfd symbol, so a test that passes
# cannot have run the eventfd path.
#
# Prerequisites: what `make test` installs (make check runs this after it).
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
    return 1
  fi
}

pipe_c() {
  echo "pipe-notifier: C suite"
  # Release (-O3) with -Werror: the optimiser's warnings (maybe-uninitialized)
  # that RelWithDebInfo does not see fail here, not in a packager's build.
  cmake -S . -B "$out/c" -DCMAKE_BUILD_TYPE=Release -DLLMRETRY_WERROR=ON -DLLMRETRY_PIPE_NOTIFIER=ON \
    >/dev/null || return 1
  cmake --build "$out/c" -j2 >"$out/c-build.log" 2>&1 || { cat "$out/c-build.log" >&2; return 1; }
  no_eventfd "$out/c/libllmretry.a" "the C library" || return 1
  (cd "$out/c" && ctest -j"${CTEST_JOBS:-4}" --output-on-failure)
}

pipe_python() {
  echo "pipe-notifier: Python suite"
  local pydir="$out/python" so
  rm -rf "$pydir"
  mkdir -p "$pydir/llmretry" || return 1
  # The package's whole tree (llmretry.testing is a subpackage), not its build.
  (cd python && tar cf - --exclude='*.so' --exclude=__pycache__ llmretry) | (cd "$pydir" && tar xf -) || return 1
  if ! CFLAGS="$DEF" python3 setup.py -q build_ext -b "$pydir" -t "$out/python-tmp" --force \
       >"$out/python-build.log" 2>&1; then
    cat "$out/python-build.log" >&2
    echo "pipe-notifier: building the Python extension failed" >&2
    return 1
  fi
  so=$(ls "$pydir"/llmretry/_llmretry*.so) || return 1
  no_eventfd "$so" "the Python extension" || return 1
  # Left out (they run in `make test`'s pass; here they would only add CI time):
  # the Jupyter kernel's notebook and the RSS runs of the CLI (50,000 lines),
  # neither of which touches the notifier beyond what test_aio does; the
  # pure_python tests (the mock server, mypy); the doc examples and the rate
  # limits' pacing (timers, not the notifier: test_aio and the batches cover
  # every wait on a channel), and the Ray and Dask clusters (call_many in
  # their workers: the batch tests run it here). PYTEST_JOBS workers, as in make test-python.
  LLMRETRY_PYTHON_DIR="$pydir" PYTHONPATH="$pydir" PYTHONDONTWRITEBYTECODE=1 \
    python3 -m pytest -q -p no:cacheprovider -n "${PYTEST_JOBS:-4}" --dist loadfile tests/python \
    --deselect tests/python/test_notebook.py \
    --deselect tests/python/test_lazy_batch.py::test_cli_peak_rss_does_not_grow_with_the_lines \
    --deselect tests/python/test_docs.py --deselect tests/python/test_ratelimit.py \
    --deselect tests/python/test_ray.py --deselect tests/python/test_dask.py \
    -m "not pure_python"
}

clean_artefacts() {
  rm -f bindings/lua/*.o core/src/*.o
  rm -f llmretry/core.so
  rmdir llmretry 2>/dev/null || true
}

pipe_lua() {
  local tree="$out/lua/5.4" lpath cpath shard
  clean_artefacts
  rm -rf "$tree"
  luarocks --lua-version 5.4 make --tree "$tree" rockspecs/llmretry-scm-1.rockspec \
    CFLAGS="-O2 -fPIC $DEF" >"$out/lua-build.log" 2>&1 || { cat "$out/lua-build.log" >&2; return 1; }
  clean_artefacts
  no_eventfd "$(ls "$tree"/lib/lua/5.4/llmretry/core.so)" "the Lua module" || return 1
  lpath="$tree/share/lua/5.4/?.lua;$tree/share/lua/5.4/?/init.lua;$repo/tests/lua/?.lua;;"
  cpath="$tree/lib/lua/5.4/?.so;;"
  lua_half() { # shard(K/N)
    local specs
    mapfile -t specs < <(spec_shard "$repo/tests/lua" "${1%/*}" "${1#*/}")
    echo "pipe-notifier: Lua suite (lua5.4), specs $1: ${specs[*]##*/}"
    LLMRETRY_REPO="$repo" PYTHONPATH="$repo/python" \
      LUA_PATH="$lpath" LUA_CPATH="$cpath" LUA_PATH_5_4="$lpath" LUA_CPATH_5_4="$cpath" \
      busted --lua=lua5.4 "${specs[@]}"
  }
  # The two halves of the specs at once, as tools/lua-test.sh runs them.
  for shard in 1/2 2/2; do jobs_start "lua5.4 (specs $shard)" lua_half "$shard"; done
  jobs_wait
}

# The Lua part runs alongside the C and Python parts (tools/jobs.sh; its
# output comes at the end): all three mostly wait on the clock. Its luarocks
# build leaves objects in core/src, which the other two builds do not read
# (cmake and setup.py compile into build-pipe/). Each part returns its
# failure (errexit does not hold in a function called with ||).
trap clean_artefacts EXIT
. "$repo/tools/jobs.sh"
jobs_start lua pipe_lua
status=0
pipe_c || status=1
pipe_python || status=1
jobs_wait || status=1
if [ "$status" -ne 0 ]; then
  echo "pipe-notifier: FAILED" >&2
  exit 1
fi
echo "pipe-notifier: all suites passed with the pipe notifier"
