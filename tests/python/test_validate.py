"""validate=: host-side response validation, retried like any invalid response."""

from __future__ import annotations

import json
import threading
from typing import Any, Dict, List

import pytest

import llmretry
from conftest import (SECRET_KEY, Events, Scenario, check_error, check_event_sequence,
                      check_outcome_secrets, run_call)


def content_json(data: Dict[str, Any]) -> Any:
    return json.loads(data["choices"][0]["message"]["content"])


def test_rejection_then_acceptance_is_retried(scen: Scenario) -> None:
    seen: List[Any] = []
    threads: List[int] = []

    def validate(data: Dict[str, Any]) -> None:
        seen.append(data)
        threads.append(threading.get_ident())
        content_json(data)  # raises on the first, prose, reply

    out = run_call(scen, [{"content": "not json at all"}, {"content": '{"answer": 42}'}],
                   validate=validate)
    assert out.ok, out.error
    res = out.result
    assert res.meta.attempts == 2 and res.meta.status == 200
    assert len(seen) == 2
    assert set(threads) == {threading.get_ident()}, "validate must run on the calling thread"
    assert out.events.names == ["llm_request_started", "llm_request_error",
                                "llm_retry_scheduled", "llm_request_started",
                                "llm_request_succeeded"]
    err_ev = out.events.of("llm_request_error")[0]
    assert err_ev["error_kind"] == "invalid_response"
    assert err_ev["error_message"]
    check_event_sequence(out.events, 2, res.meta.request_id)
    assert len(scen.requests()) == 2
    # validate's parse is reused for data: the very object validate saw.
    assert res.data is seen[-1]
    assert content_json(res.data) == {"answer": 42}


def test_returning_false_rejects(scen: Scenario) -> None:
    calls: List[int] = []

    def validate(data: Dict[str, Any]) -> Any:
        calls.append(1)
        return len(calls) > 1 and None  # False first, then None

    out = run_call(scen, [{}, {}], validate=validate)
    assert out.ok
    assert out.result.meta.attempts == 2
    assert len(calls) == 2


@pytest.mark.parametrize("value", [None, True, "yes", 1, {"ok": 1}])
def test_anything_but_false_accepts(scen: Scenario, value: Any) -> None:
    out = run_call(scen, [{}], validate=lambda data: value)
    assert out.ok
    assert out.result.meta.attempts == 1


def test_rejection_not_retried(scen: Scenario) -> None:
    def validate(data: Dict[str, Any]) -> None:
        raise ValueError("REASON-missing-field-answer")

    out = run_call(scen, [{}], validate=validate, retry_invalid_response=False)
    check_error(out.error, "invalid_response", reason="not_retryable", attempts=1, status=200)
    assert isinstance(out.error, llmretry.InvalidResponseError)
    assert "REASON-missing-field-answer" in out.error.message
    assert out.events.names == ["llm_request_started", "llm_request_error",
                                "llm_request_gave_up"]
    assert "REASON-missing-field-answer" in out.events.of("llm_request_error")[0]["error_message"]
    assert len(scen.requests()) == 1
    check_outcome_secrets(out)


def test_rejection_exhausts_retries(scen: Scenario) -> None:
    calls: List[int] = []

    def validate(data: Dict[str, Any]) -> bool:
        calls.append(1)
        return False

    out = run_call(scen, [], validate=validate, max_retries=2)
    check_error(out.error, "invalid_response", reason="retries_exhausted", attempts=3,
                status=200)
    assert len(calls) == 3
    assert len(scen.requests()) == 3
    assert out.events.field("llm_request_error", "error_kind") == ["invalid_response"] * 3


def test_validate_not_called_for_failures(scen: Scenario) -> None:
    calls: List[Any] = []
    out = run_call(scen, [{"status": 503}, {"fault": "invalid_json"}, {}],
                   validate=lambda d: calls.append(d))
    assert out.ok
    assert out.result.meta.attempts == 3
    assert len(calls) == 1, "validate sees only 2xx JSON bodies"


def test_validate_with_assert_shape(scen: Scenario) -> None:
    shape = {"answer": "number", "why": "string"}

    def validate(data: Dict[str, Any]) -> None:
        llmretry.assert_shape(llmretry.extract_json(data["choices"][0]["message"]["content"]),
                              shape)

    out = run_call(scen, [{"content": '```json\n{"answer": "x", "why": "w"}\n```'},
                          {"content": 'Sure: {"answer": 3, "why": "because"}'}],
                   validate=validate)
    assert out.ok
    assert out.result.meta.attempts == 2
    msg = out.events.of("llm_request_error")[0]["error_message"]
    assert "root.answer" in msg


class Stop(BaseException):
    pass


def test_validate_base_exception_propagates(scen: Scenario) -> None:
    def validate(data: Dict[str, Any]) -> None:
        raise Stop()

    scen.script([{}])
    with pytest.raises(Stop):
        llmretry.call_llm({"model": "gpt-test", "messages": []}, base_url=scen.url,
                          api_key=SECRET_KEY, validate=validate, logger=None)
    assert len(scen.requests()) == 1


def test_validate_gets_the_parsed_body_with_exact_ints(scen: Scenario) -> None:
    seen: List[Any] = []
    scen.script([{"body": '{"id": 9007199254740993, "object": "chat.completion", '
                          '"choices": [{"index": 0}], "note": "\\u4f60\\u597d"}'}])
    res = llmretry.call_llm({"model": "gpt-test", "messages": []}, base_url=scen.url,
                            api_key=SECRET_KEY, validate=seen.append, logger=Events())
    assert seen and seen[0]["id"] == 9007199254740993 and seen[0]["note"] == "你好"
    assert res.data is seen[0]
