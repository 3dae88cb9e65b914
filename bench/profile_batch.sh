#!/usr/bin/env bash
# Where llmretry.call_many's CPU goes (the batch benchmark's profile; see
# bench/README.md, "Batch benchmark"): `perf record --call-graph dwarf` over
# REPS batches of N requests against the local nginx (0 ms endpoint, LIMIT in
# flight), then the calling thread's samples grouped by what they were doing
# and the engine I/O thread's samples by library. Needs perf (Debian:
# linux-perf); installs nothing else. Usage:  bash bench/profile_batch.sh
#
# Knobs (environment): N=20000 REPS=6 LIMIT=64 CLIENT=callmany-nolog
# (or callmany, callmany-nolog-gcoff) LLMRETRY_BENCH_PORT=18089 PYTHON=python3
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
N=${N:-20000}
REPS=${REPS:-6}
LIMIT=${LIMIT:-64}
CLIENT=${CLIENT:-callmany-nolog}
PORT=${LLMRETRY_BENCH_PORT:-18089}
PYTHON=${PYTHON:-python3}
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"

log() { printf '%s\n' "$*" >&2; }
command -v perf >/dev/null 2>&1 || { log "perf not found (Debian: apt-get install linux-perf)"; exit 1; }

# shellcheck source=bench/nginx.sh
. "$ROOT/bench/nginx.sh"
bench_nginx_install
make --no-print-directory build-python PYTHON="$PYTHON" >/dev/null 2>&1 || {
  log "make build-python failed:"; make --no-print-directory build-python PYTHON="$PYTHON" >&2; exit 1; }
bench_nginx_start "$PORT"     # sets TMP (removed on exit), FAST, SLOW

log "== perf record: $REPS × $N requests, $CLIENT, $LIMIT in flight (load average $(cut -d' ' -f1-3 /proc/loadavg))"
perf record -q -F 999 --call-graph dwarf,16384 -o "$TMP/perf.data" -- \
  "$PYTHON" "$ROOT/bench/bench_batch.py" run "$CLIENT" --base-url "http://127.0.0.1:$PORT/v1" \
  --n "$N" --limit "$LIMIT" --reps "$REPS" >&2
perf script -i "$TMP/perf.data" -F tid,ip,sym,dso 2>/dev/null >"$TMP/perf.txt"

"$PYTHON" - "$TMP/perf.txt" <<'EOF'
import collections, sys

samples, cur = [], None
for line in open(sys.argv[1], errors="replace"):
    if not line.strip():
        if cur:
            samples.append(cur)
        cur = None
    elif not line.startswith("\t"):     # a sample's header: its thread id
        cur = (line.split()[0], [])
    elif cur is not None:
        parts = line.split(None, 2)
        if len(parts) >= 2:
            cur[1].append((parts[1], parts[2].strip() if len(parts) > 2 else ""))
if cur:
    samples.append(cur)

# The calling thread: the one running Engine_call_many. Its window: samples
# inside call_many (Engine_call_many, or the JSON encoder before it).
by_tid = collections.Counter(t for t, s in samples if any(f == "Engine_call_many" for f, _ in s))
if not by_tid:
    sys.exit("no samples in Engine_call_many (perf could not unwind the stacks?)")
main = by_tid.most_common(1)[0][0]
window = [{f for f, _ in s} for t, s in samples
          if t == main and any(f in ("Engine_call_many", "encoder_call") for f, _ in s)]
rules = [
    ("cyclic GC (gc_collect_main)", {"gc_collect_main"}),
    ("the outcome dict of each call (result_dict)", {"result_dict"}),
    ("parsing each response (bytes.decode + json scanner)",
     {"scan_once_unicode", "scanner_call", "unicode_decode_utf8"}),
    ("encoding the request bodies (json C encoder + str.encode)", {"encoder_call", "unicode_encode"}),
    ("submitting calls (llmretry_engine_submit)", {"llmretry_engine_submit"}),
    ("waiting for ready calls (lr_channel_wait)", {"lr_channel_wait", "llmretry_channel_wait"}),
    ("freeing finished calls (llmretry_call_free)", {"llmretry_call_free", "lr_call_unref"}),
    ("events to the logger (lr_py_read_mail)", {"lr_py_read_mail", "deliver_event"}),
]
other = "Python code per item (item_done → _value_of, Meta, Result, Batch.item_done) and the rest"
cats = collections.Counter()
for fs in window:
    cats[next((name for name, keys in rules if fs & keys), other)] += 1
n = len(window)
print(f"Calling thread (tid {main}): {n} samples inside call_many")
print()
print("| what the calling thread was doing | share of its samples |")
print("|---|---:|")
for name, c in cats.most_common():
    print(f"| {name} | {c / n:.1%} |")
print()

# The engine's I/O thread: the busiest other thread; self samples by library.
others = collections.Counter(t for t, s in samples if t != main)
if others:
    io = others.most_common(1)[0][0]
    dsos = collections.Counter()
    for t, s in samples:
        if t == io and s:
            d = s[0][1].strip("()").rsplit("/", 1)[-1]
            dsos[d if d not in ("inlined", "") else "(inlined frames)"] += 1
    m = sum(dsos.values())
    print(f"I/O thread (tid {io}): {m} samples, self time by library: "
          + ", ".join(f"{d} {c / m:.0%}" for d, c in dsos.most_common(6)))
EOF
