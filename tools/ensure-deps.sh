#!/usr/bin/env bash
# Install what the build and the tests need, when it is missing: Debian
# packages with apt-get, Python packages with pip. Safe to run repeatedly.
#
#   tools/ensure-deps.sh            what make test needs (pip installs into $PYTHON,
#                                   python3 unless set; LLMRETRY_NO_CLUSTERS=1: not
#                                   Ray and Dask, which may have no wheels for it)
#   tools/ensure-deps.sh --build    what building needs (make demo, make wheel):
#                                   Debian packages only, nothing pip-installed into
#                                   any Python ($PYTHON's venv and headers included)
set -euo pipefail
mode=${1:-all}
py=${PYTHON:-python3}

# hiredis: the core's Redis store of shared budgets.
debs=(pkg-config libcurl4-openssl-dev libcjson-dev libhiredis-dev make gcc)
if [ "$mode" = --build ]; then
  command -v cmake >/dev/null || debs+=(cmake)
  # A venv (make demo and make wheel work in one) and the headers to build the
  # extension: separate packages for Debian's own python3.
  "$py" -c "import ensurepip, venv" 2>/dev/null || debs+=(python3-venv)
  "$py" -c "import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))" \
    || debs+=(python3-dev)
else
  # nginx + its echo module: tests/python/test_transport_h2.py (TLS + HTTP/2);
  # curl: the doc examples that talk to a server (docs/shared.md, gunicorn);
  # redis-server: the tests of the Redis store (tests/c/test_shared*.c,
  # tests/python/test_shared_redis.py, Lua); luarocks: test_version.py's
  # `make rock` (the Lua lane installs it too, but make test runs the Python
  # lane beside it: on a new machine that test found none and skipped).
  debs+=(redis-server valgrind openssl nginx libnginx-mod-http-echo curl luarocks)
fi
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "ensure-deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
[ "$mode" = --build ] && exit 0
command -v cmake >/dev/null || python3 -m pip install -q cmake

# Python packages of the test suite, as "import-name pip-spec" (loose pins):
# nbclient + ipykernel run a notebook in a real Jupyter kernel, where tqdm +
# ipywidgets draw progress=True's widget (tests/python/test_notebook.py), uvloop is the other event loop of the
# asyncio API (test_aio_uvloop.py: uvloop.run needs 0.18), mypy checks the
# async examples' types (test_typing.py), the openai SDK and both httpx
# flavours run on llmretry.httpx / llmretry.httpx2 (test_httpx_transport.py;
# the SDK 3.x brings httpx2, installed here too for an SDK 2.x already
# there); pydantic 2 for response_model
# (test_response_model.py; the SDK brings it too); pytest-xdist runs the
# suite's tests a few at a time (they mostly wait: see PYTEST_JOBS in the
# Makefile); gunicorn runs docs/shared.md's four workers; langchain-openai
# runs docs/openai-sdk.md's framework example on the transport (not
# instructor: 1.17 pins jiter<0.15, which holds the SDK back at 3.3).
# OpenTelemetry's SDK (its in-memory exporters), its OTLP/HTTP exporter (the
# CLI's --otel) and protobuf messages (the suite's OTLP receiver) test
# llmretry.otel (test_otel.py). Ray Data and Dask (with distributed) are the
# clusters that llmretry.ray and llmretry.dask run in (test_ray.py,
# test_dask.py; Ray ships binary wheels only: `pip download ray --no-deps`
# says whether there is one for this CPython and platform, as there is for
# 3.11 on x86_64).
py_pkgs=("pytest pytest" "xdist pytest-xdist>=3" "nbclient nbclient>=0.8"
         "ipykernel ipykernel>=6.20" "tqdm tqdm>=4.66"
         "ipywidgets ipywidgets>=8" "uvloop uvloop>=0.18" "mypy mypy>=1.8" "openai openai"
         "httpx httpx" "httpx2 httpx2" "pydantic pydantic>=2" "gunicorn gunicorn"
         "langchain_openai langchain-openai"
         "opentelemetry.sdk opentelemetry-sdk>=1.27"
         "opentelemetry.exporter.otlp.proto.http opentelemetry-exporter-otlp-proto-http>=1.27"
         "opentelemetry.proto opentelemetry-proto>=1.27" "ray.data ray[data]>=2.40"
         "dask.dataframe dask[dataframe]>=2025.1" "distributed distributed>=2025.1")
# Each module looked for on the path by one interpreter, none of them run:
# importing each (Ray, Dask, LangChain, ...) in an interpreter of its own
# took 20 s of every make test on 2 idle cores, a minute on loaded ones.
if [ "${LLMRETRY_NO_CLUSTERS:-0}" = 1 ]; then
  kept=()
  for entry in "${py_pkgs[@]}"; do
    case "$entry" in ray.*|dask.*|distributed\ *) ;; *) kept+=("$entry") ;; esac
  done
  py_pkgs=("${kept[@]}")
fi
mapfile -t py_missing < <("$py" - "${py_pkgs[@]}" <<'PY'
import importlib.machinery
import importlib.util
import sys


def found(name: str) -> bool:
    top, *subs = name.split(".")
    spec = importlib.util.find_spec(top)     # a top-level name: not imported
    for sub in subs:                         # a submodule: in its parent's folders
        if spec is None or spec.submodule_search_locations is None:
            return False
        spec = importlib.machinery.PathFinder.find_spec(
            sub, list(spec.submodule_search_locations))
    return spec is not None


for entry in sys.argv[1:]:
    mod, pip_spec = entry.split(" ", 1)
    if not found(mod):
        print(pip_spec)
PY
)
if [ ${#py_missing[@]} -gt 0 ]; then
  echo "ensure-deps: pip installing ${py_missing[*]}"
  "$py" -m pip install -q "${py_missing[@]}"
fi
