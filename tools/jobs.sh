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
