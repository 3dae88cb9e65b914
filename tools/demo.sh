#!/usr/bin/env bash
# make demo: start the embedded mock server (no key needed), then
#   part 1: a batch of 40 requests through the `llmretry batch` CLI, with an
#           injected 429 (Retry-After: 1, which pauses the whole pool), 503s that
#           are retried and 503s the server says not to retry: retries, the
#           progress bar, the failures file, the summary; then `--resume`,
#           which runs just the failed requests;
#   part 2: the C core call by call (examples/demo.c): every event of a clean
#           call, a 429, a flaky 503, a 400, and 20 calls in flight at once.
# Usage: tools/demo.sh [CMAKE_BUILD_DIR]   (the Makefile passes $(BUILD))
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}"
unset OPENAI_API_KEY OPENAI_BASE_URL    # the mock needs no key; never send a real one
py=${PYTHON:-python3}
out=$(mktemp -d "${TMPDIR:-/tmp}/llmretry-demo.XXXXXX")
portfile="$out/port"
"$py" -m llmretry.testing --port 0 --scenarios "$here/examples/demo-scenarios.json" >"$portfile" &
mock=$!
trap 'kill $mock 2>/dev/null; wait $mock 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -s "$portfile" ] && break; sleep 0.1; done
port=$(head -n1 "$portfile")
rm -f "$portfile"
root="http://127.0.0.1:$port"
bold() { if [ -t 1 ]; then printf '\033[1m%s\033[0m\n' "$*"; else printf '%s\n' "$*"; fi; }

echo "mock server on 127.0.0.1:$port (llmretry.testing; no key needed); files in $out"
echo
bold "Part 1. A batch job: 40 requests, 8 at a time (examples/batch-requests.jsonl)"
echo "The mock answers in arrival order: one 429 with Retry-After: 1 (every new start"
echo "waits, not just that request), three 503s (retried with backoff) and three 503s"
echo "with x-should-retry: false (not retried: those requests fail)."
echo
batch=("$py" -m llmretry batch "$here/examples/batch-requests.jsonl"
       -o "$out/results.jsonl" --failures "$out/failed.jsonl" --limit 8
       --base-url "$root/s/batch/v1" --base-delay-ms 200 --progress -v)
echo "\$ python3 -m llmretry batch examples/batch-requests.jsonl -o results.jsonl \\"
echo "      --failures failed.jsonl --limit 8 --base-delay-ms 200 --progress -v"
status=0
"${batch[@]}" || status=$?
echo "exit status $status (1: some requests failed)"
echo
bold "The failures file: one JSON line per failed request, appended as it failed"
head -n1 "$out/failed.jsonl" | cut -c1-400
"$py" - "$out/failed.jsonl" <<'EOF'
import json, sys
for line in open(sys.argv[1], encoding="utf-8"):
    rec = json.loads(line)
    err = rec["error"]
    print(f"  request {rec['index']:>2}: {err['kind']} {err['status']} after "
          f"{err['attempts']} attempt(s), request_id {err['request_id']}")
EOF
echo
bold "The same command with --resume: only what did not succeed runs"
echo "\$ python3 -m llmretry batch ... --resume"
"${batch[@]}" --resume
echo
bold "results.jsonl: one line per request, in input order (first 3, cut):"
head -n3 "$out/results.jsonl" | cut -c1-160
"$py" - "$out/results.jsonl" <<'EOF'
import json, sys
recs = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8")]
assert [r["index"] for r in recs] == list(range(40)) and all(r["ok"] for r in recs)
print(f"  ... {len(recs)} lines, all ok, indices 0..{len(recs) - 1} in order")
EOF
echo
bold "Part 2. The C core, call by call (examples/demo.c): every event as a JSON line"
"$build/llmretry_demo" "$root"
