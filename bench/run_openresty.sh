#!/usr/bin/env bash
# The OpenResty benchmark (issue 20): calls/s and latency through an
# OpenResty gateway at 1,000 concurrent downstream clients against the 50 ms
# endpoint, llmretry.openresty (the worker's engine, no thread pool) beside
# the same gateway written the way OpenResty users write it today: a
# cosocket client (bench/clients/resty_mini_http.lua, what lua-resty-http
# does) in a retry loop. See bench/README.md ("OpenResty benchmark").
# Usage (from anywhere):  bash bench/run_openresty.sh   (markdown on stdout)
#
# Knobs (environment): RUNS=3 SECS=10 CONNS=1000 LLMRETRY_BENCH_PORT=18089
# LLMRETRY_GATEWAY_PORT=18093
# BASELINE=<commit>: also measure that commit's llmretry.openresty in the same
# rounds: its Lua module built from `git archive` into the run's temp folder,
# served by a second gateway nginx (one worker, port LLMRETRY_GATEWAY_PORT+1),
# the three gateways' runs in an order that rotates from round to round; one
# more table row and ratio line. Without it the output is as it was.
# BASELINE_TRANSPORT=engine|cosocket: the transport of the baseline's gateway
# (default engine) and of the gateway it is compared with in the last line
# (the default one, or the transport "cosocket"'s).
# The gateway with transport "cosocket" (llmretry.openresty's thread-less
# engine, its attempts on the worker's cosockets) is a third nginx on port
# LLMRETRY_GATEWAY_PORT+2, same config but for init_worker's transport: the
# row /llmretry-cosocket, its runs rotated with the others'. TRANSPORTS=engine
# leaves it out.
# GC_STEPMUL=<n>: every gateway's worker runs collectgarbage("setstepmul", n)
# in init_worker (LuaJIT's default is 200): the same GC setting on every
# side (BENCHMARKS.md, "Fewer allocations per call": it moved both alike).
# Unset: LuaJIT's default, as before.
# PACE_MS=<ms>: each downstream connection waits that long before each of its
# requests (bench/wrk_paced.lua): the same offered load for every gateway,
# below their capacity, so that the latency columns compare service times
# rather than queues (0, the default: as fast as each gateway answers).
# PEER_SPIN=<n>: the cosocket gateway turns a busy loop n times per request
# before its call (~1.9 ns a turn on the machine of BENCHMARKS.md): the same
# peer with more CPU per call, to see how calls/s and p99 follow a gateway
# worker's CPU per call near its knee (BENCHMARKS.md, "The knee"). 0, the
# default: none.
# PROFILE=1: `perf record -F 999` of each gateway's worker (all its threads)
# during its run of the last round, then a table of its CPU per call by
# library (bench/perf_by_dso.py): where the time goes (issue 36). Needs perf
# (Debian: linux-perf). Unset: no profile.
# TIMING=1: each gateway's locations time their calls (bench/clients/
# bench_timing.lua): the handler's wall time from before its call to after
# it and, for llmretry, meta.total_ms (the core's submit to finish) and
# meta.duration_ms (the attempt); after each run the script reads them
# (/timing) and adds a table of their medians over the runs, beside wrk's.
# Where the latency goes: before the handler (the event loop's queue), in
# the hand-offs (wall less total), the attempt less the endpoint's 50 ms.
# Unset: the locations skip it (one table lookup a request).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
RUNS=${RUNS:-3}
SECS=${SECS:-10}
CONNS=${CONNS:-1000}
UP_PORT=${LLMRETRY_BENCH_PORT:-18089}
GW_PORT=${LLMRETRY_GATEWAY_PORT:-18093}
BASELINE=${BASELINE:-}
BASELINE_TRANSPORT=${BASELINE_TRANSPORT:-engine}
case $BASELINE_TRANSPORT in engine|cosocket) ;; *) echo "BASELINE_TRANSPORT must be engine or cosocket" >&2; exit 2 ;; esac
case " ${TRANSPORTS:-engine cosocket} " in
  *" cosocket "*) ;;
  *) [ "$BASELINE_TRANSPORT" = engine ] || { echo "BASELINE_TRANSPORT=cosocket needs the transport \"cosocket\"'s gateway (TRANSPORTS)" >&2; exit 2; } ;;
esac
GC_STEPMUL=${GC_STEPMUL:-}
case $GC_STEPMUL in ''|*[!0-9]*) [ -z "$GC_STEPMUL" ] || { echo "GC_STEPMUL must be a whole number" >&2; exit 2; } ;; esac
GC_TUNING=""
[ -z "$GC_STEPMUL" ] || GC_TUNING="collectgarbage(\"setstepmul\", $GC_STEPMUL)"
PEER_SPIN=${PEER_SPIN:-0}
case $PEER_SPIN in ''|*[!0-9]*) echo "PEER_SPIN must be a whole number" >&2; exit 2 ;; esac
PACE_MS=${PACE_MS:-0}   # > 0: each connection waits this long before each request (bench/wrk_paced.lua)
BGW_PORT=$((GW_PORT + 1))
CGW_PORT=$((GW_PORT + 2))
TRANSPORTS=${TRANSPORTS:-engine cosocket}
PROFILE=${PROFILE:-0}
TIMING=${TIMING:-0}
case $TIMING in 0) TIMING_ON=false ;; 1) TIMING_ON=true ;; *) echo "TIMING must be 0 or 1" >&2; exit 2 ;; esac
[ "$PROFILE" = 0 ] || command -v perf >/dev/null 2>&1 || {
  echo "PROFILE=1 needs perf (Debian: apt-get install linux-perf)" >&2; exit 2; }

log() { printf '%s\n' "$*" >&2; }

# ---- 1. packages, the LuaJIT build of the module -------------------------------
debs=(nginx libnginx-mod-http-lua libnginx-mod-http-echo lua-cjson wrk curl)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "== installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >&2
fi
so=build-lua/5.1/lib/lua/5.1/llmretry/core.so
if [ ! -f "$so" ] || [ -n "$(find bindings/lua core/src core/include rockspecs -type f -newer "$so" | head -n 1)" ]; then
  log "== building the Lua module (tools/lua-test.sh --build-only)"
  tools/lua-test.sh --build-only >&2
fi
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# ---- 2. the endpoint (bench/nginx.conf) and the gateway --------------------------
# shellcheck source=bench/nginx.sh
. "$ROOT/bench/nginx.sh"
bench_nginx_install
bench_nginx_start "$UP_PORT"            # sets TMP, SLOW; stops on exit
GW="$TMP/gateway"
mkdir -p "$GW"
chmod 755 "$GW"
BGW="$TMP/gateway-baseline"     # BASELINE only: the baseline's gateway
CGW="$TMP/gateway-cosocket"     # the transport "cosocket"'s gateway
mkdir -p "$CGW"
chmod 755 "$CGW"
if [ -n "$BASELINE" ]; then
  log "== building the baseline $BASELINE's Lua module (tools/lua-test.sh --build-only)"
  mkdir -p "$TMP/baseline" "$BGW"
  chmod 755 "$TMP/baseline" "$BGW"
  git -C "$ROOT" archive "$BASELINE" | tar -x -C "$TMP/baseline"
  (cd "$TMP/baseline" && tools/lua-test.sh --build-only >&2) || {
    log "the baseline $BASELINE does not build"; exit 1; }
fi
gateway_conf() { # repo port [init_worker options] -> the gateway's nginx.conf on stdout
  sed -e "s|__REPO__|$1|g" -e "s|__GW_PORT__|$2|g" -e "s|__UP_PORT__|$UP_PORT|g" \
    -e "s|__INIT_EXTRA__|${3:-}|g" -e "s|__GC_TUNING__|$GC_TUNING|g" \
    -e "s|__PEER_SPIN__|$PEER_SPIN|g" -e "s|__BENCH__|$ROOT/bench|g" \
    -e "s|__TIMING__|$TIMING_ON|g" "$ROOT/bench/openresty.conf"
}
gateway_conf "$ROOT" "$GW_PORT" >"$GW/nginx.conf"
gateway_conf "$ROOT" "$CGW_PORT" ', transport = "cosocket"' >"$CGW/nginx.conf"
BEXTRA=""
[ "$BASELINE_TRANSPORT" = engine ] || BEXTRA=', transport = "cosocket"'
[ -z "$BASELINE" ] || gateway_conf "$TMP/baseline" "$BGW_PORT" "$BEXTRA" >"$BGW/nginx.conf"
stop_gateway() {
  local d
  for d in "$GW" "$BGW" "$CGW"; do
    [ -f "$d/nginx.pid" ] && "$NGINX" -p "$d/" -e "$d/error.log" -c "$d/nginx.conf" -s stop 2>/dev/null || true
    for _ in $(seq 50); do [ -f "$d/nginx.pid" ] || break; sleep 0.1; done
  done
  bench_nginx_stop
}
trap stop_gateway EXIT
"$NGINX" -p "$GW/" -e "$GW/error.log" -c "$GW/nginx.conf" || { cat "$GW/error.log" >&2; exit 1; }
if [ -n "$BASELINE" ]; then
  "$NGINX" -p "$BGW/" -e "$BGW/error.log" -c "$BGW/nginx.conf" || { cat "$BGW/error.log" >&2; exit 1; }
fi
WITH_COSOCKET=0
case " $TRANSPORTS " in *" cosocket "*) WITH_COSOCKET=1 ;; esac
if [ "$WITH_COSOCKET" = 1 ]; then
  "$NGINX" -p "$CGW/" -e "$CGW/error.log" -c "$CGW/nginx.conf" || { cat "$CGW/error.log" >&2; exit 1; }
fi
PATHS=(llmretry cosocket)
[ "$WITH_COSOCKET" = 0 ] || PATHS+=(llmretry-cosocket)
[ -z "$BASELINE" ] || PATHS+=(baseline)
url_of() { # path -> the gateway URL that serves it
  case $1 in
    baseline) echo "http://127.0.0.1:$BGW_PORT/llmretry" ;;
    llmretry-cosocket) echo "http://127.0.0.1:$CGW_PORT/llmretry" ;;
    *) echo "http://127.0.0.1:$GW_PORT/$1" ;;
  esac
}
for path in "${PATHS[@]}"; do
  for _ in $(seq 50); do
    [ "$(curl -s "$(url_of "$path")" 2>/dev/null)" = "ok" ] && break
    sleep 0.1
  done
  [ "$(curl -s "$(url_of "$path")")" = "ok" ] || {
    log "the gateway's $(url_of "$path") does not answer"; cat "$GW/error.log" >&2
    [ -z "$BASELINE" ] || cat "$BGW/error.log" >&2; exit 1; }
done

# ---- 3. the runs: wrk, CONNS connections, interleaved -------------------------
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
if awk "BEGIN { exit !($(cut -d' ' -f1 /proc/loadavg) > 0.5) }"; then
  log "WARNING: load average $LOAD0 before the run: other work shares these cores, figures will be noisy"
fi
# CPU ticks (utime + stime) of the gateway worker: its main thread (nginx's
# event loop, where Lua runs) and the others (llmretry's engine I/O thread).
WORKER=$(pgrep -P "$(cat "$GW/nginx.pid")" | head -n 1)
BWORKER=""
[ -z "$BASELINE" ] || BWORKER=$(pgrep -P "$(cat "$BGW/nginx.pid")" | head -n 1)
CWORKER=""
[ "$WITH_COSOCKET" = 0 ] || CWORKER=$(pgrep -P "$(cat "$CGW/nginx.pid")" | head -n 1)
TICK=$(getconf CLK_TCK)
ticks() { # [worker] -> "main others"
  local w=${1:-$WORKER} main=0 others=0 t v
  for t in /proc/"$w"/task/*; do
    v=$(awk '{ print $14 + $15 }' "$t/stat")
    if [ "${t##*/}" = "$w" ]; then main=$((main + v)); else others=$((others + v)); fi
  done
  echo "$main $others"
}
# The machine's busy and idle ticks (/proc/stat's "cpu" line, every core):
# busy is user + nice + system + irq + softirq + steal, idle is idle +
# iowait. What every process of a run spends (wrk, the endpoint, the
# gateway), for the machine's CPU a call and how idle its cores stayed.
machine_ticks() {
  awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9, $5 + $6 }' /proc/stat
}
# The scheduler's account of the gateway worker's threads (schedstat: time
# on a core, time runnable but waiting for one, and slices, one per
# wake-up or preemption), all threads summed: "run_ns wait_ns slices".
# The wait a call and the slices a call say whether a gateway's threads
# queue for the cores (the machine's other processes compete for them).
sched() { # worker
  cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ r += $1; w += $2; s += $3 } END { print r + 0, w + 0, s + 0 }'
}
# wrk's latency line "99%  123.45ms" in ms.
to_ms() { awk '{ v = $1 + 0; if ($1 ~ /us$/) v /= 1000; else if ($1 ~ /ms$/) v = v; else if ($1 ~ /s$/) v *= 1000; printf "%.1f", v }'; }
declare -A RPS P50 P99 ERRS CPU_MAIN CPU_IO CPU_ALL IDLE WAIT SLICES PROF
WRK_SCRIPT=()
[ "$PACE_MS" = 0 ] || WRK_SCRIPT=(-s "$ROOT/bench/wrk_paced.lua")
run() { # path secs -> sets OUT
  OUT=$(PACE_MS=$PACE_MS wrk -t2 -c"$CONNS" -d"$2"s --timeout 10s --latency "${WRK_SCRIPT[@]}" "$(url_of "$1")")
}
# TIMING=1: a run's timings (bench/clients/bench_timing.lua), read from its
# gateway's /timing: "wall_mean wall_p50 wall_p99 total_p50 total_p99
# attempt_p50 attempt_p99" in ms (- where it has none).
timings() { # path
  local url loc
  url=$(url_of "$1")
  loc=llmretry
  [ "$1" != cosocket ] || loc=cosocket
  curl -s "${url%/*}/timing" | python3 -c '
import json, sys
d = json.load(sys.stdin).get(sys.argv[1]) or {}
f = lambda k, i: "-" if not d.get(k) or d[k][i] is None else "%.1f" % d[k][i]
print(f("wall", 0), f("wall", 1), f("wall", 2), f("total", 1), f("total", 2), f("attempt", 1), f("attempt", 2))
' "$loc"
}
for path in "${PATHS[@]}"; do
  log "== warm-up /$path (3 s)"
  run "$path" 3
done
if [ "$TIMING" = 1 ]; then
  for path in "${PATHS[@]}"; do timings "$path" >/dev/null; done   # the warm-ups' figures go
fi
declare -A TIMES   # path -> each run's timings() line, one per line
for r in $(seq "$RUNS"); do
  order=("${PATHS[@]}")
  if [ ${#PATHS[@]} -gt 2 ]; then   # rotated: no gateway always runs first
    k=$(( (r - 1) % ${#PATHS[@]} ))
    order=("${PATHS[@]:k}" "${PATHS[@]:0:k}")
  fi
  for path in "${order[@]}"; do
    log "== run $r of $RUNS: /$path, $CONNS connections, $SECS s (load $(cut -d' ' -f1 /proc/loadavg))"
    w=$WORKER
    [ "$path" != baseline ] || w=$BWORKER
    [ "$path" != llmretry-cosocket ] || w=$CWORKER
    read -r m0 o0 < <(ticks "$w")
    read -r b0 i0 < <(machine_ticks)
    read -r _ sw0 ss0 < <(sched "$w")
    prof=""
    if [ "$PROFILE" != 0 ] && [ "$r" = "$RUNS" ]; then
      # The middle of the run: from its first second to one before its end.
      (sleep 1; exec perf record -q -F 999 -p "$w" -o "$TMP/perf.$path" -- sleep $((SECS - 2))) \
        >/dev/null 2>&1 &
      prof=$!
    fi
    run "$path" "$SECS"
    read -r m1 o1 < <(ticks "$w")
    read -r b1 i1 < <(machine_ticks)
    read -r _ sw1 ss1 < <(sched "$w")
    [ -z "$prof" ] || wait "$prof" || log "   perf record failed for /$path"
    rps=$(printf '%s\n' "$OUT" | awk '/^Requests\/sec:/ { print $2 }')
    p50=$(printf '%s\n' "$OUT" | awk '$1 == "50%" { print $2 }' | to_ms)
    p99=$(printf '%s\n' "$OUT" | awk '$1 == "99%" { print $2 }' | to_ms)
    non2xx=$(printf '%s\n' "$OUT" | awk '/Non-2xx/ { print $NF }')
    sock=$(printf '%s\n' "$OUT" | awk -F'[ ,]+' '/Socket errors/ { print $4 + $6 + $8 + $10 }')
    errs=$(( ${non2xx:-0} + ${sock:-0} ))
    calls=$(printf '%s\n' "$OUT" | awk '/requests in/ { print $1 }')
    cpu_main=$(awk "BEGIN { printf \"%.0f\", ($m1 - $m0) / $TICK * 1e6 / $calls }")
    cpu_io=$(awk "BEGIN { printf \"%.0f\", ($o1 - $o0) / $TICK * 1e6 / $calls }")
    cpu_all=$(awk "BEGIN { printf \"%.0f\", ($b1 - $b0) / $TICK * 1e6 / $calls }")
    wait=$(awk "BEGIN { printf \"%.1f\", ($sw1 - $sw0) / 1000 / $calls }")
    slices=$(awk "BEGIN { printf \"%.2f\", ($ss1 - $ss0) / $calls }")
    idle=$(awk "BEGIN { t = ($b1 - $b0) + ($i1 - $i0); printf \"%.0f\", (t > 0) ? ($i1 - $i0) * 100 / t : 0 }")
    log "   $rps req/s, p50 $p50 ms, p99 $p99 ms, errors $errs, CPU µs/call $cpu_main + $cpu_io," \
      "machine $cpu_all µs/call, idle $idle %, run-queue wait $wait µs/call, $slices slices/call"
    [ -z "$prof" ] || PROF[$path]="$TMP/perf.$path:$rps"
    if [ "$TIMING" = 1 ]; then
      read -r tw tw50 tw99 tt50 tt99 ta50 ta99 < <(timings "$path")
      log "   timings (ms): handler wall mean $tw, p50 $tw50, p99 $tw99; core total p50 $tt50," \
        "p99 $tt99; attempt p50 $ta50, p99 $ta99"
      TIMES[$path]+="$tw $tw50 $tw99 $tt50 $tt99 $ta50 $ta99"$'\n'
    fi
    CPU_MAIN[$path]+="${CPU_MAIN[$path]:+/}$cpu_main"
    CPU_IO[$path]+="${CPU_IO[$path]:+/}$cpu_io"
    CPU_ALL[$path]+="${CPU_ALL[$path]:+/}$cpu_all"
    IDLE[$path]+="${IDLE[$path]:+/}$idle"
    WAIT[$path]+="${WAIT[$path]:+/}$wait"
    SLICES[$path]+="${SLICES[$path]:+/}$slices"
    RPS[$path]+="${RPS[$path]:+/}$rps"
    P50[$path]+="${P50[$path]:+/}$p50"
    P99[$path]+="${P99[$path]:+/}$p99"
    ERRS[$path]+="${ERRS[$path]:+/}$errs"
  done
done
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)
BAD=$(grep -c '\[error\]' "$GW/error.log" || true)
[ -z "$BASELINE" ] || BAD="$BAD (the baseline's: $(grep -c '\[error\]' "$BGW/error.log" || true))"

# ---- 4. the report ----------------------------------------------------------------
median() { tr '/' '\n' <<<"$1" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
echo "llmretry OpenResty benchmark — $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores" \
  "($(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)), $("$NGINX" -v 2>&1 | sed 's/^nginx version: //')" \
  "with libnginx-mod-http-lua $(dpkg-query -W -f='${Version}' libnginx-mod-http-lua), libcurl" \
  "$(pkg-config --modversion libcurl 2>/dev/null || echo '?'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')." \
  "Load average (1/5/15 min) $LOAD0 before, $LOAD1 after; error-log lines of the gateway: $BAD."
echo
echo "One gateway worker (\`bench/openresty.conf\`) calls the 50 ms endpoint of \`bench/nginx.conf\`" \
  "(\`echo_sleep 0.05\`, its own nginx, one worker) for every downstream request and answers the" \
  "model's content; \`wrk -t2 -c$CONNS -d${SECS}s --latency\` is the $CONNS downstream clients$( [ "$PACE_MS" = 0 ] || echo ", each waiting $PACE_MS ms before each request (bench/wrk_paced.lua: the same offered load for every gateway)")." \
  "All three share the machine's cores. Median of $RUNS interleaved runs, after a 3 s warm-up of each.$( [ -z "$GC_STEPMUL" ] || echo " Every gateway's worker runs \`collectgarbage(\"setstepmul\", $GC_STEPMUL)\` (LuaJIT's default: 200).")$( [ "$PEER_SPIN" = 0 ] || echo " The cosocket gateway turns a busy loop $PEER_SPIN times per request (PEER_SPIN) before its call.")"
echo
echo "| gateway | calls/s | runs | p50 ms | p99 ms | runs (p99) | errors | worker CPU µs/call: event loop + I/O thread | machine CPU µs/call | idle % | worker's run-queue wait µs/call | worker's slices/call |"
echo "|---|---:|---|---:|---:|---|---|---:|---:|---:|---:|---:|"
for path in "${PATHS[@]}"; do
  case $path in
    llmretry) name="llmretry.openresty \`call_llm\` (one engine per worker, no thread pool)" ;;
    baseline) name="the same at the baseline $BASELINE (its own gateway nginx, same config, transport \"$BASELINE_TRANSPORT\")" ;;
    llmretry-cosocket) name="llmretry.openresty \`call_llm\`, \`transport = \"cosocket\"\` (no engine thread: attempts on the worker's cosockets; its own gateway nginx)" ;;
    cosocket) name="cosocket client + retry loop (\`bench/clients/resty_mini_http.lua\`, lua-resty-http style)" ;;
  esac
  echo "| $name | $(median "${RPS[$path]}") | ${RPS[$path]} | $(median "${P50[$path]}") | $(median "${P99[$path]}") | ${P99[$path]} | ${ERRS[$path]} | $(median "${CPU_MAIN[$path]}") + $(median "${CPU_IO[$path]}") | $(median "${CPU_ALL[$path]}") | $(median "${IDLE[$path]}") | $(median "${WAIT[$path]}") | $(median "${SLICES[$path]}") |"
done
echo
cpu_note="*Worker CPU* is the gateway worker's user + system CPU over the run ÷ calls (\`/proc\`): its"
cpu_note+=" main thread (nginx's event loop, where the Lua runs) + its other threads (llmretry's engine"
cpu_note+=" I/O thread, which runs libcurl and the retry policy). *Machine CPU* is every process's"
cpu_note+=" (wrk, the endpoint, the gateway: \`/proc/stat\`, all cores, steal included) over the run ÷ calls;"
cpu_note+=" *idle* the share of the cores' time nobody used. The worker's *run-queue wait* and *slices*"
cpu_note+=" are the scheduler's (\`/proc/<pid>/task/*/schedstat\`, all its threads) over the run ÷ calls:"
cpu_note+=" how long its threads were ready to run but waited for a core, and how often they were put on"
cpu_note+=" one (each wake-up or preemption is a slice)."
echo "$cpu_note"
echo
ratio=$(awk "BEGIN { printf \"%.2f\", $(median "${RPS[llmretry]}") / $(median "${RPS[cosocket]}") }")
echo "llmretry's gateway makes ${ratio}× the calls/s of the cosocket gateway. The ceiling is" \
  "$CONNS / 0.05 s = $((CONNS * 20)) calls/s; below it, the cores are the limit: the endpoint's" \
  "nginx, the gateway (its worker and, for llmretry, the engine's I/O thread) and wrk share them."
if [ "$WITH_COSOCKET" = 1 ]; then
  echo
  cratio=$(awk "BEGIN { printf \"%.2f\", $(median "${RPS[llmretry-cosocket]}") / $(median "${RPS[cosocket]}") }")
  echo "With \`transport = \"cosocket\"\` llmretry's gateway makes ${cratio}× the calls/s of the cosocket" \
    "gateway, p99 $(median "${P99[llmretry-cosocket]}") ms against $(median "${P99[cosocket]}") ms;" \
    "worker CPU µs/call $(median "${CPU_MAIN[llmretry-cosocket]}") + $(median "${CPU_IO[llmretry-cosocket]}")."
fi
if [ -n "$BASELINE" ]; then
  echo
  mine=llmretry
  [ "$BASELINE_TRANSPORT" = engine ] || mine=llmretry-cosocket
  bratio=$(awk "BEGIN { printf \"%.2f\", $(median "${RPS[$mine]}") / $(median "${RPS[baseline]}") }")
  echo "Against the baseline $BASELINE, transport \"$BASELINE_TRANSPORT\" on both (same rounds, order" \
    "rotated): ${bratio}× its calls/s, p99 $(median "${P99[$mine]}") ms against" \
    "$(median "${P99[baseline]}") ms; worker CPU µs/call $(median "${CPU_MAIN[$mine]}") +" \
    "$(median "${CPU_IO[$mine]}") against $(median "${CPU_MAIN[baseline]}") + $(median "${CPU_IO[baseline]}")."
fi
if [ "$PROFILE" != 0 ]; then
  echo
  echo "Where each gateway worker's CPU goes (PROFILE=1): \`perf record -F 999\` of the worker, all its" \
    "threads, over $((SECS - 2)) s in the middle of its run of the last round; µs per call by library" \
    "(samples ÷ 999 ÷ the run's calls/s ÷ $((SECS - 2)) s):"
  echo
  args=()
  for path in "${PATHS[@]}"; do [ -z "${PROF[$path]:-}" ] || args+=("$path=${PROF[$path]}"); done
  python3 "$ROOT/bench/perf_by_dso.py" --freq 999 --secs $((SECS - 2)) "${args[@]}"
fi
if [ "$TIMING" = 1 ]; then
  mid() { # path column -> that column's median over the runs, - where it has none
    local runs
    runs=$(awk -v c="$2" 'NF { printf "%s%s", sep, $c; sep = "/" }' <<<"${TIMES[$1]}")
    case $runs in -*|'') echo "-" ;; *) median "$runs" ;; esac
  }
  echo
  echo "Where the latency goes (TIMING=1, bench/clients/bench_timing.lua; medians over the runs, ms):" \
    "wrk's latency, the handler's wall time (from before its call to after it), the core's" \
    "meta.total_ms (submit to finish) and meta.duration_ms (the attempt, the endpoint's 50 ms in it)."
  echo
  echo "| gateway | wrk p50 | wrk p99 | handler mean | handler p50 | handler p99 | core total p50 | core total p99 | attempt p50 | attempt p99 |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  for path in "${PATHS[@]}"; do
    row="| /$path | $(median "${P50[$path]}") | $(median "${P99[$path]}") |"
    for col in 1 2 3 4 5 6 7; do row+=" $(mid "$path" "$col") |"; done
    echo "$row"
  done
fi
