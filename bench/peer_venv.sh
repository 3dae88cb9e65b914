# Sourced by bench/run_async.sh and bench/run_rate.sh: the extension built
# in place with $PYTHON, and a venv of the same interpreter ($VENV under
# $BUILD_DIR) holding the async peers (openai[aiohttp], httpx, aiohttp), so
# their versions stay off $PYTHON. Sets VPY; exits on failure. Needs log().
log "== building the extension (make build-python)"
make --no-print-directory build-python PYTHON="$PYTHON" >/dev/null 2>&1 || {
  log "make build-python failed:"; make --no-print-directory build-python PYTHON="$PYTHON" >&2; exit 1; }
mkdir -p "$BUILD_DIR"
[ -x "$VENV/bin/python" ] || { log "== creating the venv $VENV"; "$PYTHON" -m venv "$VENV"; }
VPY="$VENV/bin/python"
if ! "$VPY" -c 'import openai, httpx2, httpx, aiohttp; openai.DefaultAioHttpClient()' 2>/dev/null; then
  log "== installing openai[aiohttp] httpx aiohttp into $VENV (pip)"
  "$VPY" -m pip install --quiet 'openai[aiohttp]' httpx aiohttp >"$BUILD_DIR/venv-async-pip.log" 2>&1 || {
    log "pip install failed:"; cat "$BUILD_DIR/venv-async-pip.log" >&2; exit 1; }
fi
"$VPY" -c 'import llmretry' || { log "llmretry does not import in $VPY"; exit 1; }
