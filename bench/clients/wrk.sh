#!/usr/bin/env bash
# Benchmark client: wrk, the ceiling of this machine (see README.md).
#
#   bench/clients/wrk.sh --url BASE --concurrency C --requests N [--warmup W]
#
# wrk cannot run a fixed count: it runs for N / 100,000 s (at least 2 s,
# whole seconds) with C connections and min(2, C) threads, POSTing the
# suite's request (wrk_post.lua). ok = responses with a status < 400
# (wrk counts >= 400 as errors), failed = those plus connections that
# failed or timed out; seconds = wrk's measured duration; cpu_seconds =
# wrk's user + sys CPU (bash `times` before and after: this shell's
# reaped children). W is ignored: wrk has no fixed-count warm-up, and its
# runs last seconds.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
url="" conc="" n=""
while [ $# -gt 0 ]; do
  case $1 in
    --url) url=${2%/}; shift 2 ;;
    --concurrency) conc=$2; shift 2 ;;
    --requests) n=$2; shift 2 ;;
    --warmup) shift 2 ;;
    *) echo "wrk.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$url" ] || ! [ "${conc:-x}" -ge 1 ] 2>/dev/null || ! [ "${n:-x}" -ge 1 ] 2>/dev/null; then
  echo "usage: wrk.sh --url BASE --concurrency C --requests N [--warmup W]" >&2
  exit 2
fi
command -v wrk >/dev/null || { echo "wrk.sh: wrk is not installed (bench/clients/setup.sh)" >&2; exit 1; }

# 1,024 connections do not fit under the usual soft limit of 1,024 files.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

secs=$(( (n + 99999) / 100000 ))
[ "$secs" -ge 2 ] || secs=2
threads=$(( conc < 2 ? conc : 2 ))
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# `times` runs in this shell (a redirect, no subshell): its second line is
# the user and system time of the children reaped so far ("XmY.YYYs XmY.YYYs").
times >"$tmp/cpu0"
wrk -t "$threads" -c "$conc" -d "${secs}s" --timeout 60s -s "$here/wrk_post.lua" \
  "$url/chat/completions" >"$tmp/out" || { cat "$tmp/out" >&2; echo "wrk.sh: wrk failed" >&2; exit 1; }
times >"$tmp/cpu1"
cat "$tmp/out" >&2

line=$(grep '^WRK_RESULT ' "$tmp/out") || { echo "wrk.sh: no WRK_RESULT line" >&2; exit 1; }
children_cpu() {   # the second line of a `times` output, in seconds
  sed -n 2p "$1" | awk '{
    t = 0
    for (i = 1; i <= 2; i++) { split($i, p, "m"); sub("s", "", p[2]); t += p[1] * 60 + p[2] }
    printf "%.6f", t }'
}
cpu=$(awk -v a="$(children_cpu "$tmp/cpu0")" -v b="$(children_cpu "$tmp/cpu1")" \
  'BEGIN { printf "%.6f", b - a }')
printf '%s\n' "$line" | awk -v cpu="$cpu" '{
  for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
  ok = v["requests"] - v["status"]
  failed = v["status"] + v["connect"] + v["read"] + v["write"] + v["timeout"]
  printf "{\"ok\": %d, \"failed\": %d, \"seconds\": %.6f, \"cpu_seconds\": %s}\n",
    ok, failed, v["duration_us"] / 1e6, cpu }'
