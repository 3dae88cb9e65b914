"""How a stream ends (DESIGN rule 9), through every Python way of reading one:
its terminal event ends the call at once whatever the server does next, an
end with no finish_reason is no answer, typed (Responses API) streams with
or without ``event:`` lines, their usage, and text holding U+0000.

Each test is one the core failed before issue 27: the mock's ``after_done``,
``framing: "length"``, ``role_only`` and ``api: "responses"`` scenarios."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Dict, List, Tuple

import pytest

import llmretry
from conftest import SECRET_KEY, Scenario

BODY: Dict[str, Any] = {"model": "gpt-test",
                        "messages": [{"role": "user", "content": "SECRET-PROMPT-ends"}]}
FAST = dict(api_key=SECRET_KEY, base_delay_ms=10, jitter="none", timeout_ms=5000,
            logger=None)
# timeout_ms far above the test, a deadline of a few seconds: reading on
# after [DONE] fails at the deadline (3 s) instead of hanging.
HELD = dict(FAST, timeout_ms=20000, deadline_ms=3000, max_retries=2)

# What a server does after [DONE]: keep the body open and silent, send
# junk then keep it open, promise more bytes than it sends.
HOLDS = [pytest.param({"after_done": "silence"}, id="silence"),
         pytest.param({"after_done": "junk"}, id="junk"),
         pytest.param({"framing": "length"}, id="content_length"),
         pytest.param({"api": "responses", "event_lines": False, "after_done": "silence"},
                      id="typed_silence")]


def held_script(scen: Scenario, hold: Dict[str, Any]) -> None:
    # A retry would get "retried": it must not be asked for.
    scen.script([{"stream": dict(hold, chunks=["o", "k"])}],
                after={"stream": {"chunks": ["retried"]}})


def text_of(res: llmretry.Result) -> str:
    """The answer's text: a chat.completion's content, a response's output_text."""
    data = res.data
    if data.get("object") == "response":
        return "".join(part["text"] for item in data["output"]
                       for part in item["content"] if part.get("type") == "output_text")
    return data["choices"][0]["message"]["content"]


def check_one_request_closed(scen: Scenario) -> None:
    """One request, and the connection the server held open closed by us."""
    end = time.monotonic() + 3
    while True:
        recs = scen.requests()
        if recs[-1].get("client_gone") or time.monotonic() > end:
            break
        time.sleep(0.02)
    assert len(recs) == 1, "the request was sent again"
    assert recs[-1]["client_gone"] is True, "the held connection was never closed"


async def _astream(body: Any, url: str) -> Tuple[str, llmretry.Result]:
    async with llmretry.astream_llm(body, base_url=url, **HELD) as s:
        text = "".join([t async for t in s.text_deltas()])
        return text, await s.result()


@pytest.mark.parametrize("hold", HOLDS)
@pytest.mark.parametrize("how", ["stream_llm", "astream_llm", "call_llm", "call_many"])
def test_the_terminal_event_ends_the_call(scen: Scenario, hold: Dict[str, Any],
                                          how: str) -> None:
    held_script(scen, hold)
    body = dict(BODY, stream=True)
    text = None
    if how == "stream_llm":
        with llmretry.stream_llm(body, base_url=scen.url, **HELD) as s:
            text = "".join(s.text_deltas())
            res = s.result()
    elif how == "astream_llm":
        text, res = asyncio.run(_astream(body, scen.url))
    elif how == "call_llm":
        res = llmretry.call_llm(body, base_url=scen.url, **HELD)
    else:
        opts = dict(HELD)
        opts["call_deadline_ms"] = opts.pop("deadline_ms")
        batch = llmretry.call_many([body], base_url=scen.url, **opts)
        assert batch.summary.ok == 1, batch.errors()
        res = batch[0]
    assert text_of(res) == "ok"
    if text is not None:
        assert text == "ok", "text_deltas of a typed stream too"
    assert res.meta.attempts == 1 and res.meta.stream
    check_one_request_closed(scen)


@pytest.mark.parametrize("hold", HOLDS)
def test_acall_many_of_held_streams(scen: Scenario, hold: Dict[str, Any]) -> None:
    scen.script([], after={"stream": dict(hold, chunks=["o", "k"])})
    opts = dict(HELD)
    opts["call_deadline_ms"] = opts.pop("deadline_ms")
    batch = asyncio.run(llmretry.acall_many([dict(BODY, stream=True)] * 3, **opts,
                                            base_url=scen.url))
    assert [text_of(r) for r in batch] == ["ok"] * 3
    assert len(scen.requests()) == 3


def test_no_finish_reason_is_truncated_after_the_commit_point(scen: Scenario) -> None:
    """llama-cpp-python pre-empting a request: a role-only chunk, [DONE]
    (after the usage chunk, 300 ms later: time to read the first)."""
    scen.script([{"stream": {"role_only": True, "delay_ms": 300}}],
                after={"stream": {"chunks": ["retried"]}})
    with pytest.raises(llmretry.StreamInterruptedError) as info:
        with llmretry.stream_llm(BODY, base_url=scen.url, **FAST) as s:
            for _ in s:
                pass
    assert info.value.reason == "truncated" and info.value.attempts == 1
    assert len(scen.requests()) == 1


def test_no_finish_reason_is_retried_before_the_commit_point(scen: Scenario) -> None:
    scen.script([{"stream": {"role_only": True}},
                 {"stream": {"chunks": [], "finish_reason": None, "usage_chunk": False}},
                 {"stream": {"chunks": ["o", "k"]}}])
    res = llmretry.call_llm(dict(BODY, stream=True), base_url=scen.url, **FAST)
    assert text_of(res) == "ok" and res.meta.attempts == 3


def test_call_many_of_empty_streams_fails_them(scen: Scenario) -> None:
    """acall_many of 300 streams said 300 ok with 299 empty answers."""
    scen.script([], after={"stream": {"role_only": True}})
    batch = llmretry.call_many([dict(BODY, stream=True)] * 4, base_url=scen.url,
                               **dict(FAST, max_retries=1))
    assert batch.summary.ok == 0 and batch.summary.failed == 4
    assert all(isinstance(e, llmretry.NetworkError) for _, e in batch.errors())


@pytest.mark.parametrize("event_lines", [True, False])
def test_a_typed_stream_with_or_without_event_lines(scen: Scenario,
                                                    event_lines: bool) -> None:
    """LiteLLM sends the Responses API's events as data: lines alone."""
    scen.script([{"usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
                  "stream": {"api": "responses", "event_lines": event_lines,
                             "chunks": ["Hi", "!"]}}])
    with llmretry.stream_llm({"model": "m", "input": "SECRET-PROMPT"},
                             url=scen.url + "/responses", **FAST) as s:
        got: List[Tuple[str, Any]] = list(s.events())
        res = s.result()
    assert [e for e, _ in got] == ["response.created", "response.output_text.delta",
                                   "response.output_text.delta", "response.completed"]
    assert res.data["object"] == "response" and text_of(res) == "Hi!"
    assert res.meta.usage == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    sent = json.loads(scen.requests()[0]["body"])
    assert sent["stream"] is True and "stream_options" not in sent


def test_text_deltas_of_a_typed_stream(scen: Scenario) -> None:
    scen.script([{"stream": {"api": "responses", "event_lines": False,
                             "chunks": ["Hi", "!"]}}] * 2)
    with llmretry.stream_llm({"model": "m", "input": "x"}, url=scen.url + "/responses",
                             **FAST) as s:
        assert list(s.text_deltas()) == ["Hi", "!"]

    async def run() -> List[str]:
        async with llmretry.astream_llm({"model": "m", "input": "x"},
                                        url=scen.url + "/responses", **FAST) as s:
            return [t async for t in s.text_deltas()]
    assert asyncio.run(run()) == ["Hi", "!"]


def test_no_stream_options_for_responses_in_a_batch(scen: Scenario) -> None:
    """call_many puts stream_options into each streaming dict itself."""
    scen.script([], after={"stream": {"api": "responses", "chunks": ["o", "k"]}})
    body = {"model": "m", "input": "x", "stream": True}
    batch = llmretry.call_many([body, body], url=scen.url + "/responses", **FAST)
    assert [text_of(r) for r in batch] == ["ok", "ok"]
    assert batch.summary.prompt_tokens == 24 and batch.summary.completion_tokens == 6
    for rec in scen.requests():
        assert "stream_options" not in json.loads(rec["body"])
    # Chat Completions still asks for usage.
    batch = llmretry.call_many([dict(BODY, stream=True)], base_url=scen.url, **FAST)
    sent = json.loads(scen.requests()[-1]["body"])
    assert sent["stream_options"] == {"include_usage": True}


def test_responses_usage_in_a_plain_body(scen: Scenario) -> None:
    usage = {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}
    scen.script([{"body": {"id": "r", "object": "response", "output": [], "usage": usage}}])
    res = llmretry.call_llm({"model": "m", "input": "x"}, url=scen.url + "/responses",
                            **FAST)
    assert res.meta.usage == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}


def test_nul_in_text_is_kept(scen: Scenario) -> None:
    """cJSON cut "xa\\u0000by" at the NUL: assembled "xa", text_deltas whole."""
    pieces = ["xa\u0000by", "\u001f0", "\\u0000"]
    scen.script([{"stream": {"chunks": pieces}}] * 2)
    with llmretry.stream_llm(BODY, base_url=scen.url, **FAST) as s:
        assert list(s.text_deltas()) == pieces
        res = s.result()
    assert res.data["choices"][0]["message"]["content"] == "".join(pieces)
    res = llmretry.call_llm(dict(BODY, stream=True), base_url=scen.url, **FAST)
    assert res.data["choices"][0]["message"]["content"] == "".join(pieces)
