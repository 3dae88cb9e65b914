#!/usr/bin/env bash
# The host suites: llmretry's Lua module inside its real hosts.
#   * Neovim: tests/nvim/test_nvim.lua in a real headless Neovim (Debian's:
#     0.7 on bookworm, 0.10 on trixie), with llmretry.nvim on its path; and
#     tests/nvim/exit_inflight.lua: Neovim quits promptly with a call in flight;
#     tests/nvim/docs.lua: the Neovim examples of README.md and docs/.
#   * OpenResty: tests/openresty/host_check.py starts Debian's nginx with
#     libnginx-mod-http-lua (LuaJIT) on loopback (tests/openresty/nginx.conf.in)
#     and calls the mock model through llmretry.openresty; then again with
#     init_worker{ transport = "cosocket" } (no engine thread).
# Both talk to one mock server (python3 -m llmretry.testing) started here.
#
# Installs what is missing with apt-get (as root, else sudo), builds the
# LuaJIT (5.1 ABI) module with tools/lua-test.sh --build-only when it is
# missing or older than its sources, and ends with
# "host-tests: N passed, M failed" (non-zero exit on any failure).
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"

# libnginx-mod-http-lua pulls libluajit2-5.1-2 (OpenResty's LuaJIT), which
# coexists with the luajit2 / libluajit2-5.1-dev that tools/lua-test.sh
# installs (Debian's nginx Lua module pulls in libluajit2); Neovim runs on either LuaJIT library.
debs=(neovim nginx libnginx-mod-http-lua curl python3)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "host-test: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The module Neovim and nginx load: build-lua/5.1 (LuaJIT). The pure-Lua
# modules are taken from lua/ in this checkout.
so=build-lua/5.1/lib/lua/5.1/llmretry/core.so
if [ ! -f "$so" ] || [ -n "$(find bindings/lua core/src core/include rockspecs -type f -newer "$so" | head -n 1)" ]; then
  echo "host-test: building the Lua module (tools/lua-test.sh --build-only)"
  tools/lua-test.sh --build-only
fi
if ! PYTHONPATH="$repo/python" python3 -c "import llmretry.testing" 2>/dev/null; then
  echo "host-test: building the Python extension for the mock server"
  make --no-print-directory build-python
fi

echo "host-test: $(nvim --version | head -n 1); $(nginx -v 2>&1);" \
  "libnginx-mod-http-lua $(dpkg-query -W -f='${Version}' libnginx-mod-http-lua)"

work="$(mktemp -d)"
mock_pid=""
cleanup() {
  if [ -n "$mock_pid" ]; then kill "$mock_pid" 2>/dev/null || true; wait "$mock_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# The mock server: its port is the first line it prints.
PYTHONPATH="$repo/python" timeout -s TERM 1200 python3 -m llmretry.testing --host 127.0.0.1 --port 0 \
  >"$work/mock.out" 2>"$work/mock.err" &
mock_pid=$!
for _ in $(seq 1 100); do
  [ -s "$work/mock.out" ] && break
  sleep 0.1
done
port="$(head -n 1 "$work/mock.out" || true)"
if ! [[ "$port" =~ ^[0-9]+$ ]]; then
  echo "host-test: the mock server did not start" >&2
  cat "$work/mock.err" >&2
  exit 1
fi
export LLMRETRY_MOCK="http://127.0.0.1:$port"
unset OPENAI_API_KEY OPENAI_BASE_URL

passed=0
failed=0
# Count a runner's PASS/FAIL lines; a runner that failed without saying so
# counts as one failure.
tally() { # log rc name
  local p f
  p=$(grep -c '^PASS ' "$1" || true)
  f=$(grep -c '^FAIL ' "$1" || true)
  if [ "$2" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "FAIL $3: exited with status $2"
    f=1
  fi
  passed=$((passed + p))
  failed=$((failed + f))
}

nvim_run() { # script log
  local lpath="$repo/lua/?.lua;$repo/lua/?/init.lua;"
  local cpath="$repo/build-lua/5.1/lib/lua/5.1/?.so;"
  timeout -s KILL 300 nvim --headless -u NONE -i NONE \
    --cmd "lua package.path='$lpath'..package.path; package.cpath='$cpath'..package.cpath" \
    -c "luafile $repo/tests/nvim/$1" </dev/null >"$2" 2>"$2.err"
}

echo "host-test: Neovim (tests/nvim/test_nvim.lua)"
rc=0
nvim_run test_nvim.lua "$work/nvim.log" || rc=$?
cat "$work/nvim.log"
# Neovim's own messages (one expected: a callback that raises, on purpose).
if [ "$rc" -ne 0 ] && [ -s "$work/nvim.log.err" ]; then
  echo "---- Neovim's stderr ----"; cat "$work/nvim.log.err"; echo "----"
fi
tally "$work/nvim.log" "$rc" "nvim: test_nvim.lua"

echo "host-test: Neovim quits with a call in flight (tests/nvim/exit_inflight.lua)"
rc=0
t0=$(date +%s%N)
nvim_run exit_inflight.lua "$work/exit.log" || rc=$?
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
grep -v '^nvim: ' "$work/exit.log" | grep -v '^PASS ' || true
if [ "$rc" -eq 0 ] && grep -q '^nvim: 1 passed, 0 failed' "$work/exit.log" && [ "$ms" -lt 10000 ]; then
  echo "PASS nvim: quits in ${ms} ms with a call in flight (exit code 0)" | tee -a "$work/exit.tally"
else
  echo "FAIL nvim: quitting with a call in flight: exit code $rc after ${ms} ms" | tee -a "$work/exit.tally"
  cat "$work/exit.log" "$work/exit.log.err"
fi
tally "$work/exit.tally" 0 "nvim: exit_inflight.lua"

echo "host-test: Neovim, the docs' examples (tests/nvim/docs.lua)"
rc=0
python3 tests/python/doc_examples.py lua >"$work/doc_examples.json"
LLMRETRY_DOC_EXAMPLES="$work/doc_examples.json" OPENAI_BASE_URL="$LLMRETRY_MOCK/v1" \
  OPENAI_API_KEY="sk-doc-example" nvim_run docs.lua "$work/nvim-docs.log" || rc=$?
cat "$work/nvim-docs.log"
if [ "$rc" -ne 0 ] && [ -s "$work/nvim-docs.log.err" ]; then
  echo "---- Neovim's stderr ----"; cat "$work/nvim-docs.log.err"; echo "----"
fi
tally "$work/nvim-docs.log" "$rc" "nvim: docs.lua"

echo "host-test: OpenResty (tests/openresty/host_check.py)"
rc=0
timeout -s KILL 300 python3 "$repo/tests/openresty/host_check.py" --repo "$repo" --mock "$LLMRETRY_MOCK" \
  >"$work/openresty.log" 2>&1 || rc=$?
cat "$work/openresty.log"
tally "$work/openresty.log" "$rc" "openresty: host_check.py"

# The same tests with the worker's engine thread-less: its attempts on the
# worker's cosockets (init_worker's transport "cosocket", llmretry.cosocket).
echo "host-test: OpenResty, transport \"cosocket\" (tests/openresty/host_check.py --transport cosocket)"
rc=0
timeout -s KILL 300 python3 "$repo/tests/openresty/host_check.py" --repo "$repo" --mock "$LLMRETRY_MOCK" \
  --transport cosocket >"$work/openresty-cosocket.log" 2>&1 || rc=$?
cat "$work/openresty-cosocket.log"
tally "$work/openresty-cosocket.log" "$rc" "openresty (cosocket): host_check.py"

echo "host-tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
