#!/usr/bin/env bash
# Interop with a server nobody here wrote: LiteLLM's proxy with canned
# answers (tests/interop/litellm_proxy.yaml), then tests/interop/check_litellm.py
# against it. Not part of make test (installing LiteLLM takes minutes): run
# `make interop` before resolving a protocol feature.
#
# LiteLLM goes into its own venv under build-interop/ (plain `litellm[proxy]`
# backtracks for ever on some mirrors: the version is pinned).
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
out="$repo/build-interop"
venv="$out/litellm-venv"
mkdir -p "$out"
if [ ! -x "$venv/bin/litellm" ]; then
  echo "interop: installing litellm[proxy]==1.74.9 into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q 'litellm[proxy]==1.74.9' > "$out/pip.log" 2>&1 \
    || { tail -20 "$out/pip.log" >&2; echo "interop: pip install failed" >&2; exit 1; }
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$venv/bin/litellm" --config tests/interop/litellm_proxy.yaml --host 127.0.0.1 --port "$port" \
  --num_workers 1 > "$out/litellm.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 120); do
  curl -s -o /dev/null "http://127.0.0.1:$port/health/liveliness" && break
  kill -0 $pid 2>/dev/null || { tail -30 "$out/litellm.log" >&2; echo "interop: litellm died" >&2; exit 1; }
  sleep 0.5
done
make --no-print-directory build-python >/dev/null
PYTHONPATH="$repo/python" python3 tests/interop/check_litellm.py "http://127.0.0.1:$port/v1"
