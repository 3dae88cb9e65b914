"""OpenResty host test: the worker's engine (run by tests/openresty/host_check.py).

Its waiters, one engine and connection shared by requests, its I/O loop
(epoll sets and threads), 500 calls at once with no thread pool while /ping
answers (and the control: a blocking call stalls it), and a reload with
calls in flight. (Budgets shared by workers: check_shared.py.) Tests: each takes (nginx,
mock).
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import harness
from harness import FIGURES, Nginx, alive, check, http, percentile, wait_for


def test_waiter_pool(ngx, mock):
    """Kept waiters come back with nothing pending (two posts in a timeout, one never read).

    A sleeping call_llm (either transport) is posted once, an awake one not at
    all. On real semaphores, in one request."""
    status, text, _ = http("GET", ngx.base + "/waiter_pool")
    check(status == 200, f"/waiter_pool: {status} {text}")
    got = json.loads(text)
    # The setup reproduced CI's case, or the test means nothing.
    check(got["timeout_woken"] is False and got["timeout_pending"] == 2,
          f"two posts during a timeout: woken {got['timeout_woken']}, "
          f"{got['timeout_pending']} pending (want False, 2)")
    check(got["timeout_kept"] and got["timeout_clean"],
          f"after two posts during a timeout: kept {got['timeout_kept']}, "
          f"clean {got['timeout_clean']}")
    # A call_llm's waiter says when its request sleeps: posted once.
    check(got["asleep_woken"] is False and got["asleep_pending"] == 1,
          f"two posts during a sleeping request's timeout: woken {got['asleep_woken']}, "
          f"{got['asleep_pending']} pending (want False, 1)")
    check(got["asleep_kept"] and got["asleep_clean"], f"a sleeping request's waiter: {got}")
    check(got["unread_pending"] == 1 and got["unread_kept"] and got["unread_clean"],
          f"a post never waited for: {got}")
    check(got["awake_pending"] == 0 and got["awake_posted"] is False,
          f"an awake waiter was posted: {got}")


def test_engine_shared(ngx, mock):
    """Requests one after another share the worker's engine and its connection."""
    mock.script("reuse", [])
    for _ in range(3):
        status, text, _ = http("GET", ngx.base + "/llm?s=reuse")
        check(status == 200, f"/llm: {status} {text}")
    conns = [r["connection"] for r in mock.requests("reuse")]
    check(len(conns) == 3 and len(set(conns)) == 1,
          f"connections {conns}: a new engine (or connection) per call")


def epoll_sets(pid):
    """The epoll sets a process holds open (nginx's own, the engine's)."""
    d = f"/proc/{pid}/fd"
    n = 0
    for fd in os.listdir(d):
        try:
            n += os.readlink(os.path.join(d, fd)) == "anon_inode:[eventpoll]"
        except OSError:
            pass
    return n


def test_io_loop(ngx, mock):
    """The worker's engine runs the events loop by default (an epoll set of its own); io_loop = "perform" is there too; the transport "cosocket" has neither, nor a thread."""
    if harness.TRANSPORT_OPTS:
        # A fresh worker (no stream has made a threaded engine in it yet):
        # its calls add no epoll set and no thread to nginx's own.
        mock.script("io_loop", [])
        fresh = Nginx(ngx.repo, mock.root)
        try:
            fresh.start()
            status, text, _ = http("GET", fresh.base + "/llm?s=io_loop")
            check(status == 200, f"/llm: {status} {text}")
            pid = worker_pid(fresh)
            sets, threads = epoll_sets(pid), len(os.listdir(f"/proc/{pid}/task"))
        finally:
            fresh.stop()
            fresh.cleanup()
        check(sets == 1 and threads == 1,
              f"a worker of the transport cosocket: {sets} epoll sets, {threads} threads")
        check(len(mock.requests("io_loop")) == 1, "not 1 request")
        return
    mock.script("io_loop", [])
    status, text, _ = http("GET", ngx.base + "/llm?s=io_loop")
    check(status == 200, f"/llm: {status} {text}")
    events = epoll_sets(worker_pid(ngx))
    other = Nginx(ngx.repo, mock.root, init_opts='{ io_loop = "perform" }')
    try:
        other.start()
        status, text, _ = http("GET", other.base + "/llm?s=io_loop")
        check(status == 200, f"/llm with io_loop perform: {status} {text}")
        perform = epoll_sets(worker_pid(other))
    finally:
        other.stop()
        other.cleanup()
    check(events == perform + 1,
          f"epoll sets of the worker: {events} by default, {perform} with io_loop perform")
    check(len(mock.requests("io_loop")) == 2, "not 2 requests")


def ping_while(ngx, busy, every=0.01):
    """/ping, one after another, while busy() is true: their latencies."""
    pings = []
    while busy():
        status, text, secs = http("GET", ngx.base + "/ping", timeout=30)
        check(status == 200 and text.strip() == "pong", f"/ping: {status} {text}")
        pings.append(secs)
        time.sleep(every)
    return pings


def worker_pid(ngx):
    return ngx.stats()["pid"]


def test_500_calls_no_thread_pool(ngx, mock):
    """500 concurrent 1 s calls through one worker, no thread pool: about a second, /ping answering meanwhile."""
    n = 500
    mock.script("slow500", [], after={"delay_ms": 1000})
    pid = worker_pid(ngx)
    load = subprocess.Popen([sys.executable, os.path.join(ngx.repo, "tests/openresty/load.py"),
                             "127.0.0.1", str(ngx.port), "/llm?s=slow500", str(n)],
                            stdout=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    threads = []

    def busy():
        if not threads:     # the worker's threads, once the calls are all in flight
            if len(mock.requests("slow500")) >= n:
                threads.append(len(os.listdir(f"/proc/{pid}/task")))
        return load.poll() is None

    # Pings start once the first calls are in (and go on to the last answer).
    wait_for(lambda: len(mock.requests("slow500")) > 0, 10)
    pings = ping_while(ngx, busy)
    out = json.loads(load.communicate(timeout=60)[0])
    wall = time.monotonic() - t0
    statuses = [r[0] for r in out["results"]]
    check(statuses.count(200) == n, f"{statuses.count(200)} of {n} answered 200 "
          f"(others: {sorted(set(statuses) - {200})}, errors {out['errors']})")
    secs = [r[1] for r in out["results"]]
    check(min(secs) >= 0.9, f"a 1 s call answered in {min(secs):.3f} s")
    recs = mock.requests("slow500")
    check(len(recs) == n, f"the mock saw {len(recs)} requests")
    times = sorted(r["time"] for r in recs)
    FIGURES["c500_wall_s"] = out["wall"]
    FIGURES["c500_spread_s"] = times[-1] - times[0]
    FIGURES["c500_max_call_s"] = max(secs)
    FIGURES["c500_pings"] = len(pings)
    FIGURES["c500_ping_p50_ms"] = percentile(pings, 50) * 1000
    FIGURES["c500_ping_p99_ms"] = percentile(pings, 99) * 1000
    FIGURES["c500_ping_max_ms"] = max(pings) * 1000
    FIGURES["c500_worker_threads"] = threads[0] if threads else -1
    # With a pool of T threads the calls would reach the mock over n / T - 1
    # seconds (15 s with nginx's default pool of 32); all at once, within a
    # moment. 4.4 s was seen with two test runs beside 7 busy processes on 2 cores:
    # the bound leaves room for that and still fails for a pool of < 60 (the
    # thread count below is the direct check).
    check(times[-1] - times[0] < 8.0,
          f"the calls reached the mock {times[-1] - times[0]:.2f} s apart")
    # Likewise the wall: 16 s through a pool of 32; 3.5 s was seen loaded.
    check(out["wall"] < 8.0, f"{n} concurrent 1 s calls took {out['wall']:.2f} s")
    check(threads and threads[0] <= 4,
          f"the worker runs {threads} threads with {n} calls in flight")
    check(len(pings) >= 20, f"only {len(pings)} pings while the calls were in flight")
    # A worker that waited on a call would leave /ping unanswered for the
    # call's second (test_control_blocking sees it stall); one that does not
    # answers within the cores' scheduling delay: 54 ms was seen with make
    # test's Python lane running beside the host tests on 2 cores.
    check(percentile(pings, 99) < 0.25, f"/ping p99 {percentile(pings, 99) * 1000:.0f} ms "
          "while the calls were in flight")
    check(wall < 10, f"the test took {wall:.1f} s")
    # Every call's waiter is kept for the next calls (up to the engine's
    # max_in_flight, 1,024 here): past 256 most of a burst's were garbage.
    st = ngx.stats()
    kept = st["waiters_kept"]
    check(kept >= n, f"{kept} waiters kept after {n} calls at once")
    # A post that came after a call's last look is taken back before its
    # waiter is kept: else the waiter's next call wakes for nothing.
    check(st["waiters_pending"] == 0, f"{st['waiters_pending']} kept waiters have a post pending")


def test_no_lost_wakeups(ngx, mock):
    """A sleeping request is woken by the dispatcher, never by its wait's second running out.

    The transport "engine"'s wait says its request sleeps (waiter.awake):
    llmretry.openresty_waiters.post posts a sleeping request and skips an
    awake one, so a wait that did not say so would sleep out its second on
    every call. 40 calls at once, each answered in 50 ms: no wait may run
    out (stats' wait_timeouts)."""
    n = 40
    mock.script("wakeups", [], after={"delay_ms": 50})
    status, text, _ = http("GET", ngx.base + "/llm?s=wakeups")   # the dispatcher is up
    check(status == 200, f"/llm: {status} {text}")
    before = ngx.stats()["wait_timeouts"]
    load = subprocess.run([sys.executable, os.path.join(ngx.repo, "tests/openresty/load.py"),
                           "127.0.0.1", str(ngx.port), "/llm?s=wakeups", str(n)],
                          stdout=subprocess.PIPE, text=True, timeout=60)
    out = json.loads(load.stdout)
    statuses = [r[0] for r in out["results"]]
    check(statuses.count(200) == n, f"{statuses.count(200)} of {n} answered 200 "
          f"(errors {out['errors']})")
    check(len(mock.requests("wakeups")) == n + 1,
          f"the mock saw {len(mock.requests('wakeups'))} requests, want {n + 1}")
    after = ngx.stats()["wait_timeouts"]
    check(after - before == 0, f"{after - before} of {n} calls of 50 ms were woken by their "
          "wait's timeout, not by the dispatcher (a lost wake-up each)")


test_no_lost_wakeups.transports = ("engine",)
test_no_lost_wakeups.transports_why = ("its requests carry their own exchanges and wait on no "
                                       "dispatcher; wait_timeouts counts the transport "
                                       "\"engine\"'s waits")


def test_a_dispatcher_that_fails(_ngx, mock):
    """A dispatcher that cannot reach its engine's channel: the calls asleep on it look for their news at once, then every 20 ms, never sleeping out their wait's second; nothing counts as a lost wake-up."""
    ngx = Nginx(_ngx.repo, mock.root, init_worker=False)
    try:
        ngx.start()
        status, text, _ = http("GET", ngx.base + "/dispatcher_cannot_connect")
        check(status == 200 and text.strip() == "ok", f"/dispatcher_cannot_connect: {status} {text}")
        mock.script("no_dispatcher", [], after={"delay_ms": 50})
        for i in range(2):      # the first call makes the engine and its dispatcher
            status, text, secs = http("GET", ngx.base + "/llm?s=no_dispatcher", timeout=30)
            check(status == 200 and json.loads(text)["ok"], f"call {i}: {status} {text}")
            check(secs < 0.6, f"call {i} took {secs * 1000:.0f} ms for a 50 ms answer: it slept "
                  "out its wait's second")
        st = ngx.stats()
        check(st["dispatcher"] == "stopped", f"the dispatcher: {st}")
        check(st["wait_timeouts"] == 0, f"{st['wait_timeouts']} waits ran out: a failed "
              "dispatcher counted as lost wake-ups")
        check("could not connect to its engine's channel" in ngx.error_log(),
              "the failure is not in the error log")
    finally:
        ngx.stop()
        ngx.cleanup()


test_a_dispatcher_that_fails.transports = ("engine",)
test_a_dispatcher_that_fails.transports_why = ("its requests carry their own exchanges: there is "
                                               "no dispatcher to fail")


def test_control_blocking(ngx, mock):
    """Control: a call made in the handler itself blocks the worker, and /ping is seen to stall."""
    mock.script("slow_blocking", [], after={"delay_ms": 1000})
    result = []
    t = threading.Thread(target=lambda: result.append(
        http("GET", ngx.base + "/llm_blocking?s=slow_blocking")))
    t.start()
    wait_for(lambda: len(mock.requests("slow_blocking")) > 0, 5)
    pings = ping_while(ngx, t.is_alive, every=0.05)
    t.join()
    check(result and result[0][0] == 200 and result[0][1].strip() == "ok",
          f"/llm_blocking: {result}")
    worst = max(pings) if pings else 0
    FIGURES["control_ping_max_ms"] = worst * 1000
    # A ping sent while the worker is blocked waits for the call to end.
    check(worst > 0.4, f"/ping answered in {worst * 1000:.0f} ms behind a blocking call: "
          "the measurement cannot see blocking")


def test_reload_with_calls_in_flight(_ngx, mock):
    """A reload with calls in flight: they finish on the old worker, which then exits; the new one serves."""
    ngx = Nginx(_ngx.repo, mock.root, init_worker=False)
    try:
        ngx.start()
        st = ngx.stats()
        check(not st["engine"], f"the engine exists before any call: {st}")
        old = st["pid"]
        n = 10
        mock.script("reload", [], after={"delay_ms": 1500})
        results = [None] * n

        def one(i):
            results[i] = http("GET", ngx.base + "/llm?s=reload", timeout=30)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        # And one that makes a second call once the first has ended: by then
        # the old worker is exiting and its dispatcher gone.
        mock.script("reload_second", [{"content": "second"}])
        two = []
        threads.append(threading.Thread(target=lambda: two.append(
            http("GET", ngx.base + "/two_calls?s=reload&s2=reload_second", timeout=30))))
        for t in threads:
            t.start()
        check(wait_for(lambda: len(mock.requests("reload")) == n + 1, 5) is not None,
              "the calls did not reach the mock")
        st = ngx.stats()
        check(st["engine"] and st["dispatcher"] == "running" and st["waiting"] == n + 1,
              f"made on the first call: {st}")
        ngx.proc.send_signal(signal.SIGHUP)
        check(wait_for(lambda: worker_pid(ngx) != old, 5) is not None, "no new worker")
        # The new worker serves while the old one drains.
        mock.script("after_reload", [])
        status, text, _ = http("GET", ngx.base + "/llm?s=after_reload")
        check(status == 200 and json.loads(text)["ok"], f"the new worker's call: {status} {text}")
        check(alive(old), "the old worker exited with its calls in flight")
        for t in threads:
            t.join()
        done = time.monotonic()
        for status, text, secs in results:
            check(status == 200 and json.loads(text)["ok"], f"a call in flight: {status} {text}")
        check(two and two[0][0] == 200 and two[0][1].strip() == "ok second",
              f"a call made while the old worker exits: {two}")
        gone = wait_for(lambda: not alive(old), 5)
        check(gone is not None, "the old worker did not exit after its calls ended")
        FIGURES["reload_exit_after_calls_s"] = time.monotonic() - done
        check(time.monotonic() - done < 0.9, "the old worker took "
              f"{time.monotonic() - done:.2f} s to exit after its calls ended")
        # An idle worker exits at once on reload.
        old = worker_pid(ngx)
        ngx.proc.send_signal(signal.SIGHUP)
        gone = wait_for(lambda: not alive(old), 5)
        check(gone is not None, "an idle old worker did not exit")
        FIGURES["reload_idle_exit_s"] = gone
        check(gone < 0.9, f"an idle worker took {gone:.2f} s to exit on reload")
        log = ngx.error_log()
        bad = [line for line in log.splitlines()
               if re.search(r"\[(alert|crit|emerg)\]", line) or "llmretry:" in line]
        check(not bad, f"the error log says: {bad[:3]}")
    finally:
        ngx.stop()
        if sys.exc_info()[0] is not None:
            print(ngx.error_log()[-5000:])
        ngx.cleanup()
