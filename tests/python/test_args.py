"""Bad arguments raise TypeError/ValueError naming the argument, before any I/O."""

from __future__ import annotations

from typing import Any, Dict

import pytest

import llmretry
from conftest import SECRET_KEY, Scenario

BODY = {"model": "gpt-test", "messages": [{"role": "user", "content": "SECRET-PROMPT-args"}]}


class Unserialisable:
    pass


BAD_CALLS = [
    # (kwargs, exception, name the message must contain)
    ({"body": 42}, TypeError, "body"),
    ({"body": None}, TypeError, "body"),
    ({"body": ["a", "list"]}, TypeError, "body"),
    ({"body": {"x": Unserialisable()}}, TypeError, "body"),
    ({"body": {"x": {1, 2}}}, TypeError, "body"),
    ({"timeout_ms": "5000"}, TypeError, "timeout_ms"),
    ({"timeout_ms": True}, TypeError, "timeout_ms"),
    ({"timeout_ms": 1.5}, TypeError, "timeout_ms"),
    ({"timeout_ms": -5}, ValueError, "timeout_ms"),
    ({"timeout_ms": 0}, ValueError, "timeout_ms"),
    ({"max_retries": -1}, ValueError, "max_retries"),
    ({"max_retries": True}, TypeError, "max_retries"),
    ({"max_retries": "3"}, TypeError, "max_retries"),
    ({"base_delay_ms": -1}, ValueError, "base_delay_ms"),
    ({"base_delay_ms": False}, TypeError, "base_delay_ms"),
    ({"max_delay_ms": -1}, ValueError, "max_delay_ms"),
    ({"max_retry_after_ms": -1}, ValueError, "max_retry_after_ms"),
    ({"max_response_bytes": 0}, ValueError, "max_response_bytes"),
    ({"max_response_bytes": True}, TypeError, "max_response_bytes"),
    ({"deadline_ms": -1}, ValueError, "deadline_ms"),
    ({"deadline_ms": "soon"}, TypeError, "deadline_ms"),
    ({"deadline_ms": True}, TypeError, "deadline_ms"),
    ({"jitter": "sometimes"}, ValueError, "jitter"),
    ({"jitter": 1}, TypeError, "jitter"),
    ({"retry_mode": "reckless"}, ValueError, "retry_mode"),
    ({"retry_mode": None}, TypeError, "retry_mode"),
    ({"retry_statuses": [99]}, ValueError, "retry_statuses"),
    ({"retry_statuses": [700]}, ValueError, "retry_statuses"),
    ({"retry_statuses": "503"}, TypeError, "retry_statuses"),
    ({"retry_statuses": [True]}, TypeError, "retry_statuses"),
    ({"retry_statuses": ["503"]}, TypeError, "retry_statuses"),
    ({"retry_invalid_response": "yes"}, TypeError, "retry_invalid_response"),
    ({"headers": "X-A: b"}, TypeError, "headers"),
    ({"headers": {"X-A": 1}}, TypeError, "headers"),
    ({"headers": {"X-A": "a\r\nInjected: yes"}}, ValueError, "headers"),
    ({"request_id": 5}, TypeError, "request_id"),
    ({"request_id": "bad\nid"}, ValueError, "request_id"),
    ({"idempotency_key": 5}, TypeError, "idempotency_key"),
    ({"api_key": 123}, TypeError, "api_key"),
    ({"base_url": 5}, TypeError, "base_url"),
    ({"url": 5}, TypeError, "url"),
    ({"validate": 42}, TypeError, "validate"),
    ({"validate": "not callable"}, TypeError, "validate"),
    ({"logger": 42}, TypeError, "logger"),
    ({"logger": "llmretry"}, TypeError, "logger"),
    ({"client": "not a client"}, TypeError, "client"),
]


def bad_id(case: Any) -> str:
    kw, exc, name = case
    (key, value), = kw.items()
    return f"{key}={type(value).__name__}:{str(value)[:12]}"


@pytest.mark.parametrize("case", BAD_CALLS, ids=[bad_id(c) for c in BAD_CALLS])
def test_bad_argument(scen: Scenario, case: Any) -> None:
    kw, exc, name = case
    kw = dict(kw)
    body = kw.pop("body", BODY)
    kw.setdefault("base_url", scen.url)
    kw.setdefault("api_key", SECRET_KEY)
    with pytest.raises(exc) as info:
        llmretry.call_llm(body, logger=None, **kw)
    assert not isinstance(info.value, llmretry.LLMError)
    msg = str(info.value)
    assert name in msg, f"message {msg!r} does not name {name!r}"
    assert SECRET_KEY not in msg and "SECRET-PROMPT" not in msg
    assert scen.requests() == [], "a bad argument must be caught before any I/O"


def test_nan_in_body(scen: Scenario) -> None:
    with pytest.raises((TypeError, ValueError)) as info:
        llmretry.call_llm({"x": float("nan")}, base_url=scen.url, api_key=SECRET_KEY,
                          logger=None)
    assert "body" in str(info.value)
    assert scen.requests() == []


def test_unknown_keyword(scen: Scenario) -> None:
    with pytest.raises(TypeError, match="timeout_sec"):
        llmretry.call_llm(BODY, base_url=scen.url, timeout_sec=5)
    assert scen.requests() == []


def test_empty_str_body(scen: Scenario) -> None:
    with pytest.raises((TypeError, ValueError), match="body"):
        llmretry.call_llm("", base_url=scen.url, api_key=SECRET_KEY, logger=None)
    assert scen.requests() == []


def test_call_llm_with_deadline_bad_deadline(scen: Scenario) -> None:
    with pytest.raises(ValueError, match="deadline_ms"):
        llmretry.call_llm_with_deadline(BODY, deadline_ms=-5, base_url=scen.url)
    with pytest.raises(TypeError, match="deadline_ms"):
        llmretry.call_llm_with_deadline(BODY, deadline_ms="5", base_url=scen.url)
    assert scen.requests() == []


@pytest.mark.parametrize("kw,exc,name", [
    ({"limit": 0}, ValueError, "limit"),
    ({"limit": -1}, ValueError, "limit"),
    ({"limit": 1.5}, TypeError, "limit"),
    ({"limit": True}, TypeError, "limit"),
    ({"limit": "4"}, TypeError, "limit"),
    ({"worker": None}, TypeError, "worker"),
    ({"worker": 42}, TypeError, "worker"),
])
def test_map_bad_arguments(kw: Dict[str, Any], exc: type, name: str) -> None:
    calls = []
    args: Dict[str, Any] = {"items": [1, 2, 3], "limit": 2, "worker": lambda i, n: calls.append(i)}
    args.update(kw)
    with pytest.raises(exc, match=name):
        llmretry.map_with_concurrency(args["items"], args["limit"], args["worker"])
    assert calls == [], "the worker must not run"


def test_map_items_not_iterable() -> None:
    with pytest.raises(TypeError):
        llmretry.map_with_concurrency(42, 2, lambda i, n: i)


def test_client_unknown_default() -> None:
    with pytest.raises(TypeError, match="tiemout_ms"):
        llmretry.Client(tiemout_ms=5)


def test_client_bad_arguments_in_methods(scen: Scenario) -> None:
    c = llmretry.Client(base_url=scen.url, api_key=SECRET_KEY)
    try:
        with pytest.raises(ValueError, match="jitter"):
            c.call_llm(BODY, jitter="wobbly", logger=None)
        with pytest.raises(TypeError, match="max_retries"):
            c.call_llm(BODY, max_retries=False, logger=None)
        with pytest.raises(ValueError, match="limit"):
            c.map_with_concurrency([1], 0, lambda i, n: i)
    finally:
        c.close()
    assert scen.requests() == []


def test_client_bad_defaults_raise_before_io(scen: Scenario) -> None:
    """A bad default is reported at construction or at the first call, never sent."""
    try:
        c = llmretry.Client(base_url=scen.url, api_key=SECRET_KEY, timeout_ms=-1)
    except ValueError as exc:
        assert "timeout_ms" in str(exc)
        return
    try:
        with pytest.raises(ValueError, match="timeout_ms"):
            c.call_llm(BODY, logger=None)
    finally:
        c.close()
    assert scen.requests() == []


def test_assert_shape_bad_arguments() -> None:
    with pytest.raises(TypeError):
        llmretry.assert_shape({"x": Unserialisable()}, {"x": "object"})
    with pytest.raises(ValueError, match="invalid shape"):
        llmretry.assert_shape({"x": 1}, {"x": "nubmer"})


def test_extract_json_bad_arguments() -> None:
    with pytest.raises(TypeError):
        llmretry.extract_json(42)
    with pytest.raises(ValueError):
        llmretry.extract_json("no json here")
