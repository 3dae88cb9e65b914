#!/usr/bin/env bash
# Structured outputs benchmark (bench/bench_schema.py): the core's schema
# check against jsonschema, jsonschema-rs and pydantic, and call_many with a
# schema on and off. The peers go into a venv of $PYTHON under $BUILD_DIR (so
# their versions stay off $PYTHON); the extension is built in place and found
# through PYTHONPATH. Prints markdown; about a minute on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
BUILD_DIR=${BUILD_DIR:-build-bench}
VENV="$BUILD_DIR/venv-schema"
log() { echo "$*" >&2; }
log "== building the extension (make build-python)"
make --no-print-directory build-python PYTHON="$PYTHON" >/dev/null
mkdir -p "$BUILD_DIR"
[ -x "$VENV/bin/python" ] || { log "== creating the venv $VENV"; "$PYTHON" -m venv "$VENV"; }
VPY="$VENV/bin/python"
if ! "$VPY" -c 'import jsonschema, jsonschema_rs, pydantic' 2>/dev/null; then
  log "== installing jsonschema jsonschema-rs pydantic into $VENV (pip)"
  "$VPY" -m pip install --quiet jsonschema jsonschema-rs 'pydantic>=2' \
    >"$BUILD_DIR/venv-schema-pip.log" 2>&1 || {
    log "pip install failed:"; cat "$BUILD_DIR/venv-schema-pip.log" >&2; exit 1; }
fi
PYTHONPATH="$PWD/python" "$VPY" bench/bench_schema.py
