"""Streamed calls against LiteLLM's proxy (a server nobody here wrote).

Run by tools/interop.sh (``make interop``) after check_litellm.py, against
the same proxy. Two counts say how many requests a call cost, from outside
the engine:

* the proxy's access log (uvicorn writes one ``"POST /v1/chat/completions
  HTTP/1.1" <status>`` line per request it received): what llmretry sent;
* a recording upstream, started here, that LiteLLM calls for the ``up-*``
  models (litellm_proxy.yaml): what LiteLLM sent on, and a way to make
  LiteLLM's stream fail mid-way, which its mock_response cannot.

Each check prints one line; the script exits 1 when any fails.
Usage: check_streaming.py BASE_URL ACCESS_LOG UPSTREAM_PORT
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Sequence, Tuple

import llmretry
from interop_util import AccessLog, Checks

KEY = "sk-1234"
MOCK_TEXT = "hello from litellm"     # fake-ok's mock_response
checks = Checks()
check = checks.check


def body(model: str, text: str = "hi") -> Dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], "stream": True}


def content(res: llmretry.Result) -> str:
    return res.data["choices"][0]["message"]["content"]


# ---------------------------------------------------------------------------
# The recording upstream behind the up-* models

def chunk(model: str, delta: Dict[str, Any], finish: Any = None) -> Dict[str, Any]:
    return {"id": "chatcmpl-upstream", "object": "chat.completion.chunk", "created": 1,
            "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


class Upstream(BaseHTTPRequestHandler):
    """An OpenAI-style streaming server, one behaviour per model name:
    up-ok streams "one two three" with usage; up-error sends two chunks
    then an error object; up-cut sends two chunks then closes the
    connection; up-429 answers 429 before any stream; up-429-wait answers
    its first request 429 with Retry-After: 2, then streams; up-window
    answers plain requests within fixed windows of 10 a 6 s, stated in
    x-ratelimit-*, and 429s past them; up-inband
    answers a plain request 200 with an error body, and a stream with its
    choice ended by finish_reason "error"."""

    protocol_version = "HTTP/1.1"
    seen: List[Dict[str, Any]] = []
    times: List[Tuple[Any, float]] = []
    lock = threading.Lock()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def event(self, doc: Any) -> None:
        self.wfile.write(b"data: " + json.dumps(doc).encode() + b"\n\n")
        self.wfile.flush()

    def answer_json(self, status: int, doc: Any,
                    headers: Sequence[Tuple[str, str]] = ()) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        model = req.get("model")
        with self.lock:
            self.seen.append(req)
            self.times.append((model, time.monotonic()))
            first = sum(1 for r in self.seen if r.get("model") == model) == 1
        if model == "up-429-wait" and first:
            self.answer_json(429, {"error": {"message": "slow down", "type": "requests",
                                             "code": "rate_limit_exceeded"}},
                             [("Retry-After", "2")])
            return
        if model == "up-window":
            self.answer_window(model)
            return
        if model == "up-inband" and not req.get("stream"):
            self.answer_json(200, {"error": {"message": "Provider returned error", "code": 502}})
            return
        if model == "up-429":
            self.answer_json(429, {"error": {"message": "slow down", "type": "requests",
                                             "code": "rate_limit_exceeded"}})
            return
        self.close_connection = True    # the stream ends with the connection
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.event(chunk(model, {"role": "assistant", "content": "one "}))
        self.event(chunk(model, {"content": "two "}))
        if model == "up-error":
            self.event({"error": {"message": "upstream overloaded", "type": "server_error",
                                  "code": "server_error"}})
            return
        if model == "up-cut":
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if model == "up-inband":
            self.event(chunk(model, {}, "error"))
            self.wfile.write(b"data: [DONE]\n\n")
            return
        self.event(chunk(model, {"content": "three"}, "stop"))
        if (req.get("stream_options") or {}).get("include_usage"):
            self.event({"id": "chatcmpl-upstream", "object": "chat.completion.chunk",
                        "created": 1, "model": model, "choices": [],
                        "usage": {"prompt_tokens": 3, "completion_tokens": 3,
                                  "total_tokens": 6}})
        self.wfile.write(b"data: [DONE]\n\n")

    WINDOW_S, WINDOW_LIMIT = 6.0, 10
    window = {"start": time.monotonic(), "used": 0, "refused": 0}

    def answer_window(self, model: str) -> None:
        w = self.window
        with self.lock:
            now = time.monotonic()
            if now - w["start"] >= self.WINDOW_S:
                w["start"] += self.WINDOW_S * ((now - w["start"]) // self.WINDOW_S)
                w["used"] = 0
            admitted = w["used"] < self.WINDOW_LIMIT
            w["used"] += admitted
            w["refused"] += not admitted
            reset = w["start"] + self.WINDOW_S - now
            stated = [("x-ratelimit-limit-requests", str(self.WINDOW_LIMIT)),
                      ("x-ratelimit-remaining-requests", str(self.WINDOW_LIMIT - w["used"])),
                      ("x-ratelimit-reset-requests", f"{reset:.3f}s")]
        if not admitted:
            self.answer_json(429, {"error": {"message": "slow down", "type": "requests",
                                             "code": "rate_limit_exceeded"}},
                             stated + [("Retry-After", str(max(1, round(reset))))])
            return
        self.answer_json(200, {"id": "chatcmpl-upstream", "object": "chat.completion",
                               "created": 1, "model": model,
                               "choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant", "content": "ok"}}],
                               "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                         "total_tokens": 2}}, stated)

    @classmethod
    def requests_for(cls, model: str) -> List[Dict[str, Any]]:
        with cls.lock:
            return [r for r in cls.seen if r.get("model") == model]

    @classmethod
    def times_for(cls, model: str) -> List[float]:
        with cls.lock:
            return [t for m, t in cls.times if m == model]


# ---------------------------------------------------------------------------

def main(base_url: str, access_log: str, upstream_port: int) -> int:
    log = AccessLog(access_log)
    upstream = ThreadingHTTPServer(("127.0.0.1", upstream_port), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    client = llmretry.Client(base_url=base_url, api_key=KEY, logger=None,
                             base_delay_ms=200, max_delay_ms=2000)

    def one_stream() -> str:
        mark = log.mark()
        res = client.call_llm(body("fake-ok"))
        m = res.meta
        assert content(res) == MOCK_TEXT, repr(content(res))
        assert res.data["object"] == "chat.completion", res.data.get("object")
        assert res.data["choices"][0]["finish_reason"] == "stop", res.data["choices"][0]
        assert m.stream is True and m.chunks > 1, m
        assert m.attempts == 1 and m.resends == 0, m
        # LiteLLM honours include_usage (the engine asked for it).
        assert m.usage is not None and m.usage["completion_tokens"] > 0, m.usage
        sent = log.since(mark, 1)
        assert sent == [200], f"the proxy received {sent}"
        return (f"{m.chunks} chunks, ttft {m.ttft_ms} ms, usage {m.usage}, "
                f"1 request to the proxy")

    def batch_of_streams() -> str:
        mark = log.mark()
        out = client.call_many([body("fake-ok", f"q{i}") for i in range(4)], limit=4)
        assert [type(v).__name__ for v in out] == ["Result"] * 4, out
        assert all(content(v) == MOCK_TEXT for v in out)
        assert all(v.meta.stream and v.meta.chunks > 1 for v in out)
        assert all(v.meta.usage is not None for v in out), [v.meta.usage for v in out]
        s = out.summary
        assert (s.ok, s.attempts) == (4, 4) and s.total_tokens > 0, s
        sent = log.since(mark, 4)
        assert sent == [200] * 4, f"the proxy received {sent}"
        return f"4 ok, 4 requests to the proxy, {s.total_tokens} tokens"

    def mock_500_stream() -> str:
        # LiteLLM raises the mock error before it starts the stream: a JSON
        # 500, retried like any 500, never read as a broken stream.
        mark = log.mark()
        try:
            client.call_llm(body("fake-500"), max_retries=2)
        except llmretry.HTTPStatusError as exc:
            assert (exc.kind, exc.status, exc.attempts) == ("http_status", 500, 3), repr(exc)
            assert exc.reason == "retries_exhausted", repr(exc)
            sent = log.since(mark, 3)
            assert sent == [500] * 3, f"the proxy received {sent}"
            return f"{exc.attempts} attempts, 3 requests to the proxy, {str(exc)[:70]}..."
        raise AssertionError("no error")

    def upstream_stream() -> str:
        mark = log.mark()
        res = client.call_llm(body("up-ok"))
        assert content(res) == "one two three", repr(content(res))
        assert res.meta.usage is not None, res.meta
        seen = Upstream.requests_for("up-ok")
        assert len(seen) == 1, f"upstream saw {len(seen)} requests"
        assert seen[0].get("stream") is True, seen[0]
        sent = log.since(mark, 1)
        assert sent == [200], f"the proxy received {sent}"
        return (f"{res.meta.chunks} chunks, usage {res.meta.usage}; LiteLLM sent on "
                f"stream_options={seen[0].get('stream_options')}")

    def error_mid_stream() -> str:
        # LiteLLM relays an upstream error after two chunks as
        # data: {"error": {..., "code": "500"}} and ends the stream: a 500,
        # retried (nothing was handed to the caller yet).
        mark = log.mark()
        try:
            client.call_llm(body("up-error"), max_retries=2)
        except llmretry.HTTPStatusError as exc:
            assert (exc.kind, exc.status, exc.attempts) == ("http_status", 500, 3), repr(exc)
            seen = len(Upstream.requests_for("up-error"))
            sent = log.since(mark, 3)
            assert sent == [200] * 3, f"the proxy received {sent}"
            assert seen == 3, f"upstream saw {seen} requests"
            # The provider's message, as LiteLLM relays it, screened (it
            # quotes nothing of the request): what the caller needs to know.
            said = str(exc)
            assert "upstream overloaded" in said, f"the provider's message is not shown: {said}"
            assert "error inside the stream (HTTP 500-like)" in said, said
            return (f"{exc.attempts} attempts (3 to the proxy, 3 upstream), "
                    f"error_code {exc.error_code!r}: {said[:110]}...")
        raise AssertionError("no error")

    def rate_limited_before_stream() -> str:
        mark = log.mark()
        try:
            client.call_llm(body("up-429"), max_retries=1)
        except llmretry.HTTPStatusError as exc:
            assert (exc.status, exc.attempts) == (429, 2), repr(exc)
            sent = log.since(mark, 2)
            assert sent == [429] * 2, f"the proxy received {sent}"
            seen = len(Upstream.requests_for("up-429"))
            return (f"{exc.attempts} attempts, {seen} upstream, "
                    f"error_code {exc.error_code!r}")
        raise AssertionError("no error")

    def provider_wait_through_the_proxy() -> str:
        # LiteLLM passes its provider's Retry-After on only as
        # llm_provider-retry-after: read as the server's wait, the retry
        # comes 2 s later, not after our 200 ms backoff (before: 0.2 s).
        events: List[Dict[str, Any]] = []
        with llmretry.Client(base_url=base_url, api_key=KEY, logger=events.append,
                             base_delay_ms=200, max_delay_ms=2000) as waiting:
            res = waiting.call_llm(body("up-429-wait"), max_retries=1)
        assert content(res) == "one two three", repr(content(res))
        failed = [e for e in events if e["event"] == "llm_request_failed"]
        assert [e["retry_after"] for e in failed] == ["2"], failed
        scheduled = [(e["delay_source"], e["delay_ms"]) for e in events
                     if e["event"] == "llm_retry_scheduled"]
        assert scheduled == [("retry_after", 2000)], scheduled
        times = Upstream.times_for("up-429-wait")
        assert len(times) == 2 and times[1] - times[0] >= 1.9, times
        return (f"retry after {times[1] - times[0]:.2f} s (the provider's Retry-After: 2, "
                f"as llm_provider-retry-after), {res.meta.attempts} attempts")

    def provider_window_through_the_proxy() -> str:
        # 30 items at 8 in flight, nothing configured: the pace comes from
        # the provider's x-ratelimit-* as LiteLLM relays them. Its windows
        # let 30 through in about 18 s; read as 10 a minute (as it was once
        # a window's first answer said what a minute's would), they take 3
        # minutes, and the batch's 60 s deadline fails items.
        items = [{"model": "up-window", "messages": [{"role": "user", "content": f"w{i}"}]}
                 for i in range(30)]
        start = time.monotonic()
        out = client.call_many(items, limit=8, deadline_ms=60000)
        took = time.monotonic() - start
        assert out.summary.ok == 30, out.summary.format()
        refused = Upstream.window["refused"]
        assert refused <= 8, f"the provider refused {refused}"
        return (f"30 of 30 in {took:.1f} s, {out.summary.attempts} attempts, "
                f"{refused} refused by the provider")

    def cut_upstream() -> str:
        # Not the engine's to see: LiteLLM ends a stream whose upstream was
        # cut with a finish_reason "stop", its own usage and [DONE], so the
        # caller gets the partial text as a complete answer. Checked so that
        # a LiteLLM that starts reporting the cut is noticed.
        mark = log.mark()
        res = client.call_llm(body("up-cut"), max_retries=2)
        assert content(res) == "one two ", repr(content(res))
        assert res.data["choices"][0]["finish_reason"] == "stop", res.data["choices"][0]
        assert res.meta.attempts == 1, res.meta
        sent = log.since(mark, 1)
        assert sent == [200], f"the proxy received {sent}"
        return "LiteLLM reports it as finished (finish_reason stop, [DONE]): 1 attempt"

    check("a streamed call: the assembled answer, usage, one request", one_stream)
    check("call_many of 4 streams: 4 requests", batch_of_streams)
    check("a mock 500 with stream: true is retried as a 500", mock_500_stream)
    check("a stream LiteLLM relays from an upstream", upstream_stream)
    check("an upstream error mid-stream is retried as a 500", error_mid_stream)
    check("an upstream 429 before the stream is retried as a 429", rate_limited_before_stream)
    check("an upstream's Retry-After, passed on as llm_provider-retry-after, is waited",
          provider_wait_through_the_proxy)
    check("a provider's short windows, stated through the proxy, pace a batch",
          provider_window_through_the_proxy)
    check("an upstream cut mid-stream", cut_upstream)

    def upstream_answer_is_an_error() -> str:
        # An upstream that answers 200 with an error in its body (as
        # OpenRouter does when the model fails after the status), and one
        # whose stream ends its choice with finish_reason "error". LiteLLM
        # judges both as llmretry's core does (reliability.md, "A 200 that
        # is not an answer"): a 502, and an error inside the stream. Either
        # way no success reaches the caller, and each attempt is one request.
        out = []
        for stream in (False, True):
            mark = log.mark()
            before = len(Upstream.requests_for("up-inband"))
            try:
                client.call_llm(dict(body("up-inband"), stream=stream), max_retries=1)
            except llmretry.HTTPStatusError as exc:
                assert exc.attempts == 2, repr(exc)
                sent = log.since(mark, 2)
                seen = len(Upstream.requests_for("up-inband")) - before
                assert seen == 2, f"upstream saw {seen} requests"
                out.append(f"{'stream' if stream else 'plain'}: HTTP {exc.status} after "
                           f"{exc.attempts} attempts (the proxy answered {sent})")
                continue
            raise AssertionError(f"stream={stream}: a success")
        return "; ".join(out)

    check("an upstream's 200 that is an error, plain and streamed", upstream_answer_is_an_error)

    responses_log = AccessLog(access_log, "/v1/responses")

    def output_text(res: llmretry.Result) -> str:
        return "".join(part.get("text", "") for item in res.data.get("output", [])
                       for part in item.get("content", []) or [])

    def responses_stream() -> str:
        # Issue 27, items 3 and 4: LiteLLM's /responses (the lm_studio
        # provider translates it to chat) streams typed events as bare
        # `data: {"type": "response.output_text.delta", ...}` lines, with no
        # `event:` line; its usage is input_tokens/output_tokens.
        mark = responses_log.mark()
        before = len(Upstream.requests_for("up-ok"))
        with client.stream_llm({"model": "lm-responses", "input": "hi"},
                               url=base_url + "/responses") as s:
            texts = list(s.text_deltas())
            res = s.result()
        assert "".join(texts) == "one two three", f"text deltas {texts!r}"
        assert output_text(res) == "one two three", res.data
        u = res.meta.usage
        assert u is not None and u["prompt_tokens"] == 3 and u["completion_tokens"] == 3, u
        sent = responses_log.since(mark, 1)
        assert sent == [200], f"the proxy received {sent}"
        seen = Upstream.requests_for("up-ok")[before:]
        assert len(seen) == 1, f"upstream saw {len(seen)} requests"
        many = client.call_many([{"model": "lm-responses", "input": f"q{i}", "stream": True}
                                 for i in range(50)], limit=8, url=base_url + "/responses")
        texts50 = [output_text(v) if isinstance(v, llmretry.Result) else repr(v) for v in many]
        assert texts50 == ["one two three"] * 50, texts50[:3]
        assert many.summary.prompt_tokens == 150, many.summary
        return (f"{len(texts)} text deltas, usage {u}; call_many of 50 streams: "
                f"50 with text, {many.summary.total_tokens} tokens")

    check("a /responses stream with no event: lines (typed by its payload)", responses_stream)

    def asyncio_streams() -> str:
        # The asyncio surface (issue 17) through the same proxy: a stream
        # read chunk by chunk on the loop, and calls gathered at once.
        import asyncio

        async def run() -> str:
            mark = log.mark()
            async with client.astream_llm(body("fake-ok")) as s:
                texts = [t async for t in s.text_deltas()]
                res = await s.result()
            assert "".join(texts) == MOCK_TEXT, repr(texts)
            assert res.meta.stream and res.meta.usage is not None, res.meta
            many = await asyncio.gather(*(client.acall_llm(body("fake-ok", f"a{i}"))
                                          for i in range(8)))
            assert all(content(r) == MOCK_TEXT for r in many)
            out = await client.acall_many([body("fake-ok", f"m{i}") for i in range(8)],
                                          limit=4)
            assert out.summary.ok == 8, out.summary
            sent = log.since(mark, 17)
            assert sent == [200] * 17, f"the proxy received {sent}"
            return f"astream {len(texts)} deltas; 8 gathered acall_llm; acall_many 8 ok"
        return asyncio.run(run())

    check("astream_llm, gathered acall_llm and acall_many under asyncio", asyncio_streams)
    client.close()
    upstream.shutdown()
    return checks.summary("litellm streaming")

if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
