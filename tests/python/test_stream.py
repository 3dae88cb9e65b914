"""llmretry.stream_llm against the mock's SSE scenarios (docs/streaming.md): chunks
as they arrive, the commit point, interrupted streams, cancelling by leaving
the block, backpressure, and bad arguments."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any, Dict, List

import pytest

import llmretry
from conftest import (SECRET_KEY, Events, Scenario, check_event_shape, check_no_secrets,
                      rss_bytes)

BODY: Dict[str, Any] = {"model": "gpt-test",
                        "messages": [{"role": "user", "content": "SECRET-PROMPT-stream"}]}
FAST = dict(api_key=SECRET_KEY, base_delay_ms=10, jitter="none", timeout_ms=5000)


def content_of(chunks: List[Any]) -> str:
    out = []
    for ch in chunks:
        for choice in ch.get("choices") or []:
            text = (choice.get("delta") or {}).get("content")
            if text:
                out.append(text)
    return "".join(out)


def test_chunks_then_the_assembled_result(scen: Scenario) -> None:
    scen.script([{"stream": {"chunks": ["Hel", "lo", " there"]}}])
    events = Events()
    with llmretry.stream_llm(BODY, base_url=scen.url, logger=events, **FAST) as s:
        assert "SECRET" not in repr(s) and s.request_id in repr(s)
        chunks = list(s)
        res = s.result()
    assert content_of(chunks) == "Hello there"
    assert res.data["object"] == "chat.completion"
    assert res.data["choices"][0]["message"] == {"role": "assistant", "content": "Hello there"}
    assert res.meta.stream and res.meta.chunks == len(chunks) == 5   # 3, finish, usage
    assert res.meta.usage == {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    assert res.meta.ttft_ms is not None and res.meta.ttft_ms >= 0
    sent = json.loads(scen.requests()[0]["body"])
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert "stream" not in BODY, "the caller's dict is left alone"
    assert events.names == ["llm_request_started", "llm_request_succeeded"]
    for ev in events.events:
        check_event_shape(ev)
    done = events.events[-1]
    assert done["stream"] is True and done["chunks"] == 5
    check_no_secrets(["SECRET-PROMPT-stream", SECRET_KEY], events.events)


def test_text_deltas_and_a_client(scen: Scenario) -> None:
    scen.script([{"stream": {"chunks": ["a", "b", "c"]}}])
    with llmretry.Client(base_url=scen.url, **FAST) as c:
        with c.stream_llm(BODY, logger=None) as s:
            assert list(s.text_deltas()) == ["a", "b", "c"]
            assert s.result().meta.attempts == 1


def test_an_open_stream_does_not_keep_the_chunk_it_handed_out(scen: Scenario) -> None:
    """Memory per open stream (BENCHMARKS.md): a suspended iterator must
    not hold the last chunk (its parsed dict, raw bytes, event tuple) while
    the caller has moved on; 1,000 open streams held ~2 KiB each that way.
    sys.getrefcount is 2 for an object only this frame refers to (the local
    and the argument)."""
    scen.script([{"stream": {"chunks": ["a", "b"], "delay_ms": 50}}])
    with llmretry.stream_llm(BODY, base_url=scen.url, **FAST) as s:
        for it in (iter(s), s.events()):
            got = next(it)
            assert sys.getrefcount(got) == 2, "the iterator keeps what it yielded"
            del got
        assert len(list(s)) == 2            # the rest (finish, usage), then the end
        assert s.result().data["choices"][0]["message"]["content"] == "ab"


def test_failures_before_the_first_read_are_retried(scen: Scenario) -> None:
    """The first attempt breaks before the caller reads anything: it is
    retried, and its unread chunks are dropped (only attempt 2's arrive)."""
    scen.script([{"stream": {"chunks": ["a", "b", "c"], "end": "drop", "after": 2}},
                 {"stream": {"chunks": ["x", "y"]}}])
    with llmretry.stream_llm(BODY, base_url=scen.url, logger=None, **FAST) as s:
        assert len(scen.wait_requests(2)) == 2     # attempt 1 is over, nothing read
        text = "".join(s.text_deltas())
        res = s.result()
    assert text == "xy"
    assert res.meta.attempts == 2 and len(scen.requests()) == 2


@pytest.mark.parametrize("end, reason", [
    ({"end": "drop"}, "truncated"),                      # FIN inside the chunked body
    ({"end": "drop", "framing": "close"}, "truncated"),  # a clean end before [DONE]
    ({"end": "reset"}, "network"),
    ({"end": "error_event", "error_code": "server_error"}, "error_event"),
    ({"end": "stall", "stall_ms": 5000}, "idle_timeout"),
])
def test_after_the_first_read_nothing_is_retried(scen: Scenario, end: Dict[str, Any],
                                                 reason: str) -> None:
    scen.script([{"stream": dict({"chunks": ["a", "b", "c"], "after": 2, "delay_ms": 150},
                                 **end)}])
    events = Events()
    got: List[str] = []
    with pytest.raises(llmretry.StreamInterruptedError) as info:
        with llmretry.stream_llm(BODY, base_url=scen.url, logger=events,
                                 idle_timeout_ms=400, **FAST) as s:
            for text in s.text_deltas():
                got.append(text)
    err = info.value
    assert err.kind == "stream_interrupted" and err.reason == reason
    assert err.chunks_delivered == len(got) >= 1
    assert err.attempts == 1 and len(scen.requests()) == 1, "a committed stream is not retried"
    assert err.partial is not None
    assert err.partial.data["choices"][0]["message"]["content"] == "".join(got)
    if reason == "error_event":
        assert err.error_code == "server_error"
    assert isinstance(err, llmretry.LLMError) and err.request_id in str(err)
    gave_up = events.events[-1]
    check_event_shape(gave_up)
    assert gave_up["reason"] == "stream_interrupted" and gave_up["stream_reason"] == reason


def test_deadline_mid_stream(scen: Scenario) -> None:
    scen.script([{"stream": {"chunks": 20, "delay_ms": 100}}])
    with pytest.raises(llmretry.StreamInterruptedError) as info:
        with llmretry.stream_llm(BODY, base_url=scen.url, logger=None, deadline_ms=500,
                                 **FAST) as s:
            for _ in s:
                pass
    assert info.value.reason == "deadline"


def test_leaving_the_block_early_cancels(scen: Scenario) -> None:
    scen.script([{"stream": {"chunks": 50, "delay_ms": 50}}])
    events = Events()
    t0 = time.monotonic()
    with llmretry.stream_llm(BODY, base_url=scen.url, logger=events, **FAST) as s:
        for i, _ in enumerate(s):
            if i == 2:
                break
    assert time.monotonic() - t0 < 2.0
    assert s.done
    # Its last event came before the block returned.
    assert events.names[-1] == "llm_request_gave_up"
    assert events.events[-1]["reason"] == "cancelled"
    for _ in range(100):
        if scen.requests()[0].get("client_gone"):
            break
        time.sleep(0.02)
    assert scen.requests()[0].get("client_gone") is True, "the server must see the stream closed"


def test_a_slow_reader_pauses_the_transfer_and_loses_nothing(scen: Scenario) -> None:
    """Past stream_buffer_bytes of unread chunks the transfer pauses: the
    server cannot send the whole 8 MB stream while the reader sleeps (without
    the pause it all went into memory in under a second), there is no idle
    timeout meanwhile (the reader is slow, not the server), and nothing is
    lost or reordered."""
    n = 8000
    pieces = [f"<{i:05d}>" + "x" * 1000 for i in range(n)]
    scen.script([{"stream": {"chunks": pieces}}])
    with llmretry.stream_llm(BODY, base_url=scen.url, logger=None, stream_buffer_bytes=4096,
                             idle_timeout_ms=300, **FAST) as s:
        time.sleep(1.0)             # far past idle_timeout_ms, the transfer paused
        sent = scen.requests()[0]["events_sent"]
        got = []
        for i, text in enumerate(s.text_deltas()):
            got.append(text)
            if i % 2000 == 0:
                time.sleep(0.05)
        res = s.result()
    assert sent < 0.75 * n, f"the server sent {sent} of {n} chunks to a reader that slept"
    assert got == pieces
    assert res.meta.attempts == 1


def test_several_streams_from_threads(scen: Scenario) -> None:
    scen.script([], after={"stream": {"chunks": 10, "delay_ms": 20}})
    results: List[str] = []
    lock = threading.Lock()

    def run() -> None:
        with llmretry.stream_llm(BODY, base_url=scen.url, logger=None, **FAST) as s:
            text = "".join(s.text_deltas())
        with lock:
            results.append(text)

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(results) == 8 and all(r == results[0] and r for r in results)


def test_a_json_answer_to_a_stream_request(scen: Scenario) -> None:
    """A server that does not stream answers whole: the loop reads it as the
    chunk it would have streamed (it read nothing: an empty answer on the
    user's screen); the result is the body as sent."""
    scen.script([{"stream": False, "content": "whole"}] * 2)
    with llmretry.stream_llm(BODY, base_url=scen.url, logger=None, **FAST) as s:
        assert list(s.text_deltas()) == ["whole"]
        result = s.result()
    assert result.data["object"] == "chat.completion"
    assert result.data["choices"][0]["message"]["content"] == "whole"
    assert (result.meta.stream, result.meta.chunks) == (True, 0)
    with llmretry.stream_llm(BODY, base_url=scen.url, logger=None, **FAST) as s:
        (chunk,) = list(s)
    assert chunk["object"] == "chat.completion.chunk" and chunk["usage"]["total_tokens"] == 15
    assert chunk["choices"][0]["delta"] == {"role": "assistant", "content": "whole"}


def test_a_logger_that_raises_loses_nothing(scen: Scenario,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    scen.script([{"stream": {"chunks": ["a", "b"]}}])
    seen: List[Any] = []
    monkeypatch.setattr("sys.unraisablehook", seen.append)

    def bad_logger(ev: Dict[str, Any]) -> None:
        raise RuntimeError("logger broke")

    with llmretry.stream_llm(BODY, base_url=scen.url, logger=bad_logger, **FAST) as s:
        assert "".join(s.text_deltas()) == "ab"
        assert s.result().meta.chunks == 4
    assert seen, "the logger's error is reported, not swallowed"


def test_bad_arguments_raise_at_once() -> None:
    with pytest.raises(TypeError, match="timeout"):
        llmretry.stream_llm(BODY, timeout=5)
    with pytest.raises(ValueError, match="stream_buffer_bytes must be > 0"):
        llmretry.stream_llm(BODY, base_url="http://127.0.0.1:9/v1", api_key="k",
                            stream_buffer_bytes=0)
    with pytest.raises(ValueError, match="idle_timeout_ms must be > 0"):
        llmretry.stream_llm(BODY, base_url="http://127.0.0.1:9/v1", api_key="k",
                            idle_timeout_ms=0)
    with pytest.raises(TypeError, match="body"):
        llmretry.stream_llm(42, base_url="http://127.0.0.1:9/v1", api_key="k")


def test_call_llm_with_a_streaming_body_returns_the_whole(scen: Scenario) -> None:
    scen.script([{"stream": {"chunks": ["a", "b"], "end": "drop", "after": 1}},
                 {"stream": {"chunks": ["c", "d"]}}])
    res = llmretry.call_llm(dict(BODY, stream=True), base_url=scen.url, logger=None, **FAST)
    assert res.data["choices"][0]["message"]["content"] == "cd"
    assert res.meta.stream and res.meta.attempts == 2


def test_policies_apply_to_streams(scen: Scenario) -> None:
    scen.script([{"status": 503}, {"stream": {"chunks": ["p"]}}])
    pols = {"s": {"max_retries": 1, "base_delay_ms": 5, "model": "policy-model"}}
    with llmretry.Client(policies=pols, base_url=scen.url, api_key=SECRET_KEY) as c:
        body = {"messages": []}
        with c.stream_llm(body, policy="s", logger=None) as s:
            assert "".join(s.text_deltas()) == "p"
            assert s.result().meta.attempts == 2
    assert json.loads(scen.requests()[1]["body"])["model"] == "policy-model"


def _typed(event: str, data: Dict[str, Any]) -> Dict[str, str]:
    return {"raw": f"event: {event}\ndata: {json.dumps(data)}\n\n"}


def test_a_typed_stream_responses_api(scen: Scenario) -> None:
    """The Responses API's typed events come chunk by chunk with their names,
    with no [DONE]; result() is the response.completed event's response."""
    final = {"id": "resp_1", "object": "response", "status": "completed",
             "output": [{"type": "message", "content": [{"type": "output_text",
                                                          "text": "Hi!"}]}]}
    items = [_typed("response.created", {"type": "response.created",
                                         "response": {"id": "resp_1", "status": "in_progress"}}),
             _typed("response.output_text.delta", {"type": "response.output_text.delta",
                                                   "delta": "Hi"}),
             _typed("response.output_text.delta", {"type": "response.output_text.delta",
                                                   "delta": "!"}),
             _typed("response.completed", {"type": "response.completed", "response": final})]
    scen.script([{"stream": {"chunks": items, "end": "no_done", "finish_reason": None}}])
    # The mock serves any stream on its chat path.
    url = scen.url + "/chat/completions"
    with llmretry.stream_llm({"model": "m", "input": "SECRET-PROMPT"}, url=url,
                             logger=None, **FAST) as s:
        got = list(s.events())
        res = s.result()
    assert [e for e, _ in got] == ["response.created", "response.output_text.delta",
                                   "response.output_text.delta", "response.completed"]
    assert "".join(c["delta"] for e, c in got if e == "response.output_text.delta") == "Hi!"
    assert res.data == final


def test_a_typed_stream_that_fails(scen: Scenario) -> None:
    """response.failed (before any read) is an error classified by its code:
    server_error is retried."""
    failed = _typed("response.failed", {"type": "response.failed", "response": {
        "status": "failed", "error": {"code": "server_error", "message": "SECRET"}}})
    done = _typed("response.completed", {"type": "response.completed",
                                         "response": {"id": "r2", "status": "completed"}})
    scen.script([{"stream": {"chunks": [failed], "end": "no_done", "finish_reason": None}},
                 {"stream": {"chunks": [done], "end": "no_done", "finish_reason": None}}])
    with llmretry.stream_llm({"model": "m", "input": "x"}, url=scen.url + "/chat/completions",
                             logger=None, **FAST) as s:
        assert len(scen.wait_requests(2)) == 2     # failed and retried before any read
        res = s.result()
    assert res.data == {"id": "r2", "status": "completed"} and res.meta.attempts == 2


@pytest.mark.slow
def test_a_thousand_streams_open_at_once(scen: Scenario) -> None:
    """1,000 streams open on one client from one thread: each waits in its
    own mailbox until read; all end whole. The chunk timeout is long: the
    in-process mock serves 1,000 streams at once, which under ASan beside
    other test workers on 2 cores took over 5 s for one chunk (CI)."""
    scen.script([], after={"stream": {"chunks": ["a", "b", "c"], "delay_ms": 100}})
    options = dict(FAST, timeout_ms=60000)
    with llmretry.Client(base_url=scen.url, max_in_flight=1000, **options) as c:
        streams = [c.stream_llm(BODY, logger=None) for _ in range(1000)]
        try:
            texts = ["".join(s.text_deltas()) for s in streams]
        finally:
            for s in streams:
                s.close()
    assert texts == ["abc"] * 1000
    assert len(scen.requests()) == 1000


@pytest.mark.slow
def test_a_slow_reader_of_a_50_mb_stream_keeps_rss_flat(tmp_path: Any) -> None:
    """A 50 MB stream of LLM-sized chunks (260,000 deltas of 4 characters)
    read slower than the server sends: the process grows by far less than
    the stream (the transfer pauses at stream_buffer_bytes; what is kept is
    the assembled text). The mock runs in its own process, so only the
    client is measured. Also: no max_response_bytes on a stream read as it
    goes (50 MB is past its 32 MiB default)."""
    import subprocess
    import sys
    import urllib.request
    from conftest import child_env

    proc = subprocess.Popen([sys.executable, "-m", "llmretry.testing", "--port", "0"],
                            stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())      # the mock prints its port first
        base = f"http://127.0.0.1:{port}"
        n, size = 260_000, 4     # about 200 bytes on the wire per chunk: 50 MB
        script = {"steps": [{"content": "x" * (n * size), "stream": {"chunks": n}}]}
        req = urllib.request.Request(f"{base}/_mock/scenarios/big", method="PUT",
                                     data=json.dumps(script).encode(),
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=60).read()
        before = rss_bytes()
        peak, got = before, 0
        # The mock builds its 260,000 chunks before the first: no first-chunk
        # timeout here (a retry would get the default answer, and show below).
        opts = dict(FAST, timeout_ms=120000)
        with llmretry.stream_llm(BODY, base_url=f"{base}/s/big/v1", logger=None, **opts) as s:
            for i, text in enumerate(s.text_deltas()):
                got += len(text)
                if i % 5000 == 0:
                    time.sleep(0.02)        # slower than the server
                    peak = max(peak, rss_bytes())
        assert got == n * size
        meta = s.result().meta
        assert meta.chunks >= n and meta.attempts == 1
        growth_mib = (peak - before) / (1024 * 1024)
        assert growth_mib < 16, f"RSS grew {growth_mib:.1f} MiB reading a 50 MB stream"
    finally:
        proc.terminate()
        proc.wait(10)

