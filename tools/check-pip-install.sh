#!/usr/bin/env bash
# Check that `pip install .` works from a clean slate: a fresh venv, a build
# of the C extension from this checkout, then one call through the installed
# package against its own mock server. Exits non-zero on any failure.
# Needs network only for pip to fetch setuptools and wheel.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
work="$(mktemp -d "${TMPDIR:-/tmp}/llmretry-pip.XXXXXX")"
trap 'rm -rf "$work"' EXIT

echo "check-pip-install: venv in $work"
"$python" -m venv "$work/venv"
venv_python="$work/venv/bin/python"

# Build from a copy so the checkout's build dirs and in-place .so cannot
# leak into the wheel, and the venv cannot see the source tree.
mkdir "$work/src"
tar -C "$repo" --exclude=.git --exclude='build' --exclude='build-*' \
    --exclude='*.so' --exclude='__pycache__' --exclude='*.egg-info' -cf - . \
  | tar -C "$work/src" -xf -

"$venv_python" -m pip install -q --disable-pip-version-check "$work/src"

# Run from an empty directory with a clean environment: the installed copy only.
cd "$work"
env -u PYTHONPATH -u OPENAI_API_KEY -u OPENAI_BASE_URL "$venv_python" - <<'PY'
import os
import sys

import llmretry
from llmretry.testing import MockServer

where = os.path.dirname(llmretry.__file__)
assert "site-packages" in where, f"llmretry imported from {where}, not the venv"
for name in ("py.typed", "_llmretry.pyi"):
    assert os.path.exists(os.path.join(where, name)), f"{name} is not installed"

body = {"model": "pip-check", "messages": [{"role": "user", "content": "hi"}]}
with MockServer() as mock:
    mock.script("check", [{"status": 503}, {"content": "installed ok"}])
    data, meta = llmretry.call_llm(body, base_url=mock.scenario_url("check"),
                                   base_delay_ms=1, logger=None)
    answer = data["choices"][0]["message"]["content"]
    assert answer == "installed ok", answer
    assert meta.status == 200 and meta.attempts == 2, meta
    assert meta.model == "pip-check", meta
    assert len(mock.requests("check")) == 2
print(f"check-pip-install: llmretry {llmretry.__version__} installed and answered "
      f"({meta.attempts} attempts) with Python {sys.version.split()[0]}")
PY
