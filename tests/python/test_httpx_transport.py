"""llmretry.httpx: the real openai SDK on llmretry's engine, against the mock.

The SDK's own retries are off (``max_retries=0``) everywhere: every retry
the mock sees is llmretry's. Each test counts the requests the mock
recorded, so "retried invisibly" and "not retried" are what the server saw,
not what the SDK says.
"""

from __future__ import annotations

import asyncio
import http.server
import io
import json
import subprocess
import sys
import threading
import warnings
from typing import Any, Dict, List, Tuple

import httpx
import openai
import pytest

import llmretry
import llmretry.httpx
from conftest import (wait_until, PYTHON_DIR, SECRET_KEY, Events, Scenario, check_event_shape,
                      check_no_secrets)

FAST: Dict[str, Any] = {"max_retries": 3, "base_delay_ms": 20, "jitter": "none"}
MESSAGES = [{"role": "user", "content": "SECRET-PROMPT-httpx"}]
SECRETS = [SECRET_KEY, "SECRET-PROMPT-httpx"]


def sdk(scen: Scenario, **options: Any) -> openai.OpenAI:
    """An OpenAI client on a Transport with `options` (FAST by default)."""
    transport = llmretry.httpx.Transport(**{**FAST, **options})
    return openai.OpenAI(api_key=SECRET_KEY, base_url=scen.url, max_retries=0,
                         http_client=httpx.Client(transport=transport))


def async_sdk(scen: Scenario, **options: Any) -> openai.AsyncOpenAI:
    transport = llmretry.httpx.AsyncTransport(**{**FAST, **options})
    return openai.AsyncOpenAI(api_key=SECRET_KEY, base_url=scen.url, max_retries=0,
                              http_client=httpx.AsyncClient(transport=transport))


wait_for = wait_until          # conftest's poll


# ---------------------------------------------------------------------------
# Whole responses


def test_429_then_success_is_one_sdk_call(scen: Scenario) -> None:
    # OpenAI's 429s name their wait in retry-after-ms too (and it keeps the test fast).
    scen.script([{"status": 429, "retry_after_ms": "60", "headers": {"x-request-id": "req-429"}},
                 {"content": "hello", "headers": {"x-request-id": "req-ok"}}])
    events = Events()
    with sdk(scen, logger=events) as client:
        completion = client.chat.completions.create(model="gpt-test", messages=MESSAGES)
    assert completion.choices[0].message.content == "hello"
    assert completion._request_id == "req-ok"          # the final response's headers
    recs = scen.requests()
    assert len(recs) == 2
    # The SDK's key went as its own header; llmretry's request id on both.
    assert {r["headers"]["authorization"] for r in recs} == {f"Bearer {SECRET_KEY}"}
    ids = {r["headers"]["x-client-request-id"] for r in recs}
    assert len(ids) == 1 and ids == {events.events[0]["request_id"]}
    assert json.loads(recs[0]["body"]) == {"model": "gpt-test", "messages": MESSAGES}
    assert events.names == ["llm_request_started", "llm_request_failed", "llm_retry_scheduled",
                            "llm_request_started", "llm_request_succeeded"]
    retry = events.of("llm_retry_scheduled")[0]
    assert (retry["delay_source"], retry["delay_ms"]) == ("retry_after", 60)
    for ev in events.events:
        check_event_shape(ev)
    check_no_secrets(SECRETS, events.events)


def test_structured_outputs_retried_then_parsed_by_the_sdk(scen: Scenario) -> None:
    """The SDK's parse() sends response_format json_schema: the core holds the
    answer to it (a mismatch retried, invisibly to the SDK); a refusal reaches
    the SDK as the response it is (no retry), for it to read message.refusal."""
    import pydantic

    class Person(pydantic.BaseModel):
        name: str
        age: int

    refusal = {"id": "c1", "object": "chat.completion", "created": 1, "model": "gpt-test",
               "choices": [{"index": 0, "finish_reason": "stop", "message": {
                   "role": "assistant", "content": None, "refusal": "No."}}]}
    scen.script([{"content": '{"name": "Ann", "age": "three"}'},
                 {"content": '{"name": "Ann", "age": 3}'}, {"body": refusal}])
    with sdk(scen) as client:
        done = client.chat.completions.parse(model="gpt-test", messages=MESSAGES,
                                             response_format=Person)
        assert done.choices[0].message.parsed == Person(name="Ann", age=3)
        assert len(scen.requests()) == 2
        refused = client.chat.completions.parse(model="gpt-test", messages=MESSAGES,
                                                response_format=Person)
    assert refused.choices[0].message.refusal == "No."
    assert refused.choices[0].message.parsed is None and len(scen.requests()) == 3


def test_permanent_400_raises_the_sdks_error_after_one_request(scen: Scenario) -> None:
    scen.script([], after={"status": 400, "error_code": "invalid_value",
                           "headers": {"x-request-id": "req-400"}})
    events = Events()
    with sdk(scen, logger=events) as client:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="gpt-test", messages=MESSAGES)
    err = info.value
    assert err.status_code == 400 and err.code == "invalid_value"
    assert err.body == {"message": "mock error 400", "type": "invalid_value",
                        "code": "invalid_value"}
    assert err.request_id == "req-400"
    assert len(scen.requests()) == 1
    assert events.of("llm_request_gave_up")[0]["reason"] == "not_retryable"
    check_no_secrets(SECRETS, events.events, str(err))


def test_429_given_up_on_reaches_the_sdk_as_that_429(scen: Scenario) -> None:
    scen.script([], after={"status": 429, "retry_after": "0", "error_code": "rate_limit_exceeded"})
    with sdk(scen, max_retries=2) as client:
        with pytest.raises(openai.RateLimitError) as info:
            client.chat.completions.create(model="gpt-test", messages=MESSAGES)
    assert info.value.response.headers["retry-after"] == "0"
    assert len(scen.requests()) == 3


def test_a_200_whose_body_is_an_error_is_retried_under_the_sdk(scen: Scenario) -> None:
    # OpenRouter's shape: the status was sent before the model failed.
    gateway = {"body": {"error": {"code": 502, "message": "Provider returned error"}}}
    scen.script([gateway, {"content": "hello"}])
    with sdk(scen) as client:
        completion = client.chat.completions.create(model="gpt-test", messages=MESSAGES)
    assert completion.choices[0].message.content == "hello"
    assert len(scen.requests()) == 2
    # Every attempt one: the SDK gets the last as the server sent it, after all of them.
    scen.script([], after=gateway)
    with sdk(scen, max_retries=2) as client:
        last = client.chat.completions.create(model="gpt-test", messages=MESSAGES)
    assert last.choices is None and getattr(last, "error")["code"] == 502
    assert len(scen.requests()) == 3          # a new script starts a new record


def test_x_request_id_reaches_with_raw_response(scen: Scenario) -> None:
    scen.script([{"headers": {"x-request-id": "req-raw", "X-Other": "a, b"}}])
    with sdk(scen) as client:
        raw = client.chat.completions.with_raw_response.create(model="gpt-test",
                                                               messages=MESSAGES)
    assert raw.status_code == 200 and raw.http_response.http_version == "HTTP/1.1"
    assert raw.headers["x-request-id"] == "req-raw"
    assert raw.headers["x-other"] == "a, b"
    assert raw.headers["content-type"] == "application/json"
    assert raw.parse().choices[0].message.content == "ok"
    assert raw.http_response.content == raw.http_response.read()    # the server's bytes
    assert json.loads(raw.http_response.content)["object"] == "chat.completion"


def test_network_failure_and_timeouts_are_httpx_errors_with_the_request_id(
        scen: Scenario) -> None:
    # Nothing listens on port 1: ConnectError, retried by llmretry first.
    events = Events()
    transport = llmretry.httpx.Transport(max_retries=1, base_delay_ms=10, logger=events)
    client = openai.OpenAI(api_key=SECRET_KEY, base_url="http://127.0.0.1:1/v1", max_retries=0,
                           http_client=httpx.Client(transport=transport))
    with client, pytest.raises(openai.APIConnectionError) as info:
        client.chat.completions.create(model="gpt-test", messages=MESSAGES)
    cause = info.value.__cause__
    assert isinstance(cause, httpx.ConnectError)
    request_id = events.events[0]["request_id"]
    assert str(cause).endswith(f"[request_id={request_id}]")
    assert isinstance(cause.__cause__, llmretry.NetworkError)
    assert cause.__cause__.attempts == 2
    check_no_secrets(SECRETS, str(cause), events.events)

    # The SDK's per-request timeout is the attempt timeout.
    scen.script([], after={"delay_ms": 3000})
    events = Events()
    with sdk(scen, max_retries=0, logger=events) as client:
        with pytest.raises(openai.APITimeoutError) as tinfo:
            client.with_options(timeout=0.2).chat.completions.create(model="gpt-test",
                                                                     messages=MESSAGES)
    assert isinstance(tinfo.value.__cause__, httpx.ReadTimeout)
    assert "[request_id=" in str(tinfo.value.__cause__)
    assert events.of("llm_request_started")[0]["timeout_ms"] == 200
    assert len(scen.requests()) == 1


def test_the_transports_timeout_ms_wins_over_the_sdks(scen: Scenario) -> None:
    events = Events()
    with sdk(scen, timeout_ms=1234, logger=events) as client:
        client.with_options(timeout=30).chat.completions.create(model="gpt-test",
                                                                messages=MESSAGES)
    assert events.of("llm_request_started")[0]["timeout_ms"] == 1234


# ---------------------------------------------------------------------------
# Streams


def stream_texts(stream: Any) -> List[Any]:
    return [c.choices[0].delta.content for c in stream if c.choices]


def test_stream_cut_before_its_first_chunk_is_retried_invisibly(scen: Scenario) -> None:
    scen.script([{"stream": {"chunks": 3, "end": "drop", "after": 0}},
                 {"status": 503},
                 {"content": "abc", "stream": {"chunks": 3},
                  "headers": {"x-request-id": "req-stream"}}])
    events = Events()
    with sdk(scen, logger=events) as client:
        stream = client.chat.completions.create(model="gpt-test", messages=MESSAGES,
                                                stream=True)
        assert stream.response.headers["x-request-id"] == "req-stream"
        assert "content-length" not in stream.response.headers
        assert stream_texts(stream) == ["a", "b", "c", None]
    assert len(scen.requests()) == 3
    assert events.names.count("llm_request_started") == 3
    check_no_secrets(SECRETS, events.events)


def test_stream_cut_after_a_chunk_raises_in_the_sdks_iterator(scen: Scenario) -> None:
    # The gaps let the transport read the first chunk (the commit point)
    # before the cut: a cut before it would be retried, rightly.
    scen.script([{"content": "abcd",
                  "stream": {"chunks": 4, "delay_ms": 100, "end": "drop", "after": 2}}])
    got: List[Any] = []
    with sdk(scen) as client:
        stream = client.chat.completions.create(model="gpt-test", messages=MESSAGES,
                                                stream=True)
        with pytest.raises(openai.APIConnectionError) as info:
            for chunk in stream:
                got.append(chunk.choices[0].delta.content)
    assert got == ["a", "b"]
    cause = info.value.__cause__
    assert isinstance(cause, httpx.RemoteProtocolError) and "[request_id=" in str(cause)
    assert isinstance(cause.__cause__, llmretry.StreamInterruptedError)
    assert len(scen.requests()) == 1                   # never retried after a chunk


def test_closing_the_sdk_stream_cancels_the_call(scen: Scenario) -> None:
    scen.script([{"stream": {"chunks": 100, "delay_ms": 50}}])
    events = Events()
    with sdk(scen, logger=events) as client:
        stream = client.chat.completions.create(model="gpt-test", messages=MESSAGES,
                                                stream=True)
        next(iter(stream))
        stream.close()
        # The call ended, cancelled, before close() returned.
        assert events.of("llm_request_gave_up")[0]["reason"] == "cancelled"
    assert wait_for(lambda: scen.requests()[0].get("client_gone"))
    assert scen.requests()[0]["events_sent"] < 100


@pytest.mark.parametrize("code", ["server_error", "rate_limit_exceeded"])
def test_a_stream_whose_every_attempt_is_an_error_event_raises_it(scen: Scenario,
                                                                  code: str) -> None:
    """An error event before any chunk, on every attempt: the SDK gets that
    event as the server sent it and raises the error it names, as without
    llmretry; never a 200 stream with nothing in it (an empty answer)."""
    scen.script([], after={"stream": {"chunks": 2, "end": "error_event", "after": 0,
                                      "error_code": code}})
    with sdk(scen, max_retries=2) as client:
        stream = client.chat.completions.create(model="gpt-test", messages=MESSAGES,
                                                stream=True)
        with pytest.raises(openai.APIError) as info:
            stream_texts(stream)
    assert not isinstance(info.value, openai.APIConnectionError), info.value
    assert len(scen.requests()) == 3              # retried first, out of the SDK's sight
    check_no_secrets(SECRETS, [str(info.value)])


def test_a_stream_request_answered_with_an_error_is_that_error(scen: Scenario) -> None:
    scen.script([], after={"status": 400, "error_code": "bad_stream"})
    with sdk(scen) as client:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="gpt-test", messages=MESSAGES, stream=True)
    assert info.value.code == "bad_stream"
    assert len(scen.requests()) == 1


SSE_LABEL = {"Content-Type": "text/event-stream"}
JSON_LABEL = {"Content-Type": "application/json"}


@pytest.mark.parametrize("label", [{}, SSE_LABEL], ids=["json", "labelled-a-stream"])
def test_a_stream_request_answered_whole_streams_the_answer(scen: Scenario,
                                                            label: Dict[str, str]) -> None:
    """A server that answers ``"stream": true`` with the whole answer (one
    that does not stream, a cache), under either label: the SDK's loop
    reads the answer as its chunks, not an empty stream with no error (what
    the SDK reads without llmretry)."""
    scen.script([{"stream": False, "content": "whole answer", "headers": label}] * 4)
    with sdk(scen) as client:
        chunks = list(client.chat.completions.create(model="gpt-test", messages=MESSAGES,
                                                     stream=True,
                                                     stream_options={"include_usage": True}))
        text = client.completions.create(model="gpt-test", prompt="SECRET-PROMPT-httpx",
                                         stream=True)
        legacy = "".join(c.choices[0].text for c in text)
        events = list(client.responses.create(model="gpt-test", input="SECRET-PROMPT-httpx",
                                              stream=True))
        with client.responses.stream(model="gpt-test", input="SECRET-PROMPT-httpx") as helper:
            deltas = [e.delta for e in helper if e.type == "response.output_text.delta"]
            final = helper.get_final_response()
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        "whole answer"
    assert chunks[-1].choices[0].finish_reason == "stop" and chunks[-1].usage.total_tokens == 15
    assert legacy == "whole answer"
    assert [e.type for e in events] == [
        "response.created", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    assert events[3].delta == "whole answer" and events[-1].response.output_text == "whole answer"
    assert deltas == ["whole answer"] and final.output_text == "whole answer"
    assert len(scen.requests()) == 4


@pytest.mark.parametrize("label, shown", [
    ("text/event-stream; charset=utf-8", "text/event-stream; charset=utf-8"),
    ("application/json", "text/event-stream")])
def test_a_streams_label_says_what_the_sdk_reads(scen: Scenario, label: str, shown: str) -> None:
    """The server's label when it says event stream (its charset kept, as
    llama-cpp-python's server sends it); else what the body now is."""
    scen.script([{"stream": {"chunks": ["a", "b"]}, "headers": {"Content-Type": label}}])
    with sdk(scen) as client:
        stream = client.chat.completions.create(model="gpt-test", messages=MESSAGES, stream=True)
        assert stream.response.headers["content-type"] == shown
        assert "".join(t or "" for t in stream_texts(stream)) == "ab"


def test_a_whole_answer_labelled_a_stream_is_the_answer(scen: Scenario) -> None:
    """JSON under text/event-stream for a request that did not stream: the
    answer (it read as the stream's end alone: the SDK got a string)."""
    scen.script([{"content": "labelled wrong", "headers": SSE_LABEL}])
    with sdk(scen) as client:
        got = client.chat.completions.create(model="gpt-test", messages=MESSAGES)
    assert got.choices[0].message.content == "labelled wrong"


def test_an_error_event_labelled_json_raises_it(scen: Scenario) -> None:
    """A stream under application/json that fails on an error event on every
    attempt: the SDK raises the error (it was an empty stream, no error)."""
    scen.script([], after={"stream": {"chunks": 1, "end": "error_event", "after": 0,
                                      "error_code": "server_error"}, "headers": JSON_LABEL})
    with sdk(scen, max_retries=1) as client:
        with pytest.raises(openai.APIError, match="mock"):
            stream_texts(client.chat.completions.create(model="gpt-test", messages=MESSAGES,
                                                        stream=True))
    assert len(scen.requests()) == 2


def test_a_stream_not_asked_for_that_fails_is_an_error(scen: Scenario) -> None:
    """A request that did not stream, answered by a stream that fails on an
    error event on every attempt: an error carrying llmretry's, never a 200
    whose body the SDK reads as an answer with nothing in it."""
    scen.script([], after={"stream": {"chunks": 1, "end": "error_event", "after": 0,
                                      "error_code": "server_error"}})
    with sdk(scen, max_retries=1) as client:
        with pytest.raises(openai.APIConnectionError) as info:
            client.chat.completions.create(model="gpt-test", messages=MESSAGES)
    assert "sent an error inside the stream" in str(info.value.__cause__), info.value.__cause__
    assert len(scen.requests()) == 2


# ---------------------------------------------------------------------------
# asyncio


def client_threads() -> int:
    """Threads of this process but the mock server's (one per connection)."""
    return sum("process_request_thread" not in t.name for t in threading.enumerate())


def test_async_openai_500_concurrent_calls_on_one_transport(scen: Scenario) -> None:
    scen.script([{"status": 503}], after={"delay_ms": 100})
    events = Events()

    async def main() -> List[str]:
        client = async_sdk(scen, max_retries=2, logger=events, max_in_flight=512)
        # One call first: the SDK's first requests each ask a thread for the
        # platform's name (asyncify(get_platform)) until one has it.
        await client.chat.completions.create(model="gpt-test", messages=MESSAGES)
        threads_before = client_threads()
        most = [threads_before]
        done = asyncio.Event()

        async def count_threads() -> None:
            while not done.is_set():
                most[0] = max(most[0], client_threads())
                await asyncio.sleep(0.01)

        async with client:
            watcher = asyncio.ensure_future(count_threads())
            results = await asyncio.gather(*(
                client.chat.completions.create(
                    model="gpt-test", messages=[{"role": "user", "content": f"n{i}"}])
                for i in range(500)))
            done.set()
            await watcher
        # The engine's I/O thread does the requests: no thread per request.
        assert most[0] == threads_before, (threads_before, most[0])
        return [r.choices[0].message.content for r in results]

    assert asyncio.run(main()) == ["ok"] * 500
    recs = scen.requests()
    assert len(recs) == 502                 # the first call: a 503, retried once
    assert sorted(json.loads(r["body"])["messages"][0]["content"] for r in recs[2:]) == \
        sorted([f"n{i}" for i in range(500)])
    assert len(events.of("llm_request_succeeded")) == 501


def test_async_stream_retried_then_read_and_raw_headers(scen: Scenario) -> None:
    scen.script([{"stream": {"chunks": 2, "end": "reset", "after": 0}},
                 {"content": "xy", "stream": {"chunks": 2},
                  "headers": {"x-request-id": "req-async"}},
                 {"headers": {"x-request-id": "req-async-raw"}}])

    async def main() -> None:
        async with async_sdk(scen) as client:
            stream = await client.chat.completions.create(model="gpt-test",
                                                          messages=MESSAGES, stream=True)
            assert stream.response.headers["x-request-id"] == "req-async"
            assert [c.choices[0].delta.content async for c in stream if c.choices] == \
                ["x", "y", None]
            raw = await client.chat.completions.with_raw_response.create(
                model="gpt-test", messages=MESSAGES)
            assert raw.headers["x-request-id"] == "req-async-raw"

    asyncio.run(main())
    assert len(scen.requests()) == 3


def test_async_stream_request_answered_whole_streams_the_answer(scen: Scenario) -> None:
    scen.script([{"stream": False, "content": "whole answer", "headers": SSE_LABEL}])

    async def main() -> List[Any]:
        async with async_sdk(scen) as client:
            stream = await client.chat.completions.create(model="gpt-test", messages=MESSAGES,
                                                          stream=True)
            return [c.choices[0].delta.content async for c in stream if c.choices]
    assert asyncio.run(main()) == ["whole answer"]


def test_async_get_of_json_is_retried_on_the_loop(scen: Scenario) -> None:
    store = scen.server.batch_api()
    events = Events()

    async def main() -> Tuple[str, str]:
        async with async_sdk(scen, logger=events) as client:
            f = await client.files.create(file=("in.jsonl", io.BytesIO(b"")), purpose="batch")
            store.fail = 1
            return f.id, (await client.files.retrieve(f.id)).id
    try:
        made, got = asyncio.run(main())
    finally:
        store.fail = 0
    assert got == made
    assert events.field("llm_request_succeeded", "attempt") == [1], events.names


def test_async_cancel_and_stream_close_cancel_the_call(scen: Scenario) -> None:
    slow = scen.sub("slow").script([], after={"delay_ms": 5000})
    streaming = scen.sub("stream").script([{"stream": {"chunks": 100, "delay_ms": 50}}])

    events = Events()

    async def main() -> None:
        async with async_sdk(slow, logger=events) as client:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(client.chat.completions.create(
                    model="gpt-test", messages=MESSAGES), timeout=0.2)
            # Cancelled on the engine, its last event delivered, before
            # the cancellation went on.
            assert events.names[-1] == "llm_request_gave_up"
            assert events.events[-1]["reason"] == "cancelled"
            stream = await client.with_options(base_url=streaming.url).chat.completions.create(
                model="gpt-test", messages=MESSAGES, stream=True)
            async for _chunk in stream:
                break
            await stream.close()
            assert events.names[-1] == "llm_request_gave_up"
            assert events.events[-1]["reason"] == "cancelled"

    asyncio.run(main())
    assert len(slow.requests()) == 1
    assert wait_for(lambda: streaming.requests()[0].get("client_gone"))
    assert streaming.requests()[0]["events_sent"] < 100


# ---------------------------------------------------------------------------
# Options, other requests, the SDK's retries


def test_options_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="one server's response"):
        llmretry.httpx.Transport(fallbacks=[{"model": "other"}])
    with pytest.raises(ValueError, match="the SDK's"):
        llmretry.httpx.Transport(base_url="http://example.invalid/v1")
    with pytest.raises(ValueError, match="sends its own key"):
        llmretry.httpx.AsyncTransport(api_key=SECRET_KEY)
    with pytest.raises(TypeError, match="nonsense"):
        llmretry.httpx.Transport(nonsense=1)
    with pytest.raises(TypeError, match=r"^AsyncTransport\(\) got unexpected keyword argument\(s\): "
                                        r"timeout \(did you mean timeout_ms\?\)$"):
        llmretry.httpx.AsyncTransport(timeout=3)
    with llmretry.Client(fallbacks=[{"model": "other"}]) as shared:
        with pytest.raises(ValueError, match="fallbacks"):
            llmretry.httpx.Transport(client=shared)
    transport = llmretry.httpx.Transport(max_retries=2)
    assert SECRET_KEY not in repr(transport)
    transport.close()


def test_a_shared_client_and_its_defaults(scen: Scenario) -> None:
    scen.script([{"status": 500}, {}])
    events = Events()
    with llmretry.Client(api_key="sk-client-default", base_url="http://127.0.0.1:1/v1",
                         headers={"X-Team": "core"}, logger=events, **FAST) as shared:
        transport = llmretry.httpx.Transport(client=shared, max_retries=1)
        client = openai.OpenAI(api_key=SECRET_KEY, base_url=scen.url, max_retries=0,
                               http_client=httpx.Client(transport=transport))
        client.chat.completions.create(model="gpt-test", messages=MESSAGES)
        client.close()
        assert not shared.closed                    # the transport did not make it
    recs = scen.requests()
    assert len(recs) == 2
    assert recs[1]["headers"]["authorization"] == f"Bearer {SECRET_KEY}"   # the SDK's key
    assert recs[1]["headers"]["x-team"] == "core"
    assert len(events.of("llm_request_succeeded")) == 1


def test_sdk_calls_and_call_many_share_the_clients_budgets(scen: Scenario) -> None:
    # One endpoint (URL + key) for the SDK's calls and the Client's own: one
    # rate budget paces both, one breaker and retry budget count both.
    with llmretry.Client(api_key=SECRET_KEY, base_url=scen.url, rpm=6000) as shared:
        client = openai.OpenAI(api_key=SECRET_KEY, base_url=scen.url, max_retries=0,
                               http_client=httpx.Client(
                                   transport=llmretry.httpx.Transport(client=shared)))
        with client:
            for _ in range(2):
                client.chat.completions.create(model="gpt-test", messages=MESSAGES)
        shared.call_many([{"model": "gpt-test", "messages": MESSAGES}] * 3)
        stats = shared.endpoint_stats()
    assert [(s["url"], s["requests"], s["rpm"]) for s in stats] == \
        [(scen.url + "/chat/completions", 5, 6000)]
    assert len(scen.requests()) == 5


def test_a_get_of_json_is_a_call_retried_under_the_sdk(scen: Scenario) -> None:
    # The SDK's retrieve and list calls (GET, Accept: application/json) go
    # through the engine: a 503 is retried with the SDK's retries off. GET
    # /models is not an endpoint of the mock: its 404 reaches the SDK as that
    # 404, not retried.
    store = scen.server.batch_api()
    events = Events()
    with sdk(scen, logger=events) as client:
        with pytest.raises(openai.NotFoundError):
            client.models.list()
        f = client.files.create(file=("in.jsonl", io.BytesIO(b"")), purpose="batch")
        store.fail = 2
        try:
            assert client.files.retrieve(f.id).id == f.id
            assert store.fail == 0
        finally:
            store.fail = 0          # the server is the session's
    # Attempts count from 0: the models GET's one, the retrieve's first two.
    assert [e["attempt"] for e in events.of("llm_request_failed")] == [0, 0, 1], events.names
    gave_up = events.of("llm_request_gave_up")
    assert len(gave_up) == 1 and gave_up[0]["status"] == 404, gave_up
    (ok,) = events.of("llm_request_succeeded")
    assert ok["attempt"] == 2, ok


def test_a_get_of_json_lines_is_handed_on_as_it_came(scen: Scenario) -> None:
    # files.retrieve_content (deprecated, still called) asks for JSON and
    # gets a JSON Lines file: no JSON object, yet the answer, sent for once.
    events = Events()
    with sdk(scen, logger=events) as client:
        f = client.files.create(file=("in.jsonl", io.BytesIO(b'{"a": 1}\n{"b": 2}\n')),
                                purpose="batch")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            text = client.files.retrieve_content(f.id)
    assert text == '{"a": 1}\n{"b": 2}\n'
    assert events.names == ["llm_request_started", "llm_request_succeeded"], events.names


@pytest.mark.pure_python
@pytest.mark.parametrize("accept, says", [
    (None, None), ("application/json", True), ("application/vnd.api+json", True),
    ("audio/mpeg, application/json;q=0.5", True), ("application/octet-stream", False),
    ("application/binary", False), ("audio/*", False), ("*/*", None), ("application/*", None),
    ("text/event-stream", None)])
def test_what_an_accept_header_says_of_json(accept: Any, says: Any) -> None:
    # True: a JSON answer (a GET of it is a call); False: bytes only (a POST
    # is carried raw); None: anything, an event stream (judged as before).
    from llmretry._http_transport import _accepts_json
    assert _accepts_json(accept) is says


class _Speech(http.server.BaseHTTPRequestHandler):
    """audio.speech's server: a 200 of audio bytes, each request counted."""

    protocol_version = "HTTP/1.1"
    AUDIO = b"ID3\x04\x00\x00 not JSON \xff\xfb\x90"
    seen: List[str] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.seen.append(f"{self.path} {self.headers.get('Accept')}")
        self.send_response(200)
        self.send_header("Content-Type", "audio/mpeg")
        self.send_header("Content-Length", str(len(self.AUDIO)))
        self.end_headers()
        self.wfile.write(self.AUDIO)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_binary_answer_is_handed_on_once() -> None:
    # audio.speech: a POST of JSON whose Accept is application/octet-stream.
    # Its 200 of audio bytes is the answer, not a body that failed to be
    # JSON (it was retried, each request billed, until the attempts ran out).
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Speech)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Speech.seen = []
    try:
        transport = llmretry.httpx.Transport(**FAST)
        with openai.OpenAI(api_key=SECRET_KEY, base_url=f"http://127.0.0.1:{server.server_port}/v1",
                           max_retries=0, http_client=httpx.Client(transport=transport)) as client:
            speech = client.audio.speech.create(model="tts-1", voice="alloy", input="hi")
            assert speech.content == _Speech.AUDIO
    finally:
        server.shutdown()
        server.server_close()
    assert _Speech.seen == ["/v1/audio/speech application/octet-stream"]


def test_other_requests_go_through_httpx(scen: Scenario) -> None:
    # A GET for bytes (files.content: Accept application/binary, which httpx
    # can stream), a DELETE and a POST with no body are httpx's to send, as
    # without llmretry: the engine makes no call of them.
    store = scen.server.batch_api()
    events = Events()
    with sdk(scen, logger=events) as client:
        f = client.files.create(file=("in.jsonl", io.BytesIO(b"{}\n")), purpose="batch")
        assert client.files.content(f.id).content == b"{}\n"
        assert client.files.delete(f.id).deleted and f.id not in store.files
    assert events.names == [], events.names


def test_the_sdks_files_and_batch_apis_through_the_transport(scen: Scenario) -> None:
    # The SDK's Batch API as a user of the transport runs it: the multipart
    # upload and the download through httpx's own transport, the creates
    # (POSTs of JSON) and the GETs of JSON through the engine, file content
    # as raw JSON Lines bytes.
    store = scen.server.batch_api()
    lines = "".join(json.dumps({"custom_id": f"r{i}", "method": "POST",
                                "url": "/v1/chat/completions",
                                "body": {"model": "gpt-b", "messages": MESSAGES}}) + "\n"
                    for i in range(3))
    events = Events()
    with sdk(scen, logger=events) as client:
        f = client.files.create(file=("in.jsonl", io.BytesIO(lines.encode())), purpose="batch")
        assert store.content[f.id] == lines.encode()
        b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
        assert b.status == "validating" and b.input_file_id == f.id
        store.advance(b.id, to="completed")
        b = client.batches.retrieve(b.id)
        assert b.status == "completed" and b.request_counts.completed == 3
        out = [json.loads(x) for x in client.files.content(b.output_file_id).text.splitlines()]
        assert [x["custom_id"] for x in out] == ["r0", "r1", "r2"]
        assert all(x["response"]["body"]["model"] == "gpt-b" for x in out)
        assert b.id in [x.id for x in client.batches.list(limit=100)]
        other = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        assert client.batches.cancel(other.id).status == "cancelling"
        assert client.files.delete(f.id).deleted and f.id not in store.files
    # The engine carried the two creates (POSTs of JSON) and the retrieve and
    # list (GETs of JSON), and nothing else: the upload is multipart, the
    # content a download, the cancel a POST with no body, the delete a DELETE.
    assert len(events.of("llm_request_started")) == 4, events.names


def test_the_sdk_retrying_on_top_warns(scen: Scenario) -> None:
    scen.script([{"status": 429, "retry_after": "0"}], after={})
    transport = llmretry.httpx.Transport(max_retries=0)
    client = openai.OpenAI(api_key=SECRET_KEY, base_url=scen.url, max_retries=1,
                           http_client=httpx.Client(transport=transport))
    with client, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        client.chat.completions.create(model="gpt-test", messages=MESSAGES)
    assert [str(w.message) for w in caught if "max_retries=0" in str(w.message)]
    assert len(scen.requests()) == 2


# A fresh interpreter importing llmretry: under make check's ASan pass the
# extension needs libasan preloaded, which a plain subprocess lacks; what is
# checked is the import graph, no C code of the project.
@pytest.mark.pure_python
def test_importing_llmretry_does_not_import_httpx() -> None:
    code = ("import sys, llmretry; assert 'httpx' not in sys.modules and "
            "'httpx2' not in sys.modules, sorted(m for m in sys.modules if 'httpx' in m)")
    subprocess.run([sys.executable, "-c", code], check=True,
                   env={"PYTHONPATH": str(PYTHON_DIR), "PATH": "/usr/bin:/bin"})


def test_the_httpx2_flavour(scen: Scenario) -> None:
    # tools/ensure-deps.sh installs httpx2 (the openai SDK 3.x brings it):
    # not installed is an error here, never a skip.
    import httpx2
    import llmretry.httpx2
    scen.script([{"status": 503}, {"headers": {"x-request-id": "req-h2"}}])
    client = openai.OpenAI(api_key=SECRET_KEY, base_url=scen.url, max_retries=0,
                           http_client=httpx2.Client(
                               transport=llmretry.httpx2.Transport(**FAST)))
    with client:
        raw = client.chat.completions.with_raw_response.create(model="gpt-test",
                                                               messages=MESSAGES)
        assert raw.headers["x-request-id"] == "req-h2"
        with pytest.raises(openai.APIConnectionError) as info:
            client.with_options(base_url="http://127.0.0.1:1/v1").chat.completions.create(
                model="gpt-test", messages=MESSAGES)
    assert isinstance(info.value.__cause__, httpx2.ConnectError)
    assert len(scen.requests()) == 2
