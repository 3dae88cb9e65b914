#!/usr/bin/env python3
"""OpenResty host test: llmretry inside a real nginx with Debian's Lua module.

Starts nginx (tests/openresty/nginx.conf.in, filled in a temporary prefix) on
loopback, talking to the mock model server given by --mock, and checks that
calls made through llmretry.openresty (ngx.run_worker_thread) leave the
worker free: /ping answers at once while /llm calls are in flight.

Prints one "PASS name" / "FAIL name: why" line per test, then
"openresty: N passed, M failed"; exits non-zero on any failure (nginx's error
log is printed then).

    python3 tests/openresty/host_check.py --repo . --mock http://127.0.0.1:PORT
"""

import argparse
import getpass
import grp
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request

FIGURES = {}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http(method, url, body=None, timeout=30):
    """-> (status, text, seconds)"""
    data = None
    headers = {}
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        status = e.code
    return status, text, time.monotonic() - t0


class Mock:
    def __init__(self, root):
        self.root = root.rstrip("/")

    def script(self, name, steps, after=None):
        doc = {"steps": steps}
        if after is not None:
            doc["after"] = after
        status, text, _ = http("PUT", f"{self.root}/_mock/scenarios/{name}", doc)
        assert status == 204, f"PUT scenario {name}: {status} {text}"

    def requests(self, name):
        status, text, _ = http("GET", f"{self.root}/_mock/requests/{name}")
        assert status == 200, f"GET requests {name}: {status}"
        return json.loads(text)


class Nginx:
    def __init__(self, repo, mock_url):
        self.repo = repo
        self.prefix = tempfile.mkdtemp(prefix="llmretry-openresty-")
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = None
        # What /llm_env finds in the environment (kept by nginx's env directives).
        self.env = {"OPENAI_BASE_URL": mock_url.rstrip("/") + "/s/from_env/v1",
                    "OPENAI_API_KEY": "sk-test-FROM-ENV"}
        # The workers run as whoever runs the test (a root master would
        # switch them to nobody, who may not read the checkout).
        user = getpass.getuser()
        group = grp.getgrgid(os.getgid()).gr_name
        user_line = f"user {user} {group};" if os.geteuid() == 0 else ""
        with open(os.path.join(repo, "tests/openresty/nginx.conf.in")) as f:
            conf = f.read()
        for k, v in {"@PREFIX@": self.prefix, "@PORT@": str(self.port), "@REPO@": repo,
                     "@MOCK@": mock_url.rstrip("/"), "@USER_LINE@": user_line}.items():
            conf = conf.replace(k, v)
        left = re.findall(r"@[A-Z_]+@", conf)
        assert not left, f"unfilled placeholders in nginx.conf: {left}"
        self.conf = os.path.join(self.prefix, "nginx.conf")
        with open(self.conf, "w") as f:
            f.write(conf)

    def cmd(self, *extra):
        return ["nginx", "-p", self.prefix, "-c", self.conf,
                "-e", os.path.join(self.prefix, "error.log"), *extra]

    def start(self):
        t = subprocess.run(self.cmd("-t"), capture_output=True, text=True)
        if t.returncode != 0:
            raise RuntimeError("nginx -t failed:\n" + t.stdout + t.stderr)
        self.out = open(os.path.join(self.prefix, "nginx.out"), "w")
        env = dict(os.environ)
        env.update(self.env)
        self.proc = subprocess.Popen(self.cmd(), stdout=self.out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 10
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited with {self.proc.returncode}")
            try:
                status, text, _ = http("GET", self.base + "/ping", timeout=2)
                if status == 200 and text.strip() == "pong":
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("nginx did not answer /ping within 10 s")
            time.sleep(0.05)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)   # graceful: lets pool threads finish
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc:
            self.out.close()

    def error_log(self):
        try:
            with open(os.path.join(self.prefix, "error.log")) as f:
                return f.read()
        except OSError:
            return ""

    def cleanup(self):
        shutil.rmtree(self.prefix, ignore_errors=True)


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


# ---------------------------------------------------------------------------
# Tests: each takes (nginx, mock).

def test_one_call(ngx, mock):
    """A call through ngx.run_worker_thread: result rebuilt on the request side."""
    mock.script("one", [{}])
    status, text, _ = http("GET", ngx.base + "/llm?s=one")
    check(status == 200, f"/llm: {status} {text}")
    out = json.loads(text)
    check(out["ok"] and out["content"] == "ok", f"answer {out}")
    check(out["attempts"] == 1 and out["total_tokens"] == 15, f"meta {out}")
    check(out["arrays_marked"], "res.data's arrays lack llmretry's array marker")
    check(out["events"] == ["llm_request_started#0", "llm_request_succeeded#0"],
          f"events {out['events']}")
    recs = mock.requests("one")
    check(len(recs) == 1, f"{len(recs)} requests")
    h = recs[0]["headers"]
    check(h.get("authorization") == "Bearer sk-test-SECRET-KEY-123", "no key sent")
    check(h.get("x-client-request-id") == out["request_id"], "request id differs")
    check(json.loads(recs[0]["body"])["messages"][0]["content"] == "SECRET-PROMPT-one",
          "body not sent as encoded")
    log = ngx.error_log()
    check(f"llmretry event llm_request_succeeded request_id={out['request_id']}" in log,
          "the logger's ngx.log lines are not in the error log")
    check("SECRET-KEY" not in log and "SECRET-PROMPT" not in log, "a secret reached the log")


def test_retried(ngx, mock):
    """A 503 then a 429 with Retry-After, then success: events in order."""
    mock.script("retried", [{"status": 503}, {"status": 429, "retry_after": "0.1"}, {}])
    status, text, _ = http("GET", ngx.base + "/llm?s=retried")
    check(status == 200, f"/llm: {status} {text}")
    out = json.loads(text)
    check(out["attempts"] == 3, f"attempts {out['attempts']}")
    want = ["llm_request_started#0", "llm_request_failed#0", "llm_retry_scheduled#0",
            "llm_request_started#1", "llm_request_failed#1", "llm_retry_scheduled#1",
            "llm_request_started#2", "llm_request_succeeded#2"]
    check(out["events"] == want, f"events {out['events']}")
    check(len(mock.requests("retried")) == 3, "not 3 requests")


def test_failure(ngx, mock):
    """A server that stays down: nil, err with llmretry's error metatable."""
    mock.script("down", [], after={"status": 503})
    status, text, _ = http("GET", ngx.base + "/llm?s=down&retries=1")
    check(status == 502, f"/llm: {status} {text}")
    out = json.loads(text)
    check(out["kind"] == "http_status" and out["status"] == 503, f"err {out}")
    check(out["reason"] == "retries_exhausted" and out["attempts"] == 2, f"err {out}")
    check(out["is_error"], "err lacks llmretry's error metatable")
    check(out["text"].startswith("llmretry: http_status (retries_exhausted): "),
          f"tostring(err) = {out['text']!r}")
    check(len(mock.requests("down")) == 2, "not 2 requests")


def test_validate(ngx, mock):
    """validate named by module and function runs on the pool thread; a rejection is retried."""
    mock.script("validate", [{"content": "not json"}, {"content": "{\"a\": 1}"}])
    status, text, _ = http("GET", ngx.base + "/llm?s=validate&validate=1")
    check(status == 200, f"/llm: {status} {text}")
    out = json.loads(text)
    check(out["attempts"] == 2 and out["content"] == "{\"a\": 1}", f"out {out}")
    check(len(mock.requests("validate")) == 2, "not 2 requests")


def test_environment(ngx, mock):
    """OPENAI_BASE_URL and OPENAI_API_KEY reach the pool threads through nginx's env directive."""
    mock.script("from_env", [{}])
    status, text, _ = http("GET", ngx.base + "/llm_env")
    check(status == 200 and text.strip() == "ok", f"/llm_env: {status} {text}")
    recs = mock.requests("from_env")
    check(len(recs) == 1, f"{len(recs)} requests to the environment's base URL")
    check(recs[0]["headers"].get("authorization") == "Bearer sk-test-FROM-ENV",
          "the environment's key was not sent")


def test_engine_reused(ngx, mock):
    """Sequential calls reuse a pool thread's Lua state, its engine and its connection."""
    mock.script("reuse", [])
    for _ in range(3):
        status, text, _ = http("GET", ngx.base + "/llm?s=reuse")
        check(status == 200, f"/llm: {status} {text}")
    conns = [r["connection"] for r in mock.requests("reuse")]
    check(len(conns) == 3 and len(set(conns)) == 1,
          f"connections {conns}: a new engine (or connection) per call")


def fire_and_ping(ngx, mock, path, n_calls, scen):
    """n_calls concurrent GETs of path; /ping every 50 ms while they are in flight.
    -> (call results [(status, text, secs)], ping latencies [secs], wall secs)"""
    results = [None] * n_calls
    errors = []

    def one(i):
        try:
            results[i] = http("GET", ngx.base + path, timeout=30)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n_calls)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    # Wait until the mock has every call, so the pings surely overlap them.
    deadline = time.monotonic() + 5
    while len(mock.requests(scen)) < n_calls and time.monotonic() < deadline:
        time.sleep(0.01)
    in_flight = len(mock.requests(scen))
    pings = []
    # Each ping is sent while the calls are in flight (a blocked worker
    # answers it only once they are done).
    while any(t.is_alive() for t in threads):
        status, text, secs = http("GET", ngx.base + "/ping", timeout=30)
        check(status == 200 and text.strip() == "pong", f"/ping: {status} {text}")
        pings.append(secs)
        time.sleep(0.05)
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    check(not errors, f"client errors: {errors}")
    return results, pings, wall, in_flight


def test_worker_not_blocked(ngx, mock):
    """4 concurrent 1 s calls: /ping answers at once throughout; the calls overlap."""
    mock.script("slow", [], after={"delay_ms": 1000})
    n = 4
    results, pings, wall, in_flight = fire_and_ping(ngx, mock, "/llm?s=slow", n, "slow")
    check(in_flight == n, f"only {in_flight} of {n} calls reached the mock together")
    for status, text, secs in results:
        check(status == 200, f"/llm: {status} {text}")
        out = json.loads(text)
        check(out["ok"] and out["content"] == "ok" and out["attempts"] == 1, f"out {out}")
        check(secs >= 0.9, f"a 1 s call answered in {secs:.3f} s")
    check(pings, "no ping was sent while the calls were in flight")
    worst = max(pings)
    FIGURES["ping_max_ms"] = worst * 1000
    FIGURES["ping_median_ms"] = sorted(pings)[len(pings) // 2] * 1000
    FIGURES["pings"] = len(pings)
    FIGURES["llm_wall_s"] = wall
    check(worst < 0.2, f"/ping took {worst * 1000:.0f} ms while /llm calls were in flight")
    check(len(pings) >= 5, f"only {len(pings)} pings while the calls were in flight")
    # Concurrent, not one after another (4 x 1 s).
    check(wall < 2.5, f"{n} concurrent 1 s calls took {wall:.2f} s")
    times = sorted(r["time"] for r in mock.requests("slow"))
    check(times[-1] - times[0] < 0.5, f"the calls reached the mock {times[-1] - times[0]:.2f} s apart")


def test_control_blocking(ngx, mock):
    """Control: a call made in the handler itself blocks the worker, and /ping is seen to stall."""
    mock.script("slow_blocking", [], after={"delay_ms": 1000})
    results, pings, wall, _ = fire_and_ping(ngx, mock, "/llm_blocking?s=slow_blocking", 1,
                                            "slow_blocking")
    check(results[0][0] == 200 and results[0][1].strip() == "ok", f"/llm_blocking: {results[0]}")
    worst = max(pings) if pings else 0
    FIGURES["control_ping_max_ms"] = worst * 1000
    # A ping sent while the worker is blocked waits for the call to end.
    check(worst > 0.4, f"/ping answered in {worst * 1000:.0f} ms behind a blocking call: "
          "the measurement cannot see blocking")


TESTS = [test_one_call, test_retried, test_failure, test_validate, test_environment,
         test_engine_reused, test_worker_not_blocked, test_control_blocking]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", required=True)
    ap.add_argument("--mock", required=True, help="the mock server's root URL")
    a = ap.parse_args()
    repo = os.path.abspath(a.repo)
    mock = Mock(a.mock)
    ngx = Nginx(repo, a.mock)
    passed = failed = 0
    try:
        ngx.start()
        for t in TESTS:
            try:
                t(ngx, mock)
                print(f"PASS openresty: {t.__name__}: {t.__doc__.splitlines()[0]}", flush=True)
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
    print(f"openresty: {passed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
