#!/usr/bin/env bash
# The packages as users get them (make test-pip-install). Exits non-zero on
# any failure.
#  1. tools/build-wheel.sh: the sdist, a wheel built from that sdist (from
#     source: this step has the compiler and the -dev packages), repaired by
#     auditwheel to a manylinux wheel with libcurl and cJSON inside.
#  2. That wheel into a fresh venv by a pip that may not build anything
#     (--no-index --only-binary), with a PATH of only the venv's bin: no
#     compiler is found. Then the Python quick start through the installed
#     package (tools/check_installed.py: its own mock server, one call_llm,
#     the bundled libcurl and cJSON the ones loaded, the versions agreeing)
#     and `llmretry --version`, from an empty directory and a bare environment.
#  3. ldd of the installed extension: libcurl and cJSON resolve inside the wheel.
#  4. tools/check-rock.sh: the source rock of `make rock` builds and loads
#     (while 1-3 run).
# Needs network or pip's cache only for the packaging tools and setuptools.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
work="$(mktemp -d "${TMPDIR:-/tmp}/llmretry-pip.XXXXXX")"
# Step 4 runs while the others do (tools/jobs.sh: its output comes last); a
# failure here still waits for it.
. "$repo/tools/jobs.sh"
trap 'jobs_wait >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
jobs_start check-rock "$repo/tools/check-rock.sh"
start=$SECONDS

"$repo/tools/build-wheel.sh" "$work/dist" >"$work/build.out"
cat "$work/build.out"
wheel="$(ls "$work"/dist/llmretry-*-manylinux_*.whl)"
case "$wheel" in
  *-cp3*-manylinux_*_x86_64.whl|*-cp3*-manylinux_*_aarch64.whl) ;;
  *) echo "check-pip-install: unexpected wheel name: $wheel" >&2; exit 1 ;;
esac
libs="$("$python" -m zipfile -l "$wheel" | awk '{print $1}' | grep '^llmretry\.libs/' || true)"
for lib in libcurl libcjson libhiredis; do
  grep -q "^llmretry\.libs/$lib-" <<<"$libs" \
    || { echo "check-pip-install: $lib is not bundled in $wheel" >&2; exit 1; }
done

# A bare environment: the venv's bin is the whole PATH, HOME is empty.
"$python" -m venv "$work/venv"
mkdir "$work/home" "$work/run"
bare=(env -i "PATH=$work/venv/bin" "HOME=$work/home" PIP_DISABLE_PIP_VERSION_CHECK=1)
if "${bare[@]}" /bin/sh -c 'command -v cc || command -v gcc' >/dev/null; then
  echo "check-pip-install: a compiler is on the bare PATH" >&2
  exit 1
fi
"${bare[@]}" "$work/venv/bin/python" -m pip install -q --no-index --only-binary=:all: \
    --no-deps "$wheel"
cp "$repo/tools/check_installed.py" "$work/run/"
(cd "$work/run" && "${bare[@]}" "$work/venv/bin/python" check_installed.py)
version_line="$(cd "$work/run" && "${bare[@]}" llmretry --version)"
echo "check-pip-install: llmretry --version: $version_line"
grep -Eq '^llmretry [^ ]+ \(core [^ ]+, libcurl [^ ]+\)$' <<<"$version_line" \
  || { echo "check-pip-install: unexpected --version output" >&2; exit 1; }

so="$(ls "$work"/venv/lib/python*/site-packages/llmretry/_llmretry*.so)"
for lib in libcurl libcjson libhiredis; do
  resolved="$(ldd "$so" | awk -v lib="$lib" 'index($1, lib) == 1 {print $3}')"
  resolved="$(readlink -f "$resolved")"
  case "$resolved" in
    "$work"/venv/lib/python*/site-packages/llmretry.libs/*) ;;
    *) echo "check-pip-install: $lib resolves to '$resolved', not the wheel's copy" >&2; exit 1 ;;
  esac
done
echo "check-pip-install: wheel and sdist checked in $((SECONDS - start)) s"

jobs_wait
