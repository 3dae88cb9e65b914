#!/usr/bin/env python3
"""OpenResty host test: llmretry inside a real nginx with Debian's Lua module.

Starts nginx (tests/openresty/nginx.conf.in, filled in a temporary prefix) on
loopback, talking to the mock model server given by --mock, and checks
llmretry.openresty there: calls on the worker's engine with no thread pool
(500 concurrent 1 s calls in about a second while /ping keeps answering),
loggers and validators in the request as events arrive, streams proxied to
the client chunk by chunk, a client that goes away cancelling its upstream
call, call_many in a handler, and a reload with calls in flight.

Prints one "PASS name" / "FAIL name: why" line per test, then the figures
and "openresty: N passed, M failed"; exits non-zero on any failure (nginx's
error log is printed then).

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
# init_worker's options for every nginx of the run: --transport cosocket
# runs every test with the worker's engine thread-less (llmretry.cosocket).
TRANSPORT_OPTS = ""


DOCS = ["README.md", "docs/openresty.md"]


def doc_locations(repo):
    """The ```nginx blocks of DOCS that are a location, as written."""
    out = []
    for doc in DOCS:
        with open(os.path.join(repo, doc)) as f:
            text = f.read()
        for block in re.findall(r"^```nginx\n(.*?)^```", text, re.S | re.M):
            if block.lstrip().startswith("location"):
                out.append(f"# {doc}\n{block}")
    return out


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

    def script(self, name, steps, after=None, limits=None):
        doc = {"steps": steps}
        if after is not None:
            doc["after"] = after
        if limits is not None:
            doc["limits"] = limits
        status, text, _ = http("PUT", f"{self.root}/_mock/scenarios/{name}", doc)
        assert status == 204, f"PUT scenario {name}: {status} {text}"

    def outage(self, name, mode):
        status, text, _ = http("PUT", f"{self.root}/_mock/outage/{name}", {"mode": mode})
        assert status == 204, f"PUT outage {name}: {status} {text}"

    def wait_requests(self, name, n, timeout=5.0):
        deadline = time.monotonic() + timeout
        while True:
            recs = self.requests(name)
            if len(recs) >= n or time.monotonic() > deadline:
                return recs
            time.sleep(0.01)

    def requests(self, name):
        status, text, _ = http("GET", f"{self.root}/_mock/requests/{name}")
        assert status == 200, f"GET requests {name}: {status}"
        return json.loads(text)


class Nginx:
    """One nginx on loopback. init_worker: make the worker's engine in
    init_worker_by_lua (else on the first call), with init_opts (Lua table
    text) as its options; workers: worker_processes, listening with
    reuseport when more than one (the kernel spreads the connections)."""

    def __init__(self, repo, mock_url, init_worker=True, init_opts="", workers=1):
        if TRANSPORT_OPTS:
            init_opts = "{ " + TRANSPORT_OPTS + (", " + init_opts.strip()[1:-1] if init_opts else "") + " }"
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
        init = ('init_worker_by_lua_block { require("llmretry.openresty").init_worker('
                + init_opts + ') }' if init_worker else "")
        with open(os.path.join(repo, "tests/openresty/nginx.conf.in")) as f:
            conf = f.read()
        # Two self-signed certificates naming 127.0.0.1 (an IP SAN for
        # libcurl, a DNS SAN for nginx's host check): one trusted, one not.
        tls = {}
        for name in ("trusted", "untrusted"):
            cert = os.path.join(self.prefix, f"{name}.crt")
            key = os.path.join(self.prefix, f"{name}.key")
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                            "-subj", "/CN=127.0.0.1", "-keyout", key, "-out", cert,
                            "-addext", "subjectAltName=IP:127.0.0.1,DNS:127.0.0.1"],
                           check=True, capture_output=True)
            tls[name] = (cert, key, free_port())
        self.tls_port = tls["trusted"][2]
        for k, v in {"@TLS_CERT@": tls["trusted"][0], "@TLS_KEY@": tls["trusted"][1],
                     "@TLS_PORT@": str(tls["trusted"][2]),
                     "@TLS_UNTRUSTED_CERT@": tls["untrusted"][0],
                     "@TLS_UNTRUSTED_KEY@": tls["untrusted"][1],
                     "@TLS_UNTRUSTED_PORT@": str(tls["untrusted"][2]),
                     "@PREFIX@": self.prefix, "@PORT@": str(self.port), "@REPO@": repo,
                     "@MOCK@": mock_url.rstrip("/"), "@USER_LINE@": user_line,
                     "@INIT_WORKER@": init, "@WORKERS@": str(workers),
                     "@LISTEN_OPTS@": " reuseport" if workers > 1 else "",
                     "@DOC_LOCATIONS@": "\n".join(doc_locations(repo))}.items():
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

    def stats(self):
        status, text, _ = http("GET", self.base + "/stats", timeout=5)
        check(status == 200, f"/stats: {status} {text}")
        return json.loads(text)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)   # graceful: lets calls in flight finish
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


def wait_for(cond, timeout, step=0.01):
    """cond() until true or timeout seconds: the seconds it took, or None."""
    t0 = time.monotonic()
    while True:
        if cond():
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            return None
        time.sleep(step)


def alive(pid):
    return os.path.exists(f"/proc/{pid}")


def percentile(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


class Raw:
    """A raw HTTP/1.1 GET, read as it arrives: what a downstream client sees."""

    def __init__(self, ngx, path):
        self.sock = socket.create_connection(("127.0.0.1", ngx.port), timeout=10)
        self.t0 = time.monotonic()
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        self.pieces = []            # (seconds since the request, bytes)

    def read_some(self):
        data = self.sock.recv(65536)
        if data:
            self.pieces.append((time.monotonic() - self.t0, data))
        return data

    def read_all(self):
        while self.read_some():
            pass
        return b"".join(d for _, d in self.pieces)

    def close(self):
        self.sock.close()


def sse_payloads(raw):
    """The data: payloads of a chunked SSE response (chunk framing removed)."""
    head, _, body = raw.partition(b"\r\n\r\n")
    text = b""
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        text += rest[:size]
        body = rest[size + 2:]
    return head, [line[6:] for line in text.decode().split("\n") if line.startswith("data: ")]


# ---------------------------------------------------------------------------
# Tests: each takes (nginx, mock).

def test_one_call(ngx, mock):
    """A call on the worker's engine: the result as llmretry.call_llm's, the events in the request."""
    if TRANSPORT_OPTS:
        check(ngx.stats()["transport"] == "cosocket" and ngx.stats()["engine"],
              f"init_worker did not make the cosocket transport's engine: {ngx.stats()}")
    else:
        check(ngx.stats()["dispatcher"] == "running",
              f"init_worker did not start the dispatcher: {ngx.stats()}")
    mock.script("one", [{}])
    status, text, _ = http("GET", ngx.base + "/llm?s=one")
    check(status == 200, f"/llm: {status} {text}")
    out = json.loads(text)
    check(out["ok"] and out["content"] == "ok", f"answer {out}")
    check(out["attempts"] == 1 and out["total_tokens"] == 15, f"meta {out}")
    check(out["arrays_marked"], "res.data's arrays lack llmretry's array marker")
    check([e["name"] for e in out["events"]] == ["llm_request_started#0",
                                                  "llm_request_succeeded#0"],
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


def test_events_as_they_happen(ngx, mock):
    """A 503, a Retry-After of 0.3 s, then a 0.3 s answer: each event reaches the logger when it happens."""
    mock.script("retried", [{"status": 503}, {"status": 429, "retry_after": "0.3"},
                            {"delay_ms": 300}])
    status, text, _ = http("GET", ngx.base + "/llm?s=retried")
    check(status == 200, f"/llm: {status} {text}")
    out = json.loads(text)
    check(out["attempts"] == 3, f"attempts {out['attempts']}")
    want = ["llm_request_started#0", "llm_request_failed#0", "llm_retry_scheduled#0",
            "llm_request_started#1", "llm_request_failed#1", "llm_retry_scheduled#1",
            "llm_request_started#2", "llm_request_succeeded#2"]
    names = [e["name"] for e in out["events"]]
    check(names == want, f"events {names}")
    ms = {e["name"]: e["ms"] for e in out["events"]}
    # Delivered after the call ended, they would all carry about the same time.
    check(ms["llm_request_failed#0"] < 150, f"the first failure reached the logger at "
          f"{ms['llm_request_failed#0']} ms")
    check(ms["llm_request_started#2"] - ms["llm_retry_scheduled#1"] >= 250,
          f"the Retry-After wait is not between the events: {ms}")
    check(ms["llm_request_succeeded#2"] - ms["llm_request_started#2"] >= 250,
          f"the 0.3 s answer is not between the events: {ms}")
    check(len(mock.requests("retried")) == 3, "not 3 requests")
    # Each event was posted to the request: one posted after its last look
    # is taken back before the waiter is kept for the next call.
    st = ngx.stats()
    check(st["waiters_kept"] >= 1 and st["waiters_pending"] == 0,
          f"kept waiters {st['waiters_kept']}, with a post pending {st['waiters_pending']}")


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


def test_ffi_path(ngx, mock):
    """Under OpenResty's LuaJIT a call nobody listens to goes through the FFI path (llmretry.ffi), and gives what the classic path gives: a retried success, a failure."""
    mock.script("ffi_ok", [{"status": 503}, {}, {"status": 503}, {}])
    status, text, _ = http("GET", ngx.base + "/llm_ffi?s=ffi_ok")
    check(status == 200, f"/llm_ffi: {status} {text}")
    out = json.loads(text)
    check(out["jit"] == "table" and out["ffi"] == "table",
          f"llmretry.ffi is not the FFI path under OpenResty: {out['ffi']}")
    fast, classic = out["fast"], out["classic"]
    check(fast["built"] == 1 and fast["submitted"] == 1,
          f"the call without a logger did not take the FFI path: {fast}")
    check(classic["built"] == 0 and classic["submitted"] == 0,
          f"the logged call took the FFI path: {classic}")
    check(fast["meta"]["attempts"] == 2 and fast["meta"]["usage"]["total_tokens"] == 15,
          f"meta {fast['meta']}")
    check(json.loads(fast["body"]) == fast["data"], f"body and data differ: {fast}")
    for out_ in (fast, classic):    # the mock numbers and times its answers
        out_["data"].pop("id")
        out_["data"].pop("created")
        out_.pop("body")
    for k in ("data", "meta", "arrays_marked"):
        check(fast[k] == classic[k], f"{k} differs: FFI {fast[k]!r}, classic {classic[k]!r}")
    mock.script("ffi_down", [], after={"status": 503})
    status, text, _ = http("GET", ngx.base + "/llm_ffi?s=ffi_down")
    check(status == 200, f"/llm_ffi: {status} {text}")
    out = json.loads(text)
    fe, ce = out["fast"]["err"], out["classic"]["err"]
    check(fe["is_error"] and fe["kind"] == "http_status" and fe["attempts"] == 2, f"err {fe}")
    check(fe["request_id"] and f"[request_id={fe['request_id']}]" in fe["text"],
          f"the error does not name its request id: {fe}")
    for k in ("kind", "reason", "status", "attempts", "is_error"):
        check(fe[k] == ce[k], f"err.{k} differs: FFI {fe[k]!r}, classic {ce[k]!r}")
    check(fe["text"].replace(fe["request_id"], "ID") == ce["text"].replace(ce["request_id"], "ID"),
          f"tostring(err) differs: {fe['text']!r} / {ce['text']!r}")


def test_validate(ngx, mock):
    """validate is a plain function, run in the request; a rejection is retried."""
    mock.script("validate", [{"content": "not json"}, {"content": "{\"a\": 1}"}])
    status, text, _ = http("GET", ngx.base + "/llm?s=validate&validate=1")
    check(status == 200, f"/llm: {status} {text}")
    out = json.loads(text)
    check(out["attempts"] == 2 and out["content"] == "{\"a\": 1}", f"out {out}")
    check(len(mock.requests("validate")) == 2, "not 2 requests")


def test_misuse(ngx, mock):
    """Misuse raises at once naming the mistake; a raising logger is logged once, the call goes on."""
    mock.script("misuse", [])
    status, text, _ = http("GET", ngx.base + "/misuse?s=misuse")
    check(status == 200, f"/misuse: {status} {text}")
    out = json.loads(text)
    want = {
        "thread_pool": "thread_pool is not an option any more",
        "engine": "engine is not an option of llmretry.openresty",
        "validate": "validate must be a function or nil (got table)",
        "unknown": "unknown option 'timeout'",
        "on_chunk": "on_chunk must be a function (got nil)",
        "init_worker": "this worker's engine exists already",
        "init_worker_opts": "this worker's engine exists already",
        "init_worker_bad": "max_in_flight must be an integer >= 1 (got number)",
        "call_many_validate": "validate must be a function or nil (got number)",
    }
    for k, w in want.items():
        check(w in out[k], f"{k}: {out[k]!r} does not say {w!r}")
    check(out["call_ok"], "the call with a raising logger failed")
    check(len(mock.requests("misuse")) == 1, "a misused call reached the mock")
    rid = out["request_id"]
    lines = [line for line in ngx.error_log().splitlines()
             if "the logger raised" in line and rid in line]
    check(len(lines) == 1 and "logger bug llm_request_started" in lines[0],
          f"the logger's error in the log: {lines}")
    r = urllib.request.urlopen(ngx.base + "/wrong_phase", timeout=10)
    err = r.headers.get("X-Error", "")
    check("cannot wait in the header_filter phase" in err, f"a call in header_filter: {err!r}")


def test_misuse_vectors(ngx, mock):
    """tests/vectors/lua_misuse/: the same bad arguments raise the same messages as in busted and Neovim."""
    mock.script("misuse_vectors", [])
    status, text, _ = http("GET", ngx.base + "/misuse_vectors")
    check(status == 200, f"/misuse_vectors: {status} {text}")
    out = json.loads(text)
    failures = out["failures"]
    check(not failures, f"{len(failures)} of {out['ran']} cases failed:\n" + "\n".join(failures))
    check(out["ran"] >= 20, f"only {out['ran']} cases ran")
    check(len(mock.requests("misuse_vectors")) == 0, "a misused call reached the mock")


def test_doc_examples(ngx, mock):
    """The location examples of README.md and docs/openresty.md work as written."""
    check(len(doc_locations(ngx.repo)) == 4, f"{len(doc_locations(ngx.repo))} location examples")
    for path in ("/chat", "/ask"):
        mock.script("from_env", [{"content": "hello there", "stream": {"chunks": 3}}])
        req = urllib.request.Request(ngx.base + path, data=b"Say hello", method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            check(r.headers.get("Content-Type") == "text/event-stream", f"{path}: {r.headers}")
            text = r.read().decode()
        payloads = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
        check(payloads[-1:] == ["[DONE]"], f"{path}: {text[-300:]!r}")
        content = "".join(json.loads(p)["choices"][0]["delta"].get("content") or ""
                          for p in payloads[:-1] if json.loads(p)["choices"])
        check(content == "hello there", f"{path}: content {content!r}")
        recs = mock.requests("from_env")
        check(json.loads(recs[0]["body"])["messages"][0]["content"] == "Say hello",
              f"{path}: the client's text was not sent")
    mock.script("from_env", [{"content": "a summary"}])
    status, text, _ = http("POST", ngx.base + "/summarise", {"text": "long"})
    check(status == 200 and text.strip() == "a summary", f"/summarise: {status} {text}")
    mock.script("from_env", [{"content": "positive"}] * 3)
    status, text, _ = http("GET", ngx.base + "/labels")
    check(status == 200 and text.split("\n")[:3] == ["1: positive", "2: positive", "3: positive"],
          f"/labels: {status} {text}")
    mock.script("from_env", [{"content": ""}, {"content": "second try"}])
    status, text, _ = http("POST", ngx.base + "/summarise", {"text": "long"})
    check(status == 200 and text.strip() == "second try", f"/summarise's validate: {status} {text}")


def test_environment(ngx, mock):
    """OPENAI_BASE_URL and OPENAI_API_KEY reach the engine through nginx's env directive."""
    mock.script("from_env", [{}])
    status, text, _ = http("GET", ngx.base + "/llm_env")
    check(status == 200 and text.strip() == "ok", f"/llm_env: {status} {text}")
    recs = mock.requests("from_env")
    check(len(recs) == 1, f"{len(recs)} requests to the environment's base URL")
    check(recs[0]["headers"].get("authorization") == "Bearer sk-test-FROM-ENV",
          "the environment's key was not sent")


def test_waiter_pool(ngx, mock):
    """Kept waiters come back with nothing pending (two posts in a timeout, one never read).

    A sleeping request of the transport "cosocket" is posted once, an awake one
    not at all. On real semaphores, in one request."""
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
    # The transport "cosocket" knows its request sleeps: it posts it once.
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


def test_refused_connect(ngx, mock):
    """A port nobody listens on (and, on cosockets, a name that does not resolve): a network error after 3 attempts, their backoffs and no more."""
    port = free_port()
    cases = [("a refused port", f"port={port}")]
    if TRANSPORT_OPTS:
        # With no resolver directive here, nginx fails a name at once, before
        # any wait: the exchange has ended before the request would sleep on
        # it. (libcurl asks the system's resolver, which may be slow here.)
        cases.append(("a name that does not resolve", f"host=nowhere.invalid&port={port}"))
    for what, query in cases:
        t0 = time.monotonic()
        status, text, _ = http("GET", f"{ngx.base}/llm_port?{query}")
        took = time.monotonic() - t0
        out = json.loads(text)
        check(status == 200 and not out["ok"] and out["kind"] == "network"
              and out["attempts"] == 3, f"{what}: {out}")
        # A request that slept for news it had already had would wait its
        # wait's bound (a second) at the end.
        check(took < 0.9, f"{what}: 3 attempts took {took:.2f} s")


def test_big_answer_and_idle_close(ngx, mock):
    """A 300 KB answer arrives whole; a kept-alive connection the server closed while idle is not used again."""
    mock.script("big", [{"fault": "huge", "size": 300000}])
    status, text, _ = http("GET", ngx.base + "/llm?s=big")
    out = json.loads(text)
    check(status == 200 and out["ok"] and len(out["content"]) > 250000 and out["attempts"] == 1,
          f"a 300 KB answer: {status} {text[:300]}")
    mock.script("idle", [{"idle_close_ms": 20}, {}])
    status, text, _ = http("GET", ngx.base + "/llm?s=idle")
    check(status == 200 and json.loads(text)["ok"], f"the first call: {status} {text}")
    check(wait_for(lambda: mock.requests("idle")[0].get("idle_closed"), 5) is not None,
          "the mock did not close the idle connection")
    status, text, _ = http("GET", ngx.base + "/llm?s=idle")
    out = json.loads(text)
    check(status == 200 and out["ok"] and out["attempts"] == 1, f"after the idle close: {out}")
    recs = mock.requests("idle")
    check(len(recs) == 2 and recs[0]["connection"] != recs[1]["connection"],
          f"requests {[(r['connection'], r.get('idle_closed')) for r in recs]}")


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
    if TRANSPORT_OPTS:
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
    # the bound leaves room for that and still fails for a pool of < 60 (the thread count below is the direct check).
    check(times[-1] - times[0] < 8.0, f"the calls reached the mock {times[-1] - times[0]:.2f} s apart")
    # Likewise the wall: 16 s through a pool of 32; 3.5 s was seen loaded.
    check(out["wall"] < 8.0, f"{n} concurrent 1 s calls took {out['wall']:.2f} s")
    check(threads and threads[0] <= 4, f"the worker runs {threads} threads with {n} calls in flight")
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


STREAM_TEXT = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN"


def test_stream_proxied(ngx, mock):
    """A 1 s stream of 40 chunks reaches the client as SSE in pieces, its first bytes at once."""
    mock.script("stream40", [{"content": STREAM_TEXT,
                              "stream": {"chunks": 40, "delay_ms": 25, "usage_chunk": False}}])
    raw = Raw(ngx, "/stream?s=stream40")
    body = raw.read_all()
    raw.close()
    head, payloads = sse_payloads(body)
    check(b" 200 " in head.split(b"\r\n")[0] and b"text/event-stream" in head,
          f"response head {head[:200]!r}")
    check(payloads and payloads[-1] == "[DONE]", f"the stream did not end with [DONE]: {payloads[-3:]}")
    chunks = [json.loads(p) for p in payloads[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                      if c["choices"])
    check(content == STREAM_TEXT, f"content {content!r}")
    check(len(chunks) == 41, f"{len(chunks)} chunks (40 deltas and the finish)")
    first, last = raw.pieces[0][0], raw.pieces[-1][0]
    FIGURES["stream_first_bytes_ms"] = first * 1000
    FIGURES["stream_pieces"] = len(raw.pieces)
    FIGURES["stream_span_s"] = last - first
    check(first < 0.5, f"the first bytes took {first * 1000:.0f} ms")
    check(len(raw.pieces) >= 20, f"the stream reached the client in {len(raw.pieces)} pieces")
    check(last - first > 0.7, f"the pieces came within {last - first:.2f} s, not over the stream")


def test_client_abort_cancels_stream(ngx, mock):
    """A client that goes away mid-stream cancels the upstream request: the mock sees it gone."""
    mock.script("abort_stream", [{"stream": {"chunks": 40, "delay_ms": 100}}])
    raw = Raw(ngx, "/stream?s=abort_stream")
    while b"data: " not in b"".join(d for _, d in raw.pieces):
        check(raw.read_some(), "the stream ended before its first chunk")
    raw.close()
    t0 = time.monotonic()
    took = wait_for(lambda: mock.requests("abort_stream")[0].get("client_gone"), 3)
    rec = mock.requests("abort_stream")[0]
    check(took is not None, f"the mock never saw the client go: {rec}")
    FIGURES["abort_stream_ms"] = took * 1000
    check(rec["events_sent"] < 40, f"the whole stream was sent: {rec['events_sent']} events")
    rid = rec["headers"].get("x-client-request-id")
    ended = wait_for(lambda: f"llmretry stream ended: cancelled request_id={rid}"
                     in ngx.error_log(), 3)
    check(ended is not None, "the handler did not see its stream end cancelled")
    check(time.monotonic() - t0 < 3, "cancelling took too long")


def test_client_abort_cancels_call(ngx, mock):
    """A client that goes away while its call waits for an answer cancels the upstream request."""
    mock.script("abort_call", [{}])
    mock.outage("abort_call", "hang")
    raw = Raw(ngx, "/llm?s=abort_call")
    check(wait_for(lambda: len(mock.requests("abort_call")) == 1, 5) is not None,
          "the call did not reach the mock")
    raw.close()
    took = wait_for(lambda: mock.requests("abort_call")[0].get("client_gone"), 3)
    check(took is not None, f"the mock never saw the client go: {mock.requests('abort_call')}")
    FIGURES["abort_call_ms"] = took * 1000
    rid = mock.requests("abort_call")[0]["headers"].get("x-client-request-id")
    check(wait_for(lambda: f"llmretry call ended: cancelled request_id={rid}"
                   in ngx.error_log(), 3) is not None,
          "the handler did not see its call end cancelled")
    check(len(mock.requests("abort_call")) == 1, "the cancelled call was retried")


def test_tls(ngx, mock):
    """Calls over TLS: a trusted certificate answers (after a 503, retried), an untrusted one fails at once, not retried."""
    mock.script("tls", [{"status": 503}, {}])
    ca = "" if TRANSPORT_OPTS else "&ca=1"
    status, text, _ = http("GET", f"{ngx.base}/llm_tls?s=tls{ca}")
    out = json.loads(text)
    check(status == 200 and out["ok"] and out["content"] == "ok" and out["attempts"] == 2,
          f"over TLS: {out}")
    check(len(mock.requests("tls")) == 2, f"{len(mock.requests('tls'))} requests reached the mock")
    mock.script("tls_untrusted", [])
    status, text, _ = http("GET", f"{ngx.base}/llm_tls?s=tls_untrusted&untrusted=1{ca}")
    out = json.loads(text)
    check(not out["ok"] and out["kind"] == "network" and out["attempts"] == 1
          and "TLS verification failed (not retried)" in out["message"],
          f"an untrusted certificate: {out}")
    check(len(mock.requests("tls_untrusted")) == 0, "a request went through an untrusted TLS server")
    if TRANSPORT_OPTS:
        # ca_file is the threaded engine's way: the cosocket transport says so.
        status, text, _ = http("GET", f"{ngx.base}/llm_tls?s=tls&ca=1")
        check(status == 500 and "lua_ssl_trusted_certificate" in ngx.error_log(),
              f"ca_file under the cosocket transport: {status} {text}")


def test_exchange_in_the_request(ngx, mock):
    """With nobody to abort a call (nginx's default), the transport "cosocket" performs each attempt in the request: a retried success, a refused port, TLS trusted and not, each ending at once; and the request waits on its socket from a shallow stack (LuaJIT shrinks a stack of over ~90 slots between requests, and one this deep was grown again on every call: issue 36)."""
    mock.script("here", [{"status": 503}, {}])
    status, text, _ = http("GET", f"{ngx.base}/llm_here?to=mock&s=here")
    out = json.loads(text)
    check(status == 200 and out["ok"] and out["content"] == "ok" and out["attempts"] == 2,
          f"a retried call: {status} {out}")
    if TRANSPORT_OPTS:
        check(out["reads"] >= 2, f"the request read no socket of its own: {out}")
        # call_llm, its run loop and llmretry.cosocket's reader: with a
        # handler's own frame under them and a C function's 20 slots on top
        # they stay within ~90 (97 before, in six frames).
        check(out["slots"] <= 48, f"{out['slots']} stack slots of llmretry's frames under the socket read")
    else:
        check(out["reads"] == 0, f"the engine's transport read a socket in the request: {out}")
    port = free_port()
    t0 = time.monotonic()
    status, text, _ = http("GET", f"{ngx.base}/llm_here?to=refused&port={port}")
    took = time.monotonic() - t0
    out = json.loads(text)
    check(status == 200 and not out["ok"] and out["kind"] == "network" and out["attempts"] == 3,
          f"a refused port: {out}")
    # A request that slept for news it had already had would wait its
    # wait's bound (a second) at the end.
    check(took < 0.9, f"a refused port: 3 attempts took {took:.2f} s")
    if TRANSPORT_OPTS:
        mock.script("here_tls", [{"status": 503}, {}])
        status, text, _ = http("GET", f"{ngx.base}/llm_here?to=tls&s=here_tls")
        out = json.loads(text)
        check(status == 200 and out["ok"] and out["attempts"] == 2, f"over TLS: {out}")
        t0 = time.monotonic()
        status, text, _ = http("GET", f"{ngx.base}/llm_here?to=untrusted&s=here_tls")
        took = time.monotonic() - t0
        out = json.loads(text)
        check(not out["ok"] and out["attempts"] == 1
              and "TLS verification failed (not retried)" in out["message"],
              f"an untrusted certificate: {out}")
        check(took < 0.9, f"an untrusted certificate took {took:.2f} s")


def test_call_many(ngx, mock):
    """call_many in a handler: 30 bodies, 5 at once, each logged in the request."""
    mock.script("many", [], after={"delay_ms": 100})
    status, text, _ = http("GET", ngx.base + "/many?s=many&n=30&limit=5")
    check(status == 200, f"/many: {status} {text}")
    out = json.loads(text)
    check(out == {"n": 30, "ok": 30, "logged": 30}, f"out {out}")
    times = sorted(r["time"] for r in mock.requests("many"))
    check(len(times) == 30, f"{len(times)} requests")
    # 5 at once, 0.1 s each: six waves.
    check(times[-1] - times[0] >= 0.4, f"30 calls 5 at a time came within {times[-1] - times[0]:.2f} s")
    check(times[5] - times[0] >= 0.08, "more than 5 calls started at once")
    check(ngx.stats()["waiting"] == 0, f"waiters left behind: {ngx.stats()}")


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


def test_no_secrets_logged(ngx, mock):
    """After every test above, the error log holds no API key and no prompt."""
    log = ngx.error_log()
    check("llmretry event" in log, "the loggers' lines are missing")
    check("SECRET-KEY" not in log and "SECRET-PROMPT" not in log, "a secret reached the log")


TESTS = [test_one_call, test_events_as_they_happen, test_failure, test_ffi_path, test_validate,
         test_misuse, test_misuse_vectors,
         test_doc_examples, test_environment, test_waiter_pool, test_engine_shared, test_io_loop,
         test_500_calls_no_thread_pool,
         test_control_blocking, test_stream_proxied, test_client_abort_cancels_stream,
         test_client_abort_cancels_call, test_call_many, test_tls, test_exchange_in_the_request,
         test_big_answer_and_idle_close, test_refused_connect, test_no_secrets_logged,
         test_reload_with_calls_in_flight, test_workers_share_a_budget]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", required=True)
    ap.add_argument("--mock", required=True, help="the mock server's root URL")
    ap.add_argument("--transport", choices=["engine", "cosocket"], default="engine",
                    help="init_worker's transport for every nginx (default: engine)")
    ap.add_argument("tests", nargs="*", help="run only these tests (names)")
    a = ap.parse_args()
    global TRANSPORT_OPTS
    if a.transport == "cosocket":
        TRANSPORT_OPTS = 'transport = "cosocket"'
    repo = os.path.abspath(a.repo)
    mock = Mock(a.mock)
    ngx = Nginx(repo, a.mock)
    tests = [t for t in TESTS if not a.tests or t.__name__ in a.tests]
    passed = failed = 0
    try:
        ngx.start()
        for t in tests:
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
    print(f"openresty: {passed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
