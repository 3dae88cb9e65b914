#!/usr/bin/env bash
# The C core benchmark: the llmretry engine against a bare libcurl multi
# loop, both talking to a local nginx, then memory per call in flight.
# See bench/README.md. Usage (from anywhere):  bash bench/run_core.sh
#
# Knobs (environment): N=20000 INFLIGHT=64 RUNS=3 RSS_INFLIGHT=1000
# RSS_ROUNDS=4 RSS_BIG_BODY=16384 (0 = skip the long-prompt memory row)
# LLMRETRY_BENCH_PORT=18089 BUILD_DIR=build-bench
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
N=${N:-20000}
INFLIGHT=${INFLIGHT:-64}
RUNS=${RUNS:-3}
RSS_INFLIGHT=${RSS_INFLIGHT:-1000}
RSS_ROUNDS=${RSS_ROUNDS:-4}
RSS_BIG_BODY=${RSS_BIG_BODY:-16384}
PORT=${LLMRETRY_BENCH_PORT:-18089}
BUILD_DIR=${BUILD_DIR:-build-bench}

log() { printf '%s\n' "$*" >&2; }

# ---- 1. nginx and the echo module (Debian packages) ----------------------
# shellcheck source=bench/nginx.sh
. "$ROOT/bench/nginx.sh"
bench_nginx_install

# ---- 2. build: the core as a static library, the two bench programs -------
log "== building ($BUILD_DIR)"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DLLMRETRY_TESTS=OFF >/dev/null
cmake --build "$BUILD_DIR" --target llmretry -j"$(nproc)" >/dev/null
DEPS=$(pkg-config --cflags --libs libcurl libcjson)
# the core links hiredis (the Redis store of shared budgets, issue 28)
CORE_DEPS=$(pkg-config --cflags --libs hiredis)
# shellcheck disable=SC2086
gcc -O2 -Wall -Wextra -Icore/include -o "$BUILD_DIR/bench_engine" bench/bench_engine.c \
  "$BUILD_DIR/libllmretry.a" $DEPS $CORE_DEPS -lpthread -lm -lrt
# shellcheck disable=SC2086
gcc -O2 -Wall -Wextra -o "$BUILD_DIR/bare_multi" bench/bare_multi.c $DEPS -lpthread

# ---- 3. nginx on loopback, everything under a temp dir --------------------
bench_nginx_start "$PORT"     # sets TMP, FAST, SLOW; stops nginx on exit

# 1,000 connections need more than the usual 1024 descriptors.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || ulimit -n 65536 2>/dev/null || true
log "== nginx $("$NGINX" -v 2>&1 | sed 's/.*\///'), port $PORT, ulimit -n $(ulimit -n), $(nproc) cores"
LOAD0=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$LOAD0" 'BEGIN {exit !(l > 0.5)}'; then
  log "WARNING: load average $LOAD0 before the run: other work shares these cores, figures will be noisy"
fi

RESULTS="$TMP/results.txt"
: >"$RESULTS"
run() {   # run TAG PROGRAM ARGS...: keep its RESULT line (prog=NAME becomes NAME+TAG)
  local tag=$1 out
  shift
  if ! out=$("$@"); then
    log "FAILED: $*"; printf '%s\n' "$out" >&2; exit 1
  fi
  printf '%s\n' "$out" | grep '^RESULT' | sed "s/^RESULT prog=\([^ ]*\)/RESULT prog=\1$tag/" |
    tee -a "$RESULTS" >&2
}

# ---- 4. throughput: interleaved runs -------------------------------------
log "== throughput: $N requests, $INFLIGHT in flight, $RUNS runs each, interleaved"
run "" "$BUILD_DIR/bare_multi" "$FAST" 2000 "$INFLIGHT" >/dev/null   # warm nginx (not counted)
: >"$RESULTS"
for i in $(seq "$RUNS"); do
  run "" "$BUILD_DIR/bare_multi" "$FAST" "$N" "$INFLIGHT"
  run "" "$BUILD_DIR/bench_engine" poll "$FAST" "$N" "$INFLIGHT"
  run "" "$BUILD_DIR/bench_engine" threads "$FAST" "$N" "$INFLIGHT"
done

# ---- 5. memory: calls in flight against the 50 ms endpoint ----------------
log "== memory: $RSS_INFLIGHT calls in flight, 50 ms server, $RSS_ROUNDS rounds"
run "" "$BUILD_DIR/bench_engine" rss "$SLOW" "$RSS_INFLIGHT" "$RSS_ROUNDS"
run "" "$BUILD_DIR/bare_multi" "$SLOW" "$((RSS_INFLIGHT * RSS_ROUNDS))" "$RSS_INFLIGHT" --rss
if [ "$RSS_BIG_BODY" -gt 0 ]; then
  log "== memory again with a ${RSS_BIG_BODY}-byte prompt"
  export LLMRETRY_BENCH_BODY_BYTES=$RSS_BIG_BODY
  run -big "$BUILD_DIR/bench_engine" rss "$SLOW" "$RSS_INFLIGHT" "$RSS_ROUNDS"
  run -big "$BUILD_DIR/bare_multi" "$SLOW" "$((RSS_INFLIGHT * RSS_ROUNDS))" "$RSS_INFLIGHT" --rss
  unset LLMRETRY_BENCH_BODY_BYTES
fi
LOAD1=$(cut -d' ' -f1 /proc/loadavg)

# ---- 6. the table ----------------------------------------------------------
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }
median() { sort -g | awk '{v[NR]=$1} END {if (NR) print v[int((NR+1)/2)]}'; }
med() { grep "prog=$1 " "$RESULTS" | field "$2" | median; }
all() { grep "prog=$1 " "$RESULTS" | field "$2" | paste -sd/ -; }

BARE_RPS=$(med bare rps)
echo
echo "llmretry C core benchmark — $(date -u +%Y-%m-%d), $(nproc) cores, libcurl $(pkg-config --modversion libcurl), nginx 1 worker, load average $LOAD0 before / $LOAD1 after, core at $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo
echo "| client ($N req, $INFLIGHT in flight, 0 ms server) | req/s (median of $RUNS) | runs | ratio to bare | ratio per run | CPU µs/req (median) |"
echo "|---|---:|---|---:|---|---:|"
for p in bare engine-poll engine-threads; do
  rps=$(med "$p" rps)
  case $p in
    bare) name="bare libcurl multi loop + cJSON" ;;
    engine-poll) name="llmretry engine, 1 host thread (submit/poll)" ;;
    engine-threads) name="llmretry engine, $INFLIGHT threads × call_blocking" ;;
  esac
  ratio=$(awk -v a="$rps" -v b="$BARE_RPS" 'BEGIN {printf "%.2f×", a / b}')
  # run i of a client against bare run i (the runs were interleaved)
  per=$(paste -d' ' <(grep "prog=bare " "$RESULTS" | field rps) <(grep "prog=$p " "$RESULTS" | field rps) |
        awk '{printf "%s%.2f", (NR > 1 ? "/" : ""), $2 / $1}')
  echo "| $name | $rps | $(all "$p" rps) | $ratio | $per | $(med "$p" cpu_us) |"
done
POLL_RATIO=$(awk -v a="$(med engine-poll rps)" -v b="$BARE_RPS" 'BEGIN {printf "%.2f", a / b}')
echo
echo "Target engine ≥ 0.60× bare: $(awk -v r="$POLL_RATIO" 'BEGIN {print (r >= 0.6 ? "met" : "NOT met")}') (${POLL_RATIO}×)."
echo
RSS_LINE=$(grep 'prog=engine-rss ' "$RESULTS")
BRSS_LINE=$(grep 'prog=bare-rss ' "$RESULTS")
echo "| memory, $RSS_INFLIGHT in flight, 50 ms server | VmRSS before | peak | KiB per call in flight |"
echo "|---|---:|---:|---:|"
echo "| llmretry engine (peak of $RSS_ROUNDS rounds, short prompt) | $(field rss_base_kib <<<"$RSS_LINE") KiB | $(field rss_peak_kib <<<"$RSS_LINE") KiB | $(field kib_per_call <<<"$RSS_LINE") |"
echo "| bare libcurl multi loop (for scale) | $(field rss_base_kib <<<"$BRSS_LINE") KiB | $(field rss_peak_kib <<<"$BRSS_LINE") KiB | $(field kib_per_call <<<"$BRSS_LINE") |"
if [ "$RSS_BIG_BODY" -gt 0 ]; then
  for p in engine-rss-big bare-rss-big; do
    L=$(grep "prog=$p " "$RESULTS")
    case $p in engine*) name="llmretry engine, ${RSS_BIG_BODY}-byte prompt" ;; *) name="bare loop, ${RSS_BIG_BODY}-byte prompt" ;; esac
    echo "| $name | $(field rss_base_kib <<<"$L") KiB | $(field rss_peak_kib <<<"$L") KiB | $(field kib_per_call <<<"$L") |"
  done
fi
echo
KIB=$(field kib_per_call <<<"$RSS_LINE")
echo "Target ≤ 40 KiB per call in flight (short prompt): $(awk -v k="$KIB" 'BEGIN {print (k <= 40 ? "met" : "NOT met")}') (${KIB} KiB)."
