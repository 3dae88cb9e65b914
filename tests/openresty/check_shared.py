"""OpenResty host test: budgets the workers share (run by
tests/openresty/host_check.py; docs/shared.md).

4 workers naming one store pace one budget: an shm store, and a real
redis-server (tests/python/redis_server.py's); alone, each paces its own (the
control). A store that is not quite Redis (tests/python/fake_redis.py's
cases, served from this process) leaves every call working at once on the
worker's own budget, says so in one event, and keeps the worker answering
and stopping. Tests: each takes (nginx, mock).
"""

import json
import os
import sys
import threading
import time

from harness import FIGURES, Nginx, check, http

# The suites' own servers: a real redis-server, and fake_redis.py's cases.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from fake_redis import CASES, FakeRedis  # noqa: E402
from redis_server import RedisServer  # noqa: E402


def refused_by_workers(repo, mock, shared, name):
    """40 downstream requests at once to a fresh nginx of 4 workers, each
    call paced at 600 a minute (10 a second) against the mock's 10 in any
    second: -> (requests the mock refused, workers that served, outcomes)."""
    mock.script(name, [], limits={"rpm": 10, "window_ms": 1000})
    opts = '{ shared = "%s" }' % shared if shared else ""
    ngx = Nginx(repo, mock.root, init_opts=opts, workers=4)
    try:
        ngx.start()
        outs = [None] * 40

        def one(i):
            status, text, _ = http("GET", f"{ngx.base}/llm_rpm?s={name}&rpm=600", timeout=60)
            outs[i] = json.loads(text) if status == 200 else {"ok": False, "status": status}

        threads = [threading.Thread(target=one, args=(i,)) for i in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        ngx.stop()
        ngx.cleanup()
    refused = sum(1 for r in mock.requests(name) if r.get("rate_limited"))
    return refused, {o.get("pid") for o in outs if o}, outs


def test_workers_share_a_budget(_ngx, mock):
    """4 workers naming one shm store pace one budget; alone, each its own"""
    store = f"openresty-test-{os.getpid()}"
    try:
        alone, pids_alone, _ = refused_by_workers(_ngx.repo, mock, None, "workers_alone")
        shared, pids, outs = refused_by_workers(_ngx.repo, mock, "shm:" + store, "workers_shared")
    finally:
        try:
            os.unlink(f"/dev/shm/llmretry-{store}")
        except OSError:
            pass
    check(len(pids) >= 2 and len(pids_alone) >= 2,
          f"the calls were served by {len(pids)} and {len(pids_alone)} workers: not spread")
    check(all(o and o.get("ok") for o in outs), f"failed calls with a shared store: {outs}")
    FIGURES["workers_refused_alone"] = alone
    FIGURES["workers_refused_shared"] = shared
    # Each worker alone sends its own 10 a second (up to 4 times the limit).
    check(alone >= 5, f"only {alone} refused with a budget per worker: the test shows nothing")
    check(shared <= 2, f"{shared} refused with the workers' budget shared")


def test_workers_share_a_redis_budget(ngx, mock):
    """4 workers naming one redis-server pace one budget (alone: test_workers_share_a_budget)"""
    with RedisServer() as redis:
        shared, pids, outs = refused_by_workers(ngx.repo, mock, redis.url, "workers_redis")
    check(len(pids) >= 2, f"the calls were served by {len(pids)} workers: not spread")
    check(all(o and o.get("ok") for o in outs), f"failed calls with Redis: {outs}")
    FIGURES["workers_refused_redis"] = shared
    # The control, without a store, refused 5 or more (13 in docs/shared.md).
    check(shared <= 2, f"{shared} refused with the workers' budget in Redis")


def _store_not_quite_redis(ngx, mock, case):
    answer, says = CASES[case]
    name = "fake_redis_" + case.replace(" ", "_")
    mock.script(name, [])
    with FakeRedis(answer) as fake:
        outs, pings, stopped = _beside_the_store(ngx, mock, fake, name)
    check(all(o["ok"] and o["attempts"] == 1 for o in outs), f"the calls: {outs}")
    shared = [e for o in outs for e in o["events"] if e.startswith("llm_shared_")]
    check(len(shared) == 1 and shared[0].startswith("llm_shared_unavailable: " + fake.url + ": ")
          and says in shared[0], f"the store's events {shared}, not one saying {says!r}")
    check(len(mock.requests(name)) == 3, f"the mock saw {len(mock.requests(name))} requests")
    # A call waits for the store its timeout (50 ms) at most, a worker's
    # close a round's: a worker stalled by the store shows here.
    check(max(pings) < 2.0, f"/ping took {max(pings):.2f} s beside the store")
    check(stopped < 5.0, f"the worker took {stopped:.1f} s to stop")
    FIGURES["fake_redis_ping_max_ms"] = max(FIGURES.get("fake_redis_ping_max_ms", 0),
                                            max(pings) * 1000)


def _beside_the_store(ngx, mock, fake, name):
    """A worker naming the store: three calls, each followed by a /ping,
    then its stop -> (the calls' outcomes, the pings' seconds, the stop's)."""
    one = Nginx(ngx.repo, mock.root, init_opts='{ shared = "%s" }' % fake.url)
    try:
        one.start()
        outs, pings = [], []
        for _ in range(3):
            status, text, secs = http("GET", f"{one.base}/llm_events?s={name}&rpm=600",
                                      timeout=30)
            check(status == 200, f"/llm_events: {status} {text}")
            outs.append(json.loads(text))
            status, text, ping = http("GET", one.base + "/ping", timeout=30)
            check(status == 200 and text.strip() == "pong", f"/ping: {status} {text}")
            pings.append(ping)
        t0 = time.monotonic()
        one.stop()
        return outs, pings, time.monotonic() - t0
    finally:
        one.stop()
        one.cleanup()


def test_a_store_that_is_silent(ngx, mock):
    """A store that never answers: the calls go on at once on the worker's budget, one event"""
    _store_not_quite_redis(ngx, mock, "silent")


def test_a_store_that_drips_a_round(ngx, mock):
    """A store that drips its reply to a round: the calls go on, one event, the worker stops"""
    _store_not_quite_redis(ngx, mock, "a reply to a round dripped")


def test_a_store_with_a_wrong_reply(ngx, mock):
    """A store whose reply to a round is an array of the wrong length: the calls go on, one event"""
    _store_not_quite_redis(ngx, mock, "an array of the wrong length")
