#!/usr/bin/env bash
# The Python suite under other CPythons than the one make test uses (make
# test-pythons): for each interpreter, its test packages (tools/ensure-deps.sh,
# without Ray and Dask, which may have no wheels for it), the extension built
# in place for it (python/llmretry/_llmretry.cpython-3XX-*.so, beside the
# others), and tests/python without the Ray and Dask tests.
#
#   tools/test-pythons.sh [PYTHON...]   default: python3.12 and python3.13,
#                                       on PATH or in pyenv's versions
#
# Not part of make test (about 2 minutes an interpreter on 2 idle cores): run it
# where such interpreters are, before a change to the binding or to what
# Python version a test may assume lands.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

runs() { "$1" -c 'import sys' >/dev/null 2>&1; }    # a pyenv shim may not

pythons=("$@")
if [ ${#pythons[@]} -eq 0 ]; then
  pyenv_root=$(pyenv root 2>/dev/null || true)
  for v in 3.12 3.13; do
    for candidate in "python$v" ${pyenv_root:+"$pyenv_root"/versions/"$v"*/bin/python"$v"}; do
      if runs "$candidate"; then
        pythons+=("$candidate")
        break
      fi
    done
  done
fi
[ ${#pythons[@]} -gt 0 ] || { echo "test-pythons: no python3.12 or python3.13 found" >&2; exit 2; }

failed=()
for py in "${pythons[@]}"; do
  runs "$py" || { echo "test-pythons: $py does not run" >&2; failed+=("$py"); continue; }
  version=$("$py" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
  echo "test-pythons: Python $version ($py)"
  if ! PYTHON="$py" LLMRETRY_NO_CLUSTERS=1 tools/ensure-deps.sh \
       || ! "$py" setup.py -q build_ext --inplace \
       || ! "$py" -m pytest -q -p no:cacheprovider -n "${PYTEST_JOBS:-2}" --dist loadfile \
            tests/python --ignore=tests/python/test_ray.py --ignore=tests/python/test_dask.py; then
    failed+=("$py ($version)")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  for f in "${failed[@]}"; do echo "test-pythons: FAILED under $f" >&2; done
  exit 1
fi
echo "test-pythons: the suite passed under ${pythons[*]}"
