"""llmretry._sse_from_answer: a whole answer told again as the events of a
stream (llmretry.httpx, for an SDK that asked to stream). The SDK's own
reading of them is test_httpx_transport.py's; here, what any body becomes."""

from __future__ import annotations

import json
from typing import Any, List, Optional

import pytest

from llmretry._sse_from_answer import answer_events


def events(body: Any) -> Optional[List[Any]]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    out = answer_events(raw)
    if out is None:
        return None
    assert out.endswith(b"\n\n")
    got = []
    for block in out.split(b"\n\n")[:-1]:
        lines = dict(line.split(b": ", 1) for line in block.split(b"\n"))
        data = lines[b"data"]
        got.append(data.decode() if data == b"[DONE]" else json.loads(data))
    return got


def test_a_chat_completion_is_one_chunk_then_done() -> None:
    doc = {"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
           "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": None,
                        "message": {"role": "assistant", "content": None, "tool_calls": [
                            {"id": "t1", "type": "function",
                             "function": {"name": "f", "arguments": "{}"}},
                            {"id": "t2", "type": "function",
                             "function": {"name": "g", "arguments": "{}"}}]}}],
           "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}}
    chunk, done = events(doc)
    assert done == "[DONE]"
    assert chunk["object"] == "chat.completion.chunk" and chunk["usage"] == doc["usage"]
    (choice,) = chunk["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert [(c["index"], c["id"]) for c in choice["delta"]["tool_calls"]] == [(0, "t1"), (1, "t2")]


def test_a_legacy_completion_is_itself_then_done() -> None:
    doc = {"object": "text_completion", "choices": [{"index": 0, "text": "x"}]}
    assert events(doc) == [doc, "[DONE]"]


def test_a_response_is_its_events_numbered() -> None:
    doc = {"id": "r1", "object": "response", "status": "completed", "output": [
        {"type": "reasoning", "id": "rs1", "summary": []},
        {"type": "message", "id": "m1", "role": "assistant", "content": [
            {"type": "output_text", "text": "hi", "annotations": []},
            {"type": "refusal", "refusal": "no"}]}]}
    got = events(doc)
    assert [e["type"] for e in got] == [
        "response.created", "response.output_item.added", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.content_part.added", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    assert got[0]["response"]["output"] == [] and got[-1]["response"] == doc
    assert got[3]["item"]["content"] == [] and got[4]["part"]["text"] == ""
    assert got[5]["delta"] == "hi" and got[5]["output_index"] == 1


@pytest.mark.parametrize("body", [
    b"", b"not json", b"\xff\xfe", b"[]", b"5", b'"x"', b"[" * 5000 + b"]" * 5000,
    {"object": "chat.completion"}, {"object": "chat.completion", "choices": {}},
    {"object": "response", "output": "x"}, {"object": "list", "data": []},
    {"choices": [{"message": {"content": "no object"}}]},
])
def test_what_is_not_an_answer_that_streams_is_left_as_it_came(body: Any) -> None:
    assert events(body) is None


@pytest.mark.parametrize("body", [
    {"object": "chat.completion", "choices": [1, None, {"message": "x"}, {"message": {
        "tool_calls": [1, "x", None]}}]},
    {"object": "response", "output": [1, None, {"type": "message", "content": [1, None, {}]},
                                      {"type": "message", "content": "x"},
                                      {"type": "message", "content": [
                                          {"type": "output_text", "text": 5}]}]},
    {"object": "chat.completion", "choices": [{"message": {"content": "x" * 100000}}]},
])
def test_odd_answers_become_events_without_raising(body: Any) -> None:
    got = events(body)
    assert got is not None and got
