"""OpenResty host test: the network side (run by tests/openresty/host_check.py).

A refused port (or a name that does not resolve), a big answer and a
connection the server closed while idle, a stream proxied to the client
chunk by chunk, a client that goes away cancelling its upstream stream or
call, TLS trusted and not, and the transport "cosocket" performing each
attempt in the request. Tests: each takes (nginx, mock).
"""

import json
import time

import harness
from harness import FIGURES, Raw, check, free_port, http, sse_payloads, wait_for


def test_refused_connect(ngx, mock):
    """A port nobody listens on (and, on cosockets, a name that does not resolve): a network error after 3 attempts, their backoffs and no more."""
    port = free_port()
    cases = [("a refused port", f"port={port}")]
    if harness.TRANSPORT_OPTS:
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
    check(payloads and payloads[-1] == "[DONE]",
          f"the stream did not end with [DONE]: {payloads[-3:]}")
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
    ca = "" if harness.TRANSPORT_OPTS else "&ca=1"
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
    check(len(mock.requests("tls_untrusted")) == 0,
          "a request went through an untrusted TLS server")
    if harness.TRANSPORT_OPTS:
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
    if harness.TRANSPORT_OPTS:
        check(out["reads"] >= 2, f"the request read no socket of its own: {out}")
        # call_llm, its run loop and llmretry.cosocket's reader: with a
        # handler's own frame under them and a C function's 20 slots on top
        # they stay within ~90 (97 before, in six frames).
        check(out["slots"] <= 48,
              f"{out['slots']} stack slots of llmretry's frames under the socket read")
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
    if harness.TRANSPORT_OPTS:
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
