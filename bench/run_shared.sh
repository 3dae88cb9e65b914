#!/usr/bin/env bash
# Shared budgets benchmark (issue 28, bench/bench_shared.py): N processes on
# one key against the mock enforcing 50 requests in any second, each pacing
# itself (shared=None) or sharing one budget through shm or a redis-server on
# loopback (two groups of four processes standing for two machines); then
# what sharing costs when the limit is far from binding (one process, 64 in
# flight). Prints markdown; about 6 minutes on 2 cores. Usage:
#   bash bench/run_shared.sh > bench/results/shared.md
# Then the token-limited and the nothing-configured variants (bench_shared.py
# --limit tokens|none) through Redis, two groups of four, beside unshared.
# Knobs (environment): PROCS=1,4,8,16,2x4 MODES=none,shm,redis ITEMS=100 RPS=50
# N=3000 ROUNDS=5 LIMITS=tokens,none LIMIT_PROCS=2x4 PYTHON=python3
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
PROCS=${PROCS:-1,4,8,16,2x4}
MODES=${MODES:-none,shm,redis}
ITEMS=${ITEMS:-100}
RPS=${RPS:-50}
N=${N:-3000}
ROUNDS=${ROUNDS:-5}
LIMITS=${LIMITS:-tokens,none}
LIMIT_PROCS=${LIMIT_PROCS:-2x4}
log() { echo "$*" >&2; }
command -v redis-server >/dev/null || tools/ensure-deps.sh >&2
log "== building the extension (make build-python)"
make --no-print-directory build-python PYTHON="$PYTHON" >/dev/null
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
TMP=$(mktemp)
trap 'rm -f "$TMP"' EXIT
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
log "== limited runs (procs $PROCS, modes $MODES)"
"$PYTHON" bench/bench_shared.py --procs "$PROCS" --modes "$MODES" --items-per-proc "$ITEMS" \
  --rps "$RPS" | tee -a "$TMP" >&2
case ",$MODES," in *,redis,*)
  log "== two groups of four through Redis, a second before it counts as unavailable"
  "$PYTHON" bench/bench_shared.py --procs 2x4 --modes redis1s --items-per-proc "$ITEMS" \
    --rps "$RPS" | tee -a "$TMP" >&2 ;;
esac
for limit in ${LIMITS//,/ }; do
  log "== limit=$limit: $LIMIT_PROCS processes, unshared and through Redis"
  "$PYTHON" bench/bench_shared.py --procs "$LIMIT_PROCS" --modes none,redis --limit "$limit" \
    --items-per-proc "$ITEMS" --rps "$RPS" | tee -a "$TMP" >&2
done
log "== throughput, the limit far above what is sent"
"$PYTHON" bench/bench_shared.py --throughput --modes "$MODES" --n "$N" --rounds "$ROUNDS" \
  | tee -a "$TMP" >&2
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

"$PYTHON" - "$TMP" "$LOAD0" "$LOAD1" "$RPS" "$ITEMS" "$N" "$ROUNDS" <<'EOF'
import re, subprocess, sys, time
path, load0, load1, rps, items, n, rounds = sys.argv[1:]
lines = open(path).read().splitlines()
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                        text=True).stdout.strip() or "?"
redis = subprocess.run(["redis-server", "--version"], capture_output=True,
                       text=True).stdout.split()
print(f"llmretry shared-budgets benchmark — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
      f"2 cores, load average {load0} before and {load1} after, commit {commit}, "
      f"{' '.join(redis[:3])}.\n")
print(f"The mock enforces {rps} requests in any sliding second; each process runs "
      f"`call_many` of {items} items (limit 16) with `rpm={int(rps) * 60}` configured "
      f"(*limit* `requests`); `tokens`: the mock limits tokens instead ({int(rps) * 4} a "
      f"second, 4 a request) and the processes are configured with `tpm={int(rps) * 240}`; "
      "`none`: the request limit, and the processes configured with nothing (they learn it "
      "from the mock's headers, and sharing, from each other's after a shared slow start). "
      "*Refused*: attempts the mock answered 429; *used*: items served per second from the "
      "first process's start to the last one's end, as a share of the limit (pacing at 98 % "
      "of it is the most it aims for); *lost*: items that did not succeed; *outages*: the "
      "`llm_shared_unavailable` events of all processes, each a time Redis did not answer "
      "within its timeout and the processes paced alone. `2x4`: two pools of four "
      "processes (two machines' worth) through one Redis. `redis1s`: the same URL with "
      "`?timeout_ms=1000`.\n")
print("| processes | limit | shared | refused | used | lost | outages | span |")
print("|---|---|---|---:|---:|---:|---:|---:|")
for l in lines:
    m = re.match(r"RESULT procs=(\S+) shared=(\S+) limit=(\S+) items=(\d+) ok=(\d+) attempts=(\d+) "
                 r"refused=(\d+) \(([\d.]+) %\) lost=(\d+) used=([\d.]+) % of the limit over "
                 r"([\d.]+) s .* outages=(\d+)", l)
    if m:
        p, mode, limit, _, _, att, ref, pct, lost, used, span, out = m.groups()
        out = out if mode.startswith("redis") else ""
        print(f"| {p} | {limit} | {mode} | {pct} % ({ref} of {att}) | {used} % | {lost} | {out} | "
              f"{span} s |")
print(f"\nThroughput with a limit far above what is sent (`rpm=10000000`): one process, "
      f"`call_many` of {n} at 64 in flight against the mock without limits, {rounds} "
      "rounds, each running every mode in turn. *vs unshared*: the median of the same-round "
      "ratios; *CPU per call*: the client process's, every thread (the Redis store's "
      "included):\n")
print("| shared | calls/s (median) | rounds | vs unshared | CPU per call |")
print("|---|---:|---|---:|---:|")
for l in lines:
    m = re.match(r"RESULT throughput shared=(\S+) calls/s=(\d+) \(rounds ([\d ]+)\) "
                 r"ratio=([\d.]+) cpu_us=(\d+)", l)
    if m:
        mode, rate, rs, ratio, cpu = m.groups()
        print(f"| {mode} | {rate} | {rs} | {ratio}× | {cpu} µs |")
EOF
