"""OpenResty host test: calls and misuse (run by tests/openresty/host_check.py).

A call on the worker's engine, its events reaching the logger as they
happen, a failure, the FFI path, a validator, misuse raising with a message
(and tests/vectors/lua_misuse/), the docs' location examples, the
environment's key and base URL, call_many in a handler, and no secret in the
error log. Tests: each takes (nginx, mock).
"""

import json
import urllib.request

import harness
from harness import check, doc_locations, http


def test_one_call(ngx, mock):
    """A call on the worker's engine: the result as llmretry.call_llm's, the events in the request."""
    if harness.TRANSPORT_OPTS:
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
    check(times[-1] - times[0] >= 0.4,
          f"30 calls 5 at a time came within {times[-1] - times[0]:.2f} s")
    check(times[5] - times[0] >= 0.08, "more than 5 calls started at once")
    check(ngx.stats()["waiting"] == 0, f"waiters left behind: {ngx.stats()}")


def test_no_secrets_logged(ngx, mock):
    """After every test above, the error log holds no API key and no prompt."""
    log = ngx.error_log()
    check("llmretry event" in log, "the loggers' lines are missing")
    check("SECRET-KEY" not in log and "SECRET-PROMPT" not in log, "a secret reached the log")
