# shellcheck shell=bash
# The local nginx the benchmarks talk to, shared by run_core.sh and
# run_python.sh (source it; it defines functions and sets nothing else).
#
#   bench_nginx_install          apt-get nginx + libnginx-mod-http-echo when missing;
#                                sets NGINX (the binary)
#   bench_nginx_start PORT       nginx with bench/nginx.conf on 127.0.0.1:PORT, one
#                                worker, pid/logs/temp files in a fresh `mktemp -d`
#                                directory TMP (also yours for results); sets TMP,
#                                FAST (0 ms endpoint) and SLOW (50 ms endpoint), waits
#                                until both answer and installs `trap bench_nginx_stop EXIT`
#   bench_nginx_stop             stops nginx and removes TMP (idempotent)
# Needs ROOT (the repo) set and a `log` function; call from bash with set -e.

BENCH_ECHO_SO=/usr/lib/nginx/modules/ngx_http_echo_module.so

bench_nginx_install() {
  if ! command -v nginx >/dev/null 2>&1 || [ ! -f "$BENCH_ECHO_SO" ]; then
    log "== installing nginx + libnginx-mod-http-echo"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nginx libnginx-mod-http-echo >&2
  fi
  NGINX=$(command -v nginx || echo /usr/sbin/nginx)
}

bench_nginx_stop() {
  if [ -n "${TMP:-}" ] && [ -d "$TMP" ]; then
    if [ -f "$TMP/nginx.pid" ]; then
      "$NGINX" -p "$TMP/" -e "$TMP/error.log" -c "$TMP/nginx.conf" -s stop 2>/dev/null || true
      for _ in $(seq 50); do [ -f "$TMP/nginx.pid" ] || break; sleep 0.1; done
    fi
    rm -rf "$TMP"
  fi
}

bench_nginx_start() {
  local port=$1
  TMP=$(mktemp -d "${TMPDIR:-/tmp}/llmretry-bench.XXXXXX")
  chmod 755 "$TMP"            # nginx workers may run as nobody
  sed "s/127\.0\.0\.1:18089/127.0.0.1:$port/" "$ROOT/bench/nginx.conf" >"$TMP/nginx.conf"
  trap bench_nginx_stop EXIT
  "$NGINX" -p "$TMP/" -e "$TMP/error.log" -c "$TMP/nginx.conf" || {
    log "nginx failed to start (port $port busy? set LLMRETRY_BENCH_PORT)"
    cat "$TMP/error.log" >&2 || true
    exit 1
  }
  FAST="http://127.0.0.1:$port/v1/chat/completions"
  SLOW="http://127.0.0.1:$port/slow/v1/chat/completions"
  for _ in $(seq 50); do
    curl -fsS -o /dev/null -X POST -d '{}' "$FAST" 2>/dev/null && break
    sleep 0.1
  done
  curl -fsS -o /dev/null -X POST -d '{}' "$SLOW" || { log "nginx does not answer on $port"; exit 1; }
}
