#!/usr/bin/env bash
# make demo: start the embedded mock server, run the demo against it, stop it.
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}"
portfile=$(mktemp)
python3 -m llmretry.testing --port 0 --scenarios "$here/examples/demo-scenarios.json" >"$portfile" &
mock=$!
trap 'kill $mock 2>/dev/null; wait $mock 2>/dev/null; rm -f "$portfile"' EXIT
for _ in $(seq 100); do [ -s "$portfile" ] && break; sleep 0.1; done
port=$(head -n1 "$portfile")
echo "mock server on 127.0.0.1:$port (llmretry.testing; no key needed)"
echo
"$build/llmretry_demo" "http://127.0.0.1:$port"
