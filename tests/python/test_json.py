"""Exact JSON both ways, extract_json, assert_shape, log_usage."""

from __future__ import annotations

import io
import json
import logging
from typing import Any, Dict, List

import pytest

import llmretry
from conftest import SECRET_KEY, Events, Scenario, serialised

BIG = 9007199254740993  # 2**53 + 1: not representable as a double


# ---------------------------------------------------------------------------
# Exact JSON through a call
# ---------------------------------------------------------------------------

def test_64bit_integer_in_response(scen: Scenario) -> None:
    text = ('{"id": 9007199254740993, "object": "chat.completion", "created": 1700000000, '
            '"model": "gpt-test", "choices": [{"index": 0, "message": {"role": "assistant", '
            '"content": "ok"}, "finish_reason": "stop"}], "seq": -9223372036854775807, '
            '"usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}}')
    scen.script([{"body": text}])
    res = llmretry.call_llm({"model": "gpt-test", "messages": []}, base_url=scen.url,
                            api_key=SECRET_KEY, logger=None)
    assert res.data["id"] == BIG
    assert type(res.data["id"]) is int
    assert res.data["seq"] == -9223372036854775807
    assert res.data == json.loads(text)


def test_64bit_integer_in_request(scen: Scenario) -> None:
    body = {"model": "gpt-test", "seed": BIG, "messages": [], "metadata": {"n": -2 ** 63}}
    llmretry.call_llm(body, base_url=scen.url, api_key=SECRET_KEY, logger=None)
    (rec,) = scen.requests()
    assert "9007199254740993" in rec["body"]
    assert json.loads(rec["body"]) == body
    assert rec["body"] == serialised(body)


def test_unicode_round_trip(scen: Scenario) -> None:
    prompt = "SECRET-PROMPT-你好，世界 🦀 naïve ½ \u2028 end"
    reply = "答案是 42 🎉 — «ok» \U0001F600"
    scen.script([{"content": reply}])
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": prompt}]}
    events = Events()
    res = llmretry.call_llm(body, base_url=scen.url, api_key=SECRET_KEY, logger=events)
    assert res.data["choices"][0]["message"]["content"] == reply
    (rec,) = scen.requests()
    assert json.loads(rec["body"]) == body
    assert "你好，世界 🦀" in rec["body"], "the body should be UTF-8, not \\u escapes"
    assert rec["body"] == serialised(body)
    for ev in events.events:
        assert "SECRET-PROMPT" not in json.dumps(ev, ensure_ascii=False)


def test_str_body_sent_as_is(scen: Scenario) -> None:
    text = '{ "model" : "gpt-test",\n  "messages": [], "n": 9007199254740993, "s": "é" }'
    llmretry.call_llm(text, base_url=scen.url, api_key=SECRET_KEY, logger=None)
    (rec,) = scen.requests()
    assert rec["body"] == text


def test_bytes_body_sent_as_is(scen: Scenario) -> None:
    raw = '{"model":"gpt-test","messages":[{"role":"user","content":"日本語"}]}'.encode("utf-8")
    res = llmretry.call_llm(raw, base_url=scen.url, api_key=SECRET_KEY, logger=None)
    (rec,) = scen.requests()
    assert rec["body"].encode("utf-8") == raw
    assert res.meta.model == "gpt-test"


def test_body_without_model(scen: Scenario) -> None:
    events = Events()
    res = llmretry.call_llm({"messages": []}, base_url=scen.url, api_key=SECRET_KEY,
                            logger=events)
    assert res.meta.model is None
    assert {e["model"] for e in events.events} == {None}


# ---------------------------------------------------------------------------
# extract_json
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("text,want", [
    ('Here you go:\n```json\n{"a": 1}\n```\nThanks!', {"a": 1}),
    ("```\n[1, 2, 3]\n```", [1, 2, 3]),
    ('{"a": [1, 2, {"b": null}]}', {"a": [1, 2, {"b": None}]}),
    ('Sure! Here is the JSON: {"a": 1}. Let me know.', {"a": 1}),
    ('结果如下：{"名字": "张三", "emoji": "😀"} 🎉谢谢', {"名字": "张三", "emoji": "😀"}),
    ('Result: {"msg": "use } and { freely", "n": [1]} done', {"msg": "use } and { freely",
                                                              "n": [1]}),
    ('id: {"id": 9007199254740993}', {"id": BIG}),
    ("42", 42),
    (b'bytes: {"k": "v"}', {"k": "v"}),
], ids=["fenced", "fence_no_tag", "bare", "prose", "unicode", "braces_in_strings", "bigint",
        "scalar", "bytes"])
def test_extract_json(text: Any, want: Any) -> None:
    got = llmretry.extract_json(text)
    assert got == want
    if want == {"id": BIG}:
        assert type(got["id"]) is int


@pytest.mark.parametrize("text", ["", "I cannot help with that.", "{'a': 1}",
                                  "```json\n{a: 1}\n```"])
def test_extract_json_none(text: str) -> None:
    with pytest.raises(ValueError):
        llmretry.extract_json(text)


# ---------------------------------------------------------------------------
# assert_shape
# ---------------------------------------------------------------------------

def test_assert_shape_ok_returns_value() -> None:
    value = {"user": {"name": "a", "id": 1}, "tags": ["x", "y"], "ok": True, "extra": None}
    shape = {"user": {"name": "string", "id": "number"}, "tags": ["string"], "ok": "boolean"}
    assert llmretry.assert_shape(value, shape) is value


@pytest.mark.parametrize("value,shape,path,message", [
    ({"user": {"name": 5}}, {"user": {"name": "string"}}, "root",
     "invalid response at root.user.name: expected string"),
    ({"items": [{"name": "a"}, {"name": 7}]}, {"items": [{"name": "string"}]}, "root",
     "invalid response at root.items[1].name: expected string"),
    ({"name": ""}, {"name": "string"}, "response",
     "invalid response at response.name: expected string"),
    ([1, "2"], ["number"], "root", "invalid response at root[1]: expected number"),
    ({"名字": ""}, {"名字": "string"}, "root", "invalid response at root.名字: expected string"),
])
def test_assert_shape_failures(value: Any, shape: Any, path: str, message: str) -> None:
    with pytest.raises(llmretry.ShapeError) as info:
        llmretry.assert_shape(value, shape, path=path)
    assert isinstance(info.value, ValueError)
    assert str(info.value) == message


def test_assert_shape_bad_shape() -> None:
    with pytest.raises(ValueError) as info:
        llmretry.assert_shape({"x": 1}, {"x": "strng"})
    assert "invalid shape at root.x" in str(info.value)


# ---------------------------------------------------------------------------
# log_usage
# ---------------------------------------------------------------------------

USAGE_KEYS = ["label", "attempt", "duration_ms", "prompt_tokens", "completion_tokens",
              "total_tokens", "request_id", "model"]


def a_meta(scen: Scenario, **step: Any) -> Any:
    scen.script([step])
    return llmretry.call_llm({"model": "gpt-test", "messages": []}, base_url=scen.url,
                             api_key=SECRET_KEY, logger=None, request_id="req-usage").meta


def test_log_usage_prints_one_json_line(scen: Scenario,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    meta = a_meta(scen, usage={"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12})
    d = llmretry.log_usage(meta, label="batch-1")
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert json.loads(out) == d
    assert sorted(d) == sorted(USAGE_KEYS)
    assert d == {"label": "batch-1", "attempt": 0, "duration_ms": meta.duration_ms,
                 "prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12,
                 "request_id": "req-usage", "model": "gpt-test"}


def test_log_usage_default_label_and_missing_usage(scen: Scenario,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    meta = a_meta(scen, body={"object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]})
    d = llmretry.log_usage(meta)
    assert d["label"] == "request"
    assert d["prompt_tokens"] is None and d["completion_tokens"] is None
    assert d["total_tokens"] is None
    assert json.loads(capsys.readouterr().out) == d


def test_log_usage_to_logger_and_callable(scen: Scenario,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    meta = a_meta(scen)
    logger = logging.getLogger("test_llmretry.usage")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    records: List[logging.LogRecord] = []

    class H(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    h = H()
    logger.addHandler(h)
    try:
        d = llmretry.log_usage(meta, label="L", logger=logger)
    finally:
        logger.removeHandler(h)
    assert len(records) == 1 and records[0].levelno == logging.INFO
    assert json.loads(records[0].getMessage()) == d
    got: List[Dict[str, Any]] = []
    d2 = llmretry.log_usage(meta, label="C", logger=got.append)
    assert got == [d2] and d2["label"] == "C" and d2["total_tokens"] == 15
    assert capsys.readouterr().out == "", "with a logger nothing goes to stdout"
