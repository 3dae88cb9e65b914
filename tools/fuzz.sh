#!/usr/bin/env bash
# libFuzzer targets for every parser that reads server data, and for the text
# of what a user gives: URLs, option names (tests/fuzz/).
#
#   tools/fuzz.sh                 build and run every target 20 s each
#   FUZZ_SECONDS=120 tools/fuzz.sh fuzz_response
#
# Each target is built with clang -fsanitize=fuzzer,address,undefined
# against the core sources, then run on a temporary copy of its seed corpus
# (tests/fuzz/corpus/<target>/), so runs never write into the repo.
# Installs what it needs when missing (apt-get: clang, the libclang-rt-N-dev
# matching it, libcurl and cJSON headers); .ci/run calls it after make check.
# Exits non-zero on any crash and prints the path of the crashing input.
# Env: FUZZ_SECONDS (or SECONDS; default 20) per target, FUZZ_OUT (default a
# temp dir; kept on crash), CC (default: clang, else the first clang-N found).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
# bash's own $SECONDS counts time since the shell started, so the caller's
# SECONDS is read from the environment, first thing.
RUN_SECONDS=$(env | sed -n 's/^SECONDS=//p')
RUN_SECONDS=${FUZZ_SECONDS:-${RUN_SECONDS:-20}}
ALL_TARGETS="fuzz_retry_after fuzz_extract_json fuzz_response fuzz_sse fuzz_assembly fuzz_schema fuzz_schema_text fuzz_http1 fuzz_url fuzz_names"
TARGETS=${*:-$ALL_TARGETS}

# Installs Debian packages (a fresh CI machine has none of these); one
# apt-get update first, as a fresh machine may have no package lists.
apt_updated=
apt_install() {
    local sudo=; [ "$(id -u)" -ne 0 ] && sudo=sudo
    echo "fuzz.sh: installing $* (apt-get)" >&2
    if [ -z "$apt_updated" ]; then
        $sudo apt-get update -qq >/dev/null || return 1
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

find_clang() {
    if [ -n "${CC:-}" ] && "$CC" --version 2>/dev/null | grep -q clang; then
        echo "$CC"; return 0
    fi
    for c in clang clang-19 clang-18 clang-17 clang-16 clang-15 clang-14; do
        command -v "$c" >/dev/null 2>&1 && { echo "$c"; return 0; }
    done
    return 1
}

# What the targets link against: the core's own dependencies.
if ! pkg-config --exists libcurl libcjson hiredis 2>/dev/null; then
    apt_install pkg-config libcurl4-openssl-dev libcjson-dev libhiredis-dev ||
        { echo "fuzz.sh: could not install libcurl/cJSON/hiredis headers" >&2; exit 2; }
fi
CLANG=$(find_clang)
if [ -z "$CLANG" ]; then
    apt_install clang || { echo "fuzz.sh: could not install clang" >&2; exit 2; }
    CLANG=$(find_clang) || { echo "fuzz.sh: clang still not found" >&2; exit 2; }
fi
# libFuzzer and the ASan/UBSan runtimes (libclang_rt.fuzzer-x86_64.a, ...)
# are in libclang-rt-N-dev, only recommended by clang-N: probe, then install
# the one matching this clang's major version.
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n){(void)d;(void)n;return 0;}' > "$probe/p.c"
link_probe() { "$CLANG" -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" 2>"$probe/err"; }
if ! link_probe; then
    ver=$("$CLANG" --version | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -1)
    apt_install "libclang-rt-$ver-dev" && link_probe ||
        { cat "$probe/err" >&2; echo "fuzz.sh: $CLANG cannot link libFuzzer (libclang-rt-$ver-dev)" >&2; exit 2; }
fi

PKG=$(pkg-config --cflags --libs libcurl libcjson hiredis) || { echo "fuzz.sh: pkg-config libcurl libcjson hiredis failed" >&2; exit 2; }
OUT=${FUZZ_OUT:-$(mktemp -d /tmp/llmretry-fuzz.XXXXXX)}
mkdir -p "$OUT"
CFLAGS="-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -g -O1 -std=gnu11 -D_GNU_SOURCE -Wall -Wextra -Icore/include -Icore/src"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

echo "fuzz.sh: $("$CLANG" --version | head -1); ${RUN_SECONDS}s per target; work dir $OUT"
# The core's objects, compiled once for every target (two at a time) with the
# same instrumentation: -fsanitize=fuzzer-no-link is -fsanitize=fuzzer without
# libFuzzer's main, which each target's own file brings.
echo "== the core: build"
mkdir -p "$OUT/obj"
# shellcheck disable=SC2016
if ! ls core/src/*.c | CLANG="$CLANG" OBJ="$OUT/obj" \
     FLAGS="${CFLAGS/-fsanitize=fuzzer,/-fsanitize=fuzzer-no-link,} $(pkg-config --cflags libcurl libcjson hiredis)" \
     xargs -P 2 -n 1 sh -c '"$CLANG" $FLAGS -c "$1" -o "$OBJ/$(basename "$1" .c).o"' sh \
     2> "$OUT/core.build.log"; then
    cat "$OUT/core.build.log" >&2
    echo "fuzz.sh: building the core failed" >&2
    exit 1
fi
status=0
for t in $TARGETS; do
    src=tests/fuzz/$t.c
    [ -f "$src" ] || { echo "fuzz.sh: no such target: $t" >&2; status=2; continue; }
    if [ "$t" = fuzz_response ]; then
        # It includes transfer.c itself, to reach its static functions.
        core=$(ls "$OUT"/obj/*.o | grep -v '/transfer\.o$')
    else
        core=$(ls "$OUT"/obj/*.o)
    fi
    echo "== $t: build"
    # shellcheck disable=SC2086
    if ! "$CLANG" $CFLAGS "$src" $core $PKG -lpthread -lm -o "$OUT/$t" 2> "$OUT/$t.build.log"; then
        cat "$OUT/$t.build.log" >&2
        echo "fuzz.sh: $t: build failed" >&2
        status=1
        continue
    fi
    corpus=$OUT/corpus/$t
    mkdir -p "$corpus" "$OUT/artifacts/$t"
    [ -d "tests/fuzz/corpus/$t" ] && cp -r "tests/fuzz/corpus/$t/." "$corpus/"
    echo "== $t: run ${RUN_SECONDS}s ($(ls "$corpus" | wc -l) seeds)"
    "$OUT/$t" -max_total_time="$RUN_SECONDS" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$OUT/artifacts/$t/" "$corpus" > "$OUT/$t.log" 2>&1
    rc=$?
    # The last status line carries cov:, ft:, corp:, exec/s.
    grep -E '^#[0-9]+.*(DONE|pulse|NEW|REDUCE|INITED)' "$OUT/$t.log" | tail -1
    grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$OUT/$t.log"
    crash=$(ls "$OUT/artifacts/$t/" 2>/dev/null | head -1)
    if [ $rc -ne 0 ] || [ -n "$crash" ]; then
        echo "fuzz.sh: $t FAILED (exit $rc)" >&2
        grep -E 'ERROR: |runtime error|invariant broken|SUMMARY' "$OUT/$t.log" | head -5 >&2
        for f in "$OUT/artifacts/$t/"*; do
            [ -e "$f" ] && echo "fuzz.sh: crash input: $f" >&2
        done
        echo "fuzz.sh: full log: $OUT/$t.log; reproduce: $OUT/$t <crash input>" >&2
        status=1
    fi
done
if [ $status -eq 0 ]; then
    echo "fuzz.sh: no crashes"
    [ -z "${FUZZ_OUT:-}" ] && rm -rf "$OUT"
fi
exit $status
