# Sourced by bench/run_async.sh, run_rate.sh and run_otel_peer.sh: the extension built
# in place with $PYTHON, and a venv of the same interpreter ($VENV under
# $BUILD_DIR) holding the async peers (openai[aiohttp], httpx, aiohttp), so
# their versions stay off $PYTHON. Sets VPY; exits on failure. Needs log().
log "== building the extension (make build-python)"
make --no-print-directory build-python PYTHON="$PYTHON" >/dev/null 2>&1 || {
  log "make build-python failed:"; make --no-print-directory build-python PYTHON="$PYTHON" >&2; exit 1; }
mkdir -p "$BUILD_DIR"
[ -x "$VENV/bin/python" ] || { log "== creating the venv $VENV"; "$PYTHON" -m venv "$VENV"; }
VPY="$VENV/bin/python"
# Another script's peers: PEER_PKGS (an array of pip arguments), PEER_CHECK
# (Python that fails until they are in place; given PEER_PKGS as its
# arguments) and PEER_LOG, set before sourcing (bench/run_otel_peer.sh).
if [ -z "${PEER_CHECK:-}" ]; then
  PEER_PKGS=('openai[aiohttp]' httpx aiohttp)
  PEER_CHECK='import openai, httpx2, httpx, aiohttp; openai.DefaultAioHttpClient()'
  PEER_LOG=venv-async-pip.log
fi
if ! "$VPY" -c "$PEER_CHECK" "${PEER_PKGS[@]}" 2>/dev/null; then
  log "== installing ${PEER_PKGS[*]} into $VENV (pip)"
  "$VPY" -m pip install --quiet "${PEER_PKGS[@]}" >"$BUILD_DIR/$PEER_LOG" 2>&1 || {
    log "pip install failed:"; cat "$BUILD_DIR/$PEER_LOG" >&2; exit 1; }
fi
"$VPY" -c 'import llmretry' || { log "llmretry does not import in $VPY"; exit 1; }
