#!/usr/bin/env bash
# Interop with servers nobody here wrote. Not part of make test (installing
# them takes minutes): run `make interop` before resolving a protocol feature.
#
# 1. LiteLLM's proxy with canned answers (tests/interop/litellm_proxy.yaml),
#    then tests/interop/check_litellm.py, check_streaming.py, check_sdk.py
#    (the openai SDK on llmretry.httpx2) and check_endpoints.py (an
#    embeddings batch, endpoint="embeddings") against it
#    (the latter also serves, as the up-* models' api_base, a recording
#    upstream on the port given in LLMRETRY_INTEROP_UPSTREAM), and
#    check_batch_api.py (llmretry.batch_api through the proxy's Files and
#    Batch APIs, to the mock at OPENAI_BASE_URL), and check_shared.py (four
#    processes on one budget, through shm and through a redis-server it
#    starts, against the proxy's own rpm limit).
# 2. llama-cpp-python's server on a tiny random-weight model
#    (tools/interop_tiny_gguf.py), then tests/interop/check_llama.py. Its
#    install compiles llama.cpp (~12 minutes on 2 cores, once); when it
#    fails the llama checks are skipped with a message, and not tried again
#    until build-interop/llama-build-failed is removed.
#    LLMRETRY_INTEROP_LLAMA=0 skips them.
# 3. tests/interop/check_health.py: fallbacks, the retry budget and the
#    circuit breaker against LiteLLM, and a fallback from LiteLLM to
#    llama.cpp's server (when it runs).
#
# Each server goes into its own venv under build-interop/ (plain
# `litellm[proxy]` backtracks for ever on some mirrors: versions are pinned).
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
out="$repo/build-interop"
mkdir -p "$out"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# wait_up URL PID LOG NAME: until URL answers, or the server dies.
wait_up() {
  for _ in $(seq 240); do
    curl -s -o /dev/null "$1" && return 0
    kill -0 "$2" 2>/dev/null || { tail -30 "$3" >&2; echo "interop: $4 died" >&2; return 1; }
    sleep 0.5
  done
  echo "interop: $4 did not answer $1" >&2
  return 1
}

make --no-print-directory build-python >/dev/null
export PYTHONPATH="$repo/python"
status=0

# -- 1. LiteLLM ---------------------------------------------------------------
venv="$out/litellm-venv"
litellm_version=1.108.7
if ! "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('litellm') != '$litellm_version')" 2>/dev/null; then
  echo "interop: installing litellm[proxy]==$litellm_version into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "litellm[proxy]==$litellm_version" > "$out/pip.log" 2>&1 \
    || { tail -20 "$out/pip.log" >&2; echo "interop: pip install failed" >&2; exit 1; }
fi
port=$(free_port)
uport=$(free_port)
bport=$(free_port)
# LITELLM_LOCAL_MODEL_COST_MAP: no attempt to fetch prices from the network.
# OPENAI_BASE_URL: where the proxy's /v1/files and /v1/batches go (no model
# names one): check_batch_api.py's mock.
LITELLM_LOCAL_MODEL_COST_MAP=True LLMRETRY_INTEROP_UPSTREAM="http://127.0.0.1:$uport/v1" \
  OPENAI_BASE_URL="http://127.0.0.1:$bport/v1" OPENAI_API_KEY=sk-upstream-batches \
  "$venv/bin/litellm" --config tests/interop/litellm_proxy.yaml --host 127.0.0.1 --port "$port" \
  --num_workers 1 > "$out/litellm.log" 2>&1 &
pids+=($!)
wait_up "http://127.0.0.1:$port/health/liveliness" "${pids[-1]}" "$out/litellm.log" litellm
python3 tests/interop/check_litellm.py "http://127.0.0.1:$port/v1" || status=1
python3 tests/interop/check_streaming.py "http://127.0.0.1:$port/v1" "$out/litellm.log" "$uport" \
  || status=1
python3 tests/interop/check_sdk.py "http://127.0.0.1:$port/v1" || status=1
python3 tests/interop/check_endpoints.py "http://127.0.0.1:$port/v1" || status=1
python3 tests/interop/check_batch_api.py "http://127.0.0.1:$port/v1" "$bport" || status=1
# One budget across 4 processes against LiteLLM's rpm: alone, shm, Redis (~4 min).
python3 tests/interop/check_shared.py "http://127.0.0.1:$port/v1" || status=1
# llmretry.openresty with transport "cosocket": the core's HTTP/1.1 parser
# on uvicorn's answers (needs the LuaJIT build of the module).
tools/lua-test.sh --build-only >/dev/null
python3 tests/interop/check_openresty.py "http://127.0.0.1:$port/v1" || status=1
# LiteLLM stays up: the fallback checks (3.) go from it to llama.cpp's server.

# -- 2. llama-cpp-python's server ----------------------------------------------
lvenv="$out/llama-venv"
failed_mark="$out/llama-build-failed"
skip=""
if [ "${LLMRETRY_INTEROP_LLAMA:-1}" = 0 ]; then
  skip="LLMRETRY_INTEROP_LLAMA=0"
elif ! "$lvenv/bin/python" -c 'import llama_cpp.server, gguf' 2>/dev/null; then
  if [ -e "$failed_mark" ]; then
    skip="an earlier install failed (see $out/llama-pip.log; remove $failed_mark to try again)"
  else
    echo "interop: installing llama-cpp-python[server]==0.3.36 into $lvenv" \
         "(compiles llama.cpp: ~12 minutes on 2 cores; log in $out/llama-pip.log)"
    rm -rf "$lvenv"
    if python3 -m venv "$lvenv" && CMAKE_BUILD_PARALLEL_LEVEL=2 "$lvenv/bin/pip" install \
         'llama-cpp-python[server]==0.3.36' 'gguf==0.19.0' > "$out/llama-pip.log" 2>&1; then
      :
    else
      touch "$failed_mark"
      tail -20 "$out/llama-pip.log" >&2
      skip="pip install llama-cpp-python[server] failed (see $out/llama-pip.log)"
    fi
  fi
fi
if [ -n "$skip" ]; then
  echo "interop (llama.cpp): SKIPPED: $skip"
else
  "$lvenv/bin/python" tools/interop_tiny_gguf.py "$out/tiny.gguf"
  lport=$(free_port)
  # n_ctx 512 (the model's own): a prompt over it is easy to send.
  "$lvenv/bin/python" -m llama_cpp.server --model "$out/tiny.gguf" --model_alias tiny \
    --n_ctx 512 --host 127.0.0.1 --port "$lport" > "$out/llama-server.log" 2>&1 &
  pids+=($!)
  wait_up "http://127.0.0.1:$lport/v1/models" "${pids[-1]}" "$out/llama-server.log" \
    "llama-cpp-python's server"
  python3 tests/interop/check_llama.py "http://127.0.0.1:$lport/v1" "$out/llama-server.log" \
    || status=1
fi

# -- 3. fallbacks, retry budget, circuit breaker (issue 19) --------------------
if [ -n "$skip" ]; then
  python3 tests/interop/check_health.py "http://127.0.0.1:$port/v1" || status=1
else
  python3 tests/interop/check_health.py "http://127.0.0.1:$port/v1" \
    "http://127.0.0.1:$lport/v1" "$out/llama-server.log" || status=1
fi
exit $status
