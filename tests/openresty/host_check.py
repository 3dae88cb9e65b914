#!/usr/bin/env python3
"""OpenResty host test: llmretry inside a real nginx with Debian's Lua module.

Starts nginx (tests/openresty/nginx.conf.in, filled in a temporary prefix) on
loopback, talking to the mock model server given by --mock, and checks
llmretry.openresty there: calls on the worker's engine with no thread pool
(500 concurrent 1 s calls in about a second while /ping keeps answering),
loggers and validators in the request as events arrive, streams proxied to
the client chunk by chunk, a client that goes away cancelling its upstream
call, call_many in a handler, a reload with calls in flight, and budgets the
workers share (shm, Redis, a store that is not quite Redis).

Prints one "PASS name" / "FAIL name: why" line per test, then the figures
and "openresty: N passed, M failed"; exits non-zero on any failure (nginx's
error log is printed then). The tests are in check_calls.py, check_engine.py,
check_network.py and check_shared.py, the machinery they share in harness.py; this file
keeps their order (TESTS) and the command line.

    python3 tests/openresty/host_check.py --repo . --mock http://127.0.0.1:PORT
"""

import argparse
import os
import sys
import time
import traceback

import harness
from check_calls import (test_call_many, test_doc_examples, test_environment,
                         test_events_as_they_happen, test_failure, test_ffi_path,
                         test_misuse, test_misuse_vectors, test_no_secrets_logged,
                         test_one_call, test_validate)
from check_engine import (test_500_calls_no_thread_pool, test_a_dispatcher_that_fails,
                          test_control_blocking,
                          test_engine_shared, test_io_loop, test_no_lost_wakeups,
                          test_reload_with_calls_in_flight, test_waiter_pool)
from check_network import (test_big_answer_and_idle_close, test_client_abort_cancels_call,
                           test_client_abort_cancels_stream, test_exchange_in_the_request,
                           test_refused_connect, test_stream_proxied, test_tls)
from check_shared import (test_a_store_that_drips_a_round, test_a_store_that_is_silent,
                          test_a_store_with_a_wrong_reply, test_workers_share_a_budget,
                          test_workers_share_a_redis_budget)
from harness import FIGURES, Mock, Nginx


TESTS = [test_one_call, test_events_as_they_happen, test_failure, test_ffi_path, test_validate,
         test_misuse, test_misuse_vectors,
         test_doc_examples, test_environment, test_waiter_pool, test_engine_shared, test_io_loop,
         test_no_lost_wakeups, test_a_dispatcher_that_fails, test_500_calls_no_thread_pool,
         test_control_blocking, test_stream_proxied, test_client_abort_cancels_stream,
         test_client_abort_cancels_call, test_call_many, test_tls, test_exchange_in_the_request,
         test_big_answer_and_idle_close, test_refused_connect, test_no_secrets_logged,
         test_reload_with_calls_in_flight, test_workers_share_a_budget,
         test_workers_share_a_redis_budget, test_a_store_that_is_silent,
         test_a_store_that_drips_a_round, test_a_store_with_a_wrong_reply]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", required=True)
    ap.add_argument("--mock", required=True, help="the mock server's root URL")
    ap.add_argument("--transport", choices=["engine", "cosocket"], default="engine",
                    help="init_worker's transport for every nginx (default: engine)")
    ap.add_argument("tests", nargs="*", help="run only these tests (names)")
    a = ap.parse_args()
    if a.transport == "cosocket":
        harness.TRANSPORT_OPTS = 'transport = "cosocket"'
    repo = os.path.abspath(a.repo)
    mock = Mock(a.mock)
    ngx = Nginx(repo, a.mock)
    tests = [t for t in TESTS if not a.tests or t.__name__ in a.tests]
    passed = failed = skipped = 0
    try:
        ngx.start()
        for t in tests:
            if a.transport not in getattr(t, "transports", (a.transport,)):
                # Said, not passed: a check that cannot fail here is not a pass.
                print(f"SKIP openresty: {t.__name__}: not for the transport "
                      f"{a.transport!r} ({t.transports_why})", flush=True)
                skipped += 1
                continue
            t0 = time.monotonic()
            try:
                t(ngx, mock)
                print(f"PASS openresty: {t.__name__}: {t.__doc__.splitlines()[0]} "
                      f"({time.monotonic() - t0:.1f} s)", flush=True)
                passed += 1
            except Exception as e:  # noqa: BLE001 - one line per failed test
                print(f"FAIL openresty: {t.__name__}: {e}", flush=True)
                if not isinstance(e, AssertionError):
                    traceback.print_exc()
                failed += 1
    except Exception as e:  # noqa: BLE001
        print(f"FAIL openresty: nginx: {e}", flush=True)
        failed += 1
    finally:
        ngx.stop()
        if failed:
            print("---- nginx error.log ----")
            print(ngx.error_log()[-20000:])
            print("---- end of nginx error.log ----")
        ngx.cleanup()
    if FIGURES:
        print("openresty figures: " + ", ".join(
            f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
            for k, v in FIGURES.items()), flush=True)
    print(f"openresty: {passed} passed, {failed} failed, {skipped} not for this transport",
          flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
