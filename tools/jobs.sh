# Sourced by the test scripts (tools/lua-test.sh, tools/check.sh,
# tools/pipe-notifier-test.sh): run suites at the same time. They mostly wait
# on the clock (servers' delays, backoffs, timeouts: a busted run uses about
# 40 % of a core), so two at once take little more than one.
#
#   jobs_start NAME COMMAND [ARG...]   start it in the background (a shell
#                                      function is fine), its output in a file
#   jobs_wait                          wait for every job started; print each
#                                      one's output whole, in start order;
#                                      fail if any failed (JOBS_FAILED: names)
#   spec_shard DIR K N                 the busted specs of shard K of N
#
# A job gets SIGINT as a foreground command would (a shell without job
# control starts background commands with it ignored), so Ctrl-C stops it.

_jobs_names=()
_jobs_pids=()
_jobs_logs=()
JOBS_FAILED=()

jobs_start() { # name command...
  local name="$1" log
  shift
  log="$(mktemp "${TMPDIR:-/tmp}/llmretry-job.XXXXXX")"
  ( trap - INT QUIT; "$@" ) >"$log" 2>&1 &
  _jobs_names+=("$name")
  _jobs_pids+=("$!")
  _jobs_logs+=("$log")
}

jobs_wait() {
  local i rc
  JOBS_FAILED=()
  for i in "${!_jobs_pids[@]}"; do
    rc=0
    wait "${_jobs_pids[$i]}" || rc=$?
    cat "${_jobs_logs[$i]}"
    rm -f "${_jobs_logs[$i]}"
    [ "$rc" -eq 0 ] || JOBS_FAILED+=("${_jobs_names[$i]}")
  done
  _jobs_names=()
  _jobs_pids=()
  _jobs_logs=()
  [ ${#JOBS_FAILED[@]} -eq 0 ]
}

# spec_shard DIR K N: the *_spec.lua files of DIR in shard K of N (1-based),
# one a line, for N busted runs at once. Files go largest first to the shard
# with the fewest bytes so far: size stands in for time (the largest,
# faults_spec.lua, is also the slowest), and the split stays the same from
# run to run.
spec_shard() { # dir k n
  local dir="$1" k="$2" n="$3" f i best
  local -a bytes=()
  for ((i = 1; i <= n; i++)); do bytes[i]=0; done
  while IFS= read -r f; do
    best=1
    for ((i = 2; i <= n; i++)); do
      [ "${bytes[i]}" -lt "${bytes[best]}" ] && best=$i
    done
    bytes[best]=$((bytes[best] + $(stat -c %s "$dir/$f")))
    [ "$best" -eq "$k" ] && echo "$dir/$f"
  done < <(cd "$dir" && ls -S -- *_spec.lua)
  return 0
}
